"""Isolation in the lab: RPC servers on loopback only, restricted tunnel keys, persistent tunnels.

Runs the real deploy flow (source, build, rpc, tunnel plays) once per module against the session
lab, then proves behaviour from the hosts themselves: probes run *on* main (python3 in the lab
image) so latency numbers are the tunnel's, not the controller's SSH hop. Numbers are printed
(`pytest -s`) for the report.
"""

from __future__ import annotations

import json
import re
import time

import pytest

from support.cli import failed_report, tunnelspec
from support.labtunnel import KEY, KNOWN, NODES, RPC_PORT, TUNNEL_USER, probe_on, ssh_as_tunnel_key

pytestmark = pytest.mark.lab

PLAYBOOK = "tests/deploy/data/rpc_tunnel.yml"


def wait_probe(lab, host: str, port: int, deadline_s: float) -> tuple[dict, float]:
    """Poll until HELLO answers; returns (result, seconds waited). Fails at the deadline."""
    t0 = time.monotonic()
    while True:
        got = probe_on(lab, host, port, timeout=10)
        if got:
            return got, time.monotonic() - t0
        assert time.monotonic() - t0 < deadline_s, f"no HELLO on {host}:{port} within {deadline_s}s"
        time.sleep(0.5)


def sh(lab, host: str, script: str, *args: str, timeout: float = 60):
    return lab.exec(host, ["sh", "-c", script, "sh", *args], timeout=timeout)


def main_pid(lab, host: str, unit: str) -> int:
    res = lab.exec(host, ["systemctl", "show", "-p", "MainPID", "--value", unit])
    return int(res.stdout.strip() or 0)


@pytest.fixture(scope="module")
def deployed(lab):
    inv = str(lab.inventory)
    # The RPC servers serve one client at a time: a llama-server left running by an earlier test
    # (or the demo) on this shared lab would hold them. Probes are meant for a server nobody holds.
    # Disabled, not only stopped: `tunnel open` (tested here) starts an enabled llama-server again.
    lab.exec("main", ["systemctl", "disable", "--now", "tunnelspec-llama-server.service"])
    r = tunnelspec("play", inv, PLAYBOOK, "--format", "json", timeout=3600)
    assert r.rc == 0, failed_report(r)
    return inv


@pytest.fixture(scope="module")
def expected_version(lab, deployed) -> str:
    res = lab.exec("main", ["cat", "/opt/tunnelspec/src/llama.cpp/ggml/include/ggml-rpc.h"])
    parts = dict(re.findall(r"#define RPC_PROTO_(MAJOR|MINOR|PATCH)_VERSION\s+(\d+)", res.stdout))
    return f"{parts['MAJOR']}.{parts['MINOR']}.{parts['PATCH']}"


# ---- after deploy ---------------------------------------------------------------------------------
def test_hello_through_every_tunnel(lab, deployed, expected_version):
    for node, port in NODES.items():
        got = probe_on(lab, "main", port)
        assert got, f"no HELLO through the tunnel to {node}"
        assert got["version"] == expected_version
        assert got["devices"] and all(total > 0 for _, total in got["devices"])
    r = tunnelspec("tunnel", "status", deployed, "--format", "json")
    rows = json.loads(r.stdout)
    assert r.rc == 0 and {row["node"] for row in rows} == set(NODES)
    for row in rows:
        assert (row["state"], row["rpc"], row["version"]) == ("active", "ok", expected_version), row
        assert row["devices"]


def test_second_run_changes_nothing(deployed):
    r = tunnelspec("play", deployed, PLAYBOOK, "--format", "json", timeout=1800)
    assert r.rc == 0, failed_report(r)
    changed = [(e["host"], e["task"], e["msg"]) for e in r.results("changed")]
    assert all(h["changed"] == 0 for h in r.recap.values()), changed


def test_rpc_unit_verifies_and_is_hardened(lab, deployed):
    v = lab.exec("rpc-a", ["systemd-analyze", "verify", "/etc/systemd/system/tunnelspec-rpc.service"])
    assert v.returncode == 0, v.stderr
    s = lab.exec("rpc-a", ["systemd-analyze", "security", "--no-pager", "tunnelspec-rpc.service"])
    score = float(re.search(r"Overall exposure level for \S+: ([\d.]+)", s.stdout).group(1))
    print(f"\nsystemd-analyze security tunnelspec-rpc.service: {score}")
    assert score <= 2.0
    unit = lab.exec("rpc-a", ["systemctl", "cat", "tunnelspec-rpc.service"]).stdout
    assert re.search(r"^ExecStart=/usr/bin/stdbuf -oL \S+ -H 127\.0\.0\.1 -p 50052", unit, re.M)
    banner = lab.exec("rpc-a", ["journalctl", "-u", "tunnelspec-rpc", "-o", "cat", "--no-pager"]).stdout
    # The server's own banner names its endpoint: 127.0.0.1, the port (a line, not any mention).
    assert re.search(r"^\s*endpoint\s*:\s*127\.0\.0\.1:50052\s*$", banner, re.M), banner[-2000:]


# ---- negative tests ------------------------------------------------------------------------------
def test_rpc_listens_on_loopback_only(lab, deployed):
    for node in NODES:
        out = lab.exec(node, ["ss", "-Hltn", f"sport = :{RPC_PORT}"]).stdout.split("\n")
        locals_ = {line.split()[3] for line in out if line.strip()}
        assert locals_ == {f"127.0.0.1:{RPC_PORT}"}, locals_


@pytest.mark.parametrize("src,dst", [("main", "rpc-a"), ("main", "rpc-b"), ("rpc-b", "rpc-a")])
def test_rpc_port_unreachable_over_the_network(lab, deployed, src, dst):
    ip = lab.hosts[dst]
    probe = 'exec 3<>"/dev/tcp/$1/$2" && echo CONNECTED'
    # Positive control: the same probe reaches sshd on that address, so a failure below means the
    # RPC port is closed, not that the probe cannot work.
    assert "CONNECTED" in sh(lab, src, f"timeout 5 bash -c '{probe}' bash \"$1\" 22", ip).stdout
    res = sh(lab, src, f"timeout 5 bash -c '{probe}' bash \"$1\" {RPC_PORT}", ip)
    assert "CONNECTED" not in res.stdout


def test_tunnel_key_cannot_run_a_command_or_open_a_shell(lab, deployed):
    ip = lab.hosts["rpc-a"]
    # A command: the forced `sleep infinity` runs instead, so nothing is printed and it only ends
    # by our timeout (124).
    res = ssh_as_tunnel_key(lab, ip, "-T", command=("echo PWNED; id",))
    assert "PWNED" not in res.stdout and "uid=" not in res.stdout and res.returncode == 124
    # A shell with a terminal: the pty is refused by `restrict`, and still the forced command runs.
    res = ssh_as_tunnel_key(lab, ip, "-tt", command=("id",))
    assert "uid=" not in res.stdout
    # The sftp subsystem: replaced by the forced command as well.
    res = lab.exec("main", ["timeout", "6", "sftp", "-F", "none", "-i", KEY, "-o", "BatchMode=yes",
                            "-o", f"UserKnownHostsFile={KNOWN}", "-o", "IdentitiesOnly=yes",
                            "-b", "-", f"{TUNNEL_USER}@{ip}"], input="ls /\n", timeout=20)
    assert res.returncode != 0 and "etc" not in res.stdout


FORWARD_CHECK = r"""
set -u
ssh -F none -i "$1" -l "$2" -N -o BatchMode=yes -o StrictHostKeyChecking=yes -o UserKnownHostsFile="$3" \
    -o GlobalKnownHostsFile=/dev/null -o IdentitiesOnly=yes -o ExitOnForwardFailure=yes \
    -L "127.0.0.1:$5:127.0.0.1:$6" "$4" &
pid=$!
i=0
while [ $i -lt 50 ] && ! ss -Hltn "sport = :$5" | grep -q LISTEN; do sleep 0.2; i=$((i+1)); done
out=$(timeout 5 bash -c 'exec 3<>"/dev/tcp/127.0.0.1/$1"; printf "GET / HTTP/1.0\r\n\r\n" >&3; head -c 64 <&3' bash "$5" 2>&1)
kill "$pid"; wait "$pid" 2>/dev/null
printf 'GOT[%s]\n' "$out"
"""


@pytest.mark.parametrize("target", ["sshd", "second-listener", "rpc"])
def test_tunnel_key_forwards_only_to_the_rpc_port(lab, deployed, target):
    ip = lab.hosts["rpc-a"]
    port = {"sshd": 22, "second-listener": 50099, "rpc": RPC_PORT}[target]
    if target == "second-listener":
        sh(lab, "rpc-a", "systemctl stop tunnelspec-test-listener 2>/dev/null; systemd-run -q "
           "--unit tunnelspec-test-listener python3 -m http.server --bind 127.0.0.1 50099")
    try:
        res = sh(lab, "main", FORWARD_CHECK, KEY, TUNNEL_USER, KNOWN, ip, "15099", str(port))
    finally:
        if target == "second-listener":
            lab.exec("rpc-a", ["systemctl", "stop", "tunnelspec-test-listener"])
    got = re.search(r"GOT\[(.*)\]", res.stdout, re.S).group(1)
    if target == "rpc":
        # Positive control: the permitted port answers (rpc-server replies to garbage by closing,
        # so only prove that the channel opened: no "administratively prohibited").
        assert "prohibited" not in res.stderr
    else:
        assert "SSH-" not in got and "HTTP" not in got, got
        assert "administratively prohibited" in res.stderr or "open failed" in res.stderr


@pytest.mark.parametrize("spec", ["127.0.0.1:50098:127.0.0.1:22", "0:127.0.0.1:22", "50097:127.0.0.1:22"])
def test_tunnel_key_cannot_remote_forward(lab, deployed, spec):
    res = ssh_as_tunnel_key(lab, lab.hosts["rpc-a"], "-N", "-o", "ExitOnForwardFailure=yes", "-R", spec)
    assert res.returncode not in (0, 124), (res.returncode, res.stderr)


def test_non_loopback_bind_refused_before_any_host_is_touched(lab, tmp_path):
    inv = tmp_path / "inventory.ini"
    text = lab.inventory.read_text().replace("rpc-a ansible_host=", "rpc-a rpc_bind=0.0.0.0 ansible_host=")
    inv.write_text(text)
    r = tunnelspec("deploy", str(inv), "--format", "json")
    assert r.rc == 2
    assert "rpc_bind" in r.stderr and "0.0.0.0" in r.stderr
    # Nothing ran (no run_start, no connection): stdout holds only the error event.
    assert [e["event"] for e in r.events] == ["error"], "nothing may run when the inventory asks for a public bind"
    assert "rpc_bind" in r.events[0]["msg"]


# ---- faults ------------------------------------------------------------------------------------------
def test_killed_tunnel_ssh_comes_back(lab, deployed):
    unit = "tunnelspec-tunnel-rpc-a.service"
    pid = main_pid(lab, "main", unit)
    assert pid > 0
    lab.exec("main", ["kill", "-KILL", str(pid)])
    _, waited = wait_probe(lab, "main", NODES["rpc-a"], 30)
    assert main_pid(lab, "main", unit) not in (0, pid)
    print(f"\ntunnel back {waited:.1f}s after its ssh was killed")


def test_killed_rpc_server_comes_back(lab, deployed):
    pid = main_pid(lab, "rpc-a", "tunnelspec-rpc.service")
    assert pid > 0
    lab.exec("rpc-a", ["kill", "-KILL", str(pid)])
    _, waited = wait_probe(lab, "main", NODES["rpc-a"], 30)
    assert main_pid(lab, "rpc-a", "tunnelspec-rpc.service") not in (0, pid)
    print(f"\nrpc server back through the tunnel {waited:.1f}s after it was killed")


def _tunnel_processes(lab, node: str) -> list[tuple[int, int, str]]:
    """(pid, ppid, args) of the tunnel user's processes on the node."""
    out = lab.exec(node, ["ps", "-u", TUNNEL_USER, "-o", "pid=,ppid=,args="]).stdout
    return [(int(p), int(pp), a) for p, pp, a in (l.split(None, 2) for l in out.splitlines() if l.strip())]


def test_link_cut_and_restore_recovers_by_itself(lab, deployed):
    unit = "tunnelspec-tunnel-rpc-b.service"
    pid = main_pid(lab, "main", unit)
    lab.link("rpc-b", up=False)
    try:
        # "A while": until the tunnel's ssh has noticed (ServerAlive 1 s x 3) and been restarted.
        end = time.monotonic() + 45
        while main_pid(lab, "main", unit) == pid and time.monotonic() < end:
            time.sleep(0.5)
        assert main_pid(lab, "main", unit) != pid, "ssh did not notice the dead link"
    finally:
        lab.link("rpc-b", up=True)
    _, waited = wait_probe(lab, "main", NODES["rpc-b"], 60)
    print(f"\ntunnel back {waited:.1f}s after the link was restored")
    # The node's session of the dead ssh goes too (a reset once the link is back, or ClientAlive);
    # its forced command must go with it: no sleep outlives its sshd session (pdeathsig).
    end = time.monotonic() + 60
    while time.monotonic() < end:       # bounded: until only the new session is left
        procs = _tunnel_processes(lab, "rpc-b")
        if sum(a.startswith("sshd:") for _, _, a in procs) == 1:
            break
        time.sleep(1)
    procs = _tunnel_processes(lab, "rpc-b")
    sshd = {p for p, _, a in procs if a.startswith("sshd:")}
    assert len(sshd) == 1, procs
    sleeps = [(p, pp) for p, pp, a in procs if "sleep infinity" in a]
    assert len(sleeps) == 1 and all(pp in sshd for _, pp in sleeps), procs   # no orphan, parent is sshd


def test_close_then_open_twice(lab, deployed):
    r = tunnelspec("tunnel", "close", deployed, "--format", "json")
    assert r.rc == 0, failed_report(r)
    for node in NODES:
        state = lab.exec("main", ["systemctl", "is-active", f"tunnelspec-tunnel-{node}.service"]).stdout.strip()
        assert state != "active"
    assert probe_on(lab, "main", NODES["rpc-a"]) is None
    first = tunnelspec("tunnel", "open", deployed, "--format", "json")
    assert first.rc == 0 and first.recap["main"]["changed"] >= 1
    second = tunnelspec("tunnel", "open", deployed, "--format", "json")
    assert second.rc == 0 and all(h["changed"] == 0 for h in second.recap.values()), second.recap
    assert probe_on(lab, "main", NODES["rpc-a"])


def test_open_limit_one_node(lab, deployed):
    r = tunnelspec("tunnel", "close", deployed, "--limit", "rpc-b", "--format", "json")
    assert r.rc == 0, failed_report(r)
    assert lab.exec("main", ["systemctl", "is-active", "tunnelspec-tunnel-rpc-a.service"]).stdout.strip() == "active"
    r = tunnelspec("tunnel", "open", deployed, "--limit", "rpc-b", "--format", "json")
    assert r.rc == 0 and probe_on(lab, "main", NODES["rpc-b"])


# ---- round trips -------------------------------------------------------------------------------------
def test_session_tunnel_carries_300_round_trips(lab, deployed):
    """300 small round trips on one connection through the session tunnel (shipped) reach the same
    RPC server as on the node itself. How fast they are (p95 against the 10 ms target; the
    forward-only `ssh -N` tunnel for comparison) is a performance figure: `python benchmarks/tunnel.py
    --only rtt` measures and prints it. The only time bounds here catch a hang: 10 s per socket
    operation in the probe, 60 s for the probe as a whole."""
    tunnel = probe_on(lab, "main", NODES["rpc-a"], 300)
    if tunnel is None and "busy" in tunnelspec("tunnel", "status", str(lab.inventory), "--limit", "rpc-a").stdout:
        # The lab is shared: a llama-server under test elsewhere holds the one-client RPC server.
        pytest.skip("rpc-a's RPC server is held by another client (llama-server); cannot probe")
    assert tunnel is not None, "300 round trips through rpc-a's tunnel did not complete (probe failed or hung)"
    # The probe exits 0 only after all 300 DEVICE_COUNT answers; their timings came back for each.
    assert tunnel["p95"] is not None and tunnel["max"] is not None
    direct = probe_on(lab, "rpc-a", RPC_PORT)
    assert direct is not None, "rpc-a's RPC server does not answer on its own loopback"
    assert (tunnel["version"], len(tunnel["devices"])) == (direct["version"], len(direct["devices"]))
    print(f"\nsession tunnel   HELLO {tunnel['hello_ms']:.2f} ms  p50 {tunnel['p50']:.3f} ms  "
          f"p95 {tunnel['p95']:.3f} ms  max {tunnel['max']:.2f} ms  (not asserted: benchmarks/tunnel.py)")
