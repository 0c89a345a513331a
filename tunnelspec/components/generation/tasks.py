"""Generations on the hosts (tunnelspec/components/generation/record.py is the pure part; docs/generations.md).

generation_record (main, the deploy's last step, after verify): the live state of every host — where
`current` points, the serving files by sha256, the source's stack record — compared with the current
generation; a new state is recorded as generation N+1 (copies of the files kept on each host, the
build keys pinned against pruning), a state equal to a kept generation makes that one current again.
generation_pick (main): the generation a rollback returns to, every host's part held to what the deploy
writes there (record.validate_host_record) and its build to the known-vulnerable gate; registers `generation`.
generation_restore (every host): its own part checked again, then the host back to the picked generation —
files, `current`, source checkout — with a daemon-reload and a restart of what changed.
generation_current (main): the picked generation becomes the current one.
"""

from __future__ import annotations

import json
import posixpath
import time

from tunnelspec.components.generation import record as gen
from tunnelspec.core.errors import TaskFailed
from tunnelspec.facts.nft import NFT
from tunnelspec.llama import advisories
from tunnelspec.llama import build_plan as bp
from tunnelspec.llama import source_stack as ss
from tunnelspec.modules.base import Arg, Diff, Task, change, ok, register_task
from tunnelspec.components.models.files import parse_proofs, parts_of, proof_argv

# Every record on main, one per block: `--- <N>` then its JSON; then `--- current <N>`.
_RECORDS = r"""
d=$1
for f in "$d"/*.json; do [ -f "$f" ] || continue; n=${f##*/}; printf -- '--- %s\n' "${n%.json}"; cat -- "$f"; echo; done
printf -- '--- current %s\n' "$(cat -- "$d/current" 2>/dev/null)"
"""

# The copies of a host's serving files, each named by its sha256. Never through a link: a path that is
# one now is refused, and the sum is taken of the copy itself, so a file swapped for a link (or changed)
# between the state read and the copy is refused too, never kept under the sum of what it replaced.
_STORE = r"""
store=$1; shift
install -d -m 700 -- "$store"
while [ $# -gt 1 ]; do
  sha=$1; f=$2; shift 2
  [ -e "$store/$sha" ] && continue
  if [ -L "$f" ] || [ ! -f "$f" ]; then
    echo "$f is not a regular file (a link or another kind): not copied" >&2; exit 4
  fi
  install -m 600 -- "$f" "$store/$sha.tmp" || exit 4
  got=$(sha256sum < "$store/$sha.tmp" | cut -d' ' -f1)
  [ "$got" = "$sha" ] || { rm -f -- "$store/$sha.tmp"; echo "$f changed while it was recorded" >&2; exit 4; }
  mv -f -- "$store/$sha.tmp" "$store/$sha"
done
"""

# Pins for the build pruning, then the file copies no kept generation uses removed.
_PRUNE = r"""
pins=$1; store=$2; shift 2
keys=; for a in "$@"; do case $a in sha:*) ;; *) keys="$keys$a
";; esac; done
[ -d "${pins%/*}" ] && printf '%s' "$keys" > "$pins.tmp" && mv -f -- "$pins.tmp" "$pins"
cd -- "$store" 2>/dev/null || exit 0
for f in *; do
  [ -f "$f" ] || continue
  case " $* " in *" sha:$f "*) ;; *) rm -f -- "$f";; esac
done
"""


def parse_records(text: str) -> tuple[dict[int, dict], int | None]:
    records: dict[int, dict] = {}
    buf: list[str] = []
    current, n = None, None

    def flush():
        if n is not None and "".join(buf).strip():
            try:
                records[n] = json.loads("".join(buf))
            except ValueError:
                pass  # a damaged record is no record

    for line in text.splitlines(keepends=True):
        if line.startswith("--- current"):
            flush()
            n, buf = None, []
            value = line.split()[-1] if len(line.split()) > 2 else ""
            current = int(value) if value.isdigit() else None
        elif line.startswith("--- "):
            flush()
            key = line[4:].strip()
            n, buf = (int(key) if key.isdigit() else None), []
        else:
            buf.append(line)
    flush()
    return records, (current if current in records else None)


RECORDS_ARGV = ["sh", "-c", _RECORDS, "sh", gen.GEN_DIR]
STATUS_ARGV = ["cat", "--", gen.STATUS]


async def publish(conn, n: int, rollback: bool = False, event: str = "") -> None:
    """Generation `n` is current: the metrics exporter's figures (gen.STATUS) say so, and count a
    return to it when `rollback`."""
    prev = gen.parse_status((await conn.run(["cat", "--", gen.STATUS])).stdout)
    await conn.put(gen.status_text(gen.next_status(prev, n, time.time(), rollback, event)), gen.STATUS, 0o644)


async def published(conn) -> int | None:
    """The generation gen.STATUS names (None: no file, or a damaged one)."""
    n = gen.parse_status((await conn.probe(STATUS_ARGV)).stdout).get("generation")
    return n if isinstance(n, int) else None


async def read_records(conn) -> tuple[dict[int, dict], int | None]:
    res = await conn.probe(RECORDS_ARGV)
    return parse_records(res.stdout)


def _hosts(cluster) -> list[tuple[str, str, str]]:
    """(name, role, root) of every host serving touches: main first."""
    return [(cluster.main.name, "main", cluster.main.root), *((n.name, "rpc", n.root) for n in cluster.rpc)]


def _nodes(cluster, role: str) -> tuple[str, ...]:
    """The rpc nodes whose tunnel units main keeps in a generation (none on a node)."""
    return tuple(n.name for n in cluster.rpc) if role == "main" else ()


def checked(record, cluster, host: str) -> dict:
    """`host`'s part of generation `record`, held to what the deploy itself writes there
    (gen.validate_host_record) with the role and root the inventory gives the host, never the record's;
    refused before anything changes."""
    n = record.get("n") if isinstance(record, dict) else None
    where = {name: (role, root) for name, role, root in _hosts(cluster)}.get(host)
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
        gen.validate_host_record(want, *where, host, n, _nodes(cluster, where[0]))
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


async def host_state(conn, role: str, root: str, nodes: tuple[str, ...] = ()) -> dict:
    files = gen.managed_files(role, root, nodes)
    res = await conn.probe(["sh", "-c", gen.STATE_SCRIPT, "sh", root, *files], check=True)
    return {"role": role, "root": root, **gen.parse_state(res.stdout)}


_RUNNING = r"""
pid=$(systemctl show -p MainPID --value "$1" 2>/dev/null)
[ "${pid:-0}" != 0 ] && readlink -- "/proc/$pid/exe"
exit 0
"""


async def running_exe(conn, unit: str) -> str:
    """The executable `unit`'s main process runs ('' when none)."""
    return (await conn.probe(["sh", "-c", _RUNNING, "sh", unit])).stdout.strip()


async def model_sums(conn, paths: list[str]) -> dict[str, str | None]:
    """{path: sha256} of the models on main (every part of a split one) as model_proof kept it; None
    for a file not proven, or changed since. Read-only and cheap: a file is not read again."""
    paths = sorted({part for p in paths if p for part in parts_of(p)})
    if not paths:
        return {}
    got = parse_proofs((await conn.probe(proof_argv("check", paths), timeout=300)).stdout)
    return {p: (got.get(p) or {}).get("sha256") for p in paths}


async def live_state(ctx) -> dict:
    cluster = ctx.require_cluster()
    out = {}
    for name, role, root in _hosts(cluster):
        conn = ctx.conn if name == ctx.host else await ctx.connection_to(name)
        out[name] = await host_state(conn, role, root, _nodes(cluster, role))
        if role == "rpc":
            # As data (a port), what the node's tunnel key and its tunnel on main forward to: a
            # return re-renders the key's line for it (the key itself may have been rotated since).
            out[name]["rpc_port"] = cluster.node(name).rpc_port
    return out


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
        "plan": Arg(dict, default={}, help="The `llama_server` fact: what a rollback verifies against."),
    }

    def probes(self) -> list[list[str]]:
        return [RECORDS_ARGV, STATUS_ARGV]

    async def check(self, ctx):
        records, current = await read_records(ctx.conn)
        live = await live_state(ctx)
        cluster = ctx.require_cluster()
        for name, st in live.items():
            recordable(name, st, _nodes(cluster, st["role"]))
        sums = await model_sums(ctx.conn, self.p["models"])
        self._records, self._live, self._sums = records, live, sums
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
        if ch.data.get("new"):
            for name, st in self._live.items():
                conn = ctx.conn if name == ctx.host else await ctx.connection_to(name)
                pairs = [x for path, f in st["files"].items() if f for x in (f["sha256"], path)]
                await conn.run(["sh", "-c", _STORE, "sh", gen.FILES_DIR, *pairs], check=True)
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
    for name, _role, root in _hosts(cluster):
        conn = ctx.conn if name == ctx.host else await ctx.connection_to(name)
        args = [
            *gen.pinned_builds(kept_records, name),
            *(f"sha:{s}" for s in sorted(gen.used_files(kept_records, name))),
        ]
        await conn.run(
            ["sh", "-c", _PRUNE, "sh", posixpath.join(root, "build", gen.PINS), gen.FILES_DIR, *args], check=True
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
        for name, _role, _root in _hosts(cluster):
            if name in record["hosts"]:
                checked(record, cluster, name)
        note = await self._advisory(ctx, record)
        ctx.register("generation", record)
        ctx.register("generation_serve", gen.recorded_serve(record, cluster))
        ctx.register("generation_current", current)
        return ok(gen.summary(record) + (" (current)" if n == current else f" (current: {current})") + note)

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
        nodes = _nodes(ctx.require_cluster(), want["role"])
        live = await host_state(ctx.conn, want["role"], want["root"], nodes)
        if want["role"] == "rpc":
            # The tunnel key's line is restored by its own task for this port (playbooks/rollback.yml).
            ctx.register(
                "generation_rpc_port", gen.recorded_rpc_port(want) or ctx.require_cluster().node(ctx.host).rpc_port
            )
        self._live = live
        diff = gen.host_diff(want, live)
        n = self.p["record"].get("n")
        recorded = gen.model_sums(self.p["record"])
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
        files = gen.managed_files(want["role"], want["root"], _nodes(ctx.require_cluster(), want["role"]))
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
        res = await ctx.conn.run(
            ["git", *ss.GIT_CONFIG_ARGS, "-C", src, "checkout", "--quiet", "--detach", "--force", head]
        )
        if res.rc != 0:
            raise TaskFailed(f"{ctx.host}: cannot check out {head[:12]} in {src} again: {res.stderr.strip()}")
        await ctx.conn.run(["git", *ss.GIT_CONFIG_ARGS, "-C", src, "update-ref", "refs/tunnelspec/stack", head])


def _stack_head(raw: bytes | None) -> str | None:
    """The HEAD a stack record names, when it is a commit's hash (sha1 or sha256)."""
    try:
        head = json.loads(raw or b"{}").get("head")
    except (ValueError, AttributeError):
        return None
    return head if isinstance(head, str) and gen.COMMIT.fullmatch(head) else None


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
