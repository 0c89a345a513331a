"""Every cluster error of an inventory in one run, from the one set of rules in cluster.py.

The cluster model stops at its first ClusterError, which names the host and the variable
(`.host`, `.var`). To find the next one, that variable is set aside — removed from the layer it
was written in (the host's line, a group's vars or `-e`), as if the user had deleted that line —
and the model is read again. An error that follows only from a value set aside (a required
variable now missing, a default port that now collides) is not the user's: it is not reported,
and a neutral value stands in for that host so the reading can go on. The loop ends when the
model reads cleanly, when an error cannot be set aside (no variable to blame: the groups
themselves are wrong) or comes back, or after MAX_ROUNDS.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any

from tunnelspec.core.errors import ClusterError
from tunnelspec.cluster.model import Cluster, SourceCheck
from tunnelspec.inventory.model import Inventory

MAX_ROUNDS = 100
PORT_VARS = frozenset({"rpc_port", "tunnel_port", "llama_server_port", "llama_server_internal_port"})
SOURCE_VARS = ("llama_repo", "llama_commit", "llama_patches", "llama_build_number")
# Values that satisfy the model where a required variable was set aside or never given. None of
# them reaches a host: a run with errors stops before any connection.
NEUTRAL: dict[str, Any] = {
    "llama_repo": "https://example.invalid/llama.cpp",
    "llama_commit": "0" * 40,
    "llama_model": "/set-aside/model.gguf",
    "llama_draft_model": "/set-aside/draft.gguf",
    "rpc_role": "target",
}


@dataclass
class Collected:
    errors: list[ClusterError] = field(default_factory=list)
    cluster: Cluster | None = None  # the model read with the errors' variables set aside
    complete: bool = True  # False: stopped at an error that could not be set aside
    set_aside: list[tuple[str | None, str]] = field(default_factory=list)  # (host, variable)


def _layer(inv: Inventory, host: str, var: str) -> tuple[str, str | None] | None:
    """Where host's value of `var` comes from (Inventory.host_vars' layers, top first)."""
    if var in inv.extra_vars:
        return ("-e", None)
    if var in inv.hosts[host].vars:
        return ("host", host)
    for group in reversed(["all", *inv._ordered_groups(host)]):
        if var in inv.groups[group].vars:
            return ("group", group)
    return None


def _vars_of(inv: Inventory, layer: tuple[str, str | None]) -> dict:
    kind, name = layer
    if kind == "-e":
        return inv.extra_vars
    assert name is not None  # _layer() names the host or group of every layer but -e
    return inv.hosts[name].vars if kind == "host" else inv.groups[name].vars


def _main_name(inv: Inventory) -> str | None:
    mains = inv.group_hosts("main") if "main" in inv.groups else []
    return mains[0] if len(mains) == 1 else None


class _SetAside:
    def __init__(self, inv: Inventory):
        self.inv = copy.deepcopy(inv)
        self.inv.extra_vars = dict(self.inv.extra_vars)
        self.affected: set[tuple[str, str]] = set()  # (host, var) whose value was taken away
        used = {v for h in inv.hosts for k, v in inv.host_vars(h).items() if k in PORT_VARS}
        self.ports = (p for p in range(40000, 65000) if p not in used)

    def consequence(self, err: ClusterError) -> bool:
        return (err.host, err.var) in self.affected

    def neutral(self, host: str, var: str) -> Any:
        if var in PORT_VARS:
            return next(self.ports)
        main = _main_name(self.inv)
        if var in SOURCE_VARS and main and main != host and var in self.inv.host_vars(main):
            return self.inv.host_vars(main)[var]
        return NEUTRAL.get(var)

    def apply(self, err: ClusterError) -> bool:
        """Set the error's variable aside; False when there is nothing to set aside."""
        host, var = getattr(err, "host", None), getattr(err, "var", None)
        if not host or not var or host not in self.inv.hosts:
            return False
        layer = _layer(self.inv, host, var)
        main = _main_name(self.inv)
        if self.consequence(err) or layer is None:
            value = self.neutral(host, var)
            if value is None:
                return False
            # A missing variable is missing for every host that reads the same layers: given once
            # (a port, though, is one host's: each gets its own).
            own = self.consequence(err) or var in PORT_VARS
            target = self.inv.hosts[host].vars if own else self.inv.groups["all"].vars
            target[var] = value
            return True
        if var in SOURCE_VARS and main and host != main and var in self.inv.host_vars(main):
            # "differs from the main host": this host takes main's source, as the message says.
            _vars_of(self.inv, layer)[var] = self.inv.host_vars(main)[var]
            return True
        for other in self.inv.hosts:
            if _layer(self.inv, other, var) == layer:
                self.affected.add((other, var))
        del _vars_of(self.inv, layer)[var]
        return True


def collect_cluster_errors(
    inv: Inventory, *, models: bool = True, source_check: SourceCheck | None = None
) -> Collected:
    """Every ClusterError the model finds in `inv`, in the order found. `models`: also the checks
    of Cluster.require_models (what deploy needs to run llama-server); `source_check`: the model's."""
    work = _SetAside(inv)
    out = Collected()
    seen: set[str] = set()
    for _ in range(MAX_ROUNDS):
        try:
            cluster = Cluster.from_inventory(work.inv, source_check=source_check)
            if models:
                cluster.require_models()
            out.cluster = cluster
            return out
        except ClusterError as err:
            # The same text once as the user's error and once more as its consequence (a default
            # that repeats the mistake, e.g. rpc_role's default draft) is progress; a third time is not.
            key = f"{work.consequence(err)}:{err}"
            if key in seen:
                break
            seen.add(key)
            if not work.consequence(err):
                out.errors.append(err)
                if err.var:
                    out.set_aside.append((err.host, err.var))
            if not work.apply(err):
                break
    out.complete = False
    return out
