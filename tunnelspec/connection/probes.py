"""Read-only probes, batched: the checks of a play's tasks on one host in one round trip.

A no-op run is mostly reads (file states, a git HEAD, a file's content), one SSH session each. The
executor asks every task of a play for the read-only commands its check will run (`Task.probes()`),
and the connection runs them all in one `sh` on the host. A check then gets its result from that
batch — as long as nothing was done to the host since: any other command, upload or stream on the
connection drops every cached result, so a check after an apply always reads the host again.
Only results with rc 0 are served (stderr is not kept): a failing probe runs again, for real, and
its error is reported as it would be without the batch.

Inside the batch, every probe costs the host processes (a subshell, then whatever it runs), and on a
no-op run of many hosts sharing a machine those forks are most of the host's work. Two savings:
a probe that is itself `sh -c SCRIPT` runs its script in the batch's subshell (no second `sh`), and
probes of one registered shape (`Merge`: e.g. the file-state fact of many paths) are answered by one
command for all their arguments, then split back into what each probe alone would have printed.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from collections.abc import Callable

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
    if [ "$1" = sh ] && [ "$2" = -c ] && [ $# -ge 3 ]; then
      s=$3; shift 3; [ $# -gt 0 ] && shift
      eval "$s"; exit
    fi
    exec "$@" ) </dev/null 2>/dev/null
  printf '\n%s %s\n' "$B" "$?"
  shift "$n"
done
"""


@dataclass(frozen=True)
class Merge:
    """Probes shaped `prefix + [arg]` (arg accepted by `accepts`), answered together by `command(args)`.
    `split(rc, stdout, args)` returns, per arg, exactly the stdout the probe alone prints (and that
    probe's rc is then 0), or None when the combined output cannot be trusted: then none is served and
    each probe runs on its own when its check asks."""

    prefix: tuple[str, ...]
    accepts: Callable[[str], bool]
    command: Callable[[list[str]], list[str]]
    split: Callable[[int, bytes, list[str]], list[bytes] | None]


_MERGES: list[Merge] = []


def register_merge(merge: Merge) -> None:
    _MERGES.append(merge)


def plan(argvs: list[list[str]]):
    """(what the batch runs, expand): expand(batch results) → one (rc, stdout) per argv of `argvs`."""
    groups: dict[int, list[int]] = {}
    for i, a in enumerate(argvs):
        for m_i, m in enumerate(_MERGES):
            if len(a) == len(m.prefix) + 1 and tuple(a[:-1]) == m.prefix and m.accepts(a[-1]):
                groups.setdefault(m_i, []).append(i)
                break
    groups = {m_i: idx for m_i, idx in groups.items() if len(idx) > 1}
    merged = {i for idx in groups.values() for i in idx}
    alone = [i for i in range(len(argvs)) if i not in merged]
    batch = [argvs[i] for i in alone]
    for m_i, idx in groups.items():
        batch.append(_MERGES[m_i].command([argvs[i][-1] for i in idx]))

    def expand(results: list[tuple[int, bytes]]) -> list[tuple[int, bytes]]:
        out: list[tuple[int, bytes]] = [(-1, b"")] * len(argvs)
        for i, r in zip(alone, results, strict=False):
            out[i] = r
        for (m_i, idx), (rc, stdout) in zip(groups.items(), results[len(alone) :], strict=False):
            parts = _MERGES[m_i].split(rc, stdout, [argvs[i][-1] for i in idx])
            if parts is not None and len(parts) == len(idx):
                for i, part in zip(idx, parts, strict=False):
                    out[i] = (0, part)
        return out

    return batch, expand


# A large batch is cut into parts that run side by side, each its own session on the connection, so
# it takes about as long as its slowest part on a host with cores to spare, not the sum of its
# probes. Outputs come back over the sessions, never through a file on the host (a probe may read a
# secret). At most SESSIONS at once: OpenSSH's MaxSessions is 10 by default and the run lock holds
# one for the whole run; a host that refuses the extra sessions gets one per batch from then on.
SESSIONS = 3
PER_SESSION = 8


def parts(count: int, most: int = SESSIONS) -> list[list[int]]:
    """The batch's probe indices cut into sessions: one per PER_SESSION probes, at most `most`, probes
    dealt in turn (neighbours are often alike: two slow reads of one play land in different parts)."""
    k = max(1, min(most, -(-count // PER_SESSION)))
    return [list(range(i, count, k)) for i in range(k)]


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
        rc = out[at + len(marker) : end if end >= 0 else len(out)]
        if not rc.isdigit():
            return None
        results.append((int(rc), out[pos:at]))
        pos = end + 1 if end >= 0 else len(out)
    return results


class ProbeCache:
    """Results of one batch, valid until the connection does anything else. Each result is served as
    many times as the play's checks asked for it (`wanted`), then the probe runs for real: a check
    that polls (waits for a listener, a unit) reads the host again on its second try, never a stale
    answer forever."""

    def __init__(self) -> None:
        self._results: dict[tuple, list] = {}
        self._failed: set[tuple] = set()  # probes a batch ran that failed (a check runs them itself)

    def fill(self, argvs: list[list[str]], results: list[tuple[int, bytes]], wanted: dict | None = None) -> None:
        """Adds one batch's results to what earlier batches (since the last change) left."""
        self._failed.update(tuple(a) for a, (rc, _) in zip(argvs, results, strict=False) if rc != 0)
        self._results.update(
            {
                tuple(a): [out, (wanted or {}).get(tuple(a), 1)]
                for a, (rc, out) in zip(argvs, results, strict=False)
                if rc == 0
            }
        )

    def take(self, argv) -> bytes | None:
        key = tuple(str(a) for a in argv)
        got = self._results.get(key)
        if got is None:
            return None
        got[1] -= 1
        if got[1] <= 0:
            del self._results[key]
        return got[0]

    def covers(self, key: tuple) -> bool:
        """A batch since the host last changed answered this probe, and its answer is still to be
        served (or the probe failed there: it would fail again, its check runs it for real). A result
        served as many times as asked is not covered: a later batch reads it again."""
        return key in self._results or key in self._failed

    def clear(self) -> None:
        self._results.clear()
        self._failed.clear()

    def __len__(self) -> int:
        return len(self._results)
