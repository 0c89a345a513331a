"""Secret values: a str subclass that never shows itself in logs, diffs or JSON."""

from __future__ import annotations

import shlex
from collections.abc import Iterable

MASK = "***"

# Every secret value this process has met (each Secret made, each value secret_values found): the crash
# report (cli/crash.py) masks them in an exception's text, which no run's own masking reaches.
_SEEN: set[str] = set()


def seen() -> list[str]:
    """The secret values met so far, longest first (a secret that contains another is masked whole)."""
    return sorted(_SEEN, key=len, reverse=True)


class Secret(str):
    """A string whose repr/str-for-display is masked. Use `.reveal()` to get the value."""

    def __new__(cls, value: object = "") -> Secret:
        obj = super().__new__(cls, value)
        if str.__len__(obj):
            _SEEN.add(str.__str__(obj))
        return obj

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


# How a user marks a variable as secret: by its name (inventory, play vars or -e). Its value is then
# masked in every message, diff and JSON event. `no_log: true` on a task hides its whole result.
# `_pass`: Ansible's `ansible_become_pass` and `ansible_sudo_pass` (connection/become.py).
SECRET_NAME_SUFFIXES = ("_secret", "_password", "_pass", "_passphrase", "_token", "api_key", "_private_key")


def is_secret_name(name: object) -> bool:
    return isinstance(name, str) and name.lower().endswith(SECRET_NAME_SUFFIXES)


def secret_values(variables: dict) -> list[str]:
    """Values to mask: Secret instances and values of secret-named variables, at any depth (a YAML
    inventory nests: `service: {api_key: …}` or a list of such mappings)."""
    out = []
    for k, v in variables.items():
        if isinstance(v, Secret):
            out.append(v.reveal())
        elif is_secret_name(k) and isinstance(v, (str, int, float)) and not isinstance(v, bool) and str(v):
            out.append(str(v))
        elif isinstance(v, dict):
            out += secret_values(v)
        elif isinstance(v, list):
            for item in v:
                if isinstance(item, dict):
                    out += secret_values(item)
                elif isinstance(item, Secret):
                    out.append(item.reveal())
    _SEEN.update(out)
    return out


def masked(value):
    """A copy of a structure of variables with every secret-named key's value, at any depth, and
    every Secret shown as MASK."""
    if isinstance(value, Secret):
        return MASK
    if isinstance(value, dict):
        return {
            k: (MASK if is_secret_name(k) and not isinstance(v, (dict, list)) else masked(v)) for k, v in value.items()
        }
    if isinstance(value, list):
        return [masked(v) for v in value]
    return value


def mask_value(value, secrets: Iterable[str]):
    """mask_text through nested dicts and lists (JSON events)."""
    if isinstance(value, str):
        return mask_text(value, secrets)
    if isinstance(value, dict):
        return {k: mask_value(v, secrets) for k, v in value.items()}
    if isinstance(value, list):
        return [mask_value(v, secrets) for v in value]
    return value
