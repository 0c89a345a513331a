"""A probe client for llama.cpp's ggml RPC server: HELLO, DEVICE_COUNT, GET_DEVICE_MEMORY.

It speaks over asyncio streams, so the same code runs over a direct TCP connection and over a
(reader, writer) pair opened through an SSH connection (`conn.open_connection`). Every read has a
timeout: the RPC server serves one client at a time, and a second client simply waits forever —
a probe must say "busy" instead of hanging.

Wire format (little-endian, packed): request `u8 cmd | u64 size | payload`, reply `u64 size | payload`.
"""

from __future__ import annotations

import asyncio
import enum
import struct
import time
from dataclasses import dataclass, field
from collections.abc import Awaitable, Callable

from tunnelspec.core.constants import LOOPBACK
from tunnelspec.llama.versions import format_version

CMD_GET_DEVICE_MEMORY = 11
CMD_HELLO = 14
CMD_DEVICE_COUNT = 15
# Proto >= 4.0: HELLO carries 24 bytes of connection capabilities (all zero = plain TCP; we never
# ask for RDMA, which cannot work through a tunnel) and the reply appends the server's 24 bytes.
CONN_CAPS_SIZE = 24
HELLO_REPLY_SIZE = 4 + CONN_CAPS_SIZE
LEGACY_HELLO_REPLY_SIZE = 3
# Sanity bound for any reply this client expects (all are tiny); a larger size means garbage.
MAX_REPLY = 4096
MAX_DEVICES = 256

Version = tuple[int, int, int]
Opener = Callable[[], Awaitable[tuple[asyncio.StreamReader, asyncio.StreamWriter]]]


class ProbeStatus(enum.StrEnum):
    OK = "ok"
    REFUSED = "refused"  # nothing listens (or the SSH server could not connect to the port)
    BUSY = "busy"  # connected, but no reply in time: another client holds the server
    CLOSED = "closed"  # the server closed without a (valid) reply
    MISMATCH = "mismatch"  # protocol version differs from the expected one


@dataclass(frozen=True)
class DeviceMemory:
    free: int  # bytes
    total: int


@dataclass(frozen=True)
class ProbeResult:
    status: ProbeStatus
    version: Version | None = None
    devices: list[DeviceMemory] = field(default_factory=list)
    detail: str = ""
    legacy_hello: bool = False  # the server only understood the pre-4.0 empty HELLO

    @property
    def ok(self) -> bool:
        return self.status is ProbeStatus.OK

    @property
    def version_str(self) -> str:
        return format_version(self.version) if self.version else "?"

    def __str__(self) -> str:
        if self.ok:
            mem = ", ".join(f"{d.free // 2**20}/{d.total // 2**20} MiB free" for d in self.devices)
            return f"ok: RPC v{self.version_str}, {len(self.devices)} device(s) [{mem}]"
        return f"{self.status.value}: {self.detail}"


class _Closed(Exception):
    """The peer closed the stream (EOF or reset) before a full reply."""


async def _send(writer: asyncio.StreamWriter, cmd: int, payload: bytes, timeout: float) -> None:
    writer.write(struct.pack("<BQ", cmd, len(payload)) + payload)
    await asyncio.wait_for(writer.drain(), timeout)


async def _recv(reader: asyncio.StreamReader, size: int, timeout: float) -> bytes:
    """One reply of exactly `size` bytes. Raises TimeoutError (busy) or _Closed."""
    try:
        header = await asyncio.wait_for(reader.readexactly(8), timeout)
        (got,) = struct.unpack("<Q", header)
        if got != size or got > MAX_REPLY:
            raise _Closed(f"reply size {got}, expected {size}")
        return await asyncio.wait_for(reader.readexactly(size), timeout)
    except (asyncio.IncompleteReadError, ConnectionError) as exc:
        raise _Closed(str(exc) or type(exc).__name__) from exc


async def _close(writer: asyncio.StreamWriter) -> None:
    try:
        writer.close()
        await asyncio.wait_for(writer.wait_closed(), 2.0)
    except Exception:  # noqa: BLE001 - closing a dead stream may fail in many ways; nothing to do
        pass


async def _hello(reader, writer, legacy: bool, timeout: float) -> Version:
    if legacy:
        await _send(writer, CMD_HELLO, b"", timeout)
        reply = await _recv(reader, LEGACY_HELLO_REPLY_SIZE, timeout)
    else:
        await _send(writer, CMD_HELLO, bytes(CONN_CAPS_SIZE), timeout)
        reply = await _recv(reader, HELLO_REPLY_SIZE, timeout)
    return reply[0], reply[1], reply[2]


async def _devices(reader, writer, version: Version, timeout: float) -> list[DeviceMemory]:
    if version < (3, 0, 0):
        # Before 3.0 a server had one device and GET_DEVICE_MEMORY took no index.
        await _send(writer, CMD_GET_DEVICE_MEMORY, b"", timeout)
        free, total = struct.unpack("<QQ", await _recv(reader, 16, timeout))
        return [DeviceMemory(free, total)]
    await _send(writer, CMD_DEVICE_COUNT, b"", timeout)
    (count,) = struct.unpack("<I", await _recv(reader, 4, timeout))
    if count > MAX_DEVICES:
        raise _Closed(f"implausible device count {count}")
    out = []
    for index in range(count):
        await _send(writer, CMD_GET_DEVICE_MEMORY, struct.pack("<I", index), timeout)
        free, total = struct.unpack("<QQ", await _recv(reader, 16, timeout))
        out.append(DeviceMemory(free, total))
    return out


async def probe_stream(
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    timeout: float = 5.0,
    expected: Version | None = None,
    legacy: bool = False,
) -> ProbeResult:
    """Probe over one already-open stream (HELLO must be the first message on it), then close it."""
    try:
        version = await _hello(reader, writer, legacy, timeout)
        if expected is not None and tuple(version) != tuple(expected):
            # Patch matters: it bumps when ops are inserted mid-list, and llama.cpp ignores it.
            return ProbeResult(
                ProbeStatus.MISMATCH,
                version,
                detail=(f"server speaks RPC v{format_version(version)}, expected v{format_version(expected)}"),
                legacy_hello=legacy,
            )
        devices = await _devices(reader, writer, version, timeout)
        return ProbeResult(ProbeStatus.OK, version, devices, legacy_hello=legacy)
    except TimeoutError:
        return ProbeResult(
            ProbeStatus.BUSY, detail=(f"connected but no reply within {timeout:g}s (another client holds the server?)")
        )
    except _Closed as exc:
        return ProbeResult(ProbeStatus.CLOSED, detail=f"server closed the connection ({exc})")
    finally:
        await _close(writer)


def _open_error(exc: BaseException) -> ProbeResult | None:
    if isinstance(exc, ConnectionRefusedError):
        return ProbeResult(ProbeStatus.REFUSED, detail="connection refused")
    try:
        import asyncssh  # lazy: slow import (~0.1 s), error path only
    except ImportError:  # pragma: no cover - asyncssh is a dependency
        pass
    else:
        if isinstance(exc, asyncssh.ChannelOpenError):
            # The SSH server could not connect to the target port on its side.
            return ProbeResult(ProbeStatus.REFUSED, detail=f"through SSH: {exc.reason}")
    if isinstance(exc, ConnectionError):
        return ProbeResult(ProbeStatus.CLOSED, detail=f"connect failed: {exc}")
    return None


async def probe(opener: Opener, timeout: float = 5.0, expected: Version | None = None) -> ProbeResult:
    """Probe with a fresh connection from `opener`; if the server closes on the 4.0+ HELLO, try the
    legacy empty HELLO on a second fresh connection (a server drops a connection after a HELLO
    size mismatch)."""
    result = None
    for legacy in (False, True):
        try:
            reader, writer = await asyncio.wait_for(opener(), timeout)
        except TimeoutError:
            # On loopback a connect only hangs when the server's accept backlog is full.
            return ProbeResult(ProbeStatus.BUSY, detail=f"connect timed out after {timeout:g}s")
        except Exception as exc:  # noqa: BLE001 - classified below, anything else propagates
            classified = _open_error(exc)
            if classified is None:
                raise
            return classified
        result = await probe_stream(reader, writer, timeout, expected, legacy=legacy)
        if result.status is not ProbeStatus.CLOSED:
            return result
    assert result is not None
    return result


POLL_S = 0.25


async def poll(deadline_s: float, attempt):
    """Call `attempt()` until it returns a non-None value or the deadline passes (then None)."""
    end = time.monotonic() + deadline_s
    while True:
        value = await attempt()
        if value is not None or time.monotonic() >= end:
            return value
        await asyncio.sleep(POLL_S)


async def probe_until(
    opener: Opener, deadline_s: float, expected: Version | None = None, busy_timeout: float = 3.0
) -> ProbeResult:
    """Probe until the server answers (or says busy, or mismatches), polling while it is not up yet
    (it was (re)started a moment ago)."""
    last: ProbeResult | None = None

    async def attempt():
        nonlocal last
        last = await probe(opener, timeout=busy_timeout, expected=expected)
        return last if last.status in (ProbeStatus.OK, ProbeStatus.BUSY, ProbeStatus.MISMATCH) else None

    result = await poll(deadline_s, attempt) or last
    assert result is not None  # poll calls attempt at least once
    return result


async def probe_tcp(
    host: str = LOOPBACK, port: int = 50052, timeout: float = 5.0, expected: Version | None = None
) -> ProbeResult:
    return await probe(lambda: asyncio.open_connection(host, port), timeout, expected)


def probe_tcp_sync(
    host: str = LOOPBACK, port: int = 50052, timeout: float = 5.0, expected: Version | None = None
) -> ProbeResult:
    """Blocking helper for scripts and tests outside an event loop."""
    return asyncio.run(probe_tcp(host, port, timeout, expected))
