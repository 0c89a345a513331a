"""One reading of yes/no strings for the whole program, Ansible's (`ansible.module_utils.parsing.
convert_bool`): task arguments, inventory variables, connection variables and the templates' `bool`
filter all accept the same words, so `on` means the same wherever it is written."""

from __future__ import annotations

from typing import Any

TRUE_WORDS = frozenset({"true", "yes", "on", "1", "y", "t"})
FALSE_WORDS = frozenset({"false", "no", "off", "0", "n", "f"})


def parse_bool(value: Any) -> bool | None:
    """True/False for a bool, 0/1 or one of the words above (any case, surrounding blanks ignored);
    None when the value is none of them (the caller decides whether that is an error)."""
    if isinstance(value, bool):
        return value
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    if isinstance(value, str):
        word = value.strip().lower()
        if word in TRUE_WORDS:
            return True
        if word in FALSE_WORDS:
            return False
    return None


def truthy(value: Any) -> bool:
    """Lenient: anything that is not one of the true words is false (Ansible's `| bool`)."""
    return parse_bool(value) is True
