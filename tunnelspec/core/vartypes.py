"""How a variable's value is read by its type: a port, a whole number in a range, a boolean in
Ansible's spellings, a llama.cpp repository address, a file path. Pure functions of the value, so
the declaration table (cluster/schema.py), `tunnelspec check` and the connection layer read a value
the same way. Each raises VarValueError whose text is the reason alone ("must be …, got …"); the
caller adds where the value was written."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

from tunnelspec.core.booleans import parse_bool
from tunnelspec.core.errors import UsageError


class VarValueError(UsageError, ValueError):
    """A value its variable's type refuses (exit 2). A ValueError too, for the readers that
    already caught the int() of a bad port as one."""


def integer(value: Any, minimum: int | None = None, maximum: int | None = None) -> int:
    """A whole number: an int, or text of digits (`22`, ` 22 `); not 22.5, not true, not ""."""
    number: int | None = None
    if isinstance(value, int) and not isinstance(value, bool):
        number = value
    elif isinstance(value, str) and re.fullmatch(r"\s*[-+]?\d+\s*", value):
        number = int(value)
    if number is None:
        raise VarValueError(f"must be a whole number, got {value!r}")
    if maximum is None and minimum is not None and number < minimum:
        raise VarValueError(f"must be in {minimum}.. (at least {minimum}), got {number}")
    if minimum is not None and number < minimum or maximum is not None and number > maximum:
        low = "" if minimum is None else str(minimum)
        high = "" if maximum is None else str(maximum)
        raise VarValueError(f"must be in {low}..{high}, got {number}")
    return number


def port(value: Any) -> int:
    """A TCP port, 1..65535."""
    try:
        return integer(value, 1, 65535)
    except VarValueError:
        raise VarValueError(f"must be a port number 1..65535, got {value!r}") from None


def service_port(value: Any) -> int:
    """A port a tunnelspec service listens on: 1024..65535 (the services run unprivileged)."""
    number = integer(value)
    if not 1 <= number <= 65535:
        raise VarValueError(f"port {number} is out of range; use 1024..65535")
    if number < 1024:
        raise VarValueError(
            f"port {number} is privileged (< 1024); tunnelspec services run unprivileged, use 1024..65535"
        )
    return number


def fraction(value: Any, minimum: float = 0.0, maximum: float | None = None, what: str = "a number") -> float:
    """A finite number in minimum..maximum (`0.5`, `"3"`); never a boolean."""
    out: float | None = None
    if not isinstance(value, bool) and isinstance(value, (int, float, str)):
        try:
            out = float(value)
        except ValueError:
            out = None
    if out is None or out != out or out in (float("inf"), float("-inf")):
        raise VarValueError(f"must be {what}, got {value!r}")
    if out < minimum or maximum is not None and out > maximum:
        raise VarValueError(f"must be {what}, got {value!r}")
    return out


# The one rule for a pinned commit (llama_commit, every patch entry, a git checkout, a Hub revision).
FULL_SHA = re.compile(r"^[0-9a-f]{40}$")


def is_full_sha(text: Any) -> bool:
    """A full 40-hex (lower-case) git commit SHA."""
    return isinstance(text, str) and FULL_SHA.match(text) is not None


def full_sha(value: Any, what: str = "") -> str:
    """A pinned commit: a full 40-hex SHA (case and surrounding blanks forgiven), else VarValueError.
    A prefix names different commits, or none, as a repository grows and on hosts that fetched
    different refs (GitHub's fork network shares one object store: anyone can publish a commit with
    a given 7-hex prefix in minutes); tags and branches move. The pin must mean the same commit on
    every host and every day."""
    text = str(value).strip().lower() if isinstance(value, (str, int)) and not isinstance(value, bool) else ""
    if is_full_sha(text):
        return text
    name = f"{what} " if what else ""
    if re.fullmatch(r"[0-9a-f]{4,39}", text):
        raise VarValueError(
            f"{name}{value!r} is not a full 40-hex commit SHA; a short SHA can come to name another commit, or "
            f"several: give the full SHA, quoted; resolve it in a clone that has the commit: "
            f"git rev-parse '{text}^{{commit}}' (for a PR, git fetch origin refs/pull/<N>/head first)"
        )
    raise VarValueError(
        f"{name}{value!r} is not a full 40-hex commit SHA; tags and branches move: pin the full SHA "
        "(git rev-parse '<tag>^{commit}'), quoted"
    )


def number(value: Any, minimum: float = 0.0) -> float:
    """A number of seconds above `minimum` (`10`, `2.5`)."""
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise VarValueError(f"must be a number of seconds, got {value!r}")
    try:
        out = float(value)
    except ValueError:
        raise VarValueError(f"must be a number of seconds, got {value!r}") from None
    if not out > minimum or out != out or out == float("inf"):
        raise VarValueError(f"must be a number of seconds above {minimum:g}, got {value!r}")
    return out


def boolean(value: Any) -> bool:
    parsed = parse_bool(value)
    if parsed is None:
        raise VarValueError(f"must be true or false (or yes/no, on/off, 1/0), got {value!r}")
    return parsed


def string(value: Any) -> str:
    """Non-empty text (a number is its text: `ansible_user=1000` is the user "1000")."""
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        raise VarValueError(f"must be text, got {value!r}")
    text = str(value).strip()
    if not text:
        raise VarValueError("is empty; give a value or remove the line")
    return text


def address(value: Any) -> str:
    """A host name or address for ssh: text that cannot be read as an ssh option."""
    text = string(value)
    if text.startswith("-") or any(c.isspace() for c in text):
        raise VarValueError(f"must be a host name or address, got {text!r}")
    return text


# llama_repo is cloned on each host (`git clone -- REPO`: components/source/checkout.py) unless it
# is controller:PATH (components/source/controller_repo.py: relative to the inventory's directory).
_URL = re.compile(r"^(https?|ssh|git|git\+ssh)://[^/\s]+(/\S*)?$")
_SCP = re.compile(r"^([A-Za-z0-9._-]+@)?[A-Za-z0-9.-]+:(?!//)\S+$")


def repo(value: Any) -> str:
    text = string(value)
    if text.startswith("controller:"):
        if not text[len("controller:") :].strip():
            raise VarValueError("controller: needs the path of a llama.cpp clone on the controller")
        return text
    if _URL.match(text) or text.startswith("/") or text.startswith("file:///"):
        return text
    if _SCP.match(text) and "/" not in text.split(":", 1)[0]:
        return text
    raise VarValueError(
        f"{text!r} is not a git repository address: give an https://, ssh:// or git:// URL, user@host:path, "
        "an absolute path on the hosts, or controller:PATH for a clone on the controller"
    )


def file_path(value: Any, base_dir: str | os.PathLike | None = None) -> str:
    """A path to a file (`~` expanded, relative to `base_dir`); it need not exist yet, but must not
    be a directory."""
    text = string(value)
    path = Path(text).expanduser()
    if not path.is_absolute() and base_dir is not None:
        path = Path(base_dir) / path
    if path.is_dir():
        raise VarValueError(f"{text!r} is a directory; give the path of a file")
    return str(path)
