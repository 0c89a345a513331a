"""Port squatting: the listen guards of tunnelspec's nftables table (facts/nft.py) keep
anyone but root and a port's own service user from answering connections on it.

Pure: the rules render, parse back, and a changed or partial guard is foreign. Real kernel (a
private network namespace, `unshare -n`): `nobody` listens on a guarded port — with a normal backlog
and with listen(0), whose SYN-ACKs are SYN cookies that carry no socket — and a root client's
connection is refused at once while the squatter's accept() never returns; the allowed uid and root
still serve; a client of another user whose source port equals the guarded port is not hit; the
owner fact (facts/port_owners.py) names the squatter."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

from tunnelspec.facts import nft, port_owners

PORT = 50052
SERVICE = 4243


def _mixed():
    return (nft.rules_for([PORT], [4242], "c") + nft.listen_rules_for([PORT], [SERVICE], "l")
            + nft.listen_rules_for([1], [], "l"))


def test_listen_guard_renders_three_rules_per_port_and_orders_connect_guards_first():
    text = nft.ruleset_text(_mixed(), "h")
    body = [l.strip() for l in text.splitlines() if l.startswith("\t\toif")]
    assert body[0].startswith(f'oif "lo" tcp dport {PORT} ')
    assert body[1:4] == [
        'oif "lo" tcp sport 1 tcp flags & (syn | ack) == syn | ack meta skuid { 0 } accept comment "l"',
        'oif "lo" tcp sport 1 tcp flags & (syn | ack) == syn | ack meta skuid != { 0 } counter tcp flags set rst | ack comment "l"',
        'oif "lo" tcp sport 1 tcp flags & (syn | ack) == syn | ack counter drop comment "l"']
    assert body[4] == (f'oif "lo" tcp sport {PORT} tcp flags & (syn | ack) == syn | ack '
                       f'meta skuid {{ 0, {SERVICE} }} accept comment "l"')
    assert "listen tcp/1 uids 0" in nft.describe(_mixed())


def _rule(port, expr, comment="l"):
    return {"rule": {"family": "inet", "table": "tunnelspec", "chain": "output", "handle": 1, "comment": comment,
                     "expr": expr}}


def _synack(port, *more):
    return [{"match": {"op": "==", "left": {"meta": {"key": "oif"}}, "right": "lo"}},
            {"match": {"op": "==", "left": {"payload": {"protocol": "tcp", "field": "sport"}}, "right": port}},
            {"match": {"op": "==", "left": {"&": [{"payload": {"protocol": "tcp", "field": "flags"}}, ["syn", "ack"]]},
                       "right": {"|": ["syn", "ack"]}}}, *more]


def _table(*rules):
    return json.dumps({"nftables": [
        {"table": {"family": "inet", "name": "tunnelspec"}},
        {"chain": {"family": "inet", "table": "tunnelspec", "name": "output", "type": "filter", "hook": "output",
                   "prio": 0, "policy": "accept"}}, *rules]})


UIDS = {"match": {"op": "==", "left": {"meta": {"key": "skuid"}}, "right": {"set": [0, SERVICE]}}}
NOT_UIDS = {"match": {"op": "!=", "left": {"meta": {"key": "skuid"}}, "right": {"set": [0, SERVICE]}}}
RESET = {"mangle": {"key": {"payload": {"protocol": "tcp", "field": "flags"}}, "value": {"|": ["rst", "ack"]}}}
COUNTER = {"counter": {"packets": 3, "bytes": 180}}


def test_parser_reads_a_whole_guard_and_calls_a_partial_one_foreign():
    whole = _table(_rule(PORT, _synack(PORT, UIDS, {"accept": None})),
                   _rule(PORT, _synack(PORT, NOT_UIDS, COUNTER, RESET)),
                   _rule(PORT, _synack(PORT, COUNTER, {"drop": None})))
    live = nft.parse_live(whole)
    assert live.foreign == 0 and live.rules == (nft.ListenRule(PORT, (0, SERVICE), "l"),)
    assert live.rejected == 6
    assert nft.matches(live, nft.listen_rules_for([PORT], [SERVICE], "l"))
    assert not nft.matches(live, nft.listen_rules_for([PORT], [SERVICE + 1], "l"))
    # Without the drop of socketless SYN-ACKs (SYN cookies) the guard is open: not ours.
    partial = nft.parse_live(_table(_rule(PORT, _synack(PORT, UIDS, {"accept": None})),
                                    _rule(PORT, _synack(PORT, NOT_UIDS, COUNTER, RESET))))
    assert partial.rules == () and partial.foreign == 2
    # An accept for everyone in the reset rule's place: foreign.
    widened = nft.parse_live(_table(_rule(PORT, _synack(PORT, UIDS, {"accept": None})),
                                    _rule(PORT, _synack(PORT, NOT_UIDS, {"accept": None})),
                                    _rule(PORT, _synack(PORT, {"drop": None}))))
    assert widened.rules == () and widened.foreign >= 1


SS = """== ss
LISTEN 0      128    0.0.0.0:22 0.0.0.0:* users:(("sshd",pid=34,fd=3)) ino:19684 sk:1003 cgroup:/system.slice/ssh.service <->
LISTEN 0      0      127.0.0.1:50052 0.0.0.0:* users:(("python3",pid=2693,fd=3)) uid:65534 ino:96841 sk:3 cgroup: <->
LISTEN 0      1      [::1]:15052 [::]:* users:(("ssh",pid=77,fd=4)) uid:998 ino:1 sk:4 v6only:1 <->
LISTEN 0      512    127.0.0.1:18080 0.0.0.0:* users:(("llama-server",pid=90,fd=9)) uid:997 ino:2 sk:5 <->
== ps
     34 root                             sshd: /usr/sbin/sshd -D [listener] 0 of 10-100 startups
   2693 nobody                           python3 -c import socket
     77 tunnelspec-tunnel                ssh -F none -L 127.0.0.1:15052:127.0.0.1:50052 rpc-a
     90 tunnelspec-llama                 /opt/tunnelspec/current/bin/llama-server --port 18080
== users
997 tunnelspec-llama:tunnelspec service user
998 tunnelspec-tunnel:tunnelspec service user
65534 nobody:nobody
== end
"""


def test_port_owner_fact_names_the_squatter_and_spares_root_and_the_service():
    seen = port_owners.parse(SS)
    assert [(l.address, l.port, l.uid, l.owner, l.ours) for l in seen] == [
        ("0.0.0.0", 22, 0, "root", False), ("127.0.0.1", 50052, 65534, "nobody", False),
        ("::1", 15052, 998, "tunnelspec-tunnel", True), ("127.0.0.1", 18080, 997, "tunnelspec-llama", True)]
    # 18080 is now another user's (llama_user changed): llama-server still runs as tunnelspec's old
    # service account, which the deploy moves — not a squatter. nobody on 50052 is.
    bad = port_owners.squatters(seen, {50052: {4243}, 15052: {998}, 18080: {1001}, 22: set()})
    assert [b.port for b in bad] == [50052]
    assert bad[0].describe() == "127.0.0.1:50052 held by user nobody (uid 65534): pid 2693 'python3 -c import socket'"
    with pytest.raises(ValueError):
        port_owners.parse("== ss\n")


SCENARIO = r"""
set -e
ip link set lo up
nft -f "$1"
for backlog in 8 0; do
  setpriv --reuid=65534 --regid=65534 --clear-groups "$4" - "$2" "$backlog" <<'PY' &
import socket, sys
s = socket.socket(); s.bind(("127.0.0.1", int(sys.argv[1]))); s.listen(int(sys.argv[2])); s.settimeout(4)
print("listening", flush=True)
try:
    c, a = s.accept(); print("SQUATTER GOT", c.recv(100), flush=True)
except socket.timeout:
    print("squatter: nothing", flush=True)
PY
  i=0; while ! ss -Hltn | grep -q "127.0.0.1:$2 "; do i=$((i+1)); [ $i -lt 100 ] || exit 9; sleep 0.05; done
  [ "$backlog" != 8 ] || sh -c "$5" > "$6"
  echo "== backlog $backlog"
  "$4" - "$2" <<'PY'
import errno, socket, sys, time
for _ in range(3):
    s = socket.socket(); s.settimeout(3); t = time.monotonic()
    rc = s.connect_ex(("127.0.0.1", int(sys.argv[1])))
    if rc == 0:
        s.sendall(b"Authorization: Bearer secret")
    print("root", errno.errorcode.get(rc, rc), "%.1f" % (time.monotonic() - t), flush=True)
    s.close()
PY
  wait
done
echo "== service"
for uid in 0 "$3"; do
  setpriv --reuid="$uid" --regid="$uid" --clear-groups "$4" - "$2" <<'PY' &
import socket, sys
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("127.0.0.1", int(sys.argv[1]))); s.listen(8); s.settimeout(5)
c, _ = s.accept(); c.sendall(b"served"); c.close()
PY
  i=0; while ! ss -Hltn | grep -q "127.0.0.1:$2 "; do i=$((i+1)); [ $i -lt 100 ] || exit 9; sleep 0.05; done
  "$4" -c 'import socket,sys; s=socket.create_connection(("127.0.0.1", int(sys.argv[1])), 3); print(sys.argv[2], s.recv(10).decode())' "$2" "$uid"
  wait
done
echo "== sport"
# A client of nobody whose own (source) port is the guarded one reaches a root listener elsewhere.
"$4" -c 'import socket; s=socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); s.bind(("127.0.0.1", 9)); s.listen(1); s.settimeout(5); c,_=s.accept(); c.sendall(b"hi"); c.close()' &
sleep 0.3
setpriv --reuid=65534 --regid=65534 --clear-groups "$4" -c 'import socket,sys; s=socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); s.bind(("127.0.0.1", int(sys.argv[1]))); s.settimeout(3); s.connect(("127.0.0.1", 9)); print("client sport ok", s.recv(2).decode())' "$2"
wait
"""


@pytest.mark.skipif(sys.platform != "linux" or os.geteuid() != 0, reason="needs root on Linux (a network namespace)")
def test_kernel_refuses_a_squatter_at_once_and_serves_root_and_the_service(tmp_path):
    assert shutil.which("nft"), "nftables is installed by scripts/setup.sh"
    rules = nft.listen_rules_for([PORT], [SERVICE], "l")
    path = tmp_path / "guard.nft"
    path.write_text(nft.ruleset_text(rules, "test"))
    python = "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else shutil.which("python3")
    res = subprocess.run(["unshare", "-n", "sh", "-c", SCENARIO, "sh", str(path), str(PORT), str(SERVICE), python,
                          port_owners.SCRIPT, str(tmp_path / "owners")], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stdout + res.stderr
    out = res.stdout
    assert "SQUATTER GOT" not in out, out
    assert out.count("squatter: nothing") == 2, out
    # Refused at once (the SYN-ACK became a RST), with a normal backlog and with SYN cookies.
    blocks = out.split("== backlog ")
    assert blocks[1].count("root ECONNREFUSED 0.0") == 3, out
    # listen(0): each SYN-ACK is a cookie without a socket: dropped, the client times out, nothing
    # reaches the squatter.
    assert all(w in ("ECONNREFUSED", "timeout") or w.startswith(("EAGAIN", "EINPROGRESS", "11"))
               for w in [l.split()[1] for l in blocks[2].splitlines() if l.startswith("root ")]), out
    assert "\n0 served" in out and f"\n{SERVICE} served" in out, out
    assert "client sport ok hi" in out, out
    owners = port_owners.parse((tmp_path / "owners").read_text())
    bad = port_owners.squatters(owners, {PORT: {SERVICE}})
    assert [(o.port, o.owner) for o in bad] == [(PORT, "nobody")], owners


NAMED = r"""
set -e
ip link set lo up
for spec in "$2:uid:0" "$(($2 + 1)):\" uid:0 (" ; do
  setpriv --reuid=65534 --regid=65534 --clear-groups "$1" -c '
import ctypes, socket, sys, time
ctypes.CDLL(None).prctl(15, sys.argv[2].encode(), 0, 0, 0)  # PR_SET_NAME: the name ss shows
s = socket.socket(); s.bind(("127.0.0.1", int(sys.argv[1]))); s.listen(1); time.sleep(30)' "${spec%%:*}" "${spec#*:}" &
  pids="$pids $!"
done
i=0; while [ "$(ss -Hltn | grep -c '127.0.0.1:')" -lt 2 ]; do i=$((i+1)); [ $i -lt 100 ] || exit 9; sleep 0.05; done
# (each renames itself before listen(): listed means named)
sh -c "$3"
kill $pids
"""


@pytest.mark.skipif(sys.platform != "linux" or os.geteuid() != 0, reason="needs root on Linux (a network namespace)")
def test_the_owner_probe_reads_no_uid_from_a_process_name():
    """nobody's listeners named `uid:0` and `" uid:0 (`: the real probe (its ss and its getent loop)
    names nobody as their owner, so both are squatters; no uid is looked up that no socket has."""
    python = "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else shutil.which("python3")
    res = subprocess.run(["unshare", "-n", "sh", "-c", NAMED, "sh", python, str(PORT), port_owners.SCRIPT],
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stdout + res.stderr
    assert 'users:(("uid:0",' in res.stdout, res.stdout
    owners = port_owners.parse(res.stdout)
    assert sorted((o.port, o.uid, o.owner) for o in owners) == [(PORT, 65534, "nobody"), (PORT + 1, 65534, "nobody")]
    assert sorted(o.port for o in port_owners.squatters(owners, {PORT: {SERVICE}, PORT + 1: {SERVICE}})) == [PORT, PORT + 1]
    users = res.stdout.split("== users\n", 1)[1].split("== end", 1)[0].split()
    assert users[0] == "65534" and "0" not in users, res.stdout
