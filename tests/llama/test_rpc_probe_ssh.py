"""The probe over streams opened through a real OpenSSH server (direct-tcpip), as the deploy's
tunnel checks use it: same code path as TCP, asyncssh's SSHReader/SSHWriter instead of asyncio's."""

from __future__ import annotations

import asyncio
import socket
import struct

import asyncssh
import pytest

from tunnelspec.core.constants import LOOPBACK
from tunnelspec.llama import rpc
from support.localserver import free_port

pytestmark = pytest.mark.llama


async def _with_ssh(cluster, fn):
    host = cluster.hosts[0]
    async with asyncssh.connect(LOOPBACK, port=host.port, username="root",
                                client_keys=[str(cluster.key)],
                                known_hosts=str(cluster.known_hosts)) as conn:
        return await fn(conn)


def test_probe_through_ssh_ok_refused_busy(sshd_cluster, rpc_server):
    cluster = sshd_cluster(1)

    async def go(conn):
        ok = await rpc.probe(lambda: conn.open_connection(LOOPBACK, rpc_server.port), timeout=5,
                             expected=(7, 0, 0))
        dead_port = free_port()
        refused = await rpc.probe(lambda: conn.open_connection(LOOPBACK, dead_port), timeout=5)
        holder = socket.create_connection((LOOPBACK, rpc_server.port), timeout=5)
        try:
            holder.sendall(struct.pack("<BQ", rpc.CMD_HELLO, rpc.CONN_CAPS_SIZE) + bytes(24))
            assert len(holder.recv(64)) > 0
            busy = await rpc.probe(lambda: conn.open_connection(LOOPBACK, rpc_server.port), timeout=1)
        finally:
            holder.close()
        return ok, refused, busy

    ok, refused, busy = asyncio.run(_with_ssh(cluster, go))
    assert ok.status is rpc.ProbeStatus.OK and ok.version == (7, 0, 0) and ok.devices, ok
    assert refused.status is rpc.ProbeStatus.REFUSED, refused
    assert busy.status is rpc.ProbeStatus.BUSY, busy
