"""Model files on the main host: a GGUF used in place, uploaded once from the controller, or
downloaded from a pinned Hugging Face revision; uploads the inventory no longer names removed; and
each model proven whole before anything serving switches (model_proof)."""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
from pathlib import Path

from tunnelspec.connection.base import Result
from tunnelspec.connection.upload import upload_file
from tunnelspec.core.constants import STATE_DIR
from tunnelspec.core.errors import TaskFailed
from tunnelspec.llama import gguf_header
from tunnelspec.components.models import hub, proof_cache
from tunnelspec.modules.base import Arg, Task, change, ok, register_task

MODELS_DIR = f"{STATE_DIR}/models"
_SHA_CACHE: dict[tuple, str] = {}  # (path, size, mtime) -> sha256: hash a big model once per process


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
    res = await conn.probe(["sh", "-c", '[ -f "$1" ] || exit 3; sha256sum < "$1"', "sh", path])
    return res.stdout.split()[0] if res.rc == 0 and res.stdout.strip() else None


def _present_argv(path: str) -> list[str]:
    return ["test", "-f", path]


def controller_file(ctx, src: str) -> Path | None:
    """`src` as a file on the controller (relative: from the inventory's directory), else None."""
    p = Path(src).expanduser()
    if not p.is_absolute():
        p = ctx.inventory_dir / p
    return p if p.is_file() else None


def _claims(ctx) -> dict[tuple[str, str], str]:
    """What this run already uploads where: {(host, upload destination): source} (the run's memo)."""
    return ctx.memo.setdefault(ModelFile.module, {})


@register_task
class ModelFile(Task):
    """A GGUF file on the host: used in place when `src` exists there, else uploaded once from the
    controller into `dest_dir` (sha256 compared, chunked with progress, atomic rename). Registers
    the path on the host as fact `fact`."""

    module = "model_file"
    args = {
        "src": Arg(
            str,
            required=True,
            help="A path on the host, a file on the controller (relative: from the inventory's directory), or `hf://owner/repo/file.gguf@<commit>`.",
        ),
        "dest_dir": Arg(str, default=MODELS_DIR, help="Where uploads and downloads go on the host."),
        "fact": Arg(str, required=True, help="The fact to register with the model's path on the host."),
    }

    def probes(self) -> list[list[str]]:
        src = self.p["src"]
        return [_present_argv(src)] if src.startswith("/") and not hub.is_hub_ref(src) else []

    def _local(self, ctx) -> Path | None:
        return controller_file(ctx, self.p["src"])

    def _dest(self) -> str:
        return f"{self.p['dest_dir'].rstrip('/')}/{Path(self.p['src']).name}"

    async def check(self, ctx):
        src = self.p["src"]
        if hub.is_hub_ref(src):
            return await self._check_hub(ctx)
        if src.startswith("/") and (await ctx.conn.probe(_present_argv(src))).rc == 0:
            # Already on the host (a shared mount, a pre-staged file, or the controller is the host).
            ctx.register(self.p["fact"], src)
            return ok(f"{src} present on the host")
        local = self._local(ctx)
        if local is None:
            raise TaskFailed(f"model {src} is neither a file on {ctx.host} nor on the controller")
        dest = self._dest()
        claimed = _claims(ctx).setdefault((ctx.host, dest), str(local))
        if claimed != str(local):
            # Two controller files with one name (target and draft from different directories) would
            # overwrite each other on every deploy, and both would load the last one uploaded.
            raise TaskFailed(
                f"{local} and {claimed} would both be uploaded to {dest} on {ctx.host}: "
                "give the models different file names"
            )
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
        claims = _claims(ctx)
        todo = []
        for f in files:
            dest = f"{dir_}/{f.name}"
            claimed = claims.setdefault((ctx.host, dest), f"{ref.repo_id}/{f.path}@{ref.revision}")
            if claimed != f"{ref.repo_id}/{f.path}@{ref.revision}":
                raise TaskFailed(
                    f"{var}: {ref} and {claimed} would both be uploaded to {dest} on {ctx.host}: "
                    "give the models different file names"
                )
            if await _remote_sha256(ctx.conn, dest) != f.sha256:
                todo.append((f, dest))
        ctx.register(self.p["fact"], f"{dir_}/{files[0].name}")
        if not todo:
            return ok(
                f"{dir_}/{files[0].name} up to date ({len(files)} file(s), sha256 as the Hub reports "
                f"at {ref.revision[:12]})"
            )
        size = sum(f.size for f, _ in todo) / 2**20
        return change(
            f"download {ref} ({len(todo)} file(s), {size:.1f} MiB), verify, upload → {dir_}",
            hub=[(f.path, f.size, f.sha256, dest) for f, dest in todo],
        )

    async def apply(self, ctx, ch):
        if "hub" in ch.data:
            var = self.p["fact"].removesuffix("_path")
            ref = hub.parse_ref(self.p["src"])
            files = [hub.HubFile(path=p, size=size, sha256=sha) for p, size, sha, _ in ch.data["hub"]]
            # Every part downloaded and verified before the first byte goes to the host.
            locals_ = await hub.download(ref, files, var, lambda msg, pct: ctx.progress(msg, percent=pct))
            await ctx.conn.run(["install", "-d", "-m", "755", "--", self.p["dest_dir"]], check=True)
            for local, f, (_, _, _, dest) in zip(locals_, files, ch.data["hub"], strict=True):
                await upload_file(
                    ctx.conn, local, dest, f.sha256, progress=lambda msg, pct: ctx.progress(msg, percent=pct)
                )
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
    args = {
        "keep": Arg(list, required=True, help="Paths of the models in use (never removed)."),
        "dir": Arg(str, default=MODELS_DIR, help="tunnelspec's upload directory (nothing elsewhere is touched)."),
    }

    def _list_argv(self) -> list[str]:
        return [
            "sh",
            "-c",
            '[ -d "$1" ] || exit 0; find "$1" -maxdepth 1 -type f -printf "%s %f\\0"',
            "sh",
            self.p["dir"].rstrip("/"),
        ]

    def probes(self) -> list[list[str]]:
        return [self._list_argv()]

    async def _stale(self, ctx) -> list[tuple[str, int]]:
        d = self.p["dir"].rstrip("/")
        res = await ctx.conn.probe(self._list_argv(), check=True)
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
        return change(
            f"remove {len(stale)} uploaded model(s) no longer in the inventory "
            f"({', '.join(p for p, _ in stale)}; {total / 2**20:.1f} MiB)",
            paths=[p for p, _ in stale],
        )

    async def apply(self, ctx, ch):
        await ctx.conn.run(["rm", "-f", "--", *ch.data["paths"]], check=True)


# ---- proven before serving switches -------------------------------------------------------------
# What each model file was proven to be (size, mtime, inode → the bytes its tensors need, its sha256):
# a file unchanged since is not read again. Not in MODELS_DIR, which models_prune empties of strangers.
PROOFS = f"{STATE_DIR}/model-proofs.json"
_READER = Path(gguf_header.__file__).read_text()  # the one GGUF reader, run where the file lies


def proof_argv(mode: str, paths: list[str], cache: str = PROOFS) -> list[str]:
    return ["python3", "-I", "-c", _READER, mode, cache, *paths]


def parse_proofs(text: str) -> dict[str, dict]:
    out = {}
    for line in text.splitlines():
        try:
            r = json.loads(line)
        except ValueError:
            continue
        if isinstance(r, dict) and isinstance(r.get("path"), str):
            out[r["path"]] = r
    return out


async def checked_proofs(conn, paths: list[str], cache: str, timeout: float) -> tuple[dict[str, dict], Result | None]:
    """Read-only: (each file's proof line, python3's result). From a `stat` and the cache when every
    file is as proven (proof_cache; the result is then None), else from python3's `check`, which reads
    the header of a file changed since."""
    served = await proof_cache.cached_proofs(conn, paths, cache)
    if served is not None:
        return served, None
    res = await conn.probe(proof_argv("check", paths, cache), timeout=timeout)
    return parse_proofs(res.stdout), res


async def read_proofs(conn, host: str, paths: list[str], cache: str = PROOFS) -> dict[str, dict]:
    """Read-only: each file's proof as gguf_header.inspect gives it (cached when unchanged since);
    every one of them, or TaskFailed."""
    if not paths:
        return {}
    got, res = await checked_proofs(conn, paths, cache, timeout=600)
    if res is not None and (res.rc != 0 or set(got) != set(paths)):
        raise TaskFailed(
            f"cannot read {', '.join(paths)} with python3 on {host} (rc={res.rc}): "
            f"{(res.stderr or res.stdout).strip()[-400:]}"
        )
    return got


def parts_of(path: str) -> list[str]:
    """A split GGUF's every part (llama.cpp opens the others by name), else the file itself."""
    d, _, name = path.rpartition("/")
    parts = hub.split_parts(name)
    return [f"{d}/{p}" if d else p for p in parts] if parts else [path]


def _refusal(where: str, proof: dict) -> str:
    err = proof["error"]
    if err.startswith("cut short"):
        return f"model {proof['path']} on {where} is {err}: an interrupted copy? Copy it whole again"
    return f"model {proof['path']} on {where}: {err}"


@register_task
class ModelProof(Task):
    """The model is whole before anything serving switches: its GGUF header parses and every tensor's
    data (offset + size, the alignment honoured) lies within the file — a copy cut short is refused
    here, naming the host, the file and the bytes missing. Where the file is now: on the host (its
    sha256 computed there once per change of the file and kept in PROOFS, which the generation
    record reads), or on the controller when the server play will upload it (upload_file then checks
    the sha256 of what arrived). A Hub reference is checked against the Hub's sha256 as it is
    downloaded, and proven on the host once placed."""

    module = "model_proof"
    args = {
        "src": Arg(
            str,
            default="",
            help="The model as the inventory names it (model_file's `src`), or its path on the host; empty: none.",
        ),
        "cache": Arg(str, default=PROOFS, help="Where each file's proof is kept on the host."),
    }

    def probes(self) -> list[list[str]]:
        src = self.p["src"]
        if not src.startswith("/") or hub.is_hub_ref(src):
            return []
        return [_present_argv(src), proof_cache.stat_argv(parts_of(src), self.p["cache"])]

    async def check(self, ctx):
        src = self.p["src"]
        if not src:
            return ok("no model")
        if hub.is_hub_ref(src):
            return ok(f"{src}: checked against the Hub's sha256 as it downloads, proven on {ctx.host} once placed")
        if src.startswith("/") and (await ctx.conn.probe(_present_argv(src))).rc == 0:
            return await self._on_host(ctx, parts_of(src))
        local = controller_file(ctx, src)
        if local is None:
            raise TaskFailed(f"model {src} is neither a file on {ctx.host} nor on the controller")
        proofs = [await asyncio.to_thread(gguf_header.inspect, p, {}) for p in parts_of(str(local))]
        bad = [p for p in proofs if "error" in p]
        if bad:
            raise TaskFailed(_refusal("the controller", bad[0]))
        return ok(f"{local} on the controller whole ({_sizes(proofs)}); uploaded by the server play")

    async def _on_host(self, ctx, paths: list[str]):
        proofs = await read_proofs(ctx.conn, ctx.host, paths, self.p["cache"])
        bad = [p for p in proofs.values() if "error" in p]
        if bad:
            raise TaskFailed(_refusal(ctx.host, bad[0]))
        if all(p.get("cached") for p in proofs.values()):
            return ok(f"{self.p['src']} whole ({_sizes(proofs.values())}), unchanged since proven")
        return change(
            f"{self.p['src']} whole ({_sizes(proofs.values())}): its sha256 to record ({self.p['cache']})", paths=paths
        )

    async def apply(self, ctx, ch):
        res = await ctx.conn.run(proof_argv("record", ch.data["paths"], self.p["cache"]), timeout=4 * 3600)
        got = parse_proofs(res.stdout)
        bad = [p for p in got.values() if "error" in p]
        if res.rc != 0 or bad or set(got) != set(ch.data["paths"]):
            raise TaskFailed(
                _refusal(ctx.host, bad[0])
                if bad
                else f"cannot record the proof of {', '.join(ch.data['paths'])} (rc={res.rc}): "
                f"{(res.stderr or res.stdout).strip()[-400:]}"
            )
        ctx.progress("; ".join(f"{p['path']} sha256 {p['sha256']}" for p in got.values()))


def _sizes(proofs) -> str:
    ps = list(proofs)
    size = sum(p.get("size") or 0 for p in ps)
    need = sum(p.get("need") or 0 for p in ps)
    return f"{size} bytes, its tensors need {need}" + (f", {len(ps)} parts" if len(ps) > 1 else "")
