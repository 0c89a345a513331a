"""Fact: one read-only observation of a host — the argv that observes it and the pure parser of what
that argv prints (pyinfra's shape). Every fact module in this package exposes its facts as functions
that return one (`sockets.listening()`, `files.file_state(path)`, `host.host_facts(build_root)`, …).

The command is always an argv list. A caller that gathers several things in one shell script joins it
at that edge (`fact.shell()`: `shlex.join`), so there is no second, shell-string spelling of a fact.
`parse` never touches a host: it is the module's own parser (bound with `functools.partial` where it
needs more than the text, e.g. the users whose uids the isolation probe asked for).
"""

from __future__ import annotations

import shlex
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

T = TypeVar("T")


@dataclass(frozen=True)
class Fact(Generic[T]):
    argv: list[str]
    parse: Callable[[str], T]

    def shell(self) -> str:
        """The argv as one shell command (for a script that gathers several things in one round trip)."""
        return shlex.join(self.argv)

    async def gather(self, conn, **probe: Any) -> T:
        """Run the argv as a read-only probe (batched when a task named it in `probes()`) and parse its
        stdout; `probe` goes to `conn.probe` (check, timeout, become)."""
        res = await conn.probe(self.argv, **probe)
        return self.parse(res.stdout)
