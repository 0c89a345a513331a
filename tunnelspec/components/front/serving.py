"""What llama-server serves now, read on main: the mode the launcher last started it in
(docs/degraded.md), with ssh's own words when a node is away."""

from __future__ import annotations

import json
import time

from tunnelspec.components.front import model as front
from tunnelspec.components.server.args import tunnel_unit
from tunnelspec.facts import safe_read

# The launcher's mode file is a few hundred bytes; anything much larger is not its.
STATE_CAP = 256 * 1024


async def sh(conn, argv, timeout=20) -> str:
    try:
        res = await conn.probe(argv, timeout=timeout)
    except Exception as e:  # noqa: BLE001 - reported in the row, other fields still gathered
        return f"error: {e}"
    return res.stdout.strip() if res.rc == 0 else ""


def _is_active(unit: str) -> list[str]:
    return ["systemctl", "is-active", unit]


async def unit_state(conn, unit: str) -> str:
    res = await conn.probe(_is_active(unit))
    return res.stdout.strip() or "unknown"


def state_probes(cluster) -> list[list[str]]:
    """What `serving_state(conn, cluster)` reads before the mode it finds decides more: the mode
    file and, with a draft-only node, the draft watch's state."""
    watch = [_is_active(front.WATCH_UNIT)] if front.skippable_draft(cluster) else []
    return [safe_read.file_text(front.STATE_PATH, STATE_CAP).argv, *watch]


def iso(t) -> str | None:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(float(t))) if t else None


async def serving_state(conn, cluster, devices: dict | None = None) -> dict:
    """The mode llama-server was last started in (the launcher's file, docs/degraded.md): speculative
    (the draft on its node's device), degraded (the target alone while a draft-only node is away, since
    when and why), split-degraded (a split served from the remaining devices while a target node is
    away), waiting (a node with target layers holds serving down), or plain (no draft)."""
    # llama-server's user owns the directory of this file: read without following a link (SECURITY.md,
    # invariant A) — a symlink, FIFO or huge file there is an unknown mode, never read through.
    try:
        raw, _why = await safe_read.read(conn, front.STATE_PATH, cap=STATE_CAP)
    except Exception:  # noqa: BLE001 - an unknown mode, other fields still gathered
        raw = None
    try:
        state = json.loads(raw) if raw else {}
    except ValueError:
        state = {}
    if not isinstance(state, dict):
        state = {}
    mode = state.get("mode") or "unknown"
    draft = cluster.draft_node
    out = {
        "mode": mode,
        "since": iso(state.get("since")),
        "node": state.get("node"),
        "reason": state.get("reason") or None,
        "watch": (
            await unit_state(conn, front.WATCH_UNIT)
            if front.skippable_draft(cluster) or mode == front.SPLIT_DEGRADED
            else None
        ),
        "draft_node": draft.name if draft else None,
        "draft_devices": (devices or {}).get(draft.tunnel_port, []) if draft else [],
    }
    if mode in (front.DEGRADED, front.WAITING, front.SPLIT_DEGRADED) and state.get("node"):
        # Why the tunnel is down, in ssh's own words (e.g. "connect to host … Connection timed out").
        j = await sh(
            conn, ["journalctl", "--no-pager", "-o", "cat", "-n", "30", "-u", tunnel_unit(state["node"])], timeout=20
        )
        said = [
            row.strip()
            for row in j.splitlines()
            if row.strip().startswith("ssh:") or "Connection" in row or "Permission denied" in row or "Host key" in row
        ]
        out["detail"] = said[-1] if said else None
    return out
