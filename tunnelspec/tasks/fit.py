"""Does the draft fit the device it is placed on? Checked on main before llama-server is (re)started:
the draft GGUF's size and shape (read from its header on main) against the memory the draft node's
devices report (their RPC server's start banner, registered by the rpc play as `rpc_served`).
A draft that cannot fit is refused with both figures; a tight fit is a warning. Read-only."""

from __future__ import annotations

import shlex

from tunnelspec.llama import devices
from tunnelspec.tasks.base import Arg, Task, ok, register_task

HEADER_BYTES = 16 * 2**20  # a GGUF's metadata and tensor infos (a big vocabulary takes a few MiB)


async def gguf_facts(conn, path: str) -> tuple[int, devices.ModelShape | None, str]:
    """(size in bytes, shape or None, a note) of a GGUF on the host, reading only its header."""
    q = shlex.quote(path)
    res = await conn.run(["sh", "-c", f"stat -L -c %s {q} && head -c {HEADER_BYTES} {q} | base64 -w0"], timeout=120)
    if res.rc != 0:
        return 0, None, f"cannot read {path}: {res.stderr.strip()[:200]}"
    size_line, _, b64 = res.stdout.partition("\n")
    import base64

    try:
        shape = devices.gguf_shape(base64.b64decode(b64))
        return int(size_line), shape, ""
    except Exception as e:  # noqa: BLE001 - any malformed or cut header: estimate from the size alone
        return int(size_line), None, f"header not read ({e.__class__.__name__}): estimated from the size"


@register_task
class ModelFit(Task):
    """The draft model against the draft node's reported device memory (llama/devices.py check_fit)."""

    module = "model_fit"
    read_only = True
    args = {
        "draft_model": Arg(str, required=True, help="The draft GGUF's path on main."),
        "draft_devices": Arg(int, default=1, help="How many of the node's served devices the draft may use."),
    }

    async def check(self, ctx):
        cluster = ctx.require_cluster()
        node = cluster.draft_node
        if node is None:
            return ok("no draft node")
        served = (ctx.vars.get("hostvars", {}).get(node.name) or {}).get("rpc_served")
        if not served:
            return ok(f"not checked: no device memory of {node.name} in this run (the rpc play did not run)")
        size, shape, note = await gguf_facts(ctx.conn, self.p["draft_model"])
        if not size:
            return ok(f"not checked: {note}")
        need = devices.draft_need(size, shape, None)
        if note:
            need = devices.Need(need.weights, need.kv, need.compute, need.notes + (note,))
        use = served[: max(1, self.p["draft_devices"])]
        devs = [(d["name"], d["free_mib"] * devices.MIB, d["total_mib"] * devices.MIB) for d in use]
        return ok(devices.require_fit(devices.check_fit(node.name, devs, need)))
