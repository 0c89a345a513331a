"""Every cluster error of an inventory in one run, from the one set of rules of the cluster model (cluster/model.py).

The cluster model stops at its first ClusterError, which names the host and the variable
(`.host`, `.var`). To find the next one, that variable is set aside and the model is read again.
Setting aside must not itself cause errors the user did not make, so:

* a variable whose presence matters (a model, the source pin, a port, rpc_role) has its wrong value
  replaced by a neutral one (NEUTRAL, a free port, a role that makes no second draft node):
  `llama_draft_model=hf://…@main` stays "a draft model is set", so no "this node is the draft node
  but llama_draft_model is not set" nor "spec_type tunes the draft, and this cluster has none"
  follows from it. A host's own variable (a port, rpc_role) gets it on that host, over a group's
  value; the others in the layer the value was written in;
* any other variable is removed from the layer it was written in (the host's line, a group's vars
  or `-e`), as if the user had deleted that line;
* an error a re-read raises only because of what was set aside is a consequence, not reported: on a
  (host, variable) whose value was taken away or replaced, or whose text names a variable that was
  removed (a setting that needs the removed one). A neutral value then stands in for that host so
  the reading can go on; a neutral that does not help is removed. One group line read by several
  hosts is one mistake: reported once.

A missing required variable (no llama_model anywhere) gets its neutral once for every host in
[all:vars]; a per-host one (a port, rpc_role: two nodes both draft by default) on that host only.
The loop ends when the model reads cleanly, when an error cannot be set aside (no variable to
blame: the groups themselves are wrong) or keeps coming back, or after MAX_ROUNDS.
"""

from __future__ import annotations

import copy
import re
from dataclasses import dataclass, field
from typing import Any

from tunnelspec.core.errors import ClusterError
from tunnelspec.cluster.model import Cluster, SourceCheck
from tunnelspec.inventory.model import Inventory

MAX_ROUNDS = 100
PORT_VARS = frozenset({"rpc_port", "tunnel_port", "llama_server_port", "llama_server_internal_port"})
SOURCE_VARS = ("llama_repo", "llama_commit", "llama_patches", "llama_build_number")
# Values that satisfy the model where a variable was set aside or never given (rpc_role's and the
# ports' are chosen per host: _SetAside.neutral). None of them reaches
# a host: a run with errors stops before any connection.
NEUTRAL: dict[str, Any] = {
    "llama_repo": "https://example.invalid/llama.cpp",
    "llama_commit": "0" * 40,
    "llama_model": "/set-aside/model.gguf",
    "llama_draft_model": "/set-aside/draft.gguf",
}
# Variables one host owns: a neutral given for a missing one goes on that host, not in [all:vars].
PER_HOST = PORT_VARS | {"rpc_role"}


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
        self.affected: set[tuple[str, str]] = set()  # (host, var) whose value was taken away or replaced
        self.removed: set[str] = set()  # variables removed from a layer: their absence may be what an error says
        self.neutralised: set[tuple[str, str]] = set()  # (host, var) given a neutral value for a consequence
        used = {v for h in inv.hosts for k, v in inv.host_vars(h).items() if k in PORT_VARS}
        self.ports = (p for p in range(40000, 65000) if p not in used)

    def consequence(self, err: ClusterError) -> bool:
        """An error that follows from what was set aside, not from the user's file."""
        if (err.host, err.var) in self.affected:
            return True
        body = str(err).split(f"variable {err.var}:", 1)[-1] if err.var else str(err)
        return any(re.search(rf"\b{re.escape(var)}\b", body) for var in self.removed if var != err.var)

    def neutral(self, host: str, var: str) -> Any:
        if var in PORT_VARS:
            return next(self.ports)
        if var == "rpc_role":
            # Not a second draft node: target when another node is the draft already, else draft.
            rpc = self.inv.group_hosts("rpc") if "rpc" in self.inv.groups else []
            others = [h for h in rpc if h != host and self.inv.host_vars(h).get("rpc_role", "draft") == "draft"]
            return "target" if others else "draft"
        main = _main_name(self.inv)
        if var in SOURCE_VARS and main and main != host and var in self.inv.host_vars(main):
            return self.inv.host_vars(main)[var]
        return NEUTRAL.get(var)

    def _mark(self, layer: tuple[str, str | None], var: str) -> None:
        for other in self.inv.hosts:
            if _layer(self.inv, other, var) == layer:
                self.affected.add((other, var))

    def apply(self, err: ClusterError) -> bool:
        """Set the error's variable aside; False when there is nothing to set aside."""
        host, var = getattr(err, "host", None), getattr(err, "var", None)
        if not host or not var or host not in self.inv.hosts:
            return False
        layer = _layer(self.inv, host, var)
        main = _main_name(self.inv)
        consequence = self.consequence(err)
        if consequence or layer is None:
            if (host, var) in self.neutralised:
                return self.remove(err)  # the neutral value did not help: take it away again
            value = self.neutral(host, var)
            if value is None:
                return self.remove(err) if layer is not None else False
            # A missing variable is missing for every host that reads the same layers: given once
            # (a port or a role, though, is one host's: each gets its own).
            own = consequence or var in PER_HOST
            target = self.inv.hosts[host].vars if own else self.inv.groups["all"].vars
            target[var] = value
            self.neutralised.add((host, var))
            self.affected.add((host, var))
            return True
        if var in SOURCE_VARS and main and host != main and var in self.inv.host_vars(main):
            # "differs from the main host": this host takes main's source, as the message says.
            _vars_of(self.inv, layer)[var] = self.inv.host_vars(main)[var]
            return True
        value = self.neutral(host, var)
        if value is None:
            return self.remove(err)
        # A wrong value where a value matters: a neutral one of the same kind stands in, so nothing
        # reads "not set". A host's own variable (a port, a role) on that host alone, over a group's
        # value (another host reading the same line says the same on its turn); the rest in its layer.
        if var in PER_HOST and layer[0] != "-e":
            self.inv.hosts[host].vars[var] = value
            self.affected.add((host, var))
        else:
            self._mark(layer, var)
            _vars_of(self.inv, layer)[var] = value
        self.neutralised.add((host, var))
        return True

    def remove(self, err: ClusterError) -> bool:
        """Take the error's variable away from the layer it comes from, as if its line were deleted."""
        host, var = err.host, err.var
        if not host or not var:
            return False
        layer = _layer(self.inv, host, var)
        if layer is None:
            return False
        self._mark(layer, var)
        self.removed.add(var)
        del _vars_of(self.inv, layer)[var]
        return True


def _where(err: ClusterError) -> tuple:
    """The line and the variable: one mistake, however many hosts read that line (a group's
    `rpc_role=draft` makes every second node a second draft node; one report is enough)."""
    if err.var and err.line is not None:
        return (err.file, err.line, err.var)
    return (str(err),)


def collect_cluster_errors(
    inv: Inventory, *, models: bool = True, source_check: SourceCheck | None = None
) -> Collected:
    """Every ClusterError the model finds in `inv`, in the order found. `models`: also the checks
    of Cluster.require_models (what deploy needs to run llama-server); `source_check`: the model's."""
    work = _SetAside(inv)
    out = Collected()
    seen: dict[str, int] = {}
    said: set[tuple] = set()  # one mistake per line: another host reading the same line says it again
    for _ in range(MAX_ROUNDS):
        try:
            cluster = Cluster.from_inventory(work.inv, source_check=source_check)
            if models:
                cluster.require_models()
            out.cluster = cluster
            return out
        except ClusterError as err:
            # The same text again: once as the user's error, once as the consequence of a neutral
            # value that repeats it (then removed): progress; more often than that is not.
            text = str(err)
            seen[text] = seen.get(text, 0) + 1
            if seen[text] > 3:
                break
            if seen[text] == 1 and not work.consequence(err) and _where(err) not in said:
                said.add(_where(err))
                out.errors.append(err)
                if err.var:
                    out.set_aside.append((err.host, err.var))
            if not work.apply(err):
                break
    out.complete = False
    return out
