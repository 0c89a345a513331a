"""INI values, read the way Ansible reads them (so `inventory list` equals `ansible-inventory`).

Ansible feeds every INI value to `ast.literal_eval` and keeps the raw string when that fails:
`8080` is an int, `True` a bool, `"[1, 2]"` a list, `yes` stays the string "yes".
"""

from __future__ import annotations

import ast
import re
import warnings
from typing import Any

# A system user name tunnelspec creates or names in a config line (sshd Match, systemd User=):
# the portable subset useradd accepts (lower case, at most 32 characters).
USER_NAME = re.compile(r"^[a-z_][a-z0-9_-]{0,31}$")


def parse_value(text: str) -> Any:
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", SyntaxWarning)
            value = ast.literal_eval(text)
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        value = text
    return _coerce(value)


def _coerce(value: Any) -> Any:
    """Keep only JSON-like types, as Ansible does: tuples and sets become lists, bytes text,
    and the literal_eval types no variable can hold (complex, Ellipsis) their string form."""
    if isinstance(value, (list, tuple, set, frozenset)):
        return [_coerce(v) for v in value]
    if isinstance(value, dict):
        return {_coerce(k): _coerce(v) for k, v in value.items()}
    if value is ...:
        return "..."
    if isinstance(value, complex):
        return str(value)
    if isinstance(value, bytes):
        return value.decode("utf-8", errors="surrogateescape")
    return value
