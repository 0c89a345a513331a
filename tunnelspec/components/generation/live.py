"""A host's live state as a generation record holds it (record.py has its shape): where `current`
points, the serving files by sha256, the source's stack record, the running binaries and models."""

from __future__ import annotations

import asyncio
import json
import posixpath

from tunnelspec.components.generation import record as gen
from tunnelspec.components.generation import state
from tunnelspec.core.errors import TaskFailed
from tunnelspec.llama import build_plan as bp
from tunnelspec.components.models import proof_cache
from tunnelspec.components.models.files import PROOFS, checked_proofs, parts_of


def hosts_of(cluster) -> list[tuple[str, str, str]]:
    """(name, role, root) of every host serving touches: main first."""
    return [(cluster.main.name, "main", cluster.main.root), *((n.name, "rpc", n.root) for n in cluster.rpc)]


def nodes_of(cluster, role: str) -> tuple[str, ...]:
    """The rpc nodes whose tunnel units main keeps in a generation (none on a node)."""
    return tuple(n.name for n in cluster.rpc) if role == "main" else ()


def checked(record, cluster, host: str) -> dict:
    """`host`'s part of generation `record`, held to what the deploy itself writes there
    (gen.validate_host_record) with the role and root the inventory gives the host, never the record's;
    refused before anything changes."""
    n = record.get("n") if isinstance(record, dict) else None
    where = {name: (role, root) for name, role, root in hosts_of(cluster)}.get(host)
    if where is None:
        raise TaskFailed(
            f"{host} is neither main nor an rpc node in the inventory: generation {n} has nothing "
            "to restore there (nothing was changed)"
        )
    hosts = record.get("hosts") if isinstance(record, dict) else None
    want = hosts.get(host) if isinstance(hosts, dict) else None
    if not want:
        raise TaskFailed(f"generation {n} has no record of {host}")
    try:
        gen.validate_host_record(want, *where, host, n, nodes_of(cluster, where[0]))
    except gen.RecordRefused as e:
        raise TaskFailed(str(e)) from None
    return want


def recordable(host: str, state: dict, nodes: tuple[str, ...] = ()) -> None:
    """A host's live state is recorded only as a return would accept it: its serving files themselves
    (never a link: its copy would be another file), with the modes the deploy writes."""
    for path, f in state["files"].items():
        if f and "kind" in f:
            what = "a symbolic link" if f["kind"] == "link" else "not a regular file"
            raise TaskFailed(
                f"{host}: {path} is {what}; a generation keeps the serving files themselves, never "
                "what a link points to: nothing was recorded (the deploy writes it as a file: "
                "remove what is there and deploy again)"
            )
    try:
        gen.validate_host_record(state, state["role"], state["root"], host, None, nodes)
    except gen.RecordRefused as e:
        raise TaskFailed(
            f"{host}: its {e.field} {e.shown} {e.why}: a return could not put it back, so nothing was recorded"
        ) from None


async def stamped_build_number(conn, build: str) -> int | None:
    """The upstream build number (bNNNN) a build's stamp names; None when it names none or has no stamp."""
    raw = await conn.get(posixpath.join(build, bp.STAMP))
    try:
        number = json.loads(raw or b"{}").get("build_number")
    except (ValueError, AttributeError):
        return None
    return number if isinstance(number, int) and not isinstance(number, bool) else None


def host_state_argv(role: str, root: str, nodes: tuple[str, ...] = ()) -> list[str]:
    """What `host_state` reads on the host."""
    return ["sh", "-c", state.STATE_SCRIPT, "sh", root, *gen.managed_files(role, root, nodes)]


def main_state_probes(cluster) -> list[list[str]]:
    """The live state `live_state` reads on main itself (each node's is read on its own connection)."""
    return [host_state_argv("main", cluster.main.root, nodes_of(cluster, "main"))]


async def host_state(conn, role: str, root: str, nodes: tuple[str, ...] = ()) -> dict:
    res = await conn.probe(host_state_argv(role, root, nodes), check=True)
    return {"role": role, "root": root, **state.parse_state(res.stdout)}


_RUNNING = r"""
pid=$(systemctl show -p MainPID --value "$1" 2>/dev/null)
[ "${pid:-0}" != 0 ] && readlink -- "/proc/$pid/exe"
exit 0
"""


async def running_exe(conn, unit: str) -> str:
    """The executable `unit`'s main process runs ('' when none)."""
    return (await conn.probe(["sh", "-c", _RUNNING, "sh", unit])).stdout.strip()


def model_parts(paths: list[str]) -> list[str]:
    """Every file of the models at `paths` (each part of a split one), sorted; '' entries left out."""
    return sorted({part for p in paths if p for part in parts_of(p)})


def model_proofs_probe(paths: list[str], cache: str = PROOFS) -> list[list[str]]:
    """What `model_proofs(conn, paths, cache)` reads first, for a task's probes."""
    parts = model_parts(paths)
    return [proof_cache.stat_argv(parts, cache)] if parts else []


async def model_proofs(conn, paths: list[str], cache: str = PROOFS) -> dict[str, dict]:
    """{path: its proof line} of the models on main (every part of a split one), as model_proof kept
    it: size, identity, header digest, the sha256 while unchanged since proven ({} when python3
    printed none). Read-only and cheap: only a file changed since has its header read again, and
    when none did, python3 does not run at all (proof_cache)."""
    paths = model_parts(paths)
    if not paths:
        return {}
    got, _ = await checked_proofs(conn, paths, cache, timeout=300)
    return {p: got.get(p) or {} for p in paths}


async def model_sums(conn, paths: list[str]) -> dict[str, str | None]:
    """{path: sha256} of the models on main (every part of a split one) as model_proof kept it; None
    for a file not proven, or changed since."""
    return {p: proof.get("sha256") for p, proof in (await model_proofs(conn, paths)).items()}


async def live_state(ctx) -> dict:
    cluster = ctx.require_cluster()
    hosts = hosts_of(cluster)

    async def one(name: str, role: str, root: str) -> dict:
        conn = ctx.conn if name == ctx.host else await ctx.connection_to(name)
        return await host_state(conn, role, root, nodes_of(cluster, role))

    # Every host read at once (each on its own connection): one round trip, not one per host.
    states = await asyncio.gather(*(one(*h) for h in hosts))
    out = {}
    for (name, role, _root), st in zip(hosts, states, strict=True):
        out[name] = st
        if role == "rpc":
            # As data (a port), what the node's tunnel key and its tunnel on main forward to: a
            # return re-renders the key's line for it (the key itself may have been rotated since).
            out[name]["rpc_port"] = cluster.node(name).rpc_port
    return out
