"""Loopback isolation in the lab (real nftables in each host's own network namespace): after deploy
an unprivileged local user can reach neither a node's rpc port nor main's tunnel ports (127.0.0.1,
::1, IPv4-mapped ::ffff:127.0.0.1), while the remote draft, HELLO through the tunnels, `tunnel
status` and `status` keep working; drift is shown by --check --diff and repaired; the rules survive
a reboot of a node and of main; a host whose root lacks CAP_NET_ADMIN stops the deploy unless the
inventory opts out; teardown leaves nothing.

The steps share one lab. Each requests `deployed` (a deploy of the lab's own inventory: a no-op when
the lab already is, so the cost is seconds), so any one of them runs alone — teardown included, which
the file puts last.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from support import polling
from support.cli import failed_report, tunnelspec
from support.labdeploy import completion_on_main, verify_stats

pytestmark = pytest.mark.lab

DEPLOY_TIMEOUT = 3600
RPC_PORT = 50052
TUNNEL_PORTS = (15052, 15053)
NODES = ("rpc-a", "rpc-b")
TABLE_FILES = ("/etc/tunnelspec/isolation.nft", "/etc/systemd/system/tunnelspec-isolation.service")

# Connects as whoever runs it; prints "<address> ok" or "<address> <errno name>".
CONNECT = r"""
import errno, socket, sys
port = int(sys.argv[1])
for addr in sys.argv[2:]:
    s = socket.socket(socket.AF_INET6 if ":" in addr else socket.AF_INET)
    s.settimeout(5)
    rc = s.connect_ex((addr, port))
    print(addr, "ok" if rc == 0 else errno.errorcode.get(rc, str(rc)))
    s.close()
"""

# A root-owned listener on [::1]:port (IPv6 only): nothing of ours listens on ::1, so this is what
# proves the rules cover IPv6 loopback too. Accepts and closes until killed.
LISTEN6 = r"""
import socket, sys
s = socket.socket(socket.AF_INET6)
s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("::1", int(sys.argv[1])))
s.listen(8)
print("listening", flush=True)
s.settimeout(120)
try:
    while True:
        c, _ = s.accept()
        c.close()
except socket.timeout:
    pass
"""


def sh(lab, host: str, *argv: str, timeout: float = 90) -> str:
    return lab.exec(host, list(argv), timeout=timeout).stdout or ""


poll = polling.poller(120.0, 0.5)


def connect_as(lab, host: str, user: str | None, port: int, *addrs: str) -> dict[str, str]:
    argv = ["python3", "-c", CONNECT, str(port), *addrs]
    if user is not None:
        argv = ["setpriv", f"--reuid={user}", f"--regid={user if user != 'nobody' else 'nogroup'}",
                "--clear-groups", *argv]
    out = sh(lab, host, *argv)
    return dict(line.split(None, 1) for line in out.splitlines() if line.strip())


def with_listener6(lab, host: str, port: int, fn):
    """Run fn() while a root listener holds [::1]:port on host (started and ended by unit name)."""
    unit = f"tunnelspec-test-listen6-{port}"
    sh(lab, host, "systemd-run", f"--unit={unit}", "--collect", "--quiet", "python3", "-c", LISTEN6, str(port))
    try:
        assert poll(lambda: re.search(rf"\[::1\]:{port}\s", sh(lab, host, "ss", "-Hltn") + " "), 30), \
            f"no listener on [::1]:{port} on {host}"
        return fn()
    finally:
        sh(lab, host, "systemctl", "stop", unit)


def refused_everywhere(lab) -> dict:
    """Every unprivileged connection that must be refused, with what happened (empty = all refused)."""
    leaks = {}
    targets = [(n, RPC_PORT) for n in NODES] + [("main", p) for p in TUNNEL_PORTS]
    for host, port in targets:
        got = connect_as(lab, host, "nobody", port, "127.0.0.1", "::ffff:127.0.0.1")
        got6 = with_listener6(lab, host, port, lambda: (
            connect_as(lab, host, "nobody", port, "::1"), connect_as(lab, host, None, port, "::1")))
        assert got6[1] == {"::1": "ok"}, f"root must reach [::1]:{port} on {host}: {got6[1]}"
        got.update(got6[0])
        bad = {a: r for a, r in got.items() if r != "ECONNREFUSED"}
        if bad:
            leaks[f"{host}:{port}"] = bad
    return leaks


def allowed_user_passes(lab) -> None:
    """The allowed user of each side does reach the port (on [::1], a root test listener, so the
    one-client rpc-server and llama-server's connections are not disturbed)."""
    for host, user, port in [("rpc-a", "tunnelspec-tunnel", RPC_PORT), ("main", "tunnelspec-llama", TUNNEL_PORTS[0])]:
        got = with_listener6(lab, host, port, lambda: connect_as(lab, host, user, port, "::1"))
        assert got == {"::1": "ok"}, (host, user, got)


def serving_with_draft(lab) -> bool:
    body = completion_on_main(lab)
    return bool(body) and body["timings"].get("draft_n", 0) > 0 and body["timings"].get("draft_n_accepted", 0) > 0


@pytest.fixture(scope="module")
def inventory(lab):
    return str(lab.inventory)


@pytest.fixture
def deployed(inventory):
    """The lab's own inventory deployed, isolation rules loaded (the deploy's result, for the step to
    check)."""
    r = tunnelspec("deploy", inventory, "--format", "json", timeout=DEPLOY_TIMEOUT)
    assert r.rc == 0, failed_report(r)
    return r


def test_unprivileged_user_cannot_reach_rpc_or_tunnel_ports(lab, deployed):
    iso = [e for e in deployed.results() if e.get("module") == "local_isolation"]
    assert {e["host"] for e in iso} == {"main", *NODES}, iso
    assert refused_everywhere(lab) == {}
    allowed_user_passes(lab)
    listing = sh(lab, "rpc-a", "nft", "list", "table", "inet", "tunnelspec")
    assert f"tcp dport {RPC_PORT}" in listing and "reject with tcp reset" in listing, listing
    print("\n--- rpc-a: nft list table inet tunnelspec\n" + listing)
    print("--- main: nft list table inet tunnelspec\n" + sh(lab, "main", "nft", "list", "table", "inet", "tunnelspec"))


def test_draft_hello_tunnel_status_and_status_still_work(lab, inventory, deployed):
    draft_n, accepted = verify_stats(deployed)
    assert draft_n > 0 and accepted > 0
    v = tunnelspec("verify", inventory, "--format", "json", timeout=600)
    assert v.rc == 0, failed_report(v)
    msgs = {e["host"]: e["msg"] for e in v.results() if e.get("module") == "local_isolation_verify"}
    assert msgs["rpc-a"].startswith("rpc port: tunnel user only") and msgs["rpc-b"].startswith("rpc port:"), msgs
    assert msgs["main"].startswith("tunnel ports: llama-server only"), msgs
    hello = [e for e in deployed.results() if e.get("module") == "tunnel_probe"]
    assert hello and all(e["status"] in ("ok", "changed") for e in hello), hello
    # HELLO through every tunnel, as tunnelspec's probes do it (root on main): llama-server, which
    # holds the one-client rpc-servers, is stopped meanwhile.
    sh(lab, "main", "systemctl", "stop", "tunnelspec-llama-server.service")
    try:
        ts = tunnelspec("tunnel", "status", inventory, "--format", "json", timeout=300)
        assert ts.rc == 0, (ts.stdout, ts.stderr)
        rows = json.loads(ts.stdout)
        assert [(r["node"], r["rpc"]) for r in rows] == [(n, "ok") for n in NODES], rows
        assert all(r["version"] for r in rows), rows
    finally:
        sh(lab, "main", "systemctl", "start", "tunnelspec-llama-server.service")
    assert poll(lambda: serving_with_draft(lab), 300), "llama-server did not serve again"
    st = tunnelspec("status", inventory, "--format", "json", timeout=300)
    assert st.rc == 0, st.stdout[-3000:]
    report = json.loads(st.stdout)
    states = {h: r["isolation"]["state"] for h, r in report["hosts"].items()}
    assert states == {"main": "ok", "rpc-a": "ok", "rpc-b": "ok"}, states
    human = tunnelspec("status", inventory, timeout=300).stdout
    assert "isolation: rpc port: tunnel user only" in human and "isolation: tunnel ports: llama-server only" in human


def test_drift_is_shown_by_check_diff_and_repaired(lab, inventory, deployed):
    sh(lab, "rpc-a", "nft", "delete", "table", "inet", "tunnelspec")
    # The hole, for real: not refused (it times out in the busy one-client server's backlog instead).
    assert connect_as(lab, "rpc-a", "nobody", RPC_PORT, "127.0.0.1")["127.0.0.1"] != "ECONNREFUSED"
    chk = tunnelspec("deploy", inventory, "--tags", "isolation", "--check", "--diff", "--format", "json", timeout=600)
    assert chk.rc == 3, chk.stdout[-3000:]   # --check: changes pending
    ev = next(e for e in chk.results("changed") if e["host"] == "rpc-a" and e["module"] == "local_isolation")
    assert "load rules" in ev["msg"] and ev.get("diff"), ev
    assert sh(lab, "rpc-a", "sh", "-c", "nft list table inet tunnelspec >/dev/null 2>&1 && echo yes || echo no").strip() == "no"
    fix = tunnelspec("deploy", inventory, "--tags", "isolation", "--format", "json", timeout=600)
    assert fix.rc == 0, failed_report(fix)
    assert {e["host"] for e in fix.results("changed")} == {"rpc-a"}, fix.results("changed")
    assert refused_everywhere(lab) == {}
    again = tunnelspec("deploy", inventory, "--tags", "isolation", "--format", "json", timeout=600)
    assert again.rc == 0 and all(c["changed"] == 0 for c in again.recap.values()), again.results("changed")


def _boot_id(lab, host: str) -> str:
    try:
        return sh(lab, host, "cat", "/proc/sys/kernel/random/boot_id", timeout=10).strip()
    except Exception:  # noqa: BLE001 - the host is between boots
        return ""


def _running(lab, host: str) -> bool:
    try:
        return sh(lab, host, "systemctl", "is-system-running", timeout=10).strip() in ("running", "degraded")
    except Exception:  # noqa: BLE001
        return False


def test_rules_survive_reboot_of_a_node_and_of_main(lab, deployed):
    for host in ("rpc-a", "main"):
        before = _boot_id(lab, host)
        sh(lab, host, "systemctl", "reboot")
        assert poll(lambda: _boot_id(lab, host) not in ("", before), 180), f"{host} did not come back"
        assert poll(lambda: _running(lab, host), 180), f"{host} did not finish booting"
        assert sh(lab, host, "systemctl", "is-active", "tunnelspec-isolation.service").strip() == "active"
    assert refused_everywhere(lab) == {}
    assert poll(lambda: serving_with_draft(lab), 300), "serving with the remote draft did not resume"


def _capless_inventory(lab, tmp: Path, opt_out: bool) -> str:
    """The lab inventory with rpc-b reached through a second sshd whose sessions lack CAP_NET_ADMIN
    (port 2222; main's tunnel to rpc-b follows it there). Not a mock: root on rpc-b really cannot
    load rules."""
    text = Path(lab.inventory).read_text()
    extra = " ansible_port=2222" + (" rpc_local_isolation=false" if opt_out else "")
    text = re.sub(r"^(rpc-b ansible_host=\S+.*)$", lambda m: m.group(1) + extra, text, flags=re.M)
    known = tmp / "known_hosts"
    ip = lab.hosts["rpc-b"]
    lines = Path(lab.known_hosts).read_text().splitlines()
    known.write_text("\n".join(lines + [l.replace(ip, f"[{ip}]:2222", 1) for l in lines if l.startswith(ip + " ")]) + "\n")
    text = re.sub(r"^tunnelspec_known_hosts=.*$", f"tunnelspec_known_hosts={known}", text, flags=re.M)
    inv = tmp / ("inventory-optout.ini" if opt_out else "inventory-capless.ini")
    inv.write_text(text)
    return str(inv)


@pytest.fixture
def capless_sshd(lab):
    unit = "tunnelspec-test-capless-sshd"
    sh(lab, "rpc-b", "systemd-run", f"--unit={unit}", "--collect", "--quiet",
       "-p", "CapabilityBoundingSet=~CAP_NET_ADMIN", "/usr/sbin/sshd", "-D", "-p", "2222")
    assert poll(lambda: re.search(r":2222\s", sh(lab, "rpc-b", "ss", "-Hltn") + " "), 30)
    yield
    sh(lab, "rpc-b", "systemctl", "stop", unit)


def test_host_without_net_admin_fails_closed_unless_opted_out(lab, inventory, deployed, capless_sshd, tmp_path):
    unit_before = sh(lab, "rpc-b", "systemctl", "show", "-p", "ActiveEnterTimestamp", "--value", "tunnelspec-rpc.service")
    r = tunnelspec("deploy", _capless_inventory(lab, tmp_path, opt_out=False), "--format", "json", timeout=DEPLOY_TIMEOUT)
    assert r.rc != 0
    # The host's facts and plan (the read-only hosts play) come first; then the isolation check fails
    # and nothing further runs there.
    b = [e for e in r.results() if e["host"] == "rpc-b" and e["play"] != "hosts"]
    assert len(b) == 1 and b[0]["status"] == "failed", b
    assert "rpc-b" in b[0]["msg"] and "CAP_NET_ADMIN" in b[0]["msg"] and "rpc_local_isolation=false" in b[0]["msg"]
    assert sh(lab, "rpc-b", "systemctl", "show", "-p", "ActiveEnterTimestamp", "--value",
              "tunnelspec-rpc.service") == unit_before

    ok = tunnelspec("deploy", _capless_inventory(lab, tmp_path, opt_out=True), "--format", "json", timeout=DEPLOY_TIMEOUT)
    assert ok.rc == 0, failed_report(ok)
    warnings = [e["msg"] for e in ok.events if e.get("event") == "message" and "rpc-b" in e.get("msg", "")]
    assert warnings and all("rpc_local_isolation=false" in w for w in warnings), warnings
    st = json.loads(tunnelspec("status", _capless_inventory(lab, tmp_path, opt_out=True), "--format", "json",
                               timeout=300).stdout)
    assert st["hosts"]["rpc-b"]["isolation"]["state"] == "off" and st["hosts"]["rpc-a"]["isolation"]["state"] == "ok"

    # The normal inventory (and sshd) again: the next deploy puts rpc-b's rules back.
    back = tunnelspec("deploy", inventory, "--format", "json", timeout=DEPLOY_TIMEOUT)
    assert back.rc == 0, failed_report(back)
    assert refused_everywhere(lab) == {}


def _isolation_leftovers(lab) -> dict:
    found = {}
    for host in ("main", *NODES):
        items = []
        tables = sh(lab, host, "nft", "list", "tables")
        if "inet tunnelspec" in tables:
            items.append("table inet tunnelspec")
        for path in TABLE_FILES:
            if sh(lab, host, "sh", "-c", f"[ -e {path} ] && echo yes || :").strip():
                items.append(path)
        items += sh(lab, host, "sh", "-c", "find /etc/systemd/system -name 'tunnelspec-isolation*' -o "
                    "-name 'tunnelspec-*.requires' | sort").split()
        if sh(lab, host, "systemctl", "list-units", "--all", "--plain", "--no-legend", "tunnelspec-isolation*").strip():
            items.append("unit loaded")
        if items:
            found[host] = items
    return found


def test_teardown_removes_rules_unit_and_file(lab, inventory, deployed):
    r = tunnelspec("teardown", inventory, "--format", "json", timeout=600)
    assert r.rc == 0, failed_report(r)
    assert _isolation_leftovers(lab) == {}
    again = tunnelspec("teardown", inventory, "--format", "json", timeout=600)
    assert again.rc == 0 and all(c["changed"] == 0 for c in again.recap.values()), again.results("changed")
