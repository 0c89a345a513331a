"""Check the inventory's llama-server settings (spec_type, llama_split_mode, the proportions'
flag, llama_server_extra_args) against the pinned build's own `--help` *before any host is
changed* (see docs/speculative.md for the decision).

Where that `--help` comes from, in order:
1. the controller-side record of the last deploy of this exact source pin (repo, commit, patches)
   and main's build settings: `$XDG_CACHE_HOME/tunnelspec/builds/<key>.json` (default
   `~/.cache/...`), written by the `llama_server_plan` task each time it reads a built `--help`.
   `tunnelspec check` reads it (`check_recorded`), and so does deploy, which runs the same checks
   first: exit 2, no host contacted;
2. otherwise, read-only on the main host, in the deploy's preflight play (the `llama_settings`
   task): `{root}/current/bin/llama-server --help`, used only when `current`'s build stamp names the
   pinned commit and no patches are pinned (a patched tree's options cannot be told from its base
   commit). A refusal there is the task refusing its input: exit 2, before any host changes;
3. otherwise (this source was never built here): nothing is known yet; the same checks run at the
   `llama_server_plan` task, on the freshly built binary, before the llama-server unit is written.
   The preflight task says so.
"""

from __future__ import annotations

import hashlib
import json
import os
import posixpath
import secrets
from dataclasses import dataclass
from pathlib import Path

from tunnelspec.core.cachedir import cache_root
from tunnelspec.core.errors import ClusterError
from tunnelspec.llama import flags
from tunnelspec.llama.speculative import SpecError, check_extra_args, spec_support, spec_type_argv, split_modes
from tunnelspec.cluster.fields import cluster_error
from tunnelspec.modules.base import Task, ok, register_task

RECORD_VERSION = 1
STAMP = ".tunnelspec-stamp"


def _cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "tunnelspec" / "builds"


def source_key(cluster) -> str:
    s, b = cluster.source, cluster.main.build
    # A whole-PR entry adds its head (only then: the keys of every other stack stay as they were).
    patches = [
        [p.kind, p.commit, p.pr, p.remote, p.ref, str(p.file) if p.file else None, *([p.head] if p.head else [])]
        for p in s.patches
    ]
    doc = [RECORD_VERSION, s.repo, s.commit, patches, b.backend, list(b.cmake_args)]
    return hashlib.sha256(json.dumps(doc).encode()).hexdigest()[:24]


def record_path(cluster) -> Path:
    return _cache_dir() / f"{source_key(cluster)}.json"


def save_record(cluster, label: str, help_text: str) -> None:
    """Best effort: a controller that cannot write its cache only loses the early check.
    The cache root itself is never created: an ephemeral home (a CI runner's, a container's) has
    none, and a CI run leaves nothing on the runner's disk (docs/ci.md); the record would not
    outlive the runner anyway."""
    if cache_root() is None:
        return
    path = record_path(cluster)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps({"build": label, "commit": cluster.source.commit, "help": help_text}))
        os.replace(tmp, path)
    except OSError:
        pass


def load_record(cluster) -> flags.ServerHelp | None:
    try:
        doc = json.loads(record_path(cluster).read_text())
        return flags.parse_help(doc["help"], build=doc["build"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def check_settings(cluster, h: flags.ServerHelp) -> None:
    """Everything about the inventory's llama-server settings a `--help` can decide; SpecError."""
    main = cluster.main
    spec_type_argv(h, main.spec_type)
    mode = cluster.placement.split_mode
    if mode is not None and mode not in split_modes(h):
        raise SpecError(
            f"llama_split_mode {mode} is not offered by this llama-server build ({h.build}); "
            f"it has: {', '.join(split_modes(h)) or 'no --split-mode'}"
        )
    if cluster.placement.weights is not None and not h.pick("-ts", "--tensor-split"):
        raise SpecError(f"{cluster.placement.source}: this llama-server build ({h.build}) has no --tensor-split")
    if main.spec_draft_p_min is not None and not h.pick("--spec-draft-p-min", "--draft-p-min"):
        raise SpecError(f"spec_draft_p_min: this llama-server build ({h.build}) has no --spec-draft-p-min")
    try:
        check_extra_args(h, list(main.extra_args))
    except SpecError as e:
        raise SpecError(f"llama_server_extra_args: {e}") from None


@dataclass(frozen=True)
class PreflightResult:
    source: str  # "record", "main host", "none"
    build: str | None
    types: str | None

    def line(self) -> str:
        if self.build is None:
            return (
                "llama-server settings: this source was never built here; spec_type, split mode and extra "
                "args are checked against the new build's --help before its unit is written"
            )
        return f"llama-server settings checked against {self.build} (from the {self.source}): types {self.types}"


def _fail(cluster, e: SpecError) -> ClusterError:
    text = str(e)
    var = next(
        (
            v
            for v in ("llama_server_extra_args", "llama_split_mode", "spec_draft_p_min", "spec_type")
            if text.startswith(v)
        ),
        None,
    )
    var = var or (
        cluster.placement.source
        if cluster.placement.source and text.startswith(cluster.placement.source)
        else "spec_type"
    )
    return cluster_error(cluster.inventory, cluster.main.name, var, text + " (no host was changed)")


def check_known(cluster, h: flags.ServerHelp, source: str) -> PreflightResult:
    try:
        check_settings(cluster, h)
    except SpecError as e:
        raise _fail(cluster, e) from None
    return PreflightResult(source, h.build, spec_support(h).describe())


def check_recorded(cluster) -> PreflightResult | None:
    """The settings against the controller's record of the pinned build, when it holds one (None
    otherwise); ClusterError (exit 2) naming the variable. Offline: `tunnelspec check` and deploy's
    first step."""
    recorded = load_record(cluster)
    if recorded is None:
        return None
    return check_known(cluster, recorded, "controller's record of the last deploy")


@register_task
class LlamaSettings(Task):
    """Main's own check of the inventory's llama-server settings, read-only, in the deploy's preflight
    play: without a controller record, against main's current build when it is the pinned commit
    (no patches pinned); otherwise what the controller checked, or that the new build's --help
    decides. A refusal raises ClusterError: the task refuses its input, the run exits 2 before any
    host changes (engine/task_exec.py)."""

    module = "llama_settings"
    reads_cluster = True
    read_only = True

    async def check(self, ctx):
        cluster = ctx.require_cluster()
        recorded = check_recorded(cluster)
        if recorded is not None:
            return ok(recorded.line())
        if cluster.source.patches:
            return ok(PreflightResult("none", None, None).line())
        h = await _read_main_build(cluster, ctx.conn)
        if h is None:
            return ok(PreflightResult("none", None, None).line())
        return ok(check_known(cluster, h, "main host's current build").line())


# $1: main's `current` build directory, $2: a boundary line, $3: the pinned commit. The binary runs
# only when the build's stamp names the pinned commit (the parser checks the stamp again).
_READ_BUILD = r"""
[ -e "$1/.tunnelspec-stamp" ] || exit 3
cat -- "$1/.tunnelspec-stamp"
grep -qF -- "$3" "$1/.tunnelspec-stamp" || exit 0
printf '\n%s\n' "$2"
"$1/bin/llama-server" --version 2>&1
printf '\n%s\n' "$2"
exec "$1/bin/llama-server" --help 2>/dev/null
"""


async def _read_main_build(cluster, conn) -> flags.ServerHelp | None:
    current = posixpath.join(cluster.main.root, "current")
    binary = posixpath.join(current, "bin", "llama-server")
    boundary = "tunnelspec-preflight-" + secrets.token_hex(8)
    res = await conn.probe(["sh", "-c", _READ_BUILD, "sh", current, boundary, cluster.source.commit], timeout=120)
    if res.rc != 0:
        return None
    stamp, _, rest = res.stdout.partition(f"\n{boundary}\n")
    try:
        commit = json.loads(stamp).get("commit") if stamp.strip() else None
    except ValueError:
        commit = None
    if commit != cluster.source.commit or not rest:
        return None
    ver, _, helped = rest.partition(f"\n{boundary}\n")
    if "--rpc" not in helped:
        return None
    try:
        label = flags.parse_version(ver).label
    except Exception:  # noqa: BLE001 - a label only
        label = f"{binary} (version unknown)"
    save_record(cluster, label, helped)
    return flags.parse_help(helped, build=label)
