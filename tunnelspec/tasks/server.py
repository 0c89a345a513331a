"""llama-server on the main host: models in place, RPC device discovery, the command line from the
build's own --help, daemon-reload when needed, and the read-only verify step.

See ../llama/server_args.py for the argv rules and the journal evidence, ../llama/http.py for the
HTTP client that reaches 127.0.0.1 on the main host through the controller's SSH connection.
"""

from __future__ import annotations

import asyncio

import hashlib
import json
import os
import re
import weakref
from pathlib import Path

from tunnelspec.constants import LOOPBACK, STATE_DIR
from tunnelspec.errors import TaskFailed
from tunnelspec.llama import flags, http, preflight, props, server_death
from tunnelspec.connection.upload import upload_file
from tunnelspec.models import hub
from tunnelspec.llama.server_args import (UNIT, build_server_argv, draft_placement, list_devices_argv,
                                          systemd_exec, tunnel_unit)
from tunnelspec.secrets import Secret
from tunnelspec.tasks.base import Arg, Task, change, ok, register_task

MODELS_DIR = f"{STATE_DIR}/models"
DEVICES_CACHE = f"{STATE_DIR}/rpc-devices.json"
UPLOAD_CHUNK = 8 * 2**20
_SHA_CACHE: dict[tuple, str] = {}  # (path, size, mtime) -> sha256: hash a big model once per run
# run -> {(host, upload destination): controller file}: what this run already uploads where.
_CLAIMED: "weakref.WeakKeyDictionary[object, dict[tuple[str, str], str]]" = weakref.WeakKeyDictionary()


def _local_sha256(path: Path) -> str:
    st = path.stat()
    key = (str(path), st.st_size, st.st_mtime_ns)
    if key not in _SHA_CACHE:
        h = hashlib.sha256()
        with path.open("rb") as f:
            for block in iter(lambda: f.read(2**20), b""):
                h.update(block)
        _SHA_CACHE[key] = h.hexdigest()
    return _SHA_CACHE[key]


async def _remote_sha256(conn, path: str) -> str | None:
    res = await conn.run(["sh", "-c", '[ -f "$1" ] || exit 3; sha256sum < "$1"', "sh", path])
    return res.stdout.split()[0] if res.rc == 0 and res.stdout.strip() else None


@register_task
class ModelFile(Task):
    """A GGUF file on the host: used in place when `src` exists there, else uploaded once from the
    controller into `dest_dir` (sha256 compared, chunked with progress, atomic rename). Registers
    the path on the host as fact `fact`."""

    module = "model_file"
    args = {"src": Arg(str, required=True), "dest_dir": Arg(str, default=MODELS_DIR),
            "fact": Arg(str, required=True)}

    def _local(self, ctx) -> Path | None:
        p = Path(self.p["src"]).expanduser()
        if not p.is_absolute():
            p = ctx.controller.inventory.path.parent / p
        return p if p.is_file() else None

    def _dest(self) -> str:
        return f"{self.p['dest_dir'].rstrip('/')}/{Path(self.p['src']).name}"

    async def check(self, ctx):
        src = self.p["src"]
        if hub.is_hub_ref(src):
            return await self._check_hub(ctx)
        if src.startswith("/") and (await ctx.conn.run(["test", "-f", src])).rc == 0:
            # Already on the host (a shared mount, a pre-staged file, or the controller is the host).
            ctx.register(self.p["fact"], src)
            return ok(f"{src} present on the host")
        local = self._local(ctx)
        if local is None:
            raise TaskFailed(f"model {src} is neither a file on {ctx.host} nor on the controller")
        dest = self._dest()
        claimed = _CLAIMED.setdefault(ctx.controller, {}).setdefault((ctx.host, dest), str(local))
        if claimed != str(local):
            # Two controller files with one name (target and draft from different directories) would
            # overwrite each other on every deploy, and both would load the last one uploaded.
            raise TaskFailed(f"{local} and {claimed} would both be uploaded to {dest} on {ctx.host}: "
                             "give the models different file names")
        ctx.register(self.p["fact"], dest)
        want = _local_sha256(local)
        got = await _remote_sha256(ctx.conn, dest)
        if got == want:
            return ok(f"{dest} up to date (sha256 {want[:12]})")
        size = local.stat().st_size
        return change(f"upload {local} → {dest} ({size / 2**20:.1f} MiB)", local=str(local), sha256=want)

    async def _check_hub(self, ctx):
        """hf://…@SHA: compared with what the Hub reports (no download when the host has it)."""
        var = self.p["fact"].removesuffix("_path")
        for name in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN"):
            if os.environ.get(name):
                ctx.add_secret(os.environ[name])  # masked in every message of the run, whatever prints it
        try:
            ref = hub.parse_ref(self.p["src"])
        except hub.HubRefError as err:
            raise TaskFailed(f"{var}: {err}") from None
        files = await asyncio.to_thread(hub.resolve, ref, var)
        dir_ = self.p["dest_dir"].rstrip("/")
        claims = _CLAIMED.setdefault(ctx.controller, {})
        todo = []
        for f in files:
            dest = f"{dir_}/{f.name}"
            claimed = claims.setdefault((ctx.host, dest), f"{ref.repo_id}/{f.path}@{ref.revision}")
            if claimed != f"{ref.repo_id}/{f.path}@{ref.revision}":
                raise TaskFailed(f"{var}: {ref} and {claimed} would both be uploaded to {dest} on {ctx.host}: "
                                 "give the models different file names")
            if await _remote_sha256(ctx.conn, dest) != f.sha256:
                todo.append((f, dest))
        ctx.register(self.p["fact"], f"{dir_}/{files[0].name}")
        if not todo:
            return ok(f"{dir_}/{files[0].name} up to date ({len(files)} file(s), sha256 as the Hub reports "
                      f"at {ref.revision[:12]})")
        size = sum(f.size for f, _ in todo) / 2**20
        return change(f"download {ref} ({len(todo)} file(s), {size:.1f} MiB), verify, upload → {dir_}",
                      hub=[(f.path, f.size, f.sha256, dest) for f, dest in todo])

    async def apply(self, ctx, ch):
        if "hub" in ch.data:
            var = self.p["fact"].removesuffix("_path")
            ref = hub.parse_ref(self.p["src"])
            files = [hub.HubFile(path=p, size=size, sha256=sha) for p, size, sha, _ in ch.data["hub"]]
            # Every part downloaded and verified before the first byte goes to the host.
            locals_ = await hub.download(ref, files, var, lambda msg, pct: ctx.progress(msg, percent=pct))
            await ctx.conn.run(["install", "-d", "-m", "755", "--", self.p["dest_dir"]], check=True)
            for local, f, (_, _, _, dest) in zip(locals_, files, ch.data["hub"]):
                await upload_file(ctx.conn, local, dest, f.sha256,
                                  progress=lambda msg, pct: ctx.progress(msg, percent=pct))
            return
        local, want, dest = Path(ch.data["local"]), ch.data["sha256"], self._dest()
        await ctx.conn.run(["install", "-d", "-m", "755", "--", self.p["dest_dir"]], check=True)
        await upload_file(ctx.conn, local, dest, want, progress=lambda msg, pct: ctx.progress(msg, percent=pct))


@register_task
class ModelsPrune(Task):
    """Uploaded models the inventory no longer names: removed from tunnelspec's upload directory
    (models are gigabytes; switching models would otherwise fill the disk). Only regular files
    directly in `dir`, never one of `keep` (the models this deploy uses, wherever they are), never an
    upload in progress. Files elsewhere on the host are never touched."""

    module = "models_prune"
    args = {"keep": Arg(list, required=True), "dir": Arg(str, default=MODELS_DIR)}

    async def _stale(self, ctx) -> list[tuple[str, int]]:
        d = self.p["dir"].rstrip("/")
        res = await ctx.conn.run(["sh", "-c", '[ -d "$1" ] || exit 0; find "$1" -maxdepth 1 -type f -printf "%s %f\\0"',
                                  "sh", d], check=True)
        keep = {str(k) for k in self.p["keep"] if k}
        # The other parts of a kept split GGUF are kept too (llama.cpp opens them by name).
        keep |= {f"{k.rsplit('/', 1)[0]}/{p}" for k in list(keep) for p in hub.split_parts(k.rsplit("/", 1)[-1])}
        out = []
        for rec in res.stdout.split("\0"):
            if not rec:
                continue
            size, _, name = rec.partition(" ")
            path = f"{d}/{name}"
            if path in keep or name.endswith(".tunnelspec-upload"):
                continue
            out.append((path, int(size)))
        return sorted(out)

    async def check(self, ctx):
        stale = await self._stale(ctx)
        if not stale:
            return ok("no uploaded model left over")
        total = sum(s for _, s in stale)
        return change(f"remove {len(stale)} uploaded model(s) no longer in the inventory "
                      f"({', '.join(p for p, _ in stale)}; {total / 2**20:.1f} MiB)", paths=[p for p, _ in stale])

    async def apply(self, ctx, ch):
        await ctx.conn.run(["rm", "-f", "--", *ch.data["paths"]], check=True)


@register_task
class ApiKeyFile(Task):
    """The API key file (written by the user) readable by llama-server's user only: owner and mode
    0600 enforced, content never read into a diff."""

    module = "api_key_file"
    args = {"path": Arg(str, required=True), "owner": Arg(str, required=True)}

    async def check(self, ctx):
        res = await ctx.conn.run(["stat", "-c", "%a %U %s", "--", self.p["path"]])
        if res.rc != 0:
            raise TaskFailed(f"llama_server_api_key_file {self.p['path']} does not exist on {ctx.host}; "
                             "write the key there (one line) first")
        mode, owner, size = res.stdout.split()
        if int(size) == 0:
            raise TaskFailed(f"API key file {self.p['path']} is empty")
        if (mode, owner) != ("600", self.p["owner"]):
            return change(f"{self.p['path']}: mode {mode} owner {owner} → 600 {self.p['owner']}")
        # Owner and mode are not enough: every parent directory must let the user through, else
        # llama-server cannot start and the deploy only sees "not healthy" minutes later.
        res = await ctx.conn.run(["runuser", "-u", owner, "--", "test", "-r", self.p["path"]])
        if res.rc != 0:
            raise TaskFailed(f"{owner} cannot read {self.p['path']} on {ctx.host}: a parent directory is not "
                             "searchable for it (needs o+x or its group); move the key, e.g. to "
                             "/etc/tunnelspec/llama-api-key")
        return ok("API key file 0600, owned by " + owner)

    async def apply(self, ctx, ch):
        await ctx.conn.run(["chmod", "600", "--", self.p["path"]], check=True)
        await ctx.conn.run(["chown", f"{self.p['owner']}:", "--", self.p["path"]], check=True)


def _nodes_key(cluster, binary_id: str) -> str:
    """What the device map depends on: the build and, per node in --rpc order, tunnel port and devices."""
    nodes = [(n.name, n.tunnel_port, list(n.devices)) for n in cluster.rpc]
    return hashlib.sha256(json.dumps([binary_id, nodes]).encode()).hexdigest()


async def _binary_id(conn, binary: str) -> str:
    res = await conn.run(["sh", "-c", '[ -x "$1" ] || exit 3; readlink -f -- "$1"; sha256sum < "$1"', "sh", binary])
    if res.rc == 3:
        raise TaskFailed(f"{binary} is not an executable on the host (did the build play run?)")
    return " ".join(res.stdout.split())


@register_task
class RpcDevices(Task):
    """Map each tunnel port to its RPC device names with the built `llama-server --rpc … --list-devices`.

    The rpc-server serves one client at a time: while llama-server is connected, --list-devices would
    wait forever. So the map is cached on the host, keyed by the binary and the nodes; it is
    (re)discovered only when that key changes, and then llama-server is stopped first (the later
    `service` task starts it again). Registers `rpc_devices` = {port: [names]}."""

    module = "rpc_devices"
    args = {"binary": Arg(str, required=True), "cache": Arg(str, default=DEVICES_CACHE),
            "timeout": Arg(int, default=60), "service": Arg(str, default=UNIT),
            "discover": Arg(bool, default=True)}

    def _cluster(self, ctx):
        cluster = ctx.controller.cluster
        if cluster is None:
            raise TaskFailed("rpc_devices needs a cluster inventory ([main] and [rpc] groups)")
        return cluster

    async def check(self, ctx):
        cluster = self._cluster(ctx)
        key = _nodes_key(cluster, await _binary_id(ctx.conn, self.p["binary"]))
        raw = await ctx.conn.get(self.p["cache"])
        try:
            cached = json.loads(raw) if raw else None
        except ValueError:
            cached = None
        if cached and cached.get("key") == key:
            by_port = {int(p): names for p, names in cached["devices"].items()}
            ctx.register("rpc_devices", by_port)
            return ok("devices " + ", ".join(f"{LOOPBACK}:{p}→{','.join(n)}" for p, n in sorted(by_port.items())))
        if not self.p["discover"]:
            raise TaskFailed(f"no current RPC device map in {self.p['cache']} (build or nodes changed since "
                             "the last deploy): run `tunnelspec deploy` first")
        if ctx.check_mode:
            # Not discovered yet: predict the modern naming (RPC<i> in --rpc order, one device each)
            # so --check can still render the unit.
            ctx.register("rpc_devices", {n.tunnel_port: [f"RPC{i}"] for i, n in enumerate(cluster.rpc)})
        return change("discover RPC devices (llama-server is stopped for it)", key=key)

    async def apply(self, ctx, ch):
        cluster = self._cluster(ctx)
        await ctx.conn.run(["systemctl", "stop", self.p["service"]])
        argv = ["timeout", "--kill-after=5", str(self.p["timeout"]),
                *list_devices_argv(self.p["binary"], cluster.rpc_endpoints)]
        res = await ctx.conn.run(argv, timeout=self.p["timeout"] + 15)
        out = res.stdout + res.stderr
        if res.rc == 124:
            raise TaskFailed(f"llama-server --list-devices timed out after {self.p['timeout']}s: an rpc-server "
                             "serves one client at a time; is another client connected to it?")
        by_port = flags.rpc_devices_by_port(flags.parse_list_devices(out))
        missing = [n for n in cluster.rpc if n.tunnel_port not in by_port]
        if res.rc != 0 or missing:
            tail = "\n".join(out.strip().splitlines()[-12:])
            names = ", ".join(f"{n.name} ({LOOPBACK}:{n.tunnel_port})" for n in missing) or "-"
            raise TaskFailed(f"RPC device discovery failed (rc={res.rc}; no device for {names}):\n{tail}")
        doc = {"key": ch.data["key"], "devices": {str(p): n for p, n in sorted(by_port.items())}}
        await ctx.conn.run(["install", "-d", "-m", "755", "--", os.path.dirname(self.p["cache"])], check=True)
        await ctx.conn.put(json.dumps(doc, indent=1, sort_keys=True) + "\n", self.p["cache"], 0o644)


@register_task
class LlamaServerPlan(Task):
    """Read-only: parse the built llama-server's --version and --help, and register `llama_server`,
    the command line (spellings this build accepts, options it lacks refused by name) and the unit
    template's variables."""

    module = "llama_server_plan"
    read_only = True
    args = {"binary": Arg(str, required=True), "model": Arg(str, required=True),
            "draft_model": Arg(str, required=True), "rpc_wait": Arg(str, required=True),
            "rpc_wait_timeout": Arg(int, default=90)}

    async def check(self, ctx):
        cluster = ctx.controller.cluster
        conn, binary = ctx.conn, self.p["binary"]
        # Both are read-only and each loads the whole binary: run them side by side.
        ver, helped = await asyncio.gather(conn.run([binary, "--version"], timeout=60),
                                           conn.run([binary, "--help"], timeout=60))
        try:
            label = flags.parse_version(ver.stdout + ver.stderr).label
        except TaskFailed:
            label = f"{binary} (version unknown)"
        if helped.rc != 0 or "--rpc" not in helped.stdout:
            raise TaskFailed(f"{binary} --help failed or shows no --rpc (built without GGML_RPC?)")
        help_ = flags.parse_help(helped.stdout, build=label)
        # The controller keeps this build's --help: the next deploy of the same source checks the
        # inventory's llama-server settings against it before touching any host (llama/preflight.py).
        preflight.save_record(cluster, label, helped.stdout)
        by_port = ctx.vars.get("rpc_devices")
        if not by_port:
            raise TaskFailed("no RPC device map: the rpc_devices task must run first")
        plan = build_server_argv(cluster, help_, {int(k): v for k, v in by_port.items()}, binary,
                                 self.p["model"], self.p["draft_model"])
        wait_argv = ["/usr/bin/python3", self.p["rpc_wait"], "--timeout", str(self.p["rpc_wait_timeout"])]
        # Exact major.minor.patch of main's own tree: llama-server aborts on another major or a newer
        # minor and silently computes wrong results on another patch (ops renumbered), so the unit
        # never starts it against a node of another build (e.g. mid-upgrade).
        from tunnelspec.llama.versions import format_version
        from tunnelspec.tasks.tunnel import main_rpc_version

        try:
            proto = format_version(await main_rpc_version(conn, f"{cluster.main.root}/src/llama.cpp"))
        except TaskFailed:
            if not ctx.check_mode:
                raise
            proto = None  # --check before the first source checkout: nothing to compare yet
        if proto:
            wait_argv += ["--expect", proto]
        fact = plan.as_fact()
        fact["build"] = label
        fact["rpc_proto"] = proto
        fact["unit"] = {
            "exec_start": fact["exec_start"], "rpc_wait_exec": systemd_exec(wait_argv + plan.endpoints),
            "rpc_wait_timeout": self.p["rpc_wait_timeout"], "llama_user": cluster.main.users.llama,
            "tunnel_units": [tunnel_unit(n.name) for n in cluster.rpc], "draft_node": plan.draft_node,
            "draft_devices": plan.draft_devices, "backend": cluster.main.build.backend,
            "public_bind": cluster.main.public_bind,
        }
        ctx.register("llama_server", fact)
        from tunnelspec.llama import known_bugs

        np_opt = help_.pick("-np", "--parallel")
        np_default = None
        if np_opt and (m := re.search(r"\(default:\s*(-?\d+)", help_.option(np_opt).help)):
            np_default = float(m.group(1))
        warnings = known_bugs.draft_n_max_warnings(
            cluster.main.spec_draft_n_max, known_bugs.n_parallel(list(cluster.main.extra_args), np_default), label)
        note = "".join(f"; WARNING {w}" for w in warnings)
        return ok(f"{label}: draft on {plan.draft_node} ({','.join(plan.draft_devices)}), -dev {plan.target_devices}"
                  f"{note}")


@register_task
class DaemonReload(Task):
    """`systemctl daemon-reload` only when systemd says a unit's file changed on disk — a task (not a
    handler) so a changed unit is loaded before the `service` task starts it."""

    module = "daemon_reload"
    args = {"units": Arg(list, required=True)}

    async def _stale(self, ctx) -> list[str]:
        units = list(self.p["units"])
        # One `systemctl show` for every unit: it prints one value per unit, in order.
        res = await ctx.conn.run(["systemctl", "show", "-p", "NeedDaemonReload", "--value", *units])
        values = res.stdout.split()
        return [u for u, v in zip(units, values) if v == "yes"]

    async def check(self, ctx):
        stale = await self._stale(ctx)
        return change(f"daemon-reload ({', '.join(stale)} changed on disk)") if stale else ok("units loaded")

    async def apply(self, ctx, ch):
        await ctx.conn.run(["systemctl", "daemon-reload"], check=True)


@register_task
class LlamaServerResume(Task):
    """`tunnel open` after `tunnel close`: the llama-server unit is PartOf= its tunnels, so closing one
    stopped it, and nothing starts it again. Started here when deploy installed it, it is enabled
    (enabled means "should run"; `systemctl disable` keeps it down), it is not running, and every
    tunnel it wants is active — with a node left closed (`tunnel open --limit`), starting it would
    pull that tunnel up through Wants=, against the user's close."""

    module = "llama_server_resume"
    args: dict = {}

    async def _state(self, ctx) -> tuple[str, list[str]]:
        res = await ctx.conn.run(["systemctl", "show", "-p", "LoadState,UnitFileState,ActiveState,Wants", UNIT])
        props = dict(line.split("=", 1) for line in res.stdout.splitlines() if "=" in line)
        if props.get("LoadState") != "loaded":
            return "absent", []
        if props.get("UnitFileState") != "enabled":
            return "disabled", []
        if props.get("ActiveState") in ("active", "activating", "reloading"):
            return "running", []
        tunnels = sorted(u for u in props.get("Wants", "").split() if u.startswith("tunnelspec-tunnel-"))
        if not tunnels:
            return "stopped", []
        states = (await ctx.conn.run(["systemctl", "show", "-p", "ActiveState", "--value", *tunnels])).stdout.split()
        return "stopped", [u for u, st in zip(tunnels, states) if st != "active"]

    async def check(self, ctx):
        state, closed = await self._state(ctx)
        if state == "absent":
            return ok("llama-server is not deployed here")
        if state == "disabled":
            return ok("llama-server unit is disabled: left stopped")
        if state == "running":
            return ok("llama-server running")
        if closed:
            return ok(f"llama-server stays stopped: its tunnel(s) {', '.join(closed)} are closed")
        return change("start llama-server (it stopped with its tunnels)")

    async def apply(self, ctx, ch):
        await ctx.conn.run(["systemctl", "start", UNIT], check=True, timeout=300)


async def read_api_key(conn, path: str | None) -> Secret | None:
    if not path:
        return None
    data = await conn.get(path)
    if data is None:
        raise TaskFailed(f"API key file {path} does not exist on the main host")
    return Secret(data.decode().strip())


async def invocation_journal(conn, unit: str = UNIT) -> str:
    """The journal of the unit's current run only (its InvocationID), so old runs prove nothing."""
    inv = (await conn.run(["systemctl", "show", "-p", "InvocationID", "--value", unit])).stdout.strip()
    argv = ["journalctl", "--no-pager", "-o", "cat", "-u", unit]
    if inv:
        argv.append(f"_SYSTEMD_INVOCATION_ID={inv}")
    return (await conn.run(argv, timeout=60)).stdout


@register_task
class LlamaVerify(Task):
    """Read-only proof that llama-server uses the remote draft: /health ok, one short completion with
    draft tokens generated (and reported accepted), and the journal placing the draft's model buffer on
    the draft node's RPC device. Reports ok or fails with the reason; never "changed"."""

    module = "llama_verify"
    read_only = True
    # host: llama_server_host — 127.0.0.1 by default; main's own address with the public-bind opt-out,
    # where nothing listens on loopback.
    args = {"host": Arg(str, default=LOOPBACK), "port": Arg(int, required=True), "plan": Arg(dict, required=True),
            "api_key_file": Arg(str),
            "health_timeout": Arg(int, default=180), "n_predict": Arg(int, default=32),
            "prompt": Arg(str, default="The quick brown fox jumps over the lazy dog. Once upon a time"),
            "journal_timeout": Arg(int, default=30)}

    async def check(self, ctx):
        result = await verify_server(ctx.conn, self.p["port"], self.p["plan"], host=self.p["host"],
                                     api_key_file=self.p["api_key_file"],
                                     health_timeout=self.p["health_timeout"], n_predict=self.p["n_predict"],
                                     prompt=self.p["prompt"], journal_timeout=self.p["journal_timeout"],
                                     add_secret=ctx.add_secret)
        ctx.register("llama_verify", result)
        text = " ".join(result["content"].split())[:120]
        ctx.progress(f"completion {text!r}: draft_n={result['draft_n']} draft_n_accepted={result['draft_n_accepted']}",
                     **{k: result[k] for k in ("draft_n", "draft_n_accepted", "predicted_per_second")})
        return ok(result["summary"])


async def verify_server(conn, port: int, plan: dict, *, host: str = LOOPBACK, api_key_file=None,
                        health_timeout=180, n_predict=32, prompt="Once upon a time", journal_timeout=30,
                        add_secret=None) -> dict:
    """Shared by the verify task and `tunnelspec verify`: returns the facts, raises TaskFailed.
    `host` is the address llama-server listens on, as seen from the main host."""
    opener = http.ssh_opener(conn, port, host)
    try:
        await http.wait_health(opener, health_timeout)
    except http.HttpError as e:
        raise TaskFailed(await server_death.describe(conn, f"llama-server on {host}:{port} not healthy ({e})")) from None
    key = await read_api_key(conn, api_key_file)
    if key and add_secret:
        add_secret(key.reveal())
    try:
        body = await http.completion(opener, prompt, n_predict, api_key=key.reveal() if key else None)
    except http.HttpError as e:
        # A connection cut mid-request is usually llama-server dying (an abort in the decode path):
        # say so from its journal and unit state rather than "not an HTTP response".
        raise TaskFailed(await server_death.describe(conn, f"completion failed: {e}")) from None
    timings = body.get("timings") or {}
    draft_n, accepted = timings.get("draft_n"), timings.get("draft_n_accepted")
    if not draft_n:
        raise TaskFailed(f"the completion used no draft tokens (timings: draft_n={draft_n}): speculative "
                         "decoding is off; was --spec-type draft-simple given, and did the draft load?")
    # The load lines reach the journal shortly after they are printed: poll with a deadline.
    import asyncio

    loop = asyncio.get_running_loop()
    end = loop.time() + journal_timeout
    placed = None
    for _ in range(journal_timeout * 2 + 2):
        journal = await invocation_journal(conn)
        try:
            placed = draft_placement(journal, plan)
            break
        except TaskFailed:
            if loop.time() >= end:
                raise
            await asyncio.sleep(0.5)
    tps = timings.get("predicted_per_second")
    # The type llama-server runs, in its own words (after the completion a slot carries it).
    types = await props.read_spec_types(opener, key.reveal() if key else None)
    want, running = plan.get("spec_type"), types["slots"]
    # Only a slot's value is evidence (/props' is the sampling defaults'); builds where the draft
    # model alone speculates report "none" there although they draft.
    implicit = "--spec-type" not in plan.get("argv", [])
    if want and running and not implicit and want not in running.split(","):
        raise TaskFailed(f"llama-server runs speculative type {running!r} (from /slots), "
                         f"not the {want} the inventory asks for")
    summary = (f"health ok; speculative type {types['active'] or '?'}; draft model buffer on "
               f"{placed.device}[{placed.host}:{placed.port}] ({placed.size}); "
               f"completion {timings.get('predicted_n')} tokens at {tps or 0:.1f} tok/s, "
               f"draft_n={draft_n} draft_n_accepted={accepted}")
    return {"draft_n": draft_n, "draft_n_accepted": accepted, "predicted_n": timings.get("predicted_n"),
            "predicted_per_second": tps, "placement": placed.line, "content": body.get("content", ""),
            "spec_type": types["active"], "spec_type_props": types["props"], "summary": summary}


_SS_LOCAL = re.compile(r"^\S+\s+\d+\s+\d+\s+(\S+):(\d+)\s")


def listening_ports(ss_output: str) -> dict[int, str]:
    """`ss -Hltn` lines → {port: local address}."""
    out = {}
    for line in ss_output.splitlines():
        m = _SS_LOCAL.match(line.strip())
        if m:
            out[int(m.group(2))] = m.group(1)
    return out


@register_task
class PortsClosed(Task):
    """Read-only proof that nothing listens on the given TCP ports any more (`ss -Hltn`)."""

    module = "ports_closed"
    read_only = True
    args = {"ports": Arg(list, required=True)}

    async def check(self, ctx):
        res = await ctx.conn.run(["ss", "-Hltn"], check=True)
        listening = listening_ports(res.stdout)
        ports = sorted({int(p) for p in self.p["ports"]})
        still = {p: listening[p] for p in ports if p in listening}
        if still:
            rows = ", ".join(f"{a}:{p}" for p, a in sorted(still.items()))
            raise TaskFailed(f"still listening after teardown: {rows}")
        return ok(f"nothing listens on {', '.join(map(str, ports))}")
