"""Secret values: a str subclass that never shows itself in logs, diffs or JSON."""

from __future__ import annotations

import shlex
from collections.abc import Iterable

MASK = "***"


class Secret(str):
    """A string whose repr/str-for-display is masked. Use `.reveal()` to get the value."""

    def reveal(self) -> str:
        return str.__str__(self)

    def __repr__(self) -> str:  # pragma: no cover - trivial
        return "Secret('***')"


def display(value: object) -> str:
    """How a value may be shown to a human or written to JSON."""
    if isinstance(value, Secret):
        return MASK
    return str(value)


def display_argv(argv: Iterable[object]) -> str:
    """The shell-quoted command for logs, with every Secret masked."""
    return shlex.join(display(a) for a in argv)


def mask_text(text: str, secrets: Iterable[str]) -> str:
    """Replace every occurrence of each (non-empty) secret in text."""
    for s in secrets:
        raw = s.reveal() if isinstance(s, Secret) else s
        if raw:
            text = text.replace(raw, MASK)
    return text
