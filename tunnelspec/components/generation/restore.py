"""generation_restore (every host): its own part of the picked generation checked again, then the host
back to it — files, `current`, source checkout — with a daemon-reload and a restart of what changed
(tasks.py has the other generation tasks)."""

from __future__ import annotations

import asyncio
import json
import posixpath

from tunnelspec.components.generation import model_ids
from tunnelspec.components.generation import record as gen
from tunnelspec.core.errors import TaskFailed
from tunnelspec.facts.nft import NFT
from tunnelspec.llama import build_plan as bp
from tunnelspec.llama import source_stack as ss
from tunnelspec.modules.base import Arg, Diff, Task, change, ok, register_task

from tunnelspec.components.generation.live import checked, host_state, model_sums, nodes_of, running_exe


@register_task
class GenerationRestore(Task):
    """This host back to the picked generation: serving files, `current`, the source checkout; then a
    daemon-reload and a restart of what changed."""

    module = "generation_restore"
    reads_cluster = True
    args = {"record": Arg(dict, required=True, help="The generation (`generation` from generation_pick).")}

    def _want(self, ctx) -> dict:
        # Checked in check and again in apply, before anything changes: the record is data from main, and
        # this host acts on it as root. Its role and root are then the inventory's (checked equal).
        return checked(self.p["record"], ctx.require_cluster(), ctx.host)

    async def check(self, ctx):
        want = self._want(ctx)
        nodes = nodes_of(ctx.require_cluster(), want["role"])
        live = await host_state(ctx.conn, want["role"], want["root"], nodes)
        if want["role"] == "rpc":
            # The tunnel key's line is restored by its own task for this port (playbooks/rollback.yml).
            ctx.register(
                "generation_rpc_port", gen.recorded_rpc_port(want) or ctx.require_cluster().node(ctx.host).rpc_port
            )
        self._live = live
        diff = gen.host_diff(want, live)
        n = self.p["record"].get("n")
        # Models recorded by identity were compared by generation_pick (model_ids): a refusal there.
        by_id = model_ids.recorded(self.p["record"])
        recorded = {p: s for p, s in gen.model_sums(self.p["record"]).items() if p not in by_id}
        drift = (
            gen.model_drift(self.p["record"], await model_sums(ctx.conn, list(recorded)))
            if want["role"] == "main" and recorded
            else []
        )
        warn = f"; WARNING models are not kept with a generation: {'; '.join(drift)}" if drift else ""
        if not diff:
            return ok(f"at generation {n}{warn}")
        return change(f"back to generation {n}: {', '.join(diff)}{warn}", Diff(live["build"], want["build"]))

    async def apply(self, ctx, ch):
        want, live, run = self._want(ctx), self._live, ctx.conn.run
        files = gen.managed_files(want["role"], want["root"], nodes_of(ctx.require_cluster(), want["role"]))
        restart, reload_, units_changed = set(), set(), False
        await self._preconditions(ctx, want, live, files)
        if want["build"] != live["build"]:
            await run(
                [
                    "sh",
                    "-c",
                    'touch -- "$1/.tunnelspec-used" && ln -sfn -- "$1" "$2.tmp" && mv -Tf -- "$2.tmp" "$2"',
                    "sh",
                    want["build"],
                    posixpath.join(want["root"], "current"),
                ],
                check=True,
            )
            unit = gen.LLAMA_UNIT if want["role"] == "main" else gen.RPC_UNIT
            # A deploy that stopped before its switch (a node's build refused) moved only the link:
            # the process still runs the generation's build and serves on.
            if not gen.runs_build(await running_exe(ctx.conn, unit), want["build"]):
                restart.add(unit)
        for path, (action, unit) in files.items():
            if path not in want["files"]:  # a generation from before tunnelspec kept this file
                continue
            w, have = want["files"].get(path), live["files"].get(path)
            if (w or None) == (have or None):
                continue
            if w is None:
                if path.endswith(".service"):
                    await run(["systemctl", "disable", "--now", posixpath.basename(path)])
                await run(["rm", "-f", "--", path], check=True)
            else:
                src = posixpath.join(gen.FILES_DIR, w["sha256"])
                await run(
                    [
                        "sh",
                        "-c",
                        'install -D -m "$3" -- "$1" "$2.tunnelspec-tmp" && mv -f -- "$2.tunnelspec-tmp" "$2"',
                        "sh",
                        src,
                        path,
                        w["mode"] or "644",
                    ],
                    check=True,
                )
            units_changed |= path.endswith(".service")
            if action == "nft" and w is not None:
                # The generation's rules before any of its services (re)starts below: a port it
                # serves on is guarded from its first connection.
                res = await run([NFT, "-f", path], timeout=30)
                if res.rc != 0:
                    raise TaskFailed(
                        f"{ctx.host}: the isolation rules of generation {self.p['record'].get('n')} "
                        f"did not load: {res.stderr.strip()}"
                    )
            elif action == "source" and w is not None:
                await self._source(ctx, path, want["root"])
            elif action == "restart":
                restart.add(unit)
            elif action == "reload":
                reload_.add(unit)
        if units_changed:
            await run(["systemctl", "daemon-reload"], check=True)
        for unit in sorted(reload_ - restart):
            await run(["systemctl", "reload-or-restart", unit])
        # The tunnels before llama-server: its launcher probes them as it starts.
        for unit in sorted(restart, key=lambda u: (not u.startswith("tunnelspec-tunnel-"), u)):
            if unit == gen.WATCH_UNIT and want["files"].get(f"{gen.UNIT_DIR}/{unit}") is None:
                continue
            res = await run(["systemctl", "restart", unit])
            if res.rc != 0:
                raise TaskFailed(f"{ctx.host}: restart of {unit} failed: {res.stderr.strip()}")
        ctx.progress(
            f"{ctx.host} back to generation {self.p['record'].get('n')}"
            + (f"; restarted {', '.join(sorted(restart))}" if restart else "")
        )

    async def _preconditions(self, ctx, want: dict, live: dict, files: dict) -> None:
        """Everything the switch needs, checked before anything changes: a rollback that cannot be
        whole leaves the host as it is and says why."""
        n, run = self.p["record"].get("n"), ctx.conn.run
        # A directory or a copy itself, never a link to one: `current` and the serving files point at
        # what the deploy made, nothing else.
        if want["build"] != live["build"]:
            if (
                await run(["sh", "-c", '[ -d "$1" ] && [ ! -L "$1" ] && [ -f "$1/$2" ]', "sh", want["build"], bp.STAMP])
            ).rc != 0:
                raise TaskFailed(
                    f"{ctx.host}: the build of generation {n} ({want['build']}) is gone; cannot return "
                    "to it without a build (nothing was changed)"
                )
        for path, (action, _unit) in files.items():
            w = want["files"].get(path)
            if not w or w == live["files"].get(path):
                continue
            src = posixpath.join(gen.FILES_DIR, w["sha256"])
            if (await run(["sh", "-c", '[ -f "$1" ] && [ ! -L "$1" ]', "sh", src])).rc != 0:
                raise TaskFailed(
                    f"{ctx.host}: the copy of {path} for generation {n} ({src}) is missing, or is "
                    "no file of its own (nothing was changed)"
                )
            if action == "source" and not _stack_head(await ctx.conn.get(src)):
                # Its HEAD is checked out afterwards: a commit's hash, never an option or a ref's name.
                raise TaskFailed(
                    f"{ctx.host}: the copy of {path} for generation {n} ({src}) names no commit "
                    "hash as its HEAD (nothing was changed)"
                )
            if action == "nft" and (await run([NFT, "--check", "-f", src], timeout=30)).rc != 0:
                raise TaskFailed(
                    f"{ctx.host}: the isolation rules of generation {n} do not load here any more (nothing was changed)"
                )
            if path == gen.FRONT_CONFIG:
                # It may name files that are no longer there (a TLS certificate, a metrics token).
                res = await run(["/usr/sbin/haproxy", "-c", "-q", "-f", src])
                if res.rc != 0:
                    raise TaskFailed(
                        f"{ctx.host}: the front configuration of generation {n} does not validate here "
                        f"any more (nothing was changed): {(res.stderr or res.stdout).strip()[-600:]}"
                    )

    async def _source(self, ctx, stack_path: str, root: str) -> None:
        """The checkout back at the generation's HEAD (its commits are still in the repository: the
        HEAD's reflog keeps them), so the next deploy's source check sees the stack it recorded."""
        head = _stack_head(await ctx.conn.get(stack_path))
        if not head:
            return
        src = posixpath.join(root, "src", "llama.cpp")
        for attempt in range(_LOCK_TRIES):
            res = await ctx.conn.run(
                ["git", *ss.GIT_CONFIG_ARGS, "-C", src, "checkout", "--quiet", "--detach", "--force", head]
            )
            if res.rc == 0 or "index.lock" not in res.stderr or attempt == _LOCK_TRIES - 1:
                break
            # Another git process holds the index for a moment (someone's `git status` there).
            await asyncio.sleep(_LOCK_WAIT_S)
        if res.rc != 0:
            raise TaskFailed(f"{ctx.host}: cannot check out {head[:12]} in {src} again: {res.stderr.strip()}")
        await ctx.conn.run(["git", *ss.GIT_CONFIG_ARGS, "-C", src, "update-ref", "refs/tunnelspec/stack", head])


# A checkout that finds the index locked by another git process waits this long, this many times.
_LOCK_TRIES, _LOCK_WAIT_S = 6, 0.5


def _stack_head(raw: bytes | None) -> str | None:
    """The HEAD a stack record names, when it is a commit's hash (sha1 or sha256)."""
    try:
        head = json.loads(raw or b"{}").get("head")
    except (ValueError, AttributeError):
        return None
    return head if isinstance(head, str) and gen.COMMIT.fullmatch(head) else None
