"""Build llama.cpp from the fixture repo on *this* machine, for tests (rpc-server + llama-server).

Layout: `<root>/<commit>/src/llama.cpp` (a checkout), `<root>/<commit>/build/dev`, and a stamp
written last; a finished build is reused instantly. This is the layout of a deployed host
(`{root}/src/llama.cpp`, `{root}/build/<key>`) with the same options and the same ccache settings
(CCACHE_BASEDIR = the base, compilers compared by content, the build dir not hashed): ccache rewrites
absolute paths below the base dir into relative ones before hashing, so this build and a lab host's
build of the same tree hit each other's cache entries. That needs one locale too (ccache hashes
LANG and LC_*, which an SSH session on a host lacks): measured 2026-12-01, after the lab's main
built b11434 into an empty ccache, this build took 48 s (181 of 197 compiles hit) instead of 254 s.

Run by hand (e.g. in the background before tests): `python3 -m support.devbuild`.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import subprocess
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from tunnelspec.core.errors import TaskFailed
from tunnelspec.lab.fixtures import Fixtures, ensure_fixtures
from support.upstream_fixtures import ensure_upstream_fixtures
from tunnelspec.llama import versions
from tunnelspec.llama import build_plan as bp

HOST_BUILD_ROOT = "/var/cache/tunnelspec/host-build"
CCACHE_DIR = "/var/cache/tunnelspec/ccache"
STAMP = "tunnelspec-build.json"
LLAMA_SERVER = "llama-server"


@dataclass(frozen=True)
class DevBuild:
    commit: str
    source_dir: str
    bin_dir: str
    rpc_server: str  # absolute path of ggml-rpc-server (or rpc-server in older trees)
    llama_server: str
    build_seconds: float  # of the build that produced it (not of this call)


def ccache_env(base_dir: str | os.PathLike) -> dict[str, str]:
    env = dict(os.environ)
    env.update(dict(a.split("=", 1) for a in bp.ccache_env(str(base_dir))), CCACHE_DIR=CCACHE_DIR)
    return env


def cmake_options(fx: Fixtures, src: Path, tree: str | None = None) -> list[str]:
    """What `llama_build` passes on a host for this tree (cpu backend, ccache launcher)."""
    text = "\n".join((src / f).read_text() for f in bp.OPTION_FILES if (src / f).is_file())
    commit, number = _pinned(fx, tree)
    return [*bp.keyed_options(commit, number, "cpu", []), *bp.tree_options(bp.option_names(text)),
            *bp.launcher_options(True, "cpu")]


def _pinned(fx: Fixtures, tree: str | None) -> tuple[str, int | None]:
    if tree is None:
        return fx.commit, fx.build_number
    t = ensure_upstream_fixtures().tree(tree)
    return t.commit, t.build_number


def _repo(fx: Fixtures, tree: str | None) -> str:
    return fx.repo_local if tree is None else ensure_upstream_fixtures().repo_local


def ensure_dev_build(
    fx: Fixtures | None = None,
    root: str = HOST_BUILD_ROOT,
    jobs: int = 2,
    log=None,
    tree: str | None = None,
) -> DevBuild:
    """The build of the default fixture tree, or of upstream fixture tree `tree` (e.g. "b9093")."""
    fx = fx or ensure_fixtures()
    base = Path(root) / _pinned(fx, tree)[0]
    base.mkdir(parents=True, exist_ok=True)
    # One build per commit at a time (a test session and a background build may race).
    with open(base / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        done = _read_stamp(base / STAMP)
        if done is not None:
            return done
        return _build(fx, base, jobs, log, tree)


def _read_stamp(stamp: Path) -> DevBuild | None:
    try:
        b = DevBuild(**json.loads(stamp.read_text()))
    except (OSError, ValueError, TypeError):
        return None
    if all(os.access(p, os.X_OK) for p in (b.rpc_server, b.llama_server)):
        return b
    return None


def _run(argv: list[str], cwd: Path, env: dict[str, str], log) -> None:
    res = subprocess.run(argv, cwd=cwd, env=env, stdout=log or subprocess.PIPE,
                         stderr=subprocess.STDOUT, text=True, timeout=3600)
    if res.returncode != 0:
        tail = (res.stdout or "")[-3000:]
        raise TaskFailed(f"{' '.join(argv)} failed (rc={res.returncode}) in {cwd}\n{tail}")


def _build(fx: Fixtures, base: Path, jobs: int, log, tree: str | None) -> DevBuild:
    started = time.monotonic()
    commit, _ = _pinned(fx, tree)
    src, build = base / "src" / "llama.cpp", base / "build" / "dev"
    env = ccache_env(base)
    if src.exists():
        shutil.rmtree(src)
    src.parent.mkdir(parents=True, exist_ok=True)
    _run(["git", "clone", "-q", "--no-checkout", _repo(fx, tree), str(src)], base, env, log)
    _run(["git", "-c", "advice.detachedHead=false", "checkout", "-q", "--detach", commit],
         src, env, log)
    target = versions.rpc_server_target((src / versions.RPC_TOOL_CMAKELISTS).read_text())
    # A fixture repo has one commit per tree: `rev-list --count` would say "build 1"; the real
    # upstream number (0 = unknown for the default tree) is passed instead, as a deploy does.
    nice = ["nice", "-n", "10"]
    _run(nice + ["cmake", "-S", str(src), "-B", str(build), *cmake_options(fx, src, tree)], base, env, log)
    _run(nice + ["cmake", "--build", str(build), "--target", target, LLAMA_SERVER,
                 "-j", str(jobs)], base, env, log)
    bin_dir = build / "bin"
    result = DevBuild(
        commit=commit, source_dir=str(src), bin_dir=str(bin_dir),
        rpc_server=str(bin_dir / target), llama_server=str(bin_dir / LLAMA_SERVER),
        build_seconds=round(time.monotonic() - started, 1),
    )
    tmp = base / (STAMP + ".tmp")
    tmp.write_text(json.dumps(asdict(result), indent=2))
    os.replace(tmp, base / STAMP)
    return result


if __name__ == "__main__":  # pragma: no cover - a manual entry point for slow builds
    import sys

    b = ensure_dev_build(log=sys.stdout, tree=sys.argv[1] if len(sys.argv) > 1 else None)
    print(json.dumps(asdict(b), indent=2))
