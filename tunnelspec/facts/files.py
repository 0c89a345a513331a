"""FileState: what is at a path, in one round trip."""

from __future__ import annotations

from dataclasses import dataclass

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
    type: str                 # absent | file | dir | link | other
    mode: str = ""            # octal, e.g. "644"
    owner: str = ""
    group: str = ""
    sha256: str = ""
    link_target: str = ""

    @property
    def exists(self) -> bool:
        return self.type != "absent"


def command(path: str) -> list[str]:
    return ["sh", "-c", _SCRIPT, "sh", path]


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


async def file_state(conn, path: str) -> FileState:
    res = await conn.probe(command(path), check=True)
    return parse(res.stdout)


def norm_mode(mode) -> str:
    """'0644', '644', 0o644 → '644'."""
    if mode is None:
        return ""
    if isinstance(mode, int):
        return format(mode, "o")
    return str(mode).lstrip("0") or "0"
