"""The read-only verify step of a deploy (`llama_verify`, verify.yml): llama-server answers, drafts on
the draft node's device (or serves as the recorded mode says it should), over TLS when the API is
public. The proof itself: components/server/verify.py."""

from __future__ import annotations

import asyncio

from tunnelspec.components.front import model as front
from tunnelspec.components.front.serving import serving_state, state_probes
from tunnelspec.components.server.verify import (
    model_paths,
    model_sizes,
    sizes_argv,
    start_timeout,
    verify_probes,
    verify_server,
)
from tunnelspec.components.tls.reach import ApiTls
from tunnelspec.core.constants import LOOPBACK
from tunnelspec.core.errors import TaskFailed
from tunnelspec.llama.devices import served_text
from tunnelspec.llama.served_plan import ServedPlan
from tunnelspec.modules.base import Arg, Task, ok, register_task
from tunnelspec.reporting import events


@register_task
class LlamaVerify(Task):
    """Read-only proof that llama-server uses the remote draft: /health ok, one short completion with
    draft tokens generated (and reported accepted), and the journal placing the draft's model buffer on
    the draft node's RPC device. Reports ok or fails with the reason; never "changed"."""

    module = "llama_verify"
    reads_cluster = True
    read_only = True
    # host: llama_server_host — 127.0.0.1 by default; main's own address with the public-bind opt-out,
    # where nothing listens on loopback.
    args = {
        "host": Arg(
            str,
            default=LOOPBACK,
            help="Address llama-server listens on, seen from main (127.0.0.1 unless the public-bind opt-out).",
        ),
        "port": Arg(int, required=True, help="llama-server's port."),
        "plan": Arg(
            dict, required=True, help="The `llama_server` fact (its devices and argv) to check the journal against."
        ),
        "api_key_file": Arg(str, help="The API key file on main, when one is configured."),
        "health_timeout": Arg(
            int, default=0, help="Seconds to wait for /health (llama_server_start_timeout); 0: from the models' sizes."
        ),
        "n_predict": Arg(int, default=32, help="Tokens the test completion generates."),
        "prompt": Arg(
            str,
            default="The quick brown fox jumps over the lazy dog. Once upon a time",
            help="The test completion's prompt.",
        ),
        "journal_timeout": Arg(int, default=30, help="Seconds to wait for the placement line in the journal."),
        "tls_ca_file": Arg(
            str, default="", help="Public bind: the CA certificate (controller path) to pin; empty: plain HTTP."
        ),
        "tls_name": Arg(str, default="", help="Public bind: the name the server's certificate must be valid for."),
        "rejoin_wait": Arg(
            int,
            default=0,
            help="Degraded while the draft node is reachable: seconds to wait for the draft to come "
            "back (deploy: the watcher's steady time and a restart); 0: fail at once (verify).",
        ),
    }

    def _tls(self):
        if not self.p["tls_ca_file"]:
            return None
        if not self.p["tls_name"]:
            raise TaskFailed("tls_ca_file without tls_name: give the name the certificate must be valid for")
        return ApiTls(self.p["tls_ca_file"], self.p["tls_name"])

    def cluster_probes(self, cluster) -> list[list[str]]:
        """The reads of check that its arguments name (the journal of the current run is named by an
        answer: read when asked): the models' sizes, the serving mode (a plan with a degraded mode),
        what the proof reads before the completion decides more."""
        planned = ServedPlan.from_fact(self.p["plan"])
        paths = [] if self.p["health_timeout"] else model_paths(list(planned.argv))
        out = [sizes_argv(paths)] if paths else []
        if planned.has_degraded_mode and cluster is not None:
            out += state_probes(cluster)
        return [*out, *verify_probes(self.p["api_key_file"])]

    async def check(self, ctx):
        planned = ServedPlan.from_fact(self.p["plan"])  # the template boundary: typed from here on
        configured = self.p["health_timeout"]  # 0: from the sizes of the models llama-server loads
        sizes = [] if configured else await model_sizes(ctx.conn, model_paths(list(planned.argv)))
        wait = start_timeout(configured, sizes)
        plan, degraded_note = await self._mode_plan(ctx, planned, wait)
        try:
            result = await self._verify(ctx, plan, wait)
        except TaskFailed:
            # The draft node may have gone while the completion ran: llama-server lost RPC0 and the draft
            # watch serves without it (docs/degraded.md). Say that, not "no draft tokens".
            if degraded_note or not await self._went_degraded(ctx, plan):
                raise
            plan, degraded_note = await self._mode_plan(ctx, planned, wait)
            result = await self._verify(ctx, plan, wait)
        ctx.register("llama_verify", result)
        text = " ".join(result["content"].split())[:120]
        ctx.progress(
            f"completion {text!r}: draft_n={result['draft_n']} draft_n_accepted={result['draft_n_accepted']}",
            **{k: result[k] for k in ("draft_n", "draft_n_accepted", "predicted_per_second")},
        )
        served = _served_devices(ctx, plan)
        if served:
            result["summary"] += f"; devices {served}"
        if degraded_note:
            ctx.emit(events.message(f"WARNING: {ctx.host}: {degraded_note}"))
            return ok(f"{degraded_note}; {result['summary']}")
        return ok(result["summary"])

    async def _verify(self, ctx, plan: ServedPlan, wait: int) -> dict:
        return await verify_server(
            ctx.conn,
            self.p["port"],
            plan,
            host=self.p["host"],
            api_key_file=self.p["api_key_file"],
            health_timeout=wait,
            n_predict=self.p["n_predict"],
            prompt=self.p["prompt"],
            journal_timeout=self.p["journal_timeout"],
            add_secret=ctx.add_secret,
            tls=self._tls(),
            progress=ctx.progress,
        )

    async def _went_degraded(self, ctx, plan: ServedPlan, settle: float = 20.0) -> bool:
        """After a failed proof: has llama-server left speculation because the draft node went away?
        The launcher writes its mode within seconds of the restart; wait up to `settle` for it."""
        if not plan.has_degraded_mode:
            return False
        cluster = ctx.require_cluster()
        for _ in range(int(settle)):
            sv = await serving_state(ctx.conn, cluster)
            if sv["mode"] in _SERVED_WITHOUT:
                return True
            await asyncio.sleep(1.0)  # speculative, or waiting/unknown while the launcher starts again
        return False

    async def _mode_plan(self, ctx, plan: ServedPlan, health_wait: int) -> tuple[ServedPlan, str]:
        """The plan to prove, from the mode llama-server runs in (docs/degraded.md). Speculative or the
        full split: the plan. Degraded (split-degraded) with the node unreachable in this run (a deploy
        while it is away): the target alone (the split without that node), with a warning — the run
        already fails for that node. Otherwise: wait up to `rejoin_wait` for the watcher to bring the
        node back, else fail with the reason."""
        if not plan.has_degraded_mode:
            return plan, ""
        cluster = ctx.require_cluster()
        loop = asyncio.get_running_loop()
        start, next_report = loop.time(), 0.0
        end = start + self.p["rejoin_wait"] + (health_wait if self.p["rejoin_wait"] else 0)
        for _ in range(int(self.p["rejoin_wait"] + health_wait) + 2):
            sv = await serving_state(ctx.conn, cluster)
            if sv["mode"] not in _SERVED_WITHOUT:
                return plan, ""
            node = sv["node"]
            if sv["mode"] == front.DEGRADED:
                alt, label, what = plan.degraded, "DEGRADED", "the target alone, without the draft on " + node
                back, whole = "the draft comes back", "the draft"
            else:
                alt = plan.without.get(node)
                label, what = "SPLIT-DEGRADED", f"the split without {node}"
                back, whole = "the full split comes back", node
            if node in (ctx.vars.get("unreachable_hosts") or []) and alt is not None:
                return alt, (
                    f"{label} since {sv['since']}: serving {what} ({sv['reason']}); {back} by itself "
                    "when the node answers again"
                )
            if loop.time() >= end:
                detail = f" [{sv['detail']}]" if sv.get("detail") else ""
                raise TaskFailed(
                    f"{label} since {sv['since']}: llama-server serves {what}: {sv['reason']}{detail}. "
                    f"Serving continues; {back} by itself once {node} answers steadily "
                    f"({cluster.main.front.rejoin_after} s) and llama-server is idle"
                )
            waited = loop.time() - start
            if waited >= next_report:  # now, then every 10 s: the wait may take a minute or more
                next_report = (int(waited / 10) + 1) * 10.0
                ctx.progress(
                    f"{sv['mode']}: waiting for {whole} on {node} to come back: {waited:.0f} s of "
                    f"{end - start:.0f} s ({sv['reason']})",
                    waiting_for="draft" if sv["mode"] == front.DEGRADED else "node",
                    elapsed_s=round(waited, 1),
                    budget_s=round(end - start),
                )
            await asyncio.sleep(1.0)
        return plan, ""


_SERVED_WITHOUT = (front.DEGRADED, front.SPLIT_DEGRADED)


def _served_devices(ctx, plan: ServedPlan) -> str:
    """What each node in llama-server's --rpc serves, as main names it: `RPC0 = rpc-a Vulkan0 (llvmpipe …,
    23272/24105 MiB free)` — from the rpc nodes' start banners this run read (`rpc_served`)."""
    hostvars = ctx.vars.get("hostvars", {})
    out = []
    for node, names in plan.nodes.items():
        served = (hostvars.get(node) or {}).get("rpc_served")
        if served:
            out.append(f"{node}: {served_text(names, served)}")
    return "; ".join(out)
