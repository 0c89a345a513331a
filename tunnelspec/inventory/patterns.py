"""Ansible host patterns: `all`, `*`, `group`, `host`, `a:b`, `a,b`, `!x`, `&y`, globs, `~regex`,
and subscripts (`web[0]`, `web[1:3]`). Same evaluation order as Ansible: plain patterns (union, in
order), then every `&` (intersection), then every `!` (exclusion). Unknown names match nothing;
reporting that is the caller's job.
"""

from __future__ import annotations

import fnmatch
import re
from typing import TYPE_CHECKING

from tunnelspec.core.errors import UsageError
from tunnelspec.inventory.hostnames import parse_address

if TYPE_CHECKING:
    from tunnelspec.inventory.model import Inventory

_SUBSCRIPT = re.compile(r"^(.+)\[(?:(-?[0-9]+)|([0-9]+)([:-])([0-9]*))\]$")
_COLON_SEPARATED = re.compile(r"(?:[^\s:\[\]]|\[[^\]]*\])+")


def split_pattern(pattern: str) -> list[str]:
    """`a,b` or `a:b` -> ["a", "b"]; a colon inside an IPv6 address or a range is not a separator."""
    if "," in pattern:
        parts = pattern.split(",")
    else:
        is_address = parse_address(pattern) is not None
        parts = [pattern] if is_address else _COLON_SEPARATED.findall(pattern)
    return [p.strip() for p in parts if p.strip()]


def _ordered(patterns: list[str]) -> list[str]:
    regular = [p for p in patterns if p[0] not in "!&"]
    intersect = [p for p in patterns if p[0] == "&"]
    exclude = [p for p in patterns if p[0] == "!"]
    return (regular or ["all"]) + intersect + exclude


def _compile(expr: str) -> re.Pattern:
    try:
        return re.compile(expr[1:]) if expr.startswith("~") else re.compile(fnmatch.translate(expr))
    except re.error as err:
        raise UsageError(f"invalid host pattern '{expr}': {err}") from None


def _enumerate(inv: Inventory, expr: str) -> list[str]:
    regex = _compile(expr)
    groups = [g for g in inv.groups if regex.match(g)]
    result: list[str] = []
    for group in groups:
        result.extend(inv.group_hosts(group))
    if not groups or expr[0] == "~" or any(c in expr for c in ".?*["):
        result.extend(h for h in inv.hosts if regex.match(h))
    return result


def _one(inv: Inventory, pattern: str) -> list[str]:
    expr = pattern[1:] if pattern[0] in "&!" else pattern
    subscript = None
    m = None if expr.startswith("~") else _SUBSCRIPT.match(expr)
    if m:
        expr, index, start, _sep, end = m.groups()
        subscript = (int(index), None) if index else (int(start), int(end) if end else -1)
    hosts = _enumerate(inv, expr)
    if subscript and hosts:
        start_i, end_i = subscript
        if end_i is None:
            try:
                return [hosts[start_i]]
            except IndexError:
                raise UsageError(f"no host matched the subscripted pattern '{pattern}'") from None
        if end_i == -1:
            end_i = len(hosts) - 1
        return hosts[start_i : end_i + 1]
    return hosts


def match_hosts(inv: Inventory, pattern: str) -> list[str]:
    hosts: list[str] = []
    for part in _ordered(split_pattern(pattern)):
        if part in inv.hosts:
            hosts.append(part)
            continue
        found = _one(inv, part)
        if part[0] == "!":
            excluded = set(found)
            hosts = [h for h in hosts if h not in excluded]
        elif part[0] == "&":
            kept = set(found)
            hosts = [h for h in hosts if h in kept]
        else:
            existing = set(hosts)
            hosts.extend(h for h in found if h not in existing)
    return list(dict.fromkeys(hosts))
