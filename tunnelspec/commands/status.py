"""`tunnelspec status`: one read-only look at every host — source, build, services, tunnels, RPC
version and devices, llama-server health and the latest draft acceptance. Per-host failures are
values in the report, never exceptions that hide the other hosts."""

from __future__ import annotations

import asyncio
import json
import re
from typing import Any

from tunnelspec.connection import ConnectOptions, connect
from tunnelspec.core.constants import DEVICES_CACHE, LOOPBACK
from tunnelspec.core.errors import EXIT_UNREACHABLE, HostUnreachable
from tunnelspec.facts import nft, port_owners, sockets
from tunnelspec.core import http
from tunnelspec.llama import devices as dv, props, rpc, split_proof
from tunnelspec.components.server.args import UNIT, last_acceptance, tunnel_unit
from tunnelspec.components.rpc import RPC_UNIT, START_OF_RUN_SCRIPT
from tunnelspec.components.tls.reach import ApiTls, Seen, api_opener
from tunnelspec.components.front.serving import serving_state, sh, unit_state
from tunnelspec.llama.devices import served_text
from tunnelspec.components.generation import record as gen
from tunnelspec.components.generation.store import read_records
from tunnelspec.components.isolation import LocalIsolation
from tunnelspec.components.host.host import gather as gather_facts

_BANNER = re.compile(r"Starting RPC server v(\d+\.\d+\.\d+)")


async def _source_build(conn, root: str) -> dict:
    src = await sh(conn, ["git", "-C", f"{root}/src/llama.cpp", "rev-parse", "HEAD", "HEAD^{tree}"])
    parts = src.split()
    build = await sh(conn, ["readlink", "-e", "--", f"{root}/current"])
    return {
        "commit": parts[0] if len(parts) == 2 else None,
        "tree": parts[1] if len(parts) == 2 else None,
        "build": build.rsplit("/", 1)[-1] if build else None,
    }


async def _main_status(conn, cluster) -> dict:
    main = cluster.main
    out = {"role": "main", **await _source_build(conn, main.root)}
    ports = {s.port for s in sockets.parse(await sh(conn, sockets.listening().argv)) if s.loopback_only}
    raw = await sh(conn, ["cat", DEVICES_CACHE])
    try:
        devices = {int(k): v for k, v in json.loads(raw)["devices"].items()} if raw else {}
    except (ValueError, KeyError):
        devices = {}
    out["tunnels"] = [
        {
            "node": n.name,
            "unit": await unit_state(conn, tunnel_unit(n.name)),
            "endpoint": n.endpoint,
            "listening": n.tunnel_port in ports,
            "role": n.role,
            "devices": devices.get(n.tunnel_port, []),
        }
        for n in cluster.rpc
    ]
    server: dict[str, Any] = {
        "unit": await unit_state(conn, UNIT),
        "endpoint": f"{main.server_host}:{main.server_port}",
    }
    tls = ApiTls.of(main)
    seen = Seen()
    try:
        opener = api_opener(conn, main.server_port, main.server_host, tls, seen)
        r = await http.request(opener, "GET", "/health", timeout=5)
        server["health"] = "ok" if r.status == 200 else f"HTTP {r.status}"
    except http.HttpError as e:
        server["health"] = f"down ({e})"
    # Public bind: TLS with the CA pinned, and the certificate llama-server served (what clients see).
    server["tls"] = (
        {"ca_file": tls.ca_file, "server_name": tls.server_name, "certificate": seen.describe()}
        if tls is not None
        else None
    )
    server["spec_type"] = None
    if server["health"] == "ok" and not main.api_key_file:
        # With an API key /props needs it; status does not read secrets, so the type stays unknown.
        server["spec_type"] = (await props.read_spec_types(opener, timeout=5))["active"]
    journal = await sh(conn, ["journalctl", "--no-pager", "-o", "cat", "-n", "2000", "-u", UNIT], timeout=30)
    server["draft_acceptance"] = last_acceptance(journal)
    server.update(await _split_status(conn, cluster, devices))
    server["serving"] = await serving_state(conn, cluster, devices)
    out["llama_server"] = server
    out["generations"] = await _generations(conn)
    return out


async def _generations(conn, shown: int = 4) -> dict:
    """The current generation and the previous few kept on main (docs/generations.md)."""
    records, current = await read_records(conn)
    rows = [
        {"n": n, "current": n == current, "summary": gen.summary(r), "models": gen.model_sums(r)}
        for n, r in sorted(records.items(), reverse=True)[:shown]
    ]
    return {"current": current, "kept": sorted(records), "recent": rows}


def serving_line(sv: dict) -> str:
    mode = sv.get("mode")
    if mode == "speculative":
        return (
            f"serving: speculative, draft on {','.join(sv.get('draft_devices') or []) or '?'} "
            f"({sv.get('draft_node')}) since {sv.get('since') or '?'}"
        )
    detail = f" [{sv['detail']}]" if sv.get("detail") else ""  # ssh's own words, when a node is away
    if mode == "degraded":
        return (
            f"serving: DEGRADED since {sv.get('since') or '?'}: the target alone, without the draft on "
            f"{sv.get('node')}: {sv.get('reason') or '?'}{detail}"
        )
    if mode == "waiting":
        return (
            f"serving: WAITING since {sv.get('since') or '?'} for {sv.get('node')} (it holds target layers): "
            f"{sv.get('reason') or '?'}{detail}"
        )
    if mode == "split-degraded":
        return (
            f"serving: SPLIT-DEGRADED since {sv.get('since') or '?'}: the split without {sv.get('node')} "
            f"(its layers on the remaining devices): {sv.get('reason') or '?'}{detail}"
        )
    if mode == "plain":
        return "serving: no draft"
    return "serving: mode unknown (llama-server not started by this deploy's launcher yet)"


async def _split_status(conn, cluster, devices: dict) -> dict:
    """`kind`: speculative (a draft) or split (no draft: the target's layers over main and the nodes);
    for a split, where the current run's load lines put them (llama/split_proof.py)."""
    if cluster.speculative:
        return {"kind": "speculative"}
    text = await sh(conn, ["sh", "-c", split_proof.LOAD_LINES_SCRIPT, "sh", UNIT], timeout=30)
    nodes = {n.name: devices.get(n.tunnel_port, []) for n in cluster.rpc}
    load = split_proof.target_load(text, nodes, {n.name: n.tunnel_port for n in cluster.rpc})
    return {"kind": "split", "layers": split_proof.load_summary(load)}


async def _rpc_status(conn, node) -> dict:
    out = {
        "role": f"rpc ({node.role})",
        **await _source_build(conn, node.root),
        "unit": await unit_state(conn, RPC_UNIT),
    }
    result = await rpc.probe(lambda: conn.open_connection(LOOPBACK, node.rpc_port), timeout=2.0)
    # What the server serves, as its start banner says (device, description, memory): main's RPC<n>.
    text = await sh(conn, ["sh", "-c", START_OF_RUN_SCRIPT, "sh", RPC_UNIT])
    log = dv.parse_node_log(text)
    served = [d.as_fact() for d in log.banner.devices] if log.banner else None
    if result.ok:
        out["rpc"] = {"version": result.version_str, "devices": len(result.devices), "state": "idle", "served": served}
    else:
        # Busy is the normal state while llama-server holds the connection (one client at a time):
        # read the version from the server's banner instead.
        banner = _BANNER.findall(text)
        state = "serving llama-server" if result.status is rpc.ProbeStatus.BUSY else str(result)
        out["rpc"] = {"version": banner[-1] if banner else None, "devices": None, "state": state, "served": served}
    return out


def _opted_out(hv: dict) -> bool:
    return str(hv.get("rpc_local_isolation", "true")).strip().lower() in ("false", "no", "0", "off")


async def _squatters(conn, seen, listeners: list[dict]) -> list[str]:
    """Registered ports held by another user than their service's (or root): each with its owner and
    command line."""
    allowed: dict[int, set[int]] = {}
    for g in listeners:
        for p in g["ports"]:
            allowed.setdefault(int(p), set()).update(seen.uids[u] for u in g["users"] if seen.uids.get(u) is not None)
    try:
        return [
            f"port {b.port}: {b.describe()}" for b in port_owners.squatters(await port_owners.observe(conn), allowed)
        ]
    except Exception as e:  # noqa: BLE001 - a row, not a crash
        return [f"listeners unreadable: {e}"]


async def _isolation(conn, hv: dict, guards: dict) -> dict:
    """The loopback isolation as loaded now, against the registry of listeners (cluster/ports.py):
    `state` ok | missing | changed | off | error. `squatters`: registered ports another user holds."""
    try:
        seen = await nft.observe(conn, LocalIsolation(LocalIsolation.validate({"guards": guards})).all_users())
    except Exception as e:  # noqa: BLE001 - a row, not a crash
        return {"state": "error", "label": guards["label"], "msg": f"error: {e}"}
    out = _isolation_rules(seen, hv, guards)
    out["squatters"] = await _squatters(conn, seen, guards["listeners"])
    return out


def _isolation_rules(seen, hv: dict, guards: dict) -> dict:
    label = guards["label"]
    if _opted_out(hv):
        return {
            "state": "off",
            "label": label,
            "msg": "OFF (rpc_local_isolation=false): WARNING, every local user can connect",
        }
    if seen.table_error:
        return {"state": "error", "label": label, "msg": f"cannot read rules: {seen.table_error}"}
    guard = LocalIsolation(LocalIsolation.validate({"guards": guards}))
    known = all(seen.uids.get(u) is not None for u in guard.all_users())
    want = guard.rules(seen.uids)
    if known and nft.matches(seen.table, want):
        return {"state": "ok", "label": label, "msg": label, "refused": seen.table.rejected}
    if not seen.table.present:
        return {"state": "missing", "label": label, "msg": "NOT loaded: every local user can connect (run deploy)"}
    return {
        "state": "changed",
        "label": label,
        "msg": f"rules differ from the inventory ({nft.describe(seen.table.rules)}): run deploy",
    }


async def _facts(conn, root: str) -> dict:
    """The host's facts (facts/host.py) with their one-line summary; an error is a value."""
    try:
        f = await gather_facts(conn, root)
    except Exception as e:  # noqa: BLE001 - a row, not a crash
        return {"error": str(e)}
    return {**f.to_dict(), "summary": f.summary()}


async def _host(name: str, hv: dict, cluster, opts: ConnectOptions, inv_dir) -> dict:
    try:
        conn = await connect(name, hv, opts, inv_dir)
    except HostUnreachable as e:  # a row, not a crash; exit 4 (status_exit_code)
        return {"role": "?", "error": str(e), "unreachable": True}
    except Exception as e:  # noqa: BLE001 - a host that cannot be connected to is a row, not a crash
        return {"role": "?", "error": str(e)}
    try:
        facts = await _facts(conn, cluster.main.root if name == cluster.main.name else cluster.node(name).root)
        if name == cluster.main.name:
            out = await _main_status(conn, cluster)
        else:
            out = await _rpc_status(conn, cluster.node(name))
        out["isolation"] = await _isolation(conn, hv, cluster.guards(name))
        return {**out, "facts": facts}
    except Exception as e:  # noqa: BLE001
        return {"error": f"{type(e).__name__}: {e}"}
    finally:
        await conn.close()


async def gather(inventory, cluster, opts: ConnectOptions) -> dict:
    names = cluster.hosts
    rows = await asyncio.gather(
        *(_host(n, inventory.host_vars(n), cluster, opts, inventory.path.parent) for n in names)
    )
    hosts = dict(zip(names, rows, strict=True))
    main = hosts.get(cluster.main.name) or {}
    # The cluster's serving mode (also under main's llama_server): what a monitor reads first.
    return {"schema": 1, "serving": (main.get("llama_server") or {}).get("serving"), "hosts": hosts}


def _short(sha):
    return sha[:12] if sha else "-"


def render(report: dict) -> str:
    lines = []
    for name, h in report["hosts"].items():
        if "error" in h:
            lines.append(f"{name:<10} {h.get('role', '?'):<14} ERROR {h['error']}")
            continue
        lines.append(
            f"{name:<10} {h['role']:<14} commit {_short(h['commit'])} tree {_short(h['tree'])} "
            f"build {h['build'] or '-'}"
        )
        if "facts" in h:
            f = h["facts"]
            lines.append(f"{'':<10} host: {f.get('summary') or 'facts unreadable: ' + f.get('error', '?')}")
        if "rpc" in h:
            r = h["rpc"]
            lines.append(
                f"{'':<10} rpc-server: {h['unit']}, RPC v{r['version'] or '?'}, {r['state']}"
                + (f", {r['devices']} device(s)" if r["devices"] is not None else "")
            )
        for t in h.get("tunnels", []):
            served = ((report["hosts"].get(t["node"]) or {}).get("rpc") or {}).get("served")
            lines.append(
                f"{'':<10} tunnel → {t['node']:<8} {t['unit']:<9} {t['endpoint']} "
                f"{'listening' if t['listening'] else 'NOT listening'}  {t['role']} "
                f"devices {served_text(t['devices'], served)}"
            )
        if "isolation" in h:
            iso = h["isolation"]
            extra = f" ({iso['refused']} refused so far)" if iso.get("refused") else ""
            lines.append(f"{'':<10} isolation: {iso['msg']}{extra}")
            for sq in iso.get("squatters") or []:
                lines.append(f"{'':<10} WARNING guarded {sq} (not its service: run nothing there, deploy refuses)")
        if "llama_server" in h:
            s = h["llama_server"]
            acc = s["draft_acceptance"]
            acc_txt = (
                f"{acc['accepted']}/{acc['generated']} draft tokens accepted ({acc['rate']:.2f})"
                if acc
                else "no draft statistics yet"
            )
            if s.get("kind") == "split":
                lines.append(
                    f"{'':<10} llama-server: {s['unit']}, {s['endpoint']}, health {s['health']}, split, "
                    f"no draft: {split_proof.describe_summary(s.get('layers'))}"
                )
            else:
                lines.append(
                    f"{'':<10} llama-server: {s['unit']}, {s['endpoint']}, health {s['health']}, "
                    f"speculative type {s.get('spec_type') or '?'}, {acc_txt}"
                )
            if s.get("serving"):
                lines.append(f"{'':<10} {serving_line(s['serving'])}")
            if s.get("tls"):
                lines.append(f"{'':<10} {_tls_line(s['tls'])}")
        if "generations" in h:
            g = h["generations"]
            if not g["recent"]:
                lines.append(f"{'':<10} generations: none yet (a deploy that passes verify records one)")
            for row in g["recent"]:
                mark = "current" if row["current"] else "kept"
                lines.append(f"{'':<10} {mark:<8} {row['summary']}")
    return "\n".join(lines)


def _tls_line(t: dict) -> str:
    c = t.get("certificate")
    if not c:
        return f"TLS: CA {t['ca_file']} pinned, name {t['server_name']}: no certificate seen (see health)"
    return (
        f"TLS: certificate for {', '.join(c['names'])}, ends {c['not_after'][:10]} ({c['days_left']} days), "
        f"{c['sha256']}; CA {t['ca_file']} pinned" + (f"; WARNING {c['warning']}" if c.get("warning") else "")
    )


def status_exit_code(report: dict) -> int:
    """0 when every host answered and llama-server is healthy; 4 when a host could not be reached (the
    table in docs/ci.md: unreachable before failed); else 1."""
    if any(h.get("unreachable") for h in report["hosts"].values()):
        return EXIT_UNREACHABLE
    for h in report["hosts"].values():
        if "error" in h:
            return 1
        if "llama_server" in h and h["llama_server"]["health"] != "ok":
            return 1
    return 0
