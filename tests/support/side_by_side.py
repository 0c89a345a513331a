"""Two probes that tell whether a batch ran them side by side: the first waits (bounded) for a file
the second makes, and prints whether it saw it."""

from __future__ import annotations

from pathlib import Path

_WAIT = 'i=0; while [ ! -e "$1" ] && [ $i -lt "$2" ]; do sleep 0.05; i=$((i + 1)); done; [ -e "$1" ] && echo saw || echo never'


def waiter_and_maker(flag: Path, tries: int) -> list[list[str]]:
    """Probe 1 waits at most `tries` × 0.05 s for `flag`; probe 2 makes it. Probe 1 prints `saw` only
    when the two ran side by side (run one after another, it gives up first: `never`)."""
    return [["sh", "-c", _WAIT, "sh", str(flag), str(tries)], ["sh", "-c", ': > "$1"; echo made', "sh", str(flag)]]
