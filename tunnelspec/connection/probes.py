"""Read-only probes, batched: the checks of a play's tasks on one host in one round trip.

A no-op run is mostly reads (file states, a git HEAD, a file's content), one SSH session each. The
executor asks every task of a play for the read-only commands its check will run (`Task.probes()`),
and the connection runs them all in one `sh` on the host. A check then gets its result from that
batch — as long as nothing was done to the host since: any other command, upload or stream on the
connection drops every cached result, so a check after an apply always reads the host again.
Only results with rc 0 are served (stderr is not kept): a failing probe runs again, for real, and
its error is reported as it would be without the batch.
"""

from __future__ import annotations

import secrets

# Positional parameters: BOUNDARY, then for every probe its argv length followed by its argv.
# Each probe runs in a subshell that rebuilds "$@" as just its own argv (POSIX sh has no arrays:
# `for a do` expands the list once, so `set --` inside the loop does not disturb it) and execs it.
# After each probe: a newline, the boundary and the exit status, so outputs need no escaping.
_BATCH = r"""
B=$1; shift
while [ $# -gt 0 ]; do
  n=$1; shift
  ( c=0
    for a do
      [ $c -eq 0 ] && set --
      c=$((c + 1))
      [ $c -le "$n" ] && set -- "$@" "$a"
    done
    exec "$@" ) </dev/null 2>/dev/null
  printf '\n%s %s\n' "$B" "$?"
  shift "$n"
done
"""


def batch_argv(argvs: list[list[str]]) -> tuple[list[str], str]:
    """The one command that runs every probe; returns (argv, boundary)."""
    boundary = "tunnelspec-probe-" + secrets.token_hex(16)
    argv = ["sh", "-c", _BATCH, "sh", boundary]
    for a in argvs:
        argv += [str(len(a)), *a]
    return argv, boundary


def parse_batch(out: bytes, boundary: str, count: int) -> list[tuple[int, bytes]] | None:
    """[(rc, stdout)] per probe, or None when the output is not what the batch prints."""
    marker = b"\n" + boundary.encode() + b" "
    results, pos = [], 0
    for _ in range(count):
        at = out.find(marker, pos)
        if at < 0:
            return None
        end = out.find(b"\n", at + len(marker))
        rc = out[at + len(marker):end if end >= 0 else len(out)]
        if not rc.isdigit():
            return None
        results.append((int(rc), out[pos:at]))
        pos = end + 1 if end >= 0 else len(out)
    return results


class ProbeCache:
    """Results of one batch, valid until the connection does anything else."""

    def __init__(self) -> None:
        self._results: dict[tuple, bytes] = {}

    def fill(self, argvs: list[list[str]], results: list[tuple[int, bytes]]) -> None:
        self._results = {tuple(a): out for a, (rc, out) in zip(argvs, results) if rc == 0}

    def take(self, argv) -> bytes | None:
        return self._results.get(tuple(str(a) for a in argv))

    def clear(self) -> None:
        self._results.clear()

    def __len__(self) -> int:
        return len(self._results)
