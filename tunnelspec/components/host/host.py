"""The host itself: its facts, whether tunnelspec can serve it, and its prerequisites.

`host_facts` gathers the facts once per run (facts/host.py, one round trip, as the login user; the
version lines from the controller's cache when the host's binaries are unchanged: facts_cache.py) and
refuses, naming the host and what was found, a host tunnelspec cannot serve: not Linux, PID 1 not
systemd, a non-root login without working sudo, no `flock`, a compiler or cmake too old for
llama.cpp, too little disk. It runs in the deploy's first play, before the run lock and before any
host changes (engine: `preflight: true` plays).

`prerequisites` compares the prerequisites table (components/host/prereqs.py) with the facts. With `plan_only` it
is read-only: it stops the run when a missing prerequisite cannot be installed (no apt-get,
`tunnelspec_install_packages=false`, or not packaged), naming exactly what is missing; otherwise it
installs the missing packages with the host's package manager and gathers the facts again.
The GPU backend's runtime (its driver: prereqs.RUNTIME) is looked for in the same read-only pass and
never installed: a missing NVIDIA driver, or `llama_backend=metal` on Linux, is refused; a missing
Vulkan or ROCm driver is a warning in the output (the rpc play refuses a node that then serves the
CPU only: the driver may well be installed before its server starts).
"""

from __future__ import annotations

import shlex

from tunnelspec.components.host import facts_cache, prereqs
from tunnelspec.core.errors import TaskFailed
from tunnelspec.facts.host import HostFacts, facts_from_dict, host_facts, parse_facts, versions_of
from tunnelspec.reporting import events
from tunnelspec.modules.base import Arg, Task, change, ok, register_task
from tunnelspec.core.booleans import truthy

FACTS_KEY = "host_facts"
# llama.cpp builds as C++17 with CMake >= 3.14 (its CMakeLists.txt); GCC 9 is the first whose C++17
# library (std::filesystem without -lstdc++fs) the tree compiles with.
MIN_GCC = (9, 0)
MIN_CMAKE = (3, 14)
# ggml-vulkan's own CMakeLists.txt asks for more (b9093 to b11434: cmake_minimum_required 3.19).
MIN_CMAKE_BACKEND = {"vulkan": (3, 19)}
MIN_DISK_KB = 3 * 1024 * 1024  # a CPU build of llama-server with its source: about 1.5 GiB
DEFAULT_ROOT = "/opt/tunnelspec"
APT_ENV = ["env", "DEBIAN_FRONTEND=noninteractive", "NEEDRESTART_MODE=a"]


def _v(t) -> str:
    return ".".join(map(str, t))


async def _run(conn, root: str, key: str) -> str:
    res = await conn.probe(host_facts(root, key).argv, become=False, timeout=60)
    if res.rc != 0 and not res.stdout:
        raise TaskFailed(f"cannot read the host's facts (rc={res.rc}): {res.stderr.strip()[-500:]}")
    return res.stdout


async def gather(conn, root: str = DEFAULT_ROOT, *, reuse: bool = True) -> HostFacts:
    """The host's facts, its version lines from the controller's cache when the host says its
    binaries are those of the cached lines (facts_cache.py); `reuse=False`: the version commands run
    (after an install). A full gather's lines are kept for the next run."""
    ident = facts_cache.identity(conn)
    rec = facts_cache.load(ident) if reuse else None
    text = await _run(conn, root, rec.key if rec else "")
    got = versions_of(text)
    if got.cached:
        if rec is not None and got.key == rec.key:
            return parse_facts(text + "".join(f"{line}\n" for line in rec.lines))
        text = await _run(conn, root, "")  # never facts without versions: once more, in full
        got = versions_of(text)
        if got.cached:
            raise TaskFailed("the host's facts script skipped its version commands without a key to skip them by")
    facts_cache.save(ident, got.key, got.lines)
    return parse_facts(text)


def facts_of(ctx) -> HostFacts | None:
    d = ctx.facts.get(FACTS_KEY)
    return facts_from_dict(d) if isinstance(d, dict) else None


def refusals(f: HostFacts, *, become: bool, has_password: bool, build: bool) -> list[str]:
    """Why tunnelspec cannot serve this host (empty: it can)."""
    if f.system == "Darwin":
        return [
            f"this is {f.describe_os()}, not Linux: tunnelspec runs its services under systemd on Linux hosts. "
            "On a Mac, run llama.cpp's ggml-rpc-server or llama-server by hand (Metal build) bound to 127.0.0.1 and "
            "reach it through your own `ssh -L` tunnel; a Linux host can be the main host or an rpc node"
        ]
    if not f.is_linux:
        return [
            f"this is {f.system or 'an unknown system'} ({f.kernel}), not Linux: tunnelspec needs Linux with systemd"
        ]
    out = []
    if not f.has_systemd:
        out.append(
            f"PID 1 is {f.init or 'unknown'!r}, not systemd"
            + ("" if f.init != "systemd" else " (systemd is not the running service manager)")
            + ": tunnelspec runs the RPC server, tunnels and llama-server as systemd units"
        )
    if not f.is_root:
        if not become:
            out.append(
                f"the login {f.user!r} is not root and ansible_become is not set: "
                "set ansible_become=true (sudo) or log in as root"
            )
        elif "sudo" not in f.tools:
            out.append(f"the login {f.user!r} is not root and sudo is not installed (ansible_become=true needs it)")
        elif f.sudo_nopasswd is False and not has_password:
            msg = f.sudo_msg.strip() or "sudo -n refused"
            out.append(
                f"sudo refuses {f.user!r} without a password ({msg}): set ansible_become_password "
                "(e.g. -e @secrets.yml), or allow NOPASSWD for this user"
            )
    if "flock" not in f.tools:
        out.append("flock not found (package util-linux): tunnelspec holds its run lock with it")
    if build:
        out += toolchain_refusals(f)
        if f.disk_free_kb is not None and f.disk_free_kb < MIN_DISK_KB:
            out.append(f"{f.disk_free_kb // 1024} MiB free in {f.disk_dir}, a build needs {MIN_DISK_KB // 1024} MiB")
    return out


def toolchain_refusals(f: HostFacts, backend: str = "cpu") -> list[str]:
    """An installed compiler or cmake too old for llama.cpp or the host's backend (checked again
    after an install)."""
    out = []
    if f.gcc is not None and f.gcc < MIN_GCC:
        out.append(f"gcc {_v(f.gcc)} is too old for llama.cpp (C++17: gcc >= {_v(MIN_GCC)})")
    if f.cmake is not None and f.cmake < MIN_CMAKE:
        out.append(f"cmake {_v(f.cmake)} is too old for llama.cpp (cmake >= {_v(MIN_CMAKE)})")
    elif f.cmake is not None and backend in MIN_CMAKE_BACKEND and f.cmake < MIN_CMAKE_BACKEND[backend]:
        out.append(
            f"cmake {_v(f.cmake)} is too old for ggml's {backend} backend (its CMakeLists.txt needs cmake >= "
            f"{_v(MIN_CMAKE_BACKEND[backend])}; on Debian 11 take cmake from bullseye-backports)"
        )
    return out


@register_task
class HostFactsTask(Task):
    """Gather the host's facts (registered as `host_facts`) and refuse a host tunnelspec cannot serve."""

    module = "host_facts"
    read_only = True
    args = {
        "root": Arg(str, default=DEFAULT_ROOT, help="Where builds go: its file system's free space is a fact."),
        "become": Arg((bool, str), default=False, help="The inventory's ansible_become."),
        "has_password": Arg((bool, str), default=False, help="Whether ansible_become_password is set."),
        "require": Arg(bool, default=True, help="Refuse a host tunnelspec cannot serve (false: only gather)."),
        "build": Arg(bool, default=True, help="The host builds llama.cpp (compiler, cmake and disk are checked)."),
    }

    def connection_probes(self, conn) -> list[list[str]]:
        # What `gather` runs first: the version key the controller kept for this connection.
        rec = facts_cache.load(facts_cache.identity(conn))
        return [host_facts(self.p["root"], rec.key if rec else "").argv]

    async def check(self, ctx):
        f = await gather(ctx.conn, self.p["root"])
        ctx.register(FACTS_KEY, f.to_dict())
        if self.p["require"]:
            why = refusals(
                f, become=truthy(self.p["become"]), has_password=truthy(self.p["has_password"]), build=self.p["build"]
            )
            if why:
                raise TaskFailed(
                    f"{ctx.host}: tunnelspec cannot serve this host ({f.describe_os()}): "
                    + "; ".join(why)
                    + ". No host was changed"
                )
        return ok(f.summary())


def _need(ctx, p) -> prereqs.Need:
    return prereqs.Need(
        role=p["role"], backend=p["backend"], isolation=p["isolation"], https_repo=str(p["repo"]).startswith("https://")
    )


@register_task
class Prerequisites(Task):
    """The host's prerequisites (prereqs.TABLE) present: missing packages installed with apt-get."""

    module = "prerequisites"
    args = {
        "role": Arg(str, required=True, choices=("main", "rpc"), help="The host's role in the cluster."),
        "backend": Arg(str, default="cpu", help="The host's llama_backend."),
        "isolation": Arg(bool, default=True, help="rpc_local_isolation: nftables is needed."),
        "repo": Arg(str, default="", help="llama_repo (an https URL needs CA certificates)."),
        "install": Arg(
            bool,
            default=True,
            help="tunnelspec_install_packages: false never installs, and stops naming what is missing.",
        ),
        "plan_only": Arg(
            bool, default=False, help="Read-only: stop when something missing cannot be installed; install nothing."
        ),
        "root": Arg(str, default=DEFAULT_ROOT, help="Where builds go (for the facts gathered again)."),
    }

    async def check(self, ctx):
        f = facts_of(ctx) or await gather(ctx.conn, self.p["root"])
        backend_only = [w for w in toolchain_refusals(f, self.p["backend"]) if w not in toolchain_refusals(f)]
        if backend_only:
            raise TaskFailed(f"{ctx.host}: {'; '.join(backend_only)}. No host was changed")
        refused, warned = prereqs.runtime_findings(self.p["backend"], f)
        note = ""
        if self.p["plan_only"]:  # said once per run: the install pass after the lock repeats nothing
            for w in warned:
                ctx.emit(events.message(f"WARNING: {ctx.host}: {w}"))
            note = "".join(f"; WARNING {w}" for w in warned)
        missing = prereqs.missing(_need(ctx, self.p), f)
        unpackaged = [p for p in missing if not p.apt]
        if refused or unpackaged:
            why = [
                *(
                    f"missing {p.what} ({p.why}): not installable by tunnelspec, install it yourself"
                    for p in unpackaged
                ),
                *refused,
            ]
            raise TaskFailed(f"{ctx.host}: {'; '.join(why)}. Then run again. No host was changed")
        if not missing:
            elsewhere = prereqs.misplaced(_need(ctx, self.p), f)
            if elsewhere:
                raise TaskFailed(f"{ctx.host}: " + "; ".join(elsewhere))
            return ok(f"{len(prereqs.needed(_need(ctx, self.p)))} prerequisites present{note}")
        names = ", ".join(p.what for p in missing)
        pkgs = prereqs.packages(missing)
        if not self.p["install"]:
            raise TaskFailed(
                f"{ctx.host}: missing {names} (packages: {' '.join(pkgs)}), and "
                "tunnelspec_install_packages=false: install them and run again. No host was changed"
            )
        if f.package_manager not in prereqs.INSTALLERS:
            raise TaskFailed(
                f"{ctx.host}: missing {names}; tunnelspec installs packages with apt-get only and this "
                f"host has {f.package_manager or 'no known package manager'}: install them "
                f"(Debian names: {' '.join(pkgs)}) and run again. No host was changed"
            )
        if self.p["plan_only"]:
            return ok(f"will install {' '.join(pkgs)} (missing {names}){note}")
        return change(f"install {' '.join(pkgs)} (missing {names})", packages=pkgs)

    async def apply(self, ctx, ch):
        pkgs = ch.data["packages"]
        install = [*APT_ENV, "apt-get", "install", "-y", "-q", "--no-install-recommends", *pkgs]
        async with ctx.heartbeat(f"apt-get install {' '.join(pkgs)}"):
            res = await ctx.conn.run(install, timeout=1800)
        if res.rc != 0:
            # Stale or empty package lists are the usual cause on a fresh host: refresh them once.
            async with ctx.heartbeat("apt-get update (the install failed; the package lists may be stale)"):
                upd = await ctx.conn.run([*APT_ENV, "apt-get", "update", "-q"], timeout=600)
            if upd.rc != 0:
                raise TaskFailed(f"apt-get update failed:\n{_tail(upd.stderr or upd.stdout)}")
            async with ctx.heartbeat(f"apt-get install {' '.join(pkgs)} (after apt-get update)"):
                res = await ctx.conn.run(install, timeout=1800)
        if res.rc != 0:
            raise TaskFailed(f"installing failed: {shlex.join(install)}\n{_tail(res.stderr or res.stdout)}")
        f = await gather(ctx.conn, self.p["root"], reuse=False)
        ctx.register(FACTS_KEY, f.to_dict())
        why = toolchain_refusals(f, self.p["backend"])
        if why:
            raise TaskFailed(f"{ctx.host}: the installed toolchain cannot build llama.cpp: {'; '.join(why)}")


def _tail(text: str, n: int = 15) -> str:
    return "\n".join(text.rstrip().splitlines()[-n:])
