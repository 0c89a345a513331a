"""ListeningSockets: TCP listeners on a host, from `ss -Hltnp` (a command plus a pure parser).

A line looks like
`LISTEN 0 1 127.0.0.1:50052 0.0.0.0:* users:(("ggml-rpc-server",pid=812,fd=3))`;
local addresses can be `0.0.0.0:22`, `[::]:22`, `*:22`, `[::ffff:127.0.0.1]:80` or carry an
interface (`127.0.0.53%lo:53`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from tunnelspec.core.constants import LOOPBACK
from tunnelspec.facts.fact import Fact

# A name may hold `"` (a process names itself): the shortest text up to `",pid=N,fd=N)` (ss cuts a
# name at its first `)`, so that end is never inside one).
_PROC = re.compile(r'\("(.*?)",pid=(\d+),fd=\d+\)')
# Addresses that accept connections from every interface.
WILDCARDS = {"0.0.0.0", "::", "*"}


@dataclass(frozen=True)
class ListeningSocket:
    address: str  # without brackets or %interface
    port: int
    processes: tuple[tuple[str, int], ...] = field(default=())  # (name, pid)

    @property
    def loopback_only(self) -> bool:
        return self.address == LOOPBACK

    @property
    def wildcard(self) -> bool:
        return self.address in WILDCARDS


def _split_endpoint(text: str) -> tuple[str, int]:
    addr, _, port = text.rpartition(":")
    addr = addr.split("%", 1)[0]
    if addr.startswith("[") and addr.endswith("]"):
        addr = addr[1:-1]
    return addr, int(port)


def parse(text: str) -> list[ListeningSocket]:
    out = []
    for line in text.splitlines():
        parts = line.split()
        if len(parts) < 5 or parts[0] != "LISTEN":
            continue
        address, port = _split_endpoint(parts[3])
        procs = tuple((name, int(pid)) for name, pid in _PROC.findall(" ".join(parts[5:])))
        out.append(ListeningSocket(address, port, procs))
    return out


def listening() -> Fact[list[ListeningSocket]]:
    """The host's TCP listeners and the processes holding them."""
    return Fact(["ss", "-Hltnp"], parse)


def on_port(sockets: list[ListeningSocket], port: int) -> list[ListeningSocket]:
    return [s for s in sockets if s.port == port]


async def listening_sockets(conn) -> list[ListeningSocket]:
    return await listening().gather(conn, check=True)


def _count_rows(text: str) -> int:
    """`ss -H` rows with a state filter: how many connections it printed."""
    return len([row for row in text.splitlines() if row.strip()])


def established(port: int) -> Fact[int]:
    """How many accepted (or queued) connections the listener on `port` has."""
    return Fact(["ss", "-Htn", "state", "established", "(", "sport", "=", f":{port}", ")"], _count_rows)


async def clients_of(conn, port: int) -> int:
    """How many clients hold the listener on `port`. llama.cpp's rpc-server serves one at a time, so a
    count above zero means a HELLO probe would only wait for its timeout."""
    fact = established(port)
    res = await conn.probe(fact.argv)
    return fact.parse(res.stdout) if res.rc == 0 else 0


# ---- connections whose peer has closed (CLOSE-WAIT) -------------------------------------------------
# With a `state` filter ss prints no State column: `Recv-Q Send-Q Local Peer Process`, e.g.
# `1 0 127.0.0.1:41234 127.0.0.1:15052 users:(("llama-server",pid=2211,fd=17))`.


@dataclass(frozen=True)
class PeerClosed:
    local_port: int
    peer: str
    peer_port: int
    pids: tuple[int, ...]


def parse_close_wait(text: str) -> list[PeerClosed]:
    out = []
    for line in text.splitlines():
        parts = line.split()
        if len(parts) < 4 or not parts[0].isdigit():
            continue
        try:
            _, lport = _split_endpoint(parts[2])
            peer, pport = _split_endpoint(parts[3])
        except ValueError:
            continue
        pids = tuple(int(pid) for _, pid in _PROC.findall(" ".join(parts[4:])))
        out.append(PeerClosed(lport, peer, pport, pids))
    return out


def close_wait() -> Fact[list[PeerClosed]]:
    """Connections whose peer has closed while the process still holds them."""
    return Fact(["ss", "-Htnp", "state", "close-wait"], parse_close_wait)
