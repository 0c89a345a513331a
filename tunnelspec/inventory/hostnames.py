"""Host entries in an INI or YAML inventory: `name`, `name:port`, `[v6::addr]:port`, and ranges
(`node[01:03]`, `node[1:10:2]`, `node[a:c]`), with the same rules as Ansible's parser."""

from __future__ import annotations

import re
import string

_NUMERIC_RANGE = r"\[(?:[0-9]+:[0-9]+)(?::[0-9]+)?\]"
_HEX_RANGE = r"\[(?:[0-9a-f]+:[0-9a-f]+)(?::[0-9]+)?\]"
_ALNUM_RANGE = r"\[(?:[a-z]:[a-z]|[0-9]+:[0-9]+)(?::[0-9]+)?\]"
_V6 = rf"(?:[0-9a-f]{{1,4}}|{_HEX_RANGE})"
_V4 = rf"(?:[01]?[0-9]{{1,2}}|2[0-4][0-9]|25[0-5]|{_NUMERIC_RANGE})"
_LABEL = rf"(?:[\w]|{_ALNUM_RANGE})(?:[\w_-]|{_ALNUM_RANGE})*(?<![_-])"

_BRACKETED_HOSTPORT = re.compile(r"^\[(.+)\]:([0-9]+)$")
_HOSTPORT = re.compile(r"^((?:[^:\[\]]|\[[^\]]*\])*):([0-9]+)$")
IPV4 = re.compile(rf"^(?:{_V4}\.){{3}}{_V4}$", re.I)
IPV6 = re.compile(
    rf"""^((?:{_V6}:){{7}}{_V6}|(?:{_V6}:){{1,6}}:|(?:{_V6}:)(?::{_V6}){{1,6}}|
    (?:{_V6}:){{2}}(?::{_V6}){{1,5}}|(?:{_V6}:){{3}}(?::{_V6}){{1,4}}|
    (?:{_V6}:){{4}}(?::{_V6}){{1,3}}|(?:{_V6}:){{5}}(?::{_V6}){{1,2}}|(?:{_V6}:){{6}}(?::{_V6})|
    :(?::{_V6}){{1,6}}|{_V6}?::|(?:0:){{6}}(?:{_V6}\.){{3}}{_V6}|
    ::(?:ffff:)?(?:{_V6}\.){{3}}{_V6}|(?:0:){{5}}ffff:(?:{_V6}\.){{3}}{_V6})$""",
    re.X | re.I,
)
_HOSTNAME = re.compile(rf"^{_LABEL}(?:\.{_LABEL})*$", re.I | re.UNICODE)


class RangeError(ValueError):
    """A `[x:y]` range that cannot be expanded; the message says why."""


def parse_address(entry: str) -> tuple[str, int | None] | None:
    """`host:22` -> ("host", 22); None when the entry is not a host name or IP (ranges allowed)."""
    address, port = entry, None
    for pattern in (_BRACKETED_HOSTPORT, _HOSTPORT):
        m = pattern.match(address)
        if m:
            address, port = m.group(1), int(m.group(2))
    if not (IPV4.match(address) or IPV6.match(address) or _HOSTNAME.match(address)):
        return None
    return address, port


def split_port(entry: str) -> tuple[str, int | None]:
    """Like parse_address, but an unrecognisable entry is kept whole with no port (as Ansible)."""
    return parse_address(entry) or (entry, None)


def expand_range(entry: str) -> list[str]:
    """Expand every `[begin:end(:step)]` in the entry (numeric with zero padding, or letters)."""
    if "[" not in entry:
        return [entry]
    head, rest = entry.split("[", 1)
    if "]" not in rest:
        raise RangeError(f"unclosed '[' in host entry '{entry}'")
    spec, tail = rest.split("]", 1)
    bounds = spec.split(":")
    if len(bounds) not in (2, 3):
        raise RangeError(f"host range '[{spec}]' must be [begin:end] or [begin:end:step]")
    begin, end = bounds[0] or "0", bounds[1]
    step_text = bounds[2] if len(bounds) == 3 else "1"
    if not end:
        raise RangeError(f"host range '[{spec}]' has no end value")
    width = len(begin) if begin[0] == "0" and len(begin) > 1 else 0
    if width and len(end) != width:
        raise RangeError(f"host range '[{spec}]': zero-padded begin and end must have the same length")
    try:
        step = int(step_text)
    except ValueError:
        raise RangeError(f"host range '[{spec}]': step '{step_text}' is not an integer") from None
    if step == 0:
        raise RangeError(f"host range '[{spec}]': step must not be 0")
    letters = string.ascii_letters
    if begin in letters and end in letters and len(begin) == 1 and len(end) == 1:
        if letters.index(begin) > letters.index(end):
            raise RangeError(f"host range '[{spec}]' must have begin <= end")
        items = list(letters[letters.index(begin) : letters.index(end) + 1 : step])
    else:
        try:
            items = [str(i).zfill(width) for i in range(int(begin), int(end) + 1, step)]
        except ValueError:
            raise RangeError(
                f"host range '[{spec}]' must be numbers (node[01:10]) or single letters (node[a:f])"
            ) from None
    result: list[str] = []
    for item in items:
        result.extend(expand_range(head + item + tail))
    return result
