"""`Connection.open_connection` on a become connection opens its TCP connection as root, through a
relay run under sudo (connection/relay.py), against real parts: OpenSSH sshd on 127.0.0.1, a real
non-root user with a real sudoers entry, and a loopback server owned by root that reads the
connecting socket's owner uid from the kernel (/proc/net/tcp) and resets any uid but 0, as the
hosts' nftables rules do (support/guarded.py).

What is proved: the probe through a become connection reaches the server as uid 0, while a plain
connection of the same login is seen as that login and reset; the llama RPC probe and the HTTP
client work over the relay; a refused port is REFUSED at once, a connect that hangs is a timeout;
the relay ends when either side closes (and when the SSH connection dies), leaving no process;
bytes pass unchanged both ways."""

from __future__ import annotations

import asyncio
import os
import socket
import sys
import time
from pathlib import Path

import pytest

from support.guarded import GuardedServer
from tunnelspec.connection import relay
from tunnelspec.connection.base import ConnectOptions, quote
from tunnelspec.connection.factory import connect
from tunnelspec.core.constants import LOOPBACK
from tunnelspec.core import http
from tunnelspec.llama import rpc

pytestmark = pytest.mark.skipif(sys.platform != "linux" or os.geteuid() != 0,
                                reason="needs root on Linux (real users, sudo)")


def host_vars(cluster, user: str, become: bool, **extra) -> dict:
    return {"ansible_host": LOOPBACK, "ansible_port": cluster.hosts[0].port, "ansible_user": user,
            "ansible_become": become, "ansible_ssh_private_key_file": str(cluster.key),
            "tunnelspec_known_hosts": str(cluster.known_hosts), **extra}


async def open_conn(cluster, user: str, become: bool, **extra):
    return await connect("node0", host_vars(cluster, user, become, **extra), ConnectOptions(use_ssh_config=False))


def relay_pids(port: int) -> list[int]:
    """Processes on this machine running the relay to 127.0.0.1:port (sudo and python3)."""
    out = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            args = (d / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if any(b"tunnelspec-relay" in a for a in args) and str(port).encode() in args:
            out.append(int(d.name))
    return out


async def no_relay_left(port: int, within: float = 5.0) -> None:
    end = time.monotonic() + within
    while relay_pids(port):
        assert time.monotonic() < end, f"relay to port {port} still running: {relay_pids(port)}"
        await asyncio.sleep(0.05)


@pytest.fixture
def nopasswd(user_cluster, sudo_user):
    cluster = user_cluster()
    return cluster, sudo_user("nopasswd", cluster.client_pub)


def test_probe_as_root_with_become_as_the_login_without(nopasswd):
    cluster, user = nopasswd
    web, rpc_srv = GuardedServer("http"), GuardedServer("rpc")

    async def go():
        root = await open_conn(cluster, user.name, True)
        plain = await open_conn(cluster, user.name, False)
        try:
            got = await http.request(http.ssh_opener(root, web.port), "GET", "/who", timeout=10)
            assert got.status == 200 and got.json()["uid"] == 0
            assert web.seen == [0]
            with pytest.raises(http.HttpError):
                await http.request(http.ssh_opener(plain, web.port), "GET", "/who", timeout=10)
            assert web.seen == [0, user.uid], "the plain connection is opened by the login, not root"

            ok = await rpc.probe(lambda: root.open_connection(LOOPBACK, rpc_srv.port), timeout=5,
                                 expected=(3, 6, 0))
            assert ok.status is rpc.ProbeStatus.OK and ok.version == (3, 6, 0) and len(ok.devices) == 1, ok
            bad = await rpc.probe(lambda: plain.open_connection(LOOPBACK, rpc_srv.port), timeout=5)
            # Reset by the guard: sshd may report it while opening the channel (REFUSED) or after
            # (CLOSED), whichever the race gives; never an answer.
            assert bad.status in (rpc.ProbeStatus.CLOSED, rpc.ProbeStatus.REFUSED), bad
            assert rpc_srv.seen[0] == 0 and rpc_srv.seen[-1] == user.uid
            await no_relay_left(web.port)
            await no_relay_left(rpc_srv.port)
        finally:
            await root.close()
            await plain.close()

    try:
        asyncio.run(go())
    finally:
        web.close()
        rpc_srv.close()


def _full_backlog():
    """A listener that never accepts, its queue filled: the next connect to it hangs (SYN dropped)."""
    srv = socket.socket()
    srv.bind((LOOPBACK, 0))
    srv.listen(0)
    fillers = []
    for _ in range(8):
        c = socket.socket()
        c.settimeout(0.3)
        try:
            c.connect(srv.getsockname())
        except (socket.timeout, OSError):
            c.close()
            return srv, fillers
        fillers.append(c)
    raise AssertionError("could not fill the accept queue")


def test_refused_is_refused_at_once_and_a_hanging_connect_is_a_timeout(nopasswd):
    cluster, user = nopasswd
    dead = GuardedServer("http")
    dead_port = dead.port
    dead.close()                         # nothing listens there now
    srv, fillers = _full_backlog()
    hang_port = srv.getsockname()[1]

    async def go():
        conn = await open_conn(cluster, user.name, True)
        try:
            await conn.check_become()
            t0 = time.monotonic()
            with pytest.raises(ConnectionRefusedError):
                await conn.open_connection(LOOPBACK, dead_port)
            res = await rpc.probe(lambda: conn.open_connection(LOOPBACK, dead_port), timeout=5)
            assert res.status is rpc.ProbeStatus.REFUSED, res
            # A hang bound, not a speed figure: the relay's own connect limit is 30 s, and a refusal
            # that waited for it would take that long (a loaded 2-core machine may take seconds).
            assert time.monotonic() - t0 < 20, "a refusal must not wait for a timeout"

            # The caller's timeout (how every caller opens): the relay, still connecting, ends too.
            t0 = time.monotonic()
            with pytest.raises(asyncio.TimeoutError):
                await asyncio.wait_for(conn.open_connection(LOOPBACK, hang_port), 1.5)
            assert time.monotonic() - t0 < 20          # far below the relay's own 30 s limit
            busy = await rpc.probe(lambda: conn.open_connection(LOOPBACK, hang_port), timeout=1)
            assert busy.status is rpc.ProbeStatus.BUSY and "timed out" in busy.detail, busy
            await no_relay_left(hang_port)
            # The relay's own connect limit, when no caller gives up first: a TimeoutError.
            argv, prefix = await conn._as_root(relay.relay_argv(LOOPBACK, hang_port, 1))
            with pytest.raises(TimeoutError):
                await relay.open_ssh(conn._conn, quote(argv), prefix, "node0", LOOPBACK, hang_port)
            await no_relay_left(hang_port)
        finally:
            await conn.close()

    try:
        asyncio.run(go())
    finally:
        for c in fillers:
            c.close()
        srv.close()


def test_relay_ends_when_either_side_closes_and_passes_bytes_unchanged(nopasswd):
    cluster, user = nopasswd
    bye, echo = GuardedServer("bye"), GuardedServer("echo")

    async def go():
        conn = await open_conn(cluster, user.name, True)
        try:
            # The server closes first: the reader sees EOF and the relay is gone, before any close here.
            reader, writer = await conn.open_connection(LOOPBACK, bye.port)
            assert await reader.read(100) == b"bye"
            assert await reader.read(100) == b""
            with pytest.raises(asyncio.IncompleteReadError):
                await reader.readexactly(1)
            await no_relay_left(bye.port)
            writer.close()
            await writer.wait_closed()

            # The client closes first; in between, 1 MiB each way, unchanged.
            reader, writer = await conn.open_connection(LOOPBACK, echo.port)
            blob = os.urandom(2**20)

            async def send():
                writer.write(blob)
                await writer.drain()

            _, back = await asyncio.gather(send(), reader.readexactly(len(blob)))
            assert back == blob
            assert relay_pids(echo.port), "the relay runs while the stream is open"
            writer.close()
            await writer.wait_closed()
            await no_relay_left(echo.port)

            # The SSH connection dies with a relay open: the relay ends too.
            reader, writer = await conn.open_connection(LOOPBACK, echo.port)
            writer.write(b"x")
            await writer.drain()
            assert await reader.readexactly(1) == b"x"
            assert relay_pids(echo.port)
        finally:
            await conn.close()
        await no_relay_left(echo.port)

    try:
        asyncio.run(go())
    finally:
        bye.close()
        echo.close()


LOCAL_PROBE = r"""
import asyncio, json, sys
from tunnelspec.connection.local import LocalConnection
from tunnelspec.core import http
from tunnelspec.core.secrets import Secret

async def main():
    pw = sys.stdin.readline().rstrip("\n")
    conn = LocalConnection("local", become=True, become_password=Secret(pw) if pw else None)
    got = await http.request(http.ssh_opener(conn, int(sys.argv[1])), "GET", "/who", timeout=10)
    who = await conn.run(["id", "-u"])
    print(json.dumps({"uid": got.json()["uid"], "mode": conn._becomer.mode, "id": who.stdout.strip()}))

asyncio.run(main())
"""


@pytest.mark.parametrize("policy", ["nopasswd", "password"])
def test_local_connection_with_become_opens_as_root(sudo_user, policy, tmp_path):
    """ansible_connection=local with become, the controller not root: the same relay, run locally."""
    password = "Loc4l-become-pw" if policy == "password" else None
    user = sudo_user(policy, None, password)
    web = GuardedServer("http")
    repo = Path(__file__).resolve().parents[2]
    try:
        import subprocess

        p = subprocess.run(["setpriv", f"--reuid={user.uid}", f"--regid={user.uid}", "--init-groups",
                            sys.executable, "-c", LOCAL_PROBE, str(web.port)],
                           input=(password or "") + "\n", capture_output=True, text=True, timeout=60,
                           cwd=str(user.home), env={"PATH": os.environ["PATH"], "PYTHONPATH": str(repo),
                                                    "HOME": str(user.home)})
        assert p.returncode == 0, p.stderr
        import json

        got = json.loads(p.stdout.strip().splitlines()[-1])
        assert got == {"uid": 0, "mode": policy, "id": "0"}, got
        assert web.seen == [0]
        if password:
            assert password not in p.stdout + p.stderr
    finally:
        web.close()
