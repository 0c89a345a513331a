"""Generations on the hosts (tunnelspec/components/generation/record.py is the pure part; docs/generations.md).

generation_record (main, the deploy's last step, after verify): the live state of every host — where
`current` points, the serving files by sha256, the source's stack record — compared with the current
generation; a new state is recorded as generation N+1 (copies of the files kept on each host, the
build keys pinned against pruning), a state equal to a kept generation makes that one current again.
generation_pick (main): the generation a rollback returns to, every host's part held to what the deploy
writes there (record.validate_host_record) and its build to the known-vulnerable gate; registers `generation`.
generation_restore (every host; restore.py): its own part checked again, then the host back to the
picked generation — files, `current`, source checkout — with a daemon-reload and a restart of what changed.
generation_current (main): the picked generation becomes the current one.
The records on main and their reading: store.py; a host's live state as a record holds it: live.py.
"""

from __future__ import annotations

import posixpath

from tunnelspec.components.generation import model_ids
from tunnelspec.components.generation import record as gen
from tunnelspec.core.errors import TaskFailed
from tunnelspec.llama import advisories
from tunnelspec.modules.base import Arg, Diff, Task, change, ok, register_task
from tunnelspec.components.generation.live import (
    checked,
    host_state_argv,
    hosts_of,
    live_state,
    main_state_probes,
    model_proofs,
    model_proofs_probe,
    nodes_of,
    recordable,
    stamped_build_number,
)
from tunnelspec.components.models.files import PROOFS, parts_of, read_proofs
from tunnelspec.components.generation.store import (
    PRUNE_SCRIPT,
    RECORDS_ARGV,
    STATUS_ARGV,
    STORE_SCRIPT,
    publish,
    published,
    read_records,
)


@register_task
class GenerationRecord(Task):
    """After verify: record the cluster's state as a generation on main when it differs from the current one."""

    module = "generation_record"
    reads_cluster = True
    args = {
        "keep": Arg(
            int,
            default=gen.DEFAULT_KEEP,
            help="Generations kept (`tunnelspec_keep_generations`); their builds are never pruned.",
        ),
        "tree": Arg(str, default="", help="The source tree hash (`llama_src.tree`)."),
        "commit": Arg(str, default="", help="The pinned llama.cpp commit."),
        "patches": Arg(list, default=[], help="The patch stack as applied (`llama_src.patches`)."),
        "models": Arg(
            list, default=[], help="The model paths llama-server loads (their sha256 recorded as model_proof kept it)."
        ),
        "sources": Arg(
            list,
            default=[],
            help="The inventory's setting of each model (`models`' order): a path on the host, a controller "
            "file or a `hf://` reference (what a refused return says puts it back).",
        ),
        "plan": Arg(dict, default={}, help="The `llama_server` fact: what a rollback verifies against."),
    }

    def _sources(self) -> dict[str, str]:
        """{every part of each model: the inventory's setting of it}."""
        srcs = [*self.p["sources"], *([""] * len(self.p["models"]))][: len(self.p["models"])]
        pairs = zip(self.p["models"], srcs, strict=True)
        return {part: str(src or "") for path, src in pairs if path for part in parts_of(str(path))}

    def probes(self) -> list[list[str]]:
        return [RECORDS_ARGV, STATUS_ARGV, *model_proofs_probe(self.p["models"])]

    def cluster_probes(self, cluster) -> list[list[str]]:
        return [*self.probes(), *(main_state_probes(cluster) if cluster is not None else [])]

    def remote_probes(self, cluster, host: str) -> dict[str, list[list[str]]]:
        # The live state of every other host, each read on its own connection (`live_state`).
        if cluster is None:
            return {}
        return {
            name: [host_state_argv(role, root, nodes_of(cluster, role))]
            for name, role, root in hosts_of(cluster)
            if name != host
        }

    async def check(self, ctx):
        records, current = await read_records(ctx.conn)
        live = await live_state(ctx)
        cluster = ctx.require_cluster()
        for name, st in live.items():
            recordable(name, st, nodes_of(cluster, st["role"]))
        proofs = await model_proofs(ctx.conn, self.p["models"])
        sums = {p: proof.get("sha256") for p, proof in proofs.items()}
        ids = model_ids.entries(proofs, self._sources())
        self._records, self._live, self._sums, self._ids = records, live, sums, ids
        self._serve = gen.serve_of(ctx.require_cluster())
        state = {"hosts": live, "model_sha256": sums, "serve": gen.serve_of(ctx.require_cluster())}
        if current is not None and gen.same_state(records[current], state):
            if await published(ctx.conn) != current:
                # Recorded before the metrics' status file existed, or the file was lost.
                return change(
                    f"generation {current} published for the metrics ({gen.STATUS})",
                    Diff("", str(current)),
                    n=current,
                    publish_only=True,
                )
            if ids and not model_ids.recorded(records[current]):
                # Recorded before the models' identity was kept: added to it (the files are the ones
                # it recorded, by their sha256), so that a return to it compares them.
                return change(
                    f"generation {current}: its models' size, mtime and header digest recorded",
                    Diff("", ", ".join(ids)),
                    n=current,
                    identify=True,
                )
            return ok(gen.summary(records[current]) + " (current)")
        same = gen.find_same(list(records.values()), state)
        if same is not None:
            return change(f"generation {same} current again (was {current})", Diff(str(current), str(same)), n=same)
        n = gen.next_number(list(records))
        what = (
            ""
            if current is None
            else "; ".join(
                [
                    *(
                        f"{h}: {', '.join(d)}"
                        for h, s in live.items()
                        if (d := gen.host_diff(records[current]["hosts"].get(h, {}), s))
                    ),
                    *gen.models_diff(gen.model_sums(records[current]), sums),
                ]
            )
        )
        return change(
            f"record generation {n}" + (f" ({what})" if what else " (the first)"),
            Diff(str(current), str(n)),
            n=n,
            new=True,
        )

    async def apply(self, ctx, ch):
        n, records = ch.data["n"], dict(self._records)
        if ch.data.get("publish_only"):
            await publish(ctx.conn, n)
            return
        if ch.data.get("identify"):
            await ctx.conn.put(gen.dumps({**records[n], model_ids.KEY: self._ids}), f"{gen.GEN_DIR}/{n}.json", 0o600)
            return
        if ch.data.get("new"):
            for name, st in self._live.items():
                conn = ctx.conn if name == ctx.host else await ctx.connection_to(name)
                pairs = [x for path, f in st["files"].items() if f for x in (f["sha256"], path)]
                await conn.run(["sh", "-c", STORE_SCRIPT, "sh", gen.FILES_DIR, *pairs], check=True)
            records[n] = {
                "schema": gen.SCHEMA,
                "n": n,
                "tree": self.p["tree"],
                "commit": self.p["commit"],
                "patches": self.p["patches"],
                "models": self.p["models"],
                "plan": self.p["plan"],
                "hosts": self._live,
                "model_sha256": self._sums,
                model_ids.KEY: self._ids,
                "serve": self._serve,
            }
            await ctx.conn.run(["install", "-d", "-m", "700", "--", gen.GEN_DIR], check=True)
            await ctx.conn.put(gen.dumps(records[n]), f"{gen.GEN_DIR}/{n}.json", 0o600)
        await ctx.conn.put(f"{n}\n", gen.CURRENT, 0o600)
        await publish(ctx.conn, n)
        keep = gen.kept(list(records), self.p["keep"], n)
        gone = sorted(set(records) - set(keep))
        if gone:
            await ctx.conn.run(["rm", "-f", "--", *(f"{gen.GEN_DIR}/{g}.json" for g in gone)], check=True)
            ctx.progress(f"generation(s) {', '.join(map(str, gone))} removed (keep {self.p['keep']})")
        await prune_hosts(ctx, [records[k] for k in keep])


async def prune_hosts(ctx, kept_records: list[dict]) -> None:
    """Per host: the build keys kept generations use, pinned; file copies none uses, removed."""
    cluster = ctx.require_cluster()
    for name, _role, root in hosts_of(cluster):
        conn = ctx.conn if name == ctx.host else await ctx.connection_to(name)
        args = [
            *gen.pinned_builds(kept_records, name),
            *(f"sha:{s}" for s in sorted(gen.used_files(kept_records, name))),
        ]
        await conn.run(
            ["sh", "-c", PRUNE_SCRIPT, "sh", posixpath.join(root, "build", gen.PINS), gen.FILES_DIR, *args], check=True
        )


@register_task
class GenerationPick(Task):
    """The generation a rollback returns to (the current one, or `to`); registers `generation`."""

    module = "generation_pick"
    read_only = True
    reads_cluster = True
    args = {
        "to": Arg(int, default=0, help="The generation's number; 0: the current (last verified) one."),
        "vulnerable": Arg(
            str,
            default="refuse",
            choices=("refuse", "warn"),
            help="A generation whose build is in a known-vulnerable range "
            "(`tunnelspec advisories`): `refuse` it unless --allow-vulnerable-llama, or "
            "`warn` (a failed deploy's return to what served before it).",
        ),
        "cache": Arg(str, default=PROOFS, help="Where model_proof keeps each model's proof on main."),
    }

    async def check(self, ctx):
        records, current = await read_records(ctx.conn)
        if not records:
            raise TaskFailed(
                f"no generation recorded on {ctx.host} yet: a deploy records one when it passes "
                "verify; there is nothing to return to"
            )
        n = self.p["to"] or current or max(records)
        if n not in records:
            raise TaskFailed(f"generation {n} is not kept on {ctx.host}; kept: {', '.join(map(str, sorted(records)))}")
        record, cluster = records[n], ctx.require_cluster()
        if not isinstance(record, dict) or not isinstance(record.get("hosts"), dict):
            raise TaskFailed(f"generation {n} on {ctx.host} is damaged: no record of its hosts (nothing was changed)")
        # Every host's part checked here, on main, before any host changes anything; each host checks
        # its own part again before it acts (generation_restore).
        for name, _role, _root in hosts_of(cluster):
            if name in record["hosts"]:
                checked(record, cluster, name)
        note = await self._models(ctx, record) + await self._advisory(ctx, record)
        ctx.register("generation", record)
        ctx.register("generation_serve", gen.recorded_serve(record, cluster))
        ctx.register("generation_current", current)
        return ok(gen.summary(record) + (" (current)" if n == current else f" (current: {current})") + note)

    async def _models(self, ctx, record: dict) -> str:
        """Each model the generation served, by identity (model_ids): another file at its path now is
        refused here, before any host changes anything; a touched one is a warning. A record from before
        the identities were kept has none: restore.py warns by sha256 as it always did."""
        want = model_ids.recorded(record)
        if not want:
            return ""
        try:
            proofs = await read_proofs(ctx.conn, ctx.host, sorted(want), self.p["cache"])
        except TaskFailed as e:
            raise TaskFailed(f"the models of generation {record.get('n')}: {e} (nothing was changed)") from None
        refusal, warnings = model_ids.verdict(record, proofs, ctx.host)
        if refusal:
            raise TaskFailed(refusal)
        return "".join(f"; WARNING {w}" for w in warnings)

    async def _advisory(self, ctx, record: dict) -> str:
        """The deploy's known-vulnerable gate (components/build/build.py), for the build the generation
        brings back. The record holds no build number; the build's stamp does (written by llama_build).
        Main's stands for the cluster's: every host builds the same source, its build number included
        (cluster/model.py refuses hosts whose source settings differ)."""
        want = record["hosts"].get(ctx.host) or {}
        number = await stamped_build_number(ctx.conn, want["build"]) if want.get("build") else None
        result = advisories.check(number, rdma=False)
        if result.verdict in (advisories.AFFECTED, advisories.POSSIBLE):
            if self.p["vulnerable"] == "warn":
                # Refusing would leave a failed deploy's hosts half switched; this build served until it started.
                return (
                    "; WARNING returning to the known-vulnerable build that served before the deploy: " + result.message
                )
            if advisories.ACCEPT_VULNERABLE not in ctx.options.accepted:
                raise TaskFailed(
                    f"refusing to return to generation {record.get('n')}: its build is a known-vulnerable "
                    f"llama.cpp build: {result.message} (nothing was changed); pick another generation "
                    "(`tunnelspec status` lists them), deploy a fixed commit, or pass "
                    "--allow-vulnerable-llama"
                )
            return f"; WARNING known-vulnerable build allowed by --allow-vulnerable-llama: {result.message}"
        if result.verdict == advisories.UNKNOWN:
            return (
                "; WARNING build number unknown (its build's stamp names none): known-vulnerable RPC builds "
                "cannot be ruled out"
            )
        return f"; {result.message}" if result.verdict == advisories.MITIGATED else ""


@register_task
class GenerationCurrent(Task):
    """The picked generation becomes the current one on main (after it verified)."""

    module = "generation_current"
    args = {"n": Arg(int, required=True, help="The generation's number.")}

    async def check(self, ctx):
        _records, current = await read_records(ctx.conn)
        if current == self.p["n"]:
            return ok(f"generation {current} is current")
        return change(f"generation {self.p['n']} current (was {current})", Diff(str(current), str(self.p["n"])))

    async def apply(self, ctx, ch):
        await ctx.conn.put(f"{self.p['n']}\n", gen.CURRENT, 0o600)
        await publish(ctx.conn, self.p["n"], rollback=True)


@register_task
class GenerationRollbackCounted(Task):
    """Count a failed deploy's automatic return to generation `n` for the metrics (gen.STATUS), once
    per `event` (commands/rollback.py names each return): run again with the same event, it is counted already.
    playbooks/rollback.yml runs it only in the real rollback after a failed deploy (`rollback_event`),
    never in `--check` or in `tunnelspec rollback` (which counts through generation_current when the
    generation changes)."""

    module = "generation_rollback_counted"
    args = {
        "n": Arg(int, required=True, help="The generation returned to."),
        "event": Arg(str, required=True, help="This return's name (`rollback_event`): counted once."),
    }

    def probes(self) -> list[list[str]]:
        return [STATUS_ARGV]

    async def check(self, ctx):
        doc = gen.parse_status((await ctx.conn.probe(STATUS_ARGV)).stdout)
        if doc.get("last_rollback_event") == self.p["event"]:
            return ok(f"return to generation {self.p['n']} counted")
        return change(f"return to generation {self.p['n']} counted ({gen.STATUS})")

    async def apply(self, ctx, ch):
        await publish(ctx.conn, self.p["n"], rollback=True, event=self.p["event"])
