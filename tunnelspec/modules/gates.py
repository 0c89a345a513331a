"""Gates: checks across hosts after a play (e.g. every host has the same source tree)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from tunnelspec.core.errors import TaskFailed

# kind -> function(gate_args, {host: hostvars}) raising TaskFailed
GATES: dict[str, Callable] = {}


def register_gate(kind: str):
    def deco(fn):
        GATES[kind] = fn
        return fn

    return deco


@register_gate("same")
def same_value(args: dict, hostvars: dict[str, dict]) -> str:
    """Every host registered the same value under `var` (dotted path)."""
    var = args["var"]
    values = {}
    for host, hv in hostvars.items():
        cur: Any = hv
        for part in var.split("."):
            cur = cur.get(part) if isinstance(cur, dict) else None
        values[host] = cur
    if len(set(map(str, values.values()))) > 1 or None in values.values():
        rows = "\n".join(f"  {h:<20} {v}" for h, v in sorted(values.items()))
        raise TaskFailed(f"{args.get('message', var + ' differs between hosts')}:\n{rows}")
    return f"{var} equal on {len(values)} host(s)"


@register_gate("all_hosts")
def all_hosts(args: dict, hostvars: dict[str, dict]) -> str:
    """Every host of the play got through it (the executor fails them all otherwise): one host
    refused stops every host, before any of them changes."""
    return f"{len(hostvars)} host(s) passed"
