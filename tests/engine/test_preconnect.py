"""A run opens its first hosts' TCP connections before importing the SSH machinery, and the SSH
connections ride on them — only when nothing in ssh_config could send them elsewhere, and only
sockets whose connect has already succeeded (connection/preconnect.py)."""

from __future__ import annotations

import io
import json
import socket
from pathlib import Path

from helpers import generic8_inventory

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
    from tunnelspec.runner import run_playbook_file

    inv = generic8_inventory(c, tmp_path, monkeypatch)
    out = io.StringIO()
    rc = run_playbook_file(str(inv), DATA / "generic8.yml", RunOptions(), "json", stream=out)
    assert rc == 0, out.getvalue()
    recap = json.loads(out.getvalue().splitlines()[-1])["hosts"]
    assert sorted(recap) == [h.name for h in c.hosts] and all(r["failed"] == 0 for r in recap.values())


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
    started = []
    real_start = Preconnect.start
    monkeypatch.setattr(Preconnect, "start", lambda self, t: started.append(list(t)) or real_start(self, t))
    _run(c, tmp_path, monkeypatch)
    assert started == []
