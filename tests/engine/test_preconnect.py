"""A run opens its first hosts' TCP connections before importing the SSH machinery, and the SSH
connections ride on them — only when nothing in ssh_config could send them elsewhere, and only
sockets whose connect has already succeeded (connection/preconnect.py)."""

from __future__ import annotations

import io
import json
import socket
from pathlib import Path

from support.cli import generic8_inventory

from tunnelspec.connection.preconnect import Preconnect, ssh_config_may_reroute
from tunnelspec.connection.ssh import SSHConnection

DATA = Path(__file__).parent / "data"


def test_ssh_config_that_may_reroute(tmp_path):
    cfg = tmp_path / "config"
    assert not ssh_config_may_reroute(str(tmp_path / "missing"))
    for text, reroutes in [
        ("# HostName in a comment\nServerAliveInterval 5\nHost *\n  IdentitiesOnly yes\n", False),
        ("Host gpu\n  HostName 192.0.2.7\n", True),
        ("host gpu\n\tproxyjump bastion\n", True),
        ("Host *\n  Port 2222\n", True),
        ("Include ~/.ssh/conf.d/*\n", True),
        ("Match host gpu exec true\n", True),
        ("Host x\n  ProxyCommand nc %h %p\n", True),
    ]:
        cfg.write_text(text)
        assert ssh_config_may_reroute(str(cfg)) is reroutes, text


def test_only_finished_successful_connects_are_used():
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(0)                     # accept queue of one: a second SYN is dropped, its connect stays pending
    open_port = listener.getsockname()[1]
    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))          # bound, not listening: connects are refused
    closed_port = closed.getsockname()[1]
    pre = Preconnect()
    try:
        assert pre.start([("127.0.0.1", open_port), ("127.0.0.1", closed_port), ("localhost", open_port)]) == 2
        first = pre.take("127.0.0.1", open_port)
        assert first is not None and first.getpeername()[1] == open_port
        assert pre.take("127.0.0.1", open_port) is None          # each socket is used once
        assert pre.take("127.0.0.1", closed_port) is None        # refused
        assert pre.take("localhost", open_port) is None          # names are never pre-connected (no DNS here)
        pre.start([("127.0.0.1", open_port)])                    # queue is full now: this one stays pending
        assert pre.take("127.0.0.1", open_port) is None
        assert len(pre) == 0
        first.close()
    finally:
        pre.close()
        listener.close()
        closed.close()


def _run(c, tmp_path, monkeypatch):
    from tunnelspec.engine.context import RunOptions
    from tunnelspec.commands.runner import run_playbook_file

    inv = generic8_inventory(c, tmp_path, monkeypatch)
    out = io.StringIO()
    rc = run_playbook_file(str(inv), DATA / "generic8.yml", RunOptions(), "json", stream=out)
    assert rc == 0, out.getvalue()
    recap = json.loads(out.getvalue().splitlines()[-1])["hosts"]
    assert sorted(recap) == [h.name for h in c.hosts] and all(r["failed"] == 0 for r in recap.values())


def _my_tcp_connections_to(port: int) -> list[int]:
    """Local ports of this process's TCP sockets connected (or connecting) to 127.0.0.1:port,
    read from the kernel (/proc), whatever code opened them."""
    import os

    inodes = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    found = []
    with open("/proc/net/tcp") as f:
        for row in f.read().splitlines()[1:]:
            cols = row.split()
            local, remote, state, inode = cols[1], cols[2], cols[3], cols[9]
            # 01 ESTABLISHED, 02 SYN_SENT
            if inode in inodes and state in ("01", "02") and int(remote.split(":")[1], 16) == port:
                found.append(int(local.split(":")[1], 16))
    return found


def _watch_connections_before_ssh(monkeypatch) -> dict[int, list[int]]:
    """For each SSH connection: this process's TCP connections to its port when SSHConnection.open
    is entered, before asyncssh connects."""
    seen: dict[int, list[int]] = {}
    real_open = SSHConnection.open.__func__

    async def watching_open(cls, name, address, port, *a, **kw):
        seen[port] = _my_tcp_connections_to(port)
        return await real_open(cls, name, address, port, *a, **kw)

    monkeypatch.setattr(SSHConnection, "open", classmethod(watching_open))
    return seen


def test_run_rides_on_the_preconnected_sockets(tmp_path, sshd_cluster, monkeypatch):
    c = sshd_cluster(3)
    monkeypatch.setenv("HOME", str(tmp_path))          # no ~/.ssh/config
    taken, used = [], []
    real_take, real_open = Preconnect.take, SSHConnection.open.__func__

    def spy_take(self, address, port):                 # records; the real take decides
        s = real_take(self, address, port)
        taken.append((port, s.getsockname() if s is not None else None))
        return s

    async def spy_open(cls, *a, **kw):
        conn = await real_open(cls, *a, **kw)
        used.append((conn._conn.get_extra_info("peername")[1], conn._conn.get_extra_info("sockname")))
        return conn

    monkeypatch.setattr(Preconnect, "take", spy_take)
    monkeypatch.setattr(SSHConnection, "open", classmethod(spy_open))
    _run(c, tmp_path, monkeypatch)
    assert sorted(p for p, _ in taken) == sorted(h.port for h in c.hosts)
    assert all(s is not None for _, s in taken), taken
    assert sorted(taken) == sorted(used)               # every SSH connection is the pre-connected socket


def test_no_preconnect_when_ssh_config_may_reroute(tmp_path, sshd_cluster, monkeypatch):
    c = sshd_cluster(2)
    (tmp_path / ".ssh").mkdir()
    (tmp_path / ".ssh" / "config").write_text("Host elsewhere\n  HostName 192.0.2.1\n")
    monkeypatch.setenv("HOME", str(tmp_path))
    seen = _watch_connections_before_ssh(monkeypatch)
    _run(c, tmp_path, monkeypatch)
    # Observed in the kernel, not on Preconnect: when each SSH connection starts, nothing of this
    # process is connected to its host yet, by whatever path it might have been opened.
    assert sorted(seen) == sorted(h.port for h in c.hosts)
    assert all(conns == [] for conns in seen.values()), seen


def test_the_connection_watch_sees_preconnected_sockets(tmp_path, sshd_cluster, monkeypatch):
    """Positive control for the check above: without an ssh_config, the same watch sees the
    preconnected socket of every host before its SSH connection starts."""
    c = sshd_cluster(2)
    monkeypatch.setenv("HOME", str(tmp_path))
    seen = _watch_connections_before_ssh(monkeypatch)
    _run(c, tmp_path, monkeypatch)
    assert sorted(seen) == sorted(h.port for h in c.hosts)
    assert all(len(conns) == 1 for conns in seen.values()), seen
