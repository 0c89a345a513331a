"""The RPC probe against a real ggml-rpc-server built from the fixture tree."""

from __future__ import annotations

import asyncio
import socket
import struct
from pathlib import Path

import pytest

from tunnelspec.core.constants import LOOPBACK
from tunnelspec.llama import rpc, versions
from support.localserver import free_port

pytestmark = pytest.mark.llama


def _tree_version(llama_bin) -> tuple[int, int, int]:
    header = Path(llama_bin.source_dir, versions.RPC_HEADER).read_text()
    return versions.rpc_proto_version(header)


def test_ok_reports_tree_version_and_device_memory(rpc_server, llama_bin):
    expected = _tree_version(llama_bin)
    res = rpc.probe_tcp_sync(LOOPBACK, rpc_server.port, timeout=5, expected=expected)
    assert res.status is rpc.ProbeStatus.OK, res
    assert res.version == expected == (7, 0, 0)
    assert not res.legacy_hello
    assert len(res.devices) == 1  # CPU only on this machine
    dev = res.devices[0]
    assert 0 < dev.free <= dev.total


def test_refused_when_nothing_listens():
    res = rpc.probe_tcp_sync(LOOPBACK, free_port(), timeout=2)
    assert res.status is rpc.ProbeStatus.REFUSED


def test_busy_while_another_client_holds_the_server(rpc_server):
    holder = socket.create_connection((LOOPBACK, rpc_server.port), timeout=5)
    try:
        # A full HELLO proves the server accepted *this* client before the probe starts.
        holder.sendall(struct.pack("<BQ", rpc.CMD_HELLO, rpc.CONN_CAPS_SIZE) + bytes(24))
        reply = b""
        while len(reply) < 8 + rpc.HELLO_REPLY_SIZE:
            chunk = holder.recv(64)
            assert chunk, "server closed the holding connection"
            reply += chunk
        opened = []

        def opener():  # probe_tcp's own opener, counted
            opened.append(1)
            return asyncio.open_connection(LOOPBACK, rpc_server.port)

        async def go():
            # 30 s only catches a hang (the probe's own timeout is 1 s); how long is not asserted.
            return await asyncio.wait_for(rpc.probe(opener, timeout=1.0), 30)

        res = asyncio.run(go())
        assert res.status is rpc.ProbeStatus.BUSY, res
        assert "no reply within 1s" in res.detail, res  # its reply timed out: it did not wait for the holder
        assert len(opened) == 1  # no legacy retry after busy: one connection, one timeout
    finally:
        holder.close()
    # Once the holder leaves, the server serves the next client again.
    assert rpc.probe_tcp_sync(LOOPBACK, rpc_server.port, timeout=5).ok


def test_mismatch_on_any_version_difference_including_patch(rpc_server):
    res = rpc.probe_tcp_sync(LOOPBACK, rpc_server.port, timeout=5, expected=(7, 0, 1))
    assert res.status is rpc.ProbeStatus.MISMATCH
    assert res.version == (7, 0, 0)
    assert "7.0.0" in res.detail and "7.0.1" in res.detail


def test_legacy_hello_on_a_new_server_is_closed(rpc_server):
    """A 7.0 server drops a connection whose HELLO has the pre-4.0 (empty) form."""

    async def go():
        reader, writer = await asyncio.open_connection(LOOPBACK, rpc_server.port)
        return await rpc.probe_stream(reader, writer, timeout=5, legacy=True)

    res = asyncio.run(go())
    assert res.status is rpc.ProbeStatus.CLOSED
    assert "HELLO request size mismatch" in rpc_server.log()
    assert rpc.probe_tcp_sync(LOOPBACK, rpc_server.port, timeout=5).ok  # server survived


def test_server_survives_a_client_that_vanishes_mid_reply(rpc_server):
    """SIGPIPE must be ignored: close right after sending HELLO, before reading the reply."""
    for _ in range(5):
        s = socket.create_connection((LOOPBACK, rpc_server.port), timeout=5)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # RST on close
        s.sendall(struct.pack("<BQ", rpc.CMD_HELLO, rpc.CONN_CAPS_SIZE) + bytes(24))
        s.close()
    assert rpc.probe_tcp_sync(LOOPBACK, rpc_server.port, timeout=5).ok
    sig_ign = int(Path(f"/proc/{rpc_server.pid}/status").read_text().split("SigIgn:")[1].split()[0], 16)
    assert sig_ign & (1 << 12), "SIGPIPE (13) is not ignored by the rpc-server"
