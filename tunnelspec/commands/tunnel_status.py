"""`tunnelspec tunnel status`: per tunnel, the unit's state, its local port, and the remote RPC
server's version and device memory (or busy/refused), observed over the controller's SSH
connection to main. Changes nothing. (The cluster-wide view is commands/status.py.)"""

from __future__ import annotations

import asyncio

from tunnelspec.core.constants import LOOPBACK
from tunnelspec.facts.sockets import clients_of
from tunnelspec.llama.rpc import ProbeStatus
from tunnelspec.components.tunnel.units import probe_tunnel, selected_nodes, unit_name
from tunnelspec.connection import connect
from tunnelspec.inventory import load_inventory
from tunnelspec.cluster.model import Cluster
from tunnelspec.connection.factory import check_known_hosts


async def tunnel_status(
    inventory_path: str, nodes, connect_options, probe_timeout: float = 3.0, extra_vars: dict | None = None
) -> list[dict]:
    """One row per selected tunnel (see the module's docstring)."""
    inv = load_inventory(inventory_path).with_extra_vars(extra_vars or {})
    cluster = Cluster.from_inventory(inv)

    check_known_hosts(inv, [cluster.main.name], connect_options)
    conn = await connect(cluster.main.name, inv.host_vars(cluster.main.name), connect_options, inv.path.parent)

    async def one(node) -> dict:
        name = unit_name(node.name)
        res = await conn.probe(["systemctl", "is-active", name])
        state = res.stdout.strip() or "unknown"
        row = {
            "node": node.name,
            "unit": name,
            "state": state,
            "local": f"{LOOPBACK}:{node.tunnel_port}",
            "remote": f"{LOOPBACK}:{node.rpc_port}",
            "rpc": None,
            "version": None,
            "devices": [],
        }
        if state != "active":
            return row
        if await clients_of(conn, node.tunnel_port):
            # The normal state under llama-server: it holds the one-client server through this tunnel,
            # so a HELLO would only wait for its timeout. (`tunnelspec status` reads the version from
            # the node's rpc-server log.)
            row["rpc"], row["detail"] = ProbeStatus.BUSY.value, "serving a client (llama-server)"
            return row
        r = await probe_tunnel(conn, node, 0, None, probe_timeout)
        row["rpc"] = r.status.value
        row["version"] = r.version_str if r.version else None
        row["devices"] = [{"free": d.free, "total": d.total} for d in r.devices]
        row["detail"] = r.detail
        return row

    try:
        return list(await asyncio.gather(*(one(n) for n in selected_nodes(cluster, nodes))))
    finally:
        await conn.close()


def format_status(rows: list[dict]) -> str:
    out = [f"{'NODE':<12} {'UNIT':<8} {'LOCAL':<17} {'RPC':<8} {'VERSION':<8} DEVICES"]
    for r in rows:
        devs = ", ".join(f"{d['free'] // 2**20}/{d['total'] // 2**20} MiB free" for d in r["devices"])
        out.append(
            f"{r['node']:<12} {r['state']:<8} {r['local']:<17} {r['rpc'] or '-':<8} "
            f"{r['version'] or '-':<8} {devs or r.get('detail') or '-'}"
        )
    return "\n".join(out)
