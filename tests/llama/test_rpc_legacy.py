"""The legacy (proto 1.x-3.x) HELLO fallback.

An old rpc-server cannot be built here (only the fixture tree, proto 7.0, is available offline), so
this test runs a minimal in-process server that speaks the documented old wire format: it closes on
a 24-byte HELLO like a 3.x server would, answers the empty HELLO with 3 bytes, and has no
DEVICE_COUNT before 3.0. This is the one emulated peer in the llama tests.
"""

from __future__ import annotations

import asyncio
import struct

from tunnelspec.core.constants import LOOPBACK
from tunnelspec.llama import rpc


async def _legacy_server(version: tuple[int, int, int]):
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter):
        try:
            while True:
                cmd, size = struct.unpack("<BQ", await reader.readexactly(9))
                payload = await reader.readexactly(size)
                if cmd == rpc.CMD_HELLO:
                    if size != 0:
                        return  # old servers reject the 4.0+ HELLO by closing
                    writer.write(struct.pack("<Q", 3) + bytes(version))
                elif cmd == rpc.CMD_DEVICE_COUNT and version >= (3, 0, 0):
                    writer.write(struct.pack("<QI", 4, 2))
                elif cmd == rpc.CMD_GET_DEVICE_MEMORY:
                    index = struct.unpack("<I", payload)[0] if payload else 0
                    writer.write(struct.pack("<QQQ", 16, 1000 + index, 2000))
                else:
                    return
                await writer.drain()
        except asyncio.IncompleteReadError:
            pass
        finally:
            writer.close()

    return await asyncio.start_server(handle, LOOPBACK, 0)


def _probe_legacy(version):
    async def go():
        server = await _legacy_server(version)
        port = server.sockets[0].getsockname()[1]
        async with server:
            return await rpc.probe_tcp(LOOPBACK, port, timeout=2)

    return asyncio.run(go())


def test_falls_back_to_empty_hello_and_indexed_memory_on_proto_3():
    res = _probe_legacy((3, 5, 0))
    assert res.ok and res.legacy_hello
    assert res.version == (3, 5, 0)
    assert [(d.free, d.total) for d in res.devices] == [(1000, 2000), (1001, 2000)]


def test_proto_2_has_one_device_and_unindexed_memory():
    res = _probe_legacy((2, 0, 0))
    assert res.ok and res.legacy_hello
    assert [(d.free, d.total) for d in res.devices] == [(1000, 2000)]
