"""FileState: what is at a path, in one round trip."""

from __future__ import annotations

from dataclasses import dataclass

# Prints: type mode owner group sha256-or-dash link-target-or-dash
_SCRIPT = r"""
p=$1
if [ -L "$p" ]; then t=link; elif [ -d "$p" ]; then t=dir; elif [ -f "$p" ]; then t=file;
elif [ -e "$p" ]; then t=other; else echo absent; exit 0; fi
set -- $(stat -c '%a %U %G' -- "$p")
h=-; [ "$t" = file ] && h=$(sha256sum < "$p" | cut -d' ' -f1)
l=-; [ "$t" = link ] && l=$(readlink -- "$p")
printf '%s %s %s %s %s %s\n' "$t" "$1" "$2" "$3" "$h" "$l"
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
    line = out.strip()
    if line == "absent" or not line:
        return FileState("absent")
    t, mode, owner, group, h, link = line.split(" ", 5)
    return FileState(t, mode, owner, group, "" if h == "-" else h, "" if link == "-" else link)


async def file_state(conn, path: str) -> FileState:
    res = await conn.run(command(path), check=True)
    return parse(res.stdout)


def norm_mode(mode) -> str:
    """'0644', '644', 0o644 → '644'."""
    if mode is None:
        return ""
    if isinstance(mode, int):
        return format(mode, "o")
    return str(mode).lstrip("0") or "0"
