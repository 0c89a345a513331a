"""The lab's hosts are real: strict SSH with the lab's own files, real systemd, isolated loopbacks."""

from __future__ import annotations

import asyncio
import shlex
import socket
import subprocess
import uuid

import asyncssh
import pytest

from support import polling

pytestmark = pytest.mark.lab

LISTEN_PORT_LOOPBACK = 47011
LISTEN_PORT_LAB = 47012

# A one-connection-at-a-time TCP server that greets with its host name; runs as a transient unit.
LISTENER = (
    "import socket,sys\n"
    "s=socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n"
    "s.bind((sys.argv[1], int(sys.argv[2]))); s.listen(8)\n"
    "while True:\n"
    "    c,_=s.accept(); c.sendall(socket.gethostname().encode()); c.close()\n"
)
# Connects and prints what it read, or the error's class name (e.g. ConnectionRefusedError).
CONNECT = (
    "import socket,sys\n"
    "try:\n"
    "    c=socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=3)\n"
    "    print('OK', c.recv(100).decode())\n"
    "except OSError as e:\n"
    "    print(type(e).__name__)\n"
)


def ssh(lab, target: str, *argv: str, **kw) -> subprocess.CompletedProcess:
    # The remote side hands the command line to a shell: quote it as one string.
    return subprocess.run(["ssh", "-F", str(lab.ssh_config), target, "--", shlex.join(argv)],
                          capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL,
                          **kw)


poll = polling.poller(30.0, 0.2)


def test_openssh_strict_host_keys_by_name_and_ip(lab):
    for name, ip_addr in lab.hosts.items():
        by_name = ssh(lab, name, "hostname")
        assert by_name.returncode == 0, by_name.stderr
        assert by_name.stdout.strip() == name
        by_ip = ssh(lab, ip_addr, "systemctl", "is-system-running")
        assert by_ip.stdout.strip() == "running", (name, by_ip.stdout, by_ip.stderr)


def test_openssh_refuses_a_host_missing_from_known_hosts(lab, tmp_path):
    empty = tmp_path / "known_hosts"
    empty.write_text("")
    name = next(iter(lab.hosts))
    res = subprocess.run(["ssh", "-F", str(lab.ssh_config), "-o", f"UserKnownHostsFile={empty}",
                          name, "true"], capture_output=True, text=True, timeout=60,
                         stdin=subprocess.DEVNULL)
    assert res.returncode == 255
    assert "Host key verification failed" in res.stderr


def test_asyncssh_with_lab_known_hosts_sees_distinct_hosts(lab):
    async def identity(ip_addr: str) -> tuple[str, str]:
        async with asyncssh.connect(ip_addr, username="root", client_keys=[str(lab.key_file)],
                                    known_hosts=str(lab.known_hosts)) as conn:
            mid = await conn.run("cat /etc/machine-id", check=True)
            key = await conn.run("cat /etc/ssh/ssh_host_ed25519_key.pub", check=True)
            return mid.stdout.strip(), key.stdout.split()[1]

    async def main():
        return await asyncio.gather(*(identity(ip) for ip in lab.hosts.values()))

    results = asyncio.run(main())
    machine_ids = {mid for mid, _ in results}
    host_keys = {key for _, key in results}
    assert len(machine_ids) == len(lab.hosts)
    assert len(host_keys) == len(lab.hosts)
    assert all(len(mid) == 32 for mid in machine_ids)


def _run_listener(lab, host: str, unit: str, addr: str, port: int) -> None:
    lab.exec(host, ["systemctl", "stop", unit])  # from an interrupted earlier run
    res = lab.exec(host, ["systemd-run", f"--unit={unit}", "--collect", "python3", "-c",
                          LISTENER, addr, str(port)])
    assert res.returncode == 0, res.stderr


def _connect(lab, host: str, addr: str, port: int) -> str:
    return lab.exec(host, ["python3", "-c", CONNECT, addr, str(port)], timeout=30).stdout.strip()


def test_loopback_listener_is_private_lab_address_listener_is_not(lab_tools):
    lab = lab_tools
    names = list(lab.hosts)
    if len(names) < 2:
        pytest.skip("needs two lab hosts")
    server, client = names[0], names[1]
    server_ip = lab.hosts[server]
    _run_listener(lab, server, "ts-test-listen-lo", "127.0.0.1", LISTEN_PORT_LOOPBACK)
    _run_listener(lab, server, "ts-test-listen-lab", server_ip, LISTEN_PORT_LAB)
    try:
        # Positive controls first: both listeners are up and answer where they should.
        assert poll(lambda: _connect(lab, server, "127.0.0.1", LISTEN_PORT_LOOPBACK)
                    == f"OK {server}")
        assert poll(lambda: _connect(lab, client, server_ip, LISTEN_PORT_LAB) == f"OK {server}")
        # The loopback listener cannot be reached from another host: neither via the server's
        # lab address nor via the client's own loopback (separate network namespaces).
        assert _connect(lab, client, server_ip, LISTEN_PORT_LOOPBACK) == "ConnectionRefusedError"
        assert _connect(lab, client, "127.0.0.1", LISTEN_PORT_LOOPBACK) == "ConnectionRefusedError"
    finally:
        lab.exec(server, ["systemctl", "stop", "ts-test-listen-lo", "ts-test-listen-lab"])


def test_unit_installed_over_ssh_is_active(lab):
    name = list(lab.hosts)[-1]
    unit = "ts-lab-probe.service"
    text = "[Unit]\nDescription=lab probe\n[Service]\nExecStart=/bin/sleep infinity\n"
    put = subprocess.run(["ssh", "-F", str(lab.ssh_config), name, "--", shlex.join(
        ["sh", "-c", 'cat > "/etc/systemd/system/$1"', "sh", unit])],
                         input=text, capture_output=True, text=True, timeout=60)
    assert put.returncode == 0, put.stderr
    try:
        assert ssh(lab, name, "systemctl", "daemon-reload").returncode == 0
        started = ssh(lab, name, "systemctl", "start", unit)
        assert started.returncode == 0, started.stderr
        assert ssh(lab, name, "systemctl", "is-active", unit).stdout.strip() == "active"
    finally:
        ssh(lab, name, "systemctl", "stop", unit)
        ssh(lab, name, "rm", "-f", f"/etc/systemd/system/{unit}")
        ssh(lab, name, "systemctl", "daemon-reload")
    assert ssh(lab, name, "systemctl", "is-active", unit).stdout.strip() == "inactive"


def _ssh_port_open(ip_addr: str) -> bool:
    try:
        with socket.create_connection((ip_addr, 22), timeout=1) as s:
            return s.recv(8).startswith(b"SSH-")
    except OSError:
        return False


def test_link_down_cuts_a_host_off_and_up_restores_it(lab):
    name = list(lab.hosts)[-1]
    ip_addr = lab.hosts[name]
    assert _ssh_port_open(ip_addr)
    lab.link(name, up=False)
    try:
        assert poll(lambda: not _ssh_port_open(ip_addr), deadline_s=10)
        # The host itself is fine: reachable through its namespaces, not through the network.
        assert lab.exec(name, ["systemctl", "is-system-running"]).stdout.strip() == "running"
        assert {s.name: s.link_up for s in lab.status()}[name] is False
    finally:
        lab.link(name, up=True)
    assert poll(lambda: _ssh_port_open(ip_addr), deadline_s=30)


def test_status_reports_every_host_running(lab):
    rows = {s.name: s for s in lab.status()}
    assert set(rows) == set(lab.hosts)
    for name, row in rows.items():
        assert row.running and row.pid and row.link_up
        assert row.ip == lab.hosts[name]
        assert row.system_state == "running"


def test_inventory_lists_main_and_rpc_hosts_by_ip(lab):
    from tunnelspec.inventory import load_inventory

    inv = load_inventory(lab.inventory)
    names = list(lab.hosts)
    assert inv.match("main") == names[:1]
    assert sorted(inv.match("rpc")) == sorted(names[1:])
    for name, ip_addr in lab.hosts.items():
        hv = inv.host_vars(name)
        assert hv["ansible_host"] == ip_addr
        assert hv["ansible_user"] == "root"
        assert str(hv["llama_build_jobs"]) == "2"
        assert len(hv["llama_commit"]) == 40
    if len(names) > 1:
        assert inv.host_vars(names[1])["rpc_role"] == "draft"
    for name in names[2:]:
        assert inv.host_vars(name)["rpc_role"] == "target"
    assert oct(lab.key_file.stat().st_mode & 0o777) == "0o600"


def test_ccache_is_shared_between_hosts(lab_tools):
    lab = lab_tools
    names = list(lab.hosts)
    if len(names) < 2:
        pytest.skip("needs two lab hosts")
    marker = uuid.uuid4().hex  # fresh source: the first compile cannot be a hit
    script = ('mkdir -p /tmp/ts-ccache && cd /tmp/ts-ccache && '
              'printf "int f_%s(int x){return x+1;}\\n" "$1" > t.c && rm -f cc.log && '
              'CCACHE_LOGFILE=cc.log ccache gcc -c t.c -o t.o && cat cc.log')
    first = ssh(lab, names[0], "sh", "-c", script, "sh", marker)
    second = ssh(lab, names[1], "sh", "-c", script, "sh", marker)
    assert first.returncode == 0 and second.returncode == 0, (first.stderr, second.stderr)
    assert "Result: cache_miss" in first.stdout
    assert "Result: direct_cache_hit" in second.stdout
