"""Does the draft fit the device it is placed on? Checked on main before llama-server is (re)started:
the draft GGUF's size and shape (read from its header on main) against the memory the draft node's
devices report (their RPC server's start banner, registered by the rpc play as `rpc_served`).
A draft that cannot fit is refused with both figures; a tight fit is a warning. Read-only."""

from __future__ import annotations

import base64
import shlex

from tunnelspec.llama import memory_fit
from tunnelspec.modules.base import Arg, Task, ok, register_task

# A GGUF's metadata and tensor infos: the shape's keys come first (general.*, <arch>.*) and 1 MiB holds
# them; a big vocabulary's token list can take a few MiB, read only when the first read missed it.
HEADER_BYTES = (2**20, 16 * 2**20)


def header_argv(path: str, n: int = HEADER_BYTES[0]) -> list[str]:
    """The probe of `gguf_header`: the file's size, then its first `n` bytes in base64 (the first
    read, 1 MiB, is the one a task can name in its probes)."""
    q = shlex.quote(path)
    return ["sh", "-c", f"stat -L -c %s {q} && head -c {n} {q} | base64 -w0"]


async def gguf_header(conn, path: str, enough) -> tuple[int, bytes, str]:
    """(size in bytes, the first bytes, a note) of a GGUF on the host: 1 MiB, or 16 MiB when
    `enough(header, size)` says the first read was not (a big vocabulary's token list)."""
    header, size = b"", 0
    for n in HEADER_BYTES:
        res = await conn.probe(header_argv(path, n), timeout=120)
        if res.rc != 0:
            return 0, b"", f"cannot read {path}: {res.stderr.strip()[:200]}"
        size_line, _, b64 = res.stdout.partition("\n")
        size, header = int(size_line), base64.b64decode(b64)
        try:
            if enough(header, size) or size <= n:
                break
        except Exception:  # noqa: BLE001 - a malformed header: the caller's parser says why
            break
    return size, header, ""


async def gguf_facts(conn, path: str) -> tuple[int, memory_fit.ModelShape | None, str]:
    """(size in bytes, shape or None, a note) of a GGUF on the host, reading only its header."""

    def complete(header, _size):
        shape = memory_fit.gguf_shape(header)
        return bool(shape.n_layer and shape.n_vocab)

    size, header, note = await gguf_header(conn, path, complete)
    if note:
        return 0, None, note
    try:
        shape = memory_fit.gguf_shape(header)
    except Exception as e:  # noqa: BLE001 - any malformed or cut header: estimate from the size alone
        return size, None, f"header not read ({e.__class__.__name__}): estimated from the size"
    return size, shape, ""


def fit_verdicts(
    cluster, served: dict[str, list[dict]], draft: tuple | None, target: tuple | None, draft_devices: int = 1
) -> list[memory_fit.Fit]:
    """One verdict per node that holds something: the draft node (the draft, plus its target share if
    it has one) and each node with a target share. `served`: node → its served devices (as
    registered by the rpc play); `draft`/`target`: (size, shape, note) of each GGUF (draft None: a
    target split with no draft). Target shares
    are known only when given (rpc_target_share / llama_tensor_split); without them llama.cpp sizes
    each part by the devices' free memory itself, and only the draft is checked."""
    p = cluster.placement
    total = sum(w for _, w in p.weights) if p.weights is not None else 0.0
    needs: dict[str, list] = {}
    node = cluster.draft_node
    if node is not None and draft is not None:
        size, shape, note = draft
        need = memory_fit.draft_need(size, shape, None)
        needs[node.name] = [need, note, "the draft"]
    if target is not None and total > 0:
        size, shape, note = target
        for n in cluster.target_nodes:
            share = p.weight_of(n.name) or 0.0
            need = memory_fit.target_share_need(size, share, total, shape, None)
            if n.name in needs:
                first = needs[n.name]
                needs[n.name] = [
                    memory_fit.combine(first[0], need),
                    "; ".join(x for x in (first[1], note) if x),
                    f"the draft and {share / total:.0%} of the target",
                ]
            else:
                needs[n.name] = [need, note, f"{share / total:.0%} of the target"]
    out = []
    for name, (need, note, what) in needs.items():
        devs = served.get(name)
        if not devs:
            continue
        if note:
            need = memory_fit.Need(need.weights, need.kv, need.compute, need.notes + (note,))
        use = devs[: max(1, draft_devices)] if what == "the draft" else devs
        figures = [(d["name"], d["free_mib"] * memory_fit.MIB, d["total_mib"] * memory_fit.MIB) for d in use]
        out.append(memory_fit.check_fit(name, figures, need, what))
    return out


@register_task
class ModelFit(Task):
    """The draft (and the target's shares on RPC nodes, when given) against each node's reported
    device memory (llama/memory_fit.py check_fit): refused with both figures, a tight fit a warning."""

    module = "model_fit"
    reads_cluster = True
    read_only = True
    args = {
        "draft_model": Arg(str, default="", help="The draft GGUF's path on main; empty: no draft (a target split)."),
        "target_model": Arg(str, help="The target GGUF's path on main (its shares on RPC nodes)."),
        "draft_devices": Arg(int, default=1, help="How many of the node's served devices the draft may use."),
    }

    def cluster_probes(self, cluster) -> list[list[str]]:
        """The first read of each GGUF's header check makes (a second, larger one only when that
        one was not enough)."""
        out = [header_argv(self.p["draft_model"])] if self.p["draft_model"] else []
        if self.p["target_model"] and cluster is not None and cluster.placement.weights is not None:
            out.append(header_argv(self.p["target_model"]))
        return out

    async def check(self, ctx):
        cluster = ctx.require_cluster()
        hostvars = ctx.vars.get("hostvars", {})
        served = {n.name: (hostvars.get(n.name) or {}).get("rpc_served") for n in cluster.rpc}
        if not any(served.values()):
            return ok("not checked: no node's device memory in this run (the rpc play did not run)")
        draft = await gguf_facts(ctx.conn, self.p["draft_model"]) if self.p["draft_model"] else None
        target = None
        if self.p["target_model"] and cluster.placement.weights is not None:
            target = await gguf_facts(ctx.conn, self.p["target_model"])
        verdicts = fit_verdicts(
            cluster,
            {k: v for k, v in served.items() if v},
            draft,
            target if target and target[0] else None,
            self.p["draft_devices"],
        )
        if not verdicts:
            return ok("not checked: " + ((draft or ("", "", ""))[2] or "no node holds a model part"))
        for v in verdicts:
            if v.level == "refuse":
                memory_fit.require_fit(v)
        return ok("; ".join(memory_fit.require_fit(v) for v in verdicts))
