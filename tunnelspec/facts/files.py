"""FileState: what is at a path, in one round trip."""

from __future__ import annotations

import re
from dataclasses import dataclass

from tunnelspec.connection.probes import Merge, register_merge
from tunnelspec.facts.fact import Fact

# Prints "type mode owner group" on the first line, then the sha256 (files) or the target (links).
# One fork at most (stat), then `exec`: on a loaded host every process counts, and this runs for
# nearly every task of a no-op run.
_SCRIPT = r"""
p=$1
if [ -L "$p" ]; then t=link; elif [ -d "$p" ]; then t=dir; elif [ -f "$p" ]; then t=file;
elif [ -e "$p" ]; then t=other; else echo absent; exit 0; fi
printf '%s ' "$t"
case $t in
file) stat -c '%a %U %G' -- "$p" && exec sha256sum < "$p" ;;
link) stat -c '%a %U %G' -- "$p" && exec readlink -- "$p" ;;
*) exec stat -c '%a %U %G' -- "$p" ;;
esac
"""


@dataclass
class FileState:
    type: str  # absent | file | dir | link | other
    mode: str = ""  # octal, e.g. "644"
    owner: str = ""
    group: str = ""
    sha256: str = ""
    link_target: str = ""

    @property
    def exists(self) -> bool:
        return self.type != "absent"


# The same fact for many absolute paths in one probe of a batch (connection/probes.py): builtins say
# which paths exist (so a `find` that fails, or is not GNU find, cannot pass for "all absent"), one
# GNU `find` prints type/mode/owner/group/path and the link target of each, and runs one `sha256sum`
# for all the regular files. Three processes however many paths, instead of two or three per path.
_MANY = r"""
for p do
  if [ -e "$p" ] || [ -L "$p" ]; then printf 1; else printf 0; fi
done
printf '\n'
exec find "$@" -maxdepth 0 -printf '%y %m %u %g %p\0%l\0' -type f -exec sha256sum -- {} +
"""
_TYPES = {b"f": "file", b"d": "dir", b"l": "link"}
_SHA_LINE = re.compile(rb"^\\?([0-9a-f]{64}) ")


def _many_command(paths: list[str]) -> list[str]:
    return ["sh", "-c", _MANY, "sh", *paths]


def _many_split(rc: int, out: bytes, paths: list[str]) -> list[bytes] | None:
    """Per path, the bytes `file_state(path)`'s argv prints; None unless every existing path has its record
    (and every regular file its checksum) in order."""
    flags, nl, rest = out.partition(b"\n")
    if not nl or len(flags) != len(paths) or flags.strip(b"01"):
        return None
    fields = rest.split(b"\0")
    existing = [p for p, f in zip(paths, flags, strict=True) if f == ord("1")]
    if len(fields) < 2 * len(existing) + 1:
        return None
    recs, sums = fields[: 2 * len(existing)], b"\0".join(fields[2 * len(existing) :]).splitlines()
    by_path: dict[str, bytes] = {}
    files = 0
    for i, p in enumerate(existing):
        head, target = recs[2 * i].split(b" ", 4), recs[2 * i + 1]
        if len(head) != 5 or head[4] != p.encode():
            return None
        t = _TYPES.get(head[0], "other")
        line = f"{t} ".encode() + b" ".join(head[1:4]) + b"\n"
        if t == "file":
            m = _SHA_LINE.match(sums[files]) if files < len(sums) else None
            if m is None:
                return None
            files += 1
            line += m.group(1) + b"  -\n"
        elif t == "link":
            line += target + b"\n"
        by_path[p] = line
    if files != len(sums):
        return None
    return [by_path.get(p, b"absent\n") for p in paths]


register_merge(
    Merge(
        prefix=tuple(["sh", "-c", _SCRIPT, "sh"]),
        accepts=lambda p: p.startswith("/"),
        command=_many_command,
        split=_many_split,
    )
)


def parse(out: str) -> FileState:
    head, _, rest = out.partition("\n")
    head = head.strip()
    if head == "absent" or not head:
        return FileState("absent")
    t, mode, owner, group = head.split(" ", 3)
    rest = rest.rstrip("\n")
    if t == "file":
        return FileState(t, mode, owner, group, sha256=rest.split(" ", 1)[0])
    if t == "link":
        return FileState(t, mode, owner, group, link_target=rest)
    return FileState(t, mode, owner, group)


def file_state(path: str) -> Fact[FileState]:
    """What is at `path` (gathered with `check=True`: a failed probe is an error, never "absent")."""
    return Fact(["sh", "-c", _SCRIPT, "sh", path], parse)


# executable_id's exit status when the path is no executable.
NOT_EXECUTABLE = 3


def _words(out: str) -> str:
    return " ".join(out.split())


def executable_id(path: str) -> Fact[str]:
    """What an executable is: its resolved path and its sha256, on one line (exit NOT_EXECUTABLE when
    `path` is not executable)."""
    return Fact(["sh", "-c", '[ -x "$1" ] || exit 3; readlink -f -- "$1"; sha256sum < "$1"', "sh", path], _words)


def norm_mode(mode) -> str:
    """'0644', '644', 0o644 → '644'."""
    if mode is None:
        return ""
    if isinstance(mode, int):
        return format(mode, "o")
    return str(mode).lstrip("0") or "0"
