"""Tunnels on the main host: one persistent ssh unit per rpc node, and the end-to-end HELLO through
each. (The key, the pinned host keys and the nodes' side: keypair.py, sshd.py; the ssh
command line: tunnelspec/components/tunnel/units.py.)
"""

from __future__ import annotations

import asyncio

from tunnelspec.core.constants import LOOPBACK
from tunnelspec.core.errors import TaskFailed
from tunnelspec.connection.base import read_argv
from tunnelspec.facts.sockets import clients_of, established
from tunnelspec.facts import units as unit_facts
from tunnelspec.components.tunnel.keypair import TUNNEL_FORCED_COMMAND, fingerprint
from tunnelspec.llama.rpc import ProbeStatus
from tunnelspec.llama.versions import RPC_HEADER, format_version, rpc_proto_version
from tunnelspec.modules.base import Arg, Task, change, ok, register_task, wait_budget
from tunnelspec.modules.systemd import UNIT_DIR, Service, SystemdUnit, daemon_reload
from tunnelspec.components.tunnel.units import (
    AES_NI_PROBE,
    KEY_PATH,
    KNOWN_HOSTS,
    UNIT_TEMPLATE,
    node_ssh_target,
    probe_tunnel,
    selected_nodes,
    ssh_argv,
    unit_name,
)
from tunnelspec.components.front.model import skippable_draft


# ---- main: one unit per node ------------------------------------------------------------------------
# The tunnel unit files installed on main (read-only; one of the play's batched probes).
_INSTALLED_TUNNELS = ["find", UNIT_DIR, "-maxdepth", "1", "-name", "tunnelspec-tunnel-*.service", "-printf", "%f\n"]


@register_task
class TunnelUnits(Task):
    """Install, start and enable `tunnelspec-tunnel-<node>.service` on main (state=started), or
    stop and disable them (state=stopped). A unit whose file changed is restarted."""

    module = "tunnel_units"
    reads_cluster = True
    args = {
        "nodes": Arg(
            (list, str), default="all", help="Nodes (a list or comma string; empty or `all`: every rpc node)."
        ),
        "key": Arg(str, default=KEY_PATH, help="The tunnel key on main."),
        "known_hosts": Arg(str, default=KNOWN_HOSTS, help="The pinned known_hosts on main."),
        "session": Arg(
            bool,
            default=True,
            help="Carry a session (the key's forced command) rather than `ssh -N`: much lower latency for small messages.",
        ),
        "state": Arg(
            str,
            default="started",
            choices=("started", "stopped"),
            help="`started` (installed, enabled, running) or `stopped` (stopped and disabled).",
        ),
    }

    def probes(self) -> list[list[str]]:
        return [AES_NI_PROBE, _INSTALLED_TUNNELS]

    def cluster_probes(self, cluster) -> list[list[str]]:
        """What check reads per node besides: whether a unit runs from an older file, each unit
        file's state (started only) and each service's state (the inner tasks' own probes)."""
        if cluster is None:
            return self.probes()
        names = [unit_name(n.name) for n in selected_nodes(cluster, self.p["nodes"])]
        started = self.p["state"] == "started"
        out = [AES_NI_PROBE, *([unit_facts.stale(names).argv] if started and names else [])]
        for name in names:
            if started:
                out += SystemdUnit.build({"name": name, "src": UNIT_TEMPLATE}).probes()
            out += self._service(name).probes()
        return [*out, _INSTALLED_TUNNELS]

    def _service(self, name: str) -> Task:
        want = self.p["state"] == "started"
        return Service.build({"name": name, "state": self.p["state"], "enabled": want})

    async def _aes_ni(self, ctx) -> bool:
        return (await ctx.conn.probe(AES_NI_PROBE)).stdout.strip() == "aes"

    def _parts(self, ctx, node, aes_ni: bool = False):
        cluster = ctx.require_cluster()
        name = unit_name(node.name)
        key_fp = "?"
        pub = ctx.vars.get("tunnel_pubkey")
        if pub:
            key_fp = fingerprint(pub)
        target = node_ssh_target(cluster.inventory, node.name)
        argv = ssh_argv(
            node, target, node.users.tunnel, self.p["key"], self.p["known_hosts"], self.p["session"], aes_ni
        )
        unit = SystemdUnit.build(
            {
                "name": name,
                "src": UNIT_TEMPLATE,
                "verify": True,
                "vars": {
                    "node": node.name,
                    "loopback": LOOPBACK,
                    "tunnel_port": node.tunnel_port,
                    "rpc_port": node.rpc_port,
                    "tunnel_user": cluster.main.users.tunnel,
                    "ssh_argv": argv,
                    "session": self.p["session"],
                    "forced_command": TUNNEL_FORCED_COMMAND,
                    "key_fingerprint": key_fp,
                },
            }
        )
        return name, unit, self._service(name)

    async def check(self, ctx):
        todo, plan = [], []
        aes_ni = await self._aes_ni(ctx)
        nodes = selected_nodes(ctx.require_cluster(), self.p["nodes"])
        # A run killed between writing a unit and restarting it left the old ssh running.
        stale = (
            await unit_facts.stale_units(ctx.conn, [unit_name(n.name) for n in nodes])
            if self.p["state"] == "started"
            else {}
        )
        for node in nodes:
            name, unit, svc = self._parts(ctx, node, aes_ni)
            u = await unit.check(ctx) if self.p["state"] == "started" else ok("unit kept")
            s = await svc.check(ctx)
            if not u.changed and not s.changed and name in stale:
                u = change(f"restart ({stale[name]})")
            if u.changed or s.changed:
                todo.append(f"{name}: {', '.join(c.msg for c in (u, s) if c.changed)}")
                plan.append((node.name, u.changed, s.changed))
        orphans = await self._orphans(ctx)
        todo += [f"{u}: remove (its node is no longer in the inventory)" for u in orphans]
        if not todo:
            return ok(f"tunnels {self.p['state']}")
        return change("; ".join(todo), plan=plan, orphans=orphans)

    async def _orphans(self, ctx) -> list[str]:
        """Tunnel units of nodes no longer in the inventory (a node renamed or removed): they would
        keep their ssh running and hold their tunnel port, which a new node's tunnel may need. Only
        when every node is converged (`tunnel open --limit NODE` touches no other unit)."""
        if self.p["state"] != "started" or self.p["nodes"] not in ("all", "", [], ["all"]):
            return []
        wanted = {unit_name(n.name) for n in ctx.require_cluster().rpc}
        found = (await ctx.conn.probe(_INSTALLED_TUNNELS)).stdout.split()
        return sorted(u for u in found if u not in wanted)

    async def apply(self, ctx, ch):
        nodes = {n.name: n for n in ctx.require_cluster().rpc}
        aes_ni = await self._aes_ni(ctx)
        parts = {n: self._parts(ctx, nodes[n], aes_ni) for n, _, _ in ch.data["plan"]}
        changed_units = []
        for node, unit_changed, _ in ch.data["plan"]:
            name, unit, _ = parts[node]
            if unit_changed:
                await unit.apply(ctx, await unit.check(ctx))
                changed_units.append(name)
        for unit in ch.data.get("orphans", []):
            await ctx.conn.run(["systemctl", "disable", "--now", "--quiet", unit])
            await ctx.conn.run(["rm", "-f", "--", f"{UNIT_DIR}/{unit}"], check=True)
        if changed_units or ch.data.get("orphans"):
            await daemon_reload(ctx.conn)
        for unit in ch.data.get("orphans", []):
            await ctx.conn.run(["systemctl", "reset-failed", unit])
        for node, _, _ in ch.data["plan"]:
            name, _, svc = parts[node]
            if name in changed_units and self.p["state"] == "started":
                await ctx.conn.run(["systemctl", "enable", "--quiet", name], check=True)
                res = await ctx.conn.run(["systemctl", "restart", name])
                if res.rc != 0:
                    raise TaskFailed(f"{name} failed to start: {res.stderr.strip()}")
            else:
                await svc.apply(ctx, await svc.check(ctx))


# ---- main: HELLO through each tunnel -------------------------------------------------------------------
async def main_rpc_version(conn, source_dir: str) -> tuple[int, int, int]:
    data = await conn.get(f"{source_dir}/{RPC_HEADER}")
    if data is None:
        raise TaskFailed(
            f"{source_dir}/{RPC_HEADER} not found on the main host: the tunnel check compares "
            "each node's RPC version with the main host's source (run the source play)"
        )
    return rpc_proto_version(data.decode(errors="replace"))


@register_task
class TunnelProbe(Task):
    """Each tunnel answers HELLO with exactly the main build's RPC protocol version."""

    module = "tunnel_probe"
    reads_cluster = True
    read_only = True
    args = {
        "nodes": Arg(
            (list, str), default="all", help="Nodes to check (a list or comma string; empty or `all`: every rpc node)."
        ),
        "source_dir": Arg(
            str, required=True, help="The llama.cpp source on main (its RPC version is the expected one)."
        ),
        "timeout": Arg((int, float), default=30, help="Seconds to keep trying while tunnels come up."),
        "allow_busy": Arg(bool, default=True, help="A tunnel serving llama-server counts as up."),
    }

    def cluster_probes(self, cluster) -> list[list[str]]:
        """main's RPC header and, with allow_busy, each tunnel's clients (a busy one is not probed)."""
        header = [read_argv(f"{self.p['source_dir']}/{RPC_HEADER}")]
        if cluster is None or not self.p["allow_busy"]:
            return header
        return [*header, *(established(n.tunnel_port).argv for n in selected_nodes(cluster, self.p["nodes"]))]

    async def check(self, ctx):
        expected = await main_rpc_version(ctx.conn, self.p["source_dir"])
        cluster = ctx.require_cluster()
        nodes = selected_nodes(cluster, self.p["nodes"])
        # A draft-only node this run could not reach: serving goes on without it (docs/degraded.md).
        spare = skippable_draft(cluster)
        away = [
            n
            for n in nodes
            if spare is not None and n.name == spare.name and n.name in (ctx.vars.get("unreachable_hosts") or [])
        ]
        nodes = [n for n in nodes if n not in away]

        async def one(node):
            # llama-server connected through the tunnel holds the one-client server: busy, no wait.
            if self.p["allow_busy"] and await clients_of(ctx.conn, node.tunnel_port):
                return "busy: serving a client (llama-server)", True
            res = await probe_tunnel(ctx.conn, node, wait_budget(ctx, self.p["timeout"]), expected)
            return str(res), res.ok or (res.status is ProbeStatus.BUSY and self.p["allow_busy"])

        results = await asyncio.gather(*(one(n) for n in nodes))
        out: list[str] = []
        bad: list[str] = []
        for node, (text, good) in zip(nodes, results, strict=True):
            (out if good else bad).append(f"{node.name} via {LOOPBACK}:{node.tunnel_port}: {text}")
        if bad:
            raise TaskFailed(f"tunnel check (expected RPC v{format_version(expected)}): " + "; ".join(bad))
        out += [f"{n.name}: unreachable in this run, not checked (serving goes on without its draft)" for n in away]
        return ok("; ".join(out))
