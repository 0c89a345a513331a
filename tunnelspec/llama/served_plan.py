"""What the tasks after the plan read of the `llama_server` fact, typed and read-only.

The fact itself is data, as Ansible facts are: the plan task registers it, playbook templates read
its parts (`{{ llama_server.unit }}`, `{{ llama_server.modes_json }}`) and pass it whole to the
verify task (`plan: "{{ llama_server }}"`). `ServedPlan.from_fact` is the one place where that
data becomes a value a task reads by attribute: a missing or mistyped key fails there, naming it,
rather than as a KeyError deep in a journal check. docs/internals.md, "Registered facts".
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from tunnelspec.core.errors import TaskFailed


@dataclass(frozen=True)
class ServedPlan:
    argv: tuple[str, ...]  # llama-server's full command, binary first
    kind: str  # "speculative", "split" or "local"
    draft_node: str | None = None  # None: no draft (a target split, or the draft node left out)
    draft_devices: tuple[str, ...] = ()  # the draft's RPC device names, e.g. ("RPC0",)
    draft_port: int | None = None  # the draft node's tunnel port on main
    target_devices: str = ""  # the -dev value
    endpoints: tuple[str, ...] = ()  # --rpc items, in node order
    spec_type: str | None = None  # the speculative type the inventory asked for
    tensor_split: tuple[tuple[str, float], ...] = ()  # (-dev device, weight) in -dev order
    cpu_weight: float = 0.0  # main's CPU share in the proportions
    # node in --rpc → its RPC device names, in --rpc order (read-only)
    nodes: Mapping[str, tuple[str, ...]] = field(default_factory=lambda: MappingProxyType({}))
    build: str | None = None  # the build's label (the plan task's own; None in a degraded plan)
    slot_bytes: tuple[int, ...] | None = None  # bytes per target layer slot, when read
    degraded: ServedPlan | None = None  # the plan without the draft node
    without: Mapping[str, ServedPlan] = field(default_factory=lambda: MappingProxyType({}))  # node → split without it
    draft_skippable: bool = False  # serving can go on without a node (the launcher and watcher run)

    @property
    def has_degraded_mode(self) -> bool:
        """Serving can go on without one of this plan's nodes: a draft-only node with a degraded plan,
        or a split's target node the rest can hold the model without."""
        return self.draft_skippable and (self.degraded is not None or bool(self.without))

    @property
    def implicit_spec_type(self) -> bool:
        """The command line gives no --spec-type: the build's default type speculates."""
        return "--spec-type" not in self.argv

    @classmethod
    def from_fact(cls, fact: Any, where: str = "plan") -> ServedPlan:
        """The view of a `llama_server` fact (or one of its `degraded`/`without` plans); TaskFailed
        naming the key when the fact is not one."""
        if not isinstance(fact, Mapping):
            raise TaskFailed(f"{where}: not a llama_server fact (a mapping): {type(fact).__name__}")
        r = _Reader(fact, where)
        without, slots = r.get("without", Mapping, {}), r.get("slot_bytes", list, None)
        return cls(
            argv=r.strs("argv", required=True),
            kind=r.get("kind", str, "") or "split",
            draft_node=r.get("draft_node", str, None),
            draft_devices=r.strs("draft_devices"),
            draft_port=r.get("draft_port", int, None),
            target_devices=r.get("target_devices", str, ""),
            endpoints=r.strs("endpoints"),
            spec_type=r.get("spec_type", str, None),
            tensor_split=tuple((str(d), r.number(w, "tensor_split")) for d, w in r.pairs("tensor_split")),
            cpu_weight=r.number(fact.get("cpu_weight") or 0.0, "cpu_weight"),
            nodes=MappingProxyType(
                {str(n): _strs(v, f"{where}.nodes.{n}") for n, v in r.get("nodes", Mapping, {}).items()}
            ),
            build=r.get("build", str, None),
            slot_bytes=tuple(int(x) for x in slots) if slots else None,
            degraded=(
                cls.from_fact(fact["degraded"], f"{where}.degraded") if fact.get("degraded") is not None else None
            ),
            without=MappingProxyType({str(n): cls.from_fact(p, f"{where}.without.{n}") for n, p in without.items()}),
            draft_skippable=bool(fact.get("draft_skippable")),
        )


class _Reader:
    def __init__(self, fact: Mapping, where: str):
        self.fact, self.where = fact, where

    def get(self, key: str, kind, default):
        v = self.fact.get(key)
        if v is None:
            return default
        if not isinstance(v, kind) or (kind is int and isinstance(v, bool)):
            raise TaskFailed(f"{self.where}.{key}: {v!r} is not {_name(kind)}")
        return v

    def strs(self, key: str, required: bool = False) -> tuple[str, ...]:
        if required and not self.fact.get(key):
            raise TaskFailed(f"{self.where}: no {key} (not a llama_server fact?)")
        return _strs(self.fact.get(key) or [], f"{self.where}.{key}")

    def pairs(self, key: str) -> list:
        out = self.get(key, (list, tuple), []) or []
        for p in out:
            if not isinstance(p, (list, tuple)) or len(p) != 2:
                raise TaskFailed(f"{self.where}.{key}: {p!r} is not a (device, weight) pair")
        return out

    def number(self, v, key: str) -> float:
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise TaskFailed(f"{self.where}.{key}: {v!r} is not a number")
        return float(v)


def _strs(v, where: str) -> tuple[str, ...]:
    if not isinstance(v, (list, tuple)) or not all(isinstance(x, str) for x in v):
        raise TaskFailed(f"{where}: {v!r} is not a list of strings")
    return tuple(v)


def _name(kind) -> str:
    kinds = kind if isinstance(kind, tuple) else (kind,)
    return " or ".join(
        {
            str: "a string",
            int: "an integer",
            float: "a number",
            list: "a list",
            tuple: "a list",
            Mapping: "a mapping",
        }.get(k, k.__name__)
        for k in kinds
    )
