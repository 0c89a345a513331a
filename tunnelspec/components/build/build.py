"""llama_build: the binaries a host's role needs, built from the proven source tree into
`{root}/build/<key>` (key = tree hash + output-changing options), a stamp written last, and
`{root}/current` pointing at it.

check (read-only, one command): is there a finished build for this key, and is it current? A
finished build for the key is reused without compiling (e.g. after a patch is removed again).
apply: cmake configure + build under `nice`, ccache when present, progress from cmake's `[ 42%]`;
on main, `llama-server --version` must name the pinned commit before the stamp is written. Before
`current` moves (a new build or a switch to a finished one), every binary of the build must start on
the host: llama-server's --version, the RPC server's --help (it has no --version).

With backend cuda, `nvidia-smi` is probed first (read-only, before anything is configured): no driver or
no GPU is an error naming the host, and unless the inventory sets the architectures
(llama_cuda_architectures, or -DCMAKE_CUDA_ARCHITECTURES in llama_cmake_args) the build targets the
compute capabilities it reports (8.9 → 89); the build step names them (docs/accelerators.md). Before
a CUDA build configures, the host's nvcc (its release, from the host facts) is checked against what
the tree's ggml-cuda/CMakeLists.txt says each of those architectures needs (llama/cuda_toolkit.py).

Refuses known-vulnerable pinned builds (tunnelspec/llama/advisories.py) unless
--allow-vulnerable-llama; an unknown build number is a warning in the message.

Registers `llama_build` = {dir, key, tree, commit, build_number, targets, bin: {name: path in the
keyed dir}, current_bin: {name: path under {root}/current}, rpc_server, llama_server}.
"""

from __future__ import annotations

import json
import posixpath
import shlex
import time

from tunnelspec.core.errors import TaskFailed
from tunnelspec.llama import advisories, cuda_toolkit, vulkan
from tunnelspec.llama import build_plan as bp
from tunnelspec.llama import nvidia_smi
from tunnelspec.llama.flags import parse_version
from tunnelspec.modules.base import Arg, Diff, Task, change, ok, register_task
from tunnelspec.components.host.host import facts_of
from tunnelspec.facts.host import CUDA_BIN

# Per build step: a cold llama-server build on 2 shared cores takes ≈ 8 min; leave headroom.
BUILD_TIMEOUT = 4 * 3600
LOCK_WAIT = str(BUILD_TIMEOUT)
USED = ".tunnelspec-used"  # touched whenever the build becomes current: its mtime ranks builds for pruning

# After a switch: keep the `keep` most recently used build dirs (last made current; else stamp, else
# the dir's own mtime — a failed build keeps its partial objects for the retry while it is recent),
# never one a tunnelspec unit's ExecStart still names (e.g. the rpc-server until the rpc play rewrites
# its unit), never one a kept generation uses (listed in build/.tunnelspec-pinned by the deploy's
# generation record, docs/generations.md), never one another run is building (its flock is held).
# Prints each removed key.
_PRUNE = r"""
root=$1; keep=$2; cur=$3; used=$4; stamp=$5
cd -- "$root/build" 2>/dev/null || exit 0
for d in */; do
  d=${d%/}
  [ -d "$d" ] || continue
  if [ -e "$d/$used" ]; then m=$d/$used; elif [ -e "$d/$stamp" ]; then m=$d/$stamp; else m=$d; fi
  printf '%s %s\n' "$(stat -c %Y -- "$m")" "$d"
done | sort -rn | while read -r t d; do
  if [ "$d" = "$cur" ]; then continue; fi
  if [ "$keep" -gt 1 ]; then keep=$((keep - 1)); continue; fi
  if grep -qsxF -- "$d" "$root/build/.tunnelspec-pinned"; then continue; fi
  if grep -qsF -- "/build/$d/" /etc/systemd/system/tunnelspec-*.service; then continue; fi
  flock -n "$d.lock" rm -rf -- "$d" && rm -f -- "$d.lock" && echo "$d"
done
exit 0
"""


@register_task
class LlamaBuild(Task):
    """Build the role's llama.cpp targets from the checked-out source in a directory keyed by the tree and the options, then make it `current`; registers `llama_build`."""

    module = "llama_build"
    reads_cluster = True
    args = {
        "root": Arg(
            str,
            required=True,
            help="tunnelspec's directory on the host (`tunnelspec_root`): builds go to `<root>/build/<key>`.",
        ),
        "role": Arg(
            str,
            required=True,
            choices=("main", "rpc"),
            help="`main` builds llama-server, `rpc` the RPC server: only what the role needs.",
        ),
        "tree": Arg(
            str,
            default="",
            help="The source tree hash from the source play (`llama_src.tree`; empty when it did not run).",
        ),
        "commit": Arg(str, required=True, help="The pinned llama.cpp commit (passed to CMake as the build's commit)."),
        "build_number": Arg(int, help="The upstream build number (bNNNN) to stamp; default: from the source play."),
        "backend": Arg(
            str,
            default="cpu",
            choices=tuple(bp.BACKEND_OPTIONS),
            help="GPU backend (`llama_backend`): cpu, cuda, hip, vulkan or metal.",
        ),
        "cmake_args": Arg(
            (list, str),
            default=[],
            help="Extra `-DNAME=VALUE` cache entries (a list, or a string split like a shell line).",
        ),
        "cuda_architectures": Arg(
            str,
            help="CMake CUDA architectures (`89`, `86;89`) for backend cuda; default: the "
            "host's llama_cuda_architectures, else what its nvidia-smi reports.",
        ),
        "jobs": Arg(int, help="Parallel build jobs (default: the host's cores)."),
        "keep_builds": Arg(
            int,
            default=3,
            help="Build directories kept per host (the current one included); least recently used go first.",
        ),
    }

    @property
    def src(self) -> str:
        return posixpath.join(self.p["root"], "src", "llama.cpp")

    def _extra(self) -> list[str]:
        extra = self.p["cmake_args"] or []
        return shlex.split(extra) if isinstance(extra, str) else [str(a) for a in extra]

    def _options(self) -> list[str]:
        extra = [*self._extra(), *getattr(self, "_cuda_options", [])]
        return bp.keyed_options(self.p["commit"], self.p["build_number"], self.p["backend"], extra)

    def _state_argv(self, key: str) -> list[str]:
        return ["sh", "-c", bp.STATE_SCRIPT, "sh", self.p["root"], key, self.src]

    def probes(self) -> list[list[str]]:
        # A CUDA build's key holds the architectures nvidia-smi reports: known only from its answer.
        if self.p["backend"] == "cuda":
            return [nvidia_smi.NVIDIA_SMI_PROBE]
        return [self._state_argv(bp.build_key(self.p["tree"], self._options()))] if self.p["tree"] else []

    def _inventory_archs(self, ctx) -> str | None:
        if self.p["cuda_architectures"]:
            return self.p["cuda_architectures"]
        cluster = ctx.cluster
        if cluster is None:
            return None
        if cluster.main.name == ctx.host:
            return cluster.main.build.cuda_architectures
        node = next((n for n in cluster.rpc if n.name == ctx.host), None)
        return node.build.cuda_architectures if node else None

    async def _cuda_plan(self, ctx) -> tuple[list[str], str]:
        """backend cuda: the driver must answer (read-only nvidia-smi, before any configure), and the
        architectures come from the inventory or from the GPUs it reports."""
        res = await ctx.conn.probe(nvidia_smi.NVIDIA_SMI_PROBE)
        gpus = nvidia_smi.parse_nvidia_smi(res.stdout + res.stderr, res.rc, ctx.host)
        try:
            options, note = bp.cuda_arch_plan(
                "cuda",
                self._extra(),
                self._inventory_archs(ctx),
                nvidia_smi.cuda_architectures(gpus),
                nvidia_smi.describe_gpus(gpus),
            )
        except ValueError as e:
            raise TaskFailed(f"{ctx.host}: {e}") from None
        f = facts_of(ctx)
        compiler = bp.cuda_compiler_options((f.tools.get("nvcc") if f is not None else None), self._extra())
        if compiler:
            note += f"; nvcc {compiler[0].split('=', 1)[1]} (off the PATH: named to CMake)"
        return options + compiler, note

    def _advisory_note(self, ctx) -> str:
        result = advisories.check(self.p["build_number"], rdma=False)
        if result.verdict in (advisories.AFFECTED, advisories.POSSIBLE):
            if advisories.ACCEPT_VULNERABLE not in ctx.options.accepted:
                raise TaskFailed(
                    f"refusing a known-vulnerable llama.cpp build: {result.message}; pin a fixed "
                    "commit (see `tunnelspec advisories`) or pass --allow-vulnerable-llama"
                )
            return f"; WARNING known-vulnerable build allowed by --allow-vulnerable-llama: {result.message}"
        if result.verdict == advisories.UNKNOWN:
            return (
                "; WARNING build number unknown (set llama_build_number): known-vulnerable RPC builds "
                "cannot be ruled out"
            )
        return f"; {result.message}" if result.verdict == advisories.MITIGATED else ""

    async def check(self, ctx):
        # The GPU before anything else (--check and a first run included): no driver, no build.
        self._cuda_options: list[str] = []
        self._cuda_note = ""
        if self.p["backend"] == "cuda":
            self._cuda_options, cuda_note = await self._cuda_plan(ctx)
            self._cuda_note = f"; {cuda_note}"
        if not self.p["tree"]:
            if ctx.check_mode:
                return change(f"would build once the source play has applied{self._cuda_note}")
            raise TaskFailed(
                "no proven source tree for this host: the source play did not run in this "
                "invocation (e.g. --tags build alone); run with --tags source,build"
            )
        note = self._advisory_note(ctx) + self._cuda_note
        options = self._options()
        key = bp.build_key(self.p["tree"], options)
        self._key, self._dir = key, posixpath.join(self.p["root"], "build", key)
        res = await ctx.conn.probe(self._state_argv(key), check=True)
        st = bp.parse_state(res.stdout)
        self._state = st
        if st.tree != self.p["tree"]:
            raise TaskFailed(
                f"{self.src} is at tree {st.tree} but the source play proved {self.p['tree']}: "
                "the checkout changed since; run again with --tags source,build"
            )
        try:
            bp.check_tree(st.options, f"{self.src} (commit {self.p['commit'][:12]})")
        except ValueError as e:
            raise TaskFailed(str(e)) from None
        try:
            targets = bp.targets_for(self.p["role"], st.rpc_target)
        except ValueError:
            raise TaskFailed(
                f"{self.src}: no RPC server target (ggml-rpc-server or rpc-server) found in "
                "tools/rpc/CMakeLists.txt or examples/rpc/CMakeLists.txt"
            ) from None
        self._targets = targets
        names = ", ".join(targets)
        if st.stamp is not None and bp.stamp_ok(st.stamp, key, targets, st.bins):
            if st.current != self._dir:
                return change(
                    f"switch current to the finished build {key} of {names} (no compile){note}",
                    Diff(str(st.current), self._dir),
                    switch=True,
                )
            self._register(ctx, st.stamp)
            return ok(f"{names} built for tree {self.p['tree'][:12]} in build/{key}{note}")
        if self.p["backend"] == "vulkan":
            await self._vulkan_headers(ctx)
        if self.p["backend"] == "cuda":
            await self._cuda_toolkit(ctx)
        jobs = min(st.nproc, self.p["jobs"] or st.nproc)
        how = f"{jobs} job(s), {'ccache' if st.ccache else 'no ccache'}"
        return change(f"build {names} in build/{key} ({how}){note}", Diff(str(st.current), self._dir), jobs=jobs)

    async def _vulkan_headers(self, ctx) -> None:
        """Before configuring a Vulkan build: the host's Vulkan headers have what the tree uses."""
        res = await ctx.conn.probe(vulkan.probe_argv(self.src))
        why = vulkan.refusal(ctx.host, res.stdout)
        if why:
            raise TaskFailed(why)

    async def _cuda_toolkit(self, ctx) -> None:
        """Before configuring a CUDA build: the host's nvcc is one the tree builds these architectures with."""
        archs = bp.cmake_sets(self._options(), bp.CUDA_ARCH_VAR)
        if not archs:
            return
        f = facts_of(ctx)
        nvcc, text = (f.nvcc, f.nvcc_text) if f is not None and f.nvcc else (None, "")
        if nvcc is None:  # no facts in this run's context (a task run on its own)
            res = await ctx.conn.probe(
                ["sh", "-c", f'PATH="$PATH:{CUDA_BIN}" nvcc --version 2>/dev/null | grep release']
            )
            nvcc, text = cuda_toolkit.parse_nvcc(res.stdout), res.stdout.strip()
        res = await ctx.conn.probe(["cat", "--", posixpath.join(self.src, cuda_toolkit.CMAKELISTS)])
        if res.rc != 0:  # a tree without ggml-cuda: cmake says so itself
            return
        why = cuda_toolkit.refusal(
            ctx.host, nvcc, text, archs, res.stdout, f"{self.src} (commit {self.p['commit'][:12]})"
        )
        if why:
            raise TaskFailed(why)

    def _register(self, ctx, stamp: dict) -> None:
        root = self.p["root"]
        bins = {t: posixpath.join(self._dir, "bin", t) for t in stamp.get("targets", [])}
        current = {t: posixpath.join(root, "current", "bin", t) for t in bins}
        rpc = next((t for t in bins if t != bp.LLAMA_SERVER), None)
        ctx.register(
            "llama_build",
            {
                "dir": self._dir,
                "key": self._key,
                "tree": stamp.get("tree"),
                "commit": stamp.get("commit"),
                "build_number": stamp.get("build_number"),
                "targets": sorted(bins),
                "bin": bins,
                "current_bin": current,
                "rpc_server": bins.get(rpc) if rpc else None,
                "llama_server": bins.get(bp.LLAMA_SERVER),
                "seconds": stamp.get("seconds"),
            },
        )

    # ---- apply -------------------------------------------------------------------------------
    async def apply(self, ctx, ch):
        if not ch.data.get("switch"):
            await self._build(ctx, ch.data["jobs"])
        await self._binaries_run(ctx, fresh=not ch.data.get("switch"))
        root = self.p["root"]
        # Atomic switch: a reader sees the old build or the new one, never a missing link.
        await ctx.conn.run(
            [
                "sh",
                "-c",
                'touch -- "$1/$3" && ln -sfn -- "$1" "$2.tmp" && mv -Tf -- "$2.tmp" "$2"',
                "sh",
                self._dir,
                posixpath.join(root, "current"),
                USED,
            ],
            check=True,
        )
        res = await ctx.conn.run(
            ["sh", "-c", _PRUNE, "sh", root, str(max(1, self.p["keep_builds"])), self._key, USED, bp.STAMP],
            check=True,
            timeout=600,
        )
        if res.stdout.split():
            ctx.progress(f"removed old build(s) {', '.join(res.stdout.split())} (keep_builds={self.p['keep_builds']})")

    async def _build(self, ctx, jobs: int) -> None:
        st, d, run = self._state, self._dir, ctx.conn.run
        started = time.monotonic()
        options = [*self._options(), *bp.tree_options(st.options), *bp.launcher_options(st.ccache, self.p["backend"])]
        await run(["mkdir", "-p", d], check=True)
        # Another run building the same key on this host waits for it (then finds the stamp valid).
        lock = ["flock", "-w", LOCK_WAIT, d + ".lock"]
        prefix = [*lock, "nice", "-n", "10", "env", *bp.ccache_env(self.p["root"])]
        ctx.progress(f"configure build/{self._key}{self._cuda_note}")
        await ctx.conn.run_stream(
            [*prefix, "cmake", "-S", self.src, "-B", d, *options], lambda line: None, timeout=BUILD_TIMEOUT, check=True
        )
        last = [-100]

        def on_line(line: str) -> None:
            pct = bp.progress_percent(line)
            if pct is not None and (pct >= last[0] + 5 or (pct == 100 and last[0] != 100)):
                last[0] = pct
                ctx.progress(f"build {', '.join(self._targets)} {pct}%", percent=pct)

        await ctx.conn.run_stream(
            [*prefix, "cmake", "--build", d, "--target", *self._targets, "-j", str(jobs)],
            on_line,
            timeout=BUILD_TIMEOUT,
            check=True,
        )
        if bp.LLAMA_SERVER in self._targets:
            await self._verify_version(ctx)
        stamp = {
            "key": self._key,
            "tree": self.p["tree"],
            "commit": self.p["commit"],
            "build_number": self.p["build_number"],
            "targets": self._targets,
            "options": options,
            "seconds": round(time.monotonic() - started, 1),
            "recipe": bp.BUILD_RECIPE,
        }
        await ctx.conn.put(json.dumps(stamp, indent=2, sort_keys=True) + "\n", posixpath.join(d, bp.STAMP))

    async def _binaries_run(self, ctx, fresh: bool) -> None:
        """Before `current` moves: every binary of the build starts on this host (its libraries
        resolve, its backends load) — llama-server's --version (a fresh build's was checked with its
        commit before the stamp), the RPC server's --help: it has no --version, and --help loads the
        backends, prints its usage and exits 0."""
        for name in self._targets:
            if name == bp.LLAMA_SERVER and fresh:
                continue
            exe = posixpath.join(self._dir, "bin", name)
            flag = "--version" if name == bp.LLAMA_SERVER else "--help"
            res = await ctx.conn.probe([exe, flag], timeout=60)
            if res.rc != 0:
                said = (res.stderr + res.stdout).strip()[-600:] or "no output"
                how = f"rc={res.rc}" if res.rc > 0 else "killed by a signal"
                raise TaskFailed(
                    f"{ctx.host}: the new {name} does not run ({exe} {flag}: {how}): {said}; "
                    f"nothing was switched ({self.p['root']}/current is unchanged)"
                )

    async def _verify_version(self, ctx) -> None:
        exe = posixpath.join(self._dir, "bin", bp.LLAMA_SERVER)
        res = await ctx.conn.probe([exe, "--version"], timeout=60)
        version = parse_version(res.stderr + "\n" + res.stdout)
        if res.rc != 0 and not version.commit:
            said = (res.stderr + res.stdout).strip()[-600:] or "no output"
            how = f"rc={res.rc}" if res.rc > 0 else "killed by a signal"
            raise TaskFailed(
                f"{ctx.host}: the new llama-server does not run ({exe} --version: {how}): {said}; "
                f"nothing was switched ({self.p['root']}/current is unchanged)"
            )
        if not version.commit or not self.p["commit"].startswith(version.commit):
            raise TaskFailed(
                f"{exe} --version reports commit {version.commit} ({version.label}), not the pinned "
                f"{self.p['commit'][:12]}; the build did not take LLAMA_BUILD_COMMIT"
            )
