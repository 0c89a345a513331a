"""The docs' fenced blocks that tests run as written, found by an explicit marker on the line before
the fence (an HTML comment, invisible on GitHub):

    <!-- doctest: quickstart step 3 -->
    ```sh
    tunnelspec hostkeys scan inventory.ini
    ```

A block inside a list item is indented; the fence's indentation is removed from each of its lines.
A marker without a block right after it, or a name marked twice, is an error: a test must never
silently run nothing."""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from pathlib import Path

_MARKED = re.compile(r"^(?P<indent>[ \t]*)<!-- doctest: (?P<name>[^>]+?) -->\n"
                     r"(?P=indent)```(?P<lang>[\w-]*)\n(?P<body>.*?)^(?P=indent)```[ \t]*$", re.M | re.S)
_MARKER = re.compile(r"<!-- doctest: ([^>]+?) -->")


@dataclass(frozen=True)
class Block:
    name: str
    lang: str
    text: str      # the block's lines, the fence's indentation removed
    line: int      # 1-based line of the marker in the page, for messages


def blocks(path: Path) -> dict[str, Block]:
    page = path.read_text()
    out: dict[str, Block] = {}
    for m in _MARKED.finditer(page):
        name, indent = m.group("name").strip(), m.group("indent")
        assert name not in out, f"{path}: doctest block {name!r} marked twice"
        lines = [l[len(indent):] if l.startswith(indent) else l for l in m.group("body").splitlines()]
        out[name] = Block(name, m.group("lang"), "\n".join(lines) + "\n", page[:m.start()].count("\n") + 1)
    markers = [n.strip() for n in _MARKER.findall(page)]
    lost = sorted(set(markers) - set(out))
    assert not lost, f"{path}: doctest marker(s) not followed by a fenced block: {lost}"
    return out


def commands(block: Block) -> list[tuple[list[str], str]]:
    """A shell block's commands: (argv, the comment on that line and its continuation lines), one per
    command line. Comments are what the doc promises about the command (`# exit 3`, `changed=0`)."""
    out: list[tuple[list[str], str]] = []
    for line in block.text.splitlines():
        argv = shlex.split(line, comments=True)
        comment = line.split("#", 1)[1].strip() if "#" in line else ""
        if argv:
            out.append((argv, comment))
        elif comment and out:  # a comment line continues the previous command's
            out[-1] = (out[-1][0], f"{out[-1][1]} {comment}")
    return out
