"""The inventory as a tunnelspec cluster: one `main` host, one or more `rpc` nodes, one pinned
llama.cpp source. Everything is checked here, before any connection is made, and every error
names the host, the variable and (when the parser saw it) the `file:line` to fix. One host's
sections are read in host_sections.py; this module puts them together and checks across hosts.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from tunnelspec.cluster.fields import HostVars, cluster_error
from tunnelspec.cluster.host_sections import (
    BuildSettings,
    MainHost,
    Patch,
    RpcNode,
    SourcePin,
    Users,
    main_host_of,
    rpc_node_of,
    source_of,
)
from tunnelspec.core.errors import ClusterError
from tunnelspec.inventory.model import Inventory
from tunnelspec.llama import known_issues
from tunnelspec.cluster import ports, schema
from tunnelspec.cluster.placement import TargetPlacement, parse_placement

# Checks the pinned source where it lives (the inventory, the main host's name, the pin); raises ClusterError.
SourceCheck = Callable[[Inventory, str, SourcePin], None]

__all__ = ["BuildSettings", "Cluster", "MainHost", "Patch", "RpcNode", "SourcePin", "Users"]


@dataclass(frozen=True)
class Cluster:
    inventory: Inventory
    main: MainHost
    rpc: tuple[RpcNode, ...]
    source: SourcePin
    placement: TargetPlacement = TargetPlacement(None, None, None)

    @property
    def hosts(self) -> list[str]:
        return [self.main.name, *(n.name for n in self.rpc)]

    @property
    def skippable_draft(self):
        """The draft-only node serving can go on without (docs/degraded.md), or None: the draft node
        when it holds no target layers."""
        d = self.draft_node
        if d is None or d in self.target_nodes:
            return None
        if self.placement.weights is not None and (self.placement.weight_of(d.name) or 0) > 0:
            return None
        return d

    @property
    def optional_hosts(self) -> frozenset[str]:
        """Hosts a run may go on without while they are unreachable: the draft-only node, since serving
        continues with the target alone while it is away (docs/degraded.md)."""
        d = self.skippable_draft
        return frozenset() if d is None else frozenset({d.name})

    @property
    def draft_node(self) -> RpcNode | None:
        return next((n for n in self.rpc if n.role == "draft"), None)

    @property
    def rpc_endpoints(self) -> list[str]:
        """`--rpc` value items for llama-server, in node order."""
        return [n.endpoint for n in self.rpc]

    @property
    def target_nodes(self) -> list[RpcNode]:
        """Nodes carrying target layers, in --rpc order: rpc_role=target, and a draft node given a
        positive proportion."""
        p = self.placement
        return [n for n in self.rpc if n.role == "target" or (p.weights is not None and (p.weight_of(n.name) or 0) > 0)]

    def node(self, name: str) -> RpcNode:
        return next(n for n in self.rpc if n.name == name)

    def guards(self, host: str) -> dict:
        """local_isolation's arguments on `host`, derived from the registry of listeners (cluster/ports.py)."""
        return ports.isolation_args(self, host)

    def listener_ports(self, host: str) -> list[int]:
        """Every port a tunnelspec service listens on on `host` (teardown proves none is left)."""
        return sorted({x.port for x in ports.on_host(self, host) if x.listen is not None})

    @property
    def speculative(self) -> bool:
        """A draft model on the draft node (the default kind); False: the target alone, its layers
        spread over main and the nodes (a split with no draft: every node rpc_role=target and no
        llama_draft_model)."""
        return self.draft_node is not None and bool(self.main.draft_model)

    def require_models(self) -> None:
        """What the llama-server part needs on the main host: the target model, and the draft model
        exactly when a node is the draft node (rpc_role=draft, the default role)."""
        main, draft = self.main, self.draft_node
        if main.spec_type == "draft-mtp" and not main.draft_model:
            raise cluster_error(
                self.inventory,
                main.name,
                "spec_type",
                "draft-mtp needs llama_draft_model, a separate MTP GGUF: without one llama.cpp builds the MTP "
                "draft on the target model itself (its heads, its KV cache) and ignores the draft device, so "
                "the draft could not run on the remote node",
            )
        if not main.model:
            raise cluster_error(
                self.inventory,
                main.name,
                "llama_model",
                "is required to run llama-server; set it on the main host (a path on that host)",
            )
        if main.draft_model and draft is None:
            raise cluster_error(
                self.inventory,
                main.name,
                "llama_draft_model",
                "is set but no rpc node has rpc_role=draft: the draft model runs on a remote device; set "
                "rpc_role=draft on one rpc node, or remove llama_draft_model for a target split with no draft",
            )
        if draft is not None and not main.draft_model:
            raise cluster_error(
                self.inventory,
                draft.name,
                "rpc_role",
                "this node is the draft node (rpc_role=draft, the default role) but llama_draft_model is not "
                "set: give the draft model on the main host, or set rpc_role=target on every rpc node for a "
                "target split with no draft",
            )
        if draft is None:
            for var, value in (
                ("spec_type", main.spec_type),
                ("spec_draft_n_max", main.spec_draft_n_max),
                ("spec_draft_p_min", main.spec_draft_p_min),
            ):
                if value is not None:
                    raise cluster_error(
                        self.inventory,
                        main.name,
                        var,
                        "tunes the draft, and this cluster has none (no llama_draft_model, every rpc node "
                        "rpc_role=target): remove it, or add a draft model and a draft node",
                    )
        self.require_no_known_issue()

    def _known_issues(self) -> tuple[list[str], list[str]]:
        main = self.main
        topo = known_issues.Topology(
            rpc_endpoints=len(self.rpc),
            spec_types=((main.spec_type or "draft-simple",) if self.speculative else ()),
            draft_model=bool(main.draft_model),
        )
        return known_issues.findings(topo, self.source.build_number)

    def require_no_known_issue(self) -> None:
        """The topology against the open upstream failure modes (llama/known_issues.py) for the pinned
        build: one the build is known to have is refused, naming the issue and what to do instead."""
        refused, _ = self._known_issues()
        if refused:
            nodes = ", ".join(n.name for n in self.rpc)
            raise cluster_error(
                self.inventory,
                self.main.name,
                "llama_build_number",
                f"{refused[0]} (rpc nodes: {nodes}; spec_type: {self.main.spec_type or 'default'})",
            )

    def known_issue_warnings(self) -> list[ClusterError]:
        """The same failure modes where the pinned build's status is not known: warnings of check."""
        _, warned = self._known_issues()
        return [cluster_error(self.inventory, self.main.name, "llama_build_number", w) for w in warned]

    @classmethod
    def from_inventory(cls, inv: Inventory, source_check: SourceCheck | None = None) -> Cluster:
        """`source_check`: also check the pinned source where it lives, e.g. llama_repo=controller:PATH
        against the controller's git (the commands that send the source pass
        `components.source.controller_repo.check_controller_source`; teardown does not). The model itself
        runs no git and no network."""
        main_name, rpc_names = _topology(inv)
        for err in schema.check_hosts(inv, [main_name, *rpc_names]):
            raise err  # the first; cluster/collect.py sets it aside and reads on for the next
        for name in [main_name, *rpc_names]:
            HostVars(inv, name).check_typos()
        sources = {name: source_of(HostVars(inv, name)) for name in [main_name, *rpc_names]}
        source = sources[main_name]
        for name, other in sources.items():
            if other != source:
                var = next(
                    f for f in ("repo", "commit", "patches", "build_number") if getattr(other, f) != getattr(source, f)
                )
                raise cluster_error(
                    inv,
                    name,
                    f"llama_{var}",
                    f"differs from the main host {main_name}; every host must build the same "
                    "source, so set it once in [all:vars]",
                )
        if source_check is not None:
            source_check(inv, main_name, source)
        main = main_host_of(HostVars(inv, main_name))
        if main.build.backend == "metal":
            raise cluster_error(inv, main_name, "llama_backend", METAL_MAIN)
        nodes = tuple(rpc_node_of(HostVars(inv, name), i) for i, name in enumerate(rpc_names))
        _check_roles(inv, nodes)
        _check_ports(inv, main, nodes)
        local = () if main.target_devices == "none" else tuple(main.target_devices.split(","))
        placement = parse_placement(
            HostVars(inv, main_name), [(HostVars(inv, n.name), n.role, n.target_share) for n in nodes], local
        )
        return cls(inventory=inv, main=main, rpc=nodes, source=source, placement=placement)


# The inventory alone says it (a Metal main is a Mac): refused before any connection, where the
# host facts would refuse it only after the first login (components/host/host.py, components/host/prereqs.py).
METAL_MAIN = (
    "metal refused on the main host: Metal exists on macOS only, and tunnelspec deploys to Linux hosts "
    "with systemd (llama-server, the tunnels and the RPC servers are systemd units). Make a Linux host "
    "the main host (e.g. llama_backend=cuda llama_target_devices=CUDA0; the Mac's GPU is then not used), "
    "or run llama-server yourself on the Mac (a Metal build) behind an SSH tunnel you open and supervise "
    "(ssh -N -L 127.0.0.1:<tunnel_port>:127.0.0.1:<rpc_port> <node>): that part is outside what "
    "tunnelspec deploys and checks"
)


# ---- topology ------------------------------------------------------------------------------------
def _topology(inv: Inventory) -> tuple[str, list[str]]:
    if "main" not in inv.groups:
        raise cluster_error(
            inv,
            None,
            None,
            "no [main] group; add one with exactly one host (it runs llama-server). An inventory of rpc nodes "
            "only is not supported: their RPC servers are reached only through main's tunnels, which "
            "tunnelspec sets up and proves (docs/first-cluster.md, 'Keeping main by hand')",
        )
    mains = inv.group_hosts("main")
    if len(mains) != 1:
        found = ", ".join(mains) or "none"
        raise cluster_error(
            inv,
            None,
            None,
            f"group [main] must have exactly one host, found {len(mains)} ({found})",
            line=inv.hosts[mains[1]].line if len(mains) > 1 else inv.groups["main"].line,
        )
    if "rpc" not in inv.groups or not inv.group_hosts("rpc"):
        raise cluster_error(
            inv,
            None,
            None,
            "no host in group [rpc]; add at least one node that runs ggml-rpc-server",
            line=inv.groups["rpc"].line if "rpc" in inv.groups else None,
        )
    rpcs = inv.group_hosts("rpc")
    if mains[0] in rpcs:
        raise cluster_error(
            inv,
            mains[0],
            None,
            "is in both [main] and [rpc]; the main host reaches rpc nodes through SSH tunnels, "
            "so list it in one group only",
        )
    _check_rpc_vars_outside_rpc(inv, rpcs)
    return mains[0], rpcs


# Variables that only mean something on an rpc node. Set on another host's own line they are a
# misplaced node (e.g. "draft node not in [rpc]"): ignoring them would deploy without that node.
RPC_ONLY_VARS = (
    "rpc_role",
    "rpc_port",
    "tunnel_port",
    "rpc_devices",
    "rpc_env",
    "rpc_threads",
    "rpc_bind",
    "rpc_cache",
    "rpc_target_share",
)


def _check_rpc_vars_outside_rpc(inv: Inventory, rpcs: list[str]) -> None:
    for name, host in inv.hosts.items():
        if name in rpcs:
            continue
        for var in RPC_ONLY_VARS:
            if var in host.vars:
                raise cluster_error(
                    inv,
                    name,
                    var,
                    "is an rpc node setting but this host is not in [rpc]; move the host into [rpc] "
                    "or remove the variable",
                )


# ---- cross-host checks ----------------------------------------------------------------------------
def _check_roles(inv: Inventory, nodes: tuple[RpcNode, ...]) -> None:
    drafts = [n.name for n in nodes if n.role == "draft"]
    if len(drafts) > 1:
        raise cluster_error(
            inv,
            drafts[1],
            "rpc_role",
            f"more than one draft node ({', '.join(drafts)}); the draft model runs on one node: "
            "set rpc_role=target on the others (rpc_role defaults to draft)",
        )


def _check_ports(inv: Inventory, main: MainHost, nodes: tuple[RpcNode, ...]) -> None:
    """One port per listener per machine, from the registry of listeners (cluster/ports.py)."""
    for other, x, address in ports.collisions(inv, main, nodes):
        if x.host == other.host:
            raise cluster_error(
                inv,
                x.owner,
                x.var,
                f"port {x.port} on the {'main host' if x.host == main.name else 'host'} is already used by "
                f"{other.var or other.name} of {other.owner}; "
                + (
                    "give each rpc node its own tunnel_port"
                    if x.var == other.var == "tunnel_port"
                    else f"give {x.name} a port of its own"
                ),
            )
        raise cluster_error(
            inv,
            x.owner,
            x.var,
            f"{other.owner} on the same address {address} already uses {other.var} {x.port}",
        )
