"""Build llama.cpp from the fixture repo on *this* machine, for tests (rpc-server + llama-server).

Layout: `<root>/<commit>/src` (a checkout), `<root>/<commit>/build`, and a stamp written last; a
finished build is reused instantly. ccache runs with CCACHE_BASEDIR = `<root>/<commit>` and
CCACHE_COMPILERCHECK=content so that lab hosts building the same tree with the same
`src`/`build` layout under another base path hit the same cache (ccache rewrites absolute paths
below the base dir into relative ones before hashing).

Run by hand (e.g. in the background before tests): `python3 -m tunnelspec.lab.devbuild`.
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

from tunnelspec.errors import TaskFailed
from tunnelspec.lab.fixtures import Fixtures, ensure_fixtures
from tunnelspec.llama import versions
from tunnelspec.llama.build_plan import BASE_OPTIONS

HOST_BUILD_ROOT = "/var/cache/tunnelspec/host-build"
CCACHE_DIR = "/var/cache/tunnelspec/ccache"
STAMP = "tunnelspec-build.json"
LLAMA_SERVER = "llama-server"

# The same options as a deployed build (build_plan.BASE_OPTIONS), with ccache as the launcher.
CMAKE_OPTIONS = [
    *BASE_OPTIONS,
    "-DCMAKE_C_COMPILER_LAUNCHER=ccache",
    "-DCMAKE_CXX_COMPILER_LAUNCHER=ccache",
]


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
    env.update(
        CCACHE_DIR=CCACHE_DIR,
        CCACHE_BASEDIR=str(base_dir),
        CCACHE_COMPILERCHECK="content",
        # __DATE__/__TIME__ in build-info would otherwise defeat the cache.
        CCACHE_SLOPPINESS="time_macros",
    )
    return env


def ensure_dev_build(
    fx: Fixtures | None = None,
    root: str = HOST_BUILD_ROOT,
    jobs: int = 2,
    log=None,
) -> DevBuild:
    fx = fx or ensure_fixtures()
    base = Path(root) / fx.commit
    base.mkdir(parents=True, exist_ok=True)
    # One build per commit at a time (a test session and a background build may race).
    with open(base / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        done = _read_stamp(base / STAMP)
        if done is not None:
            return done
        return _build(fx, base, jobs, log)


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


def _build(fx: Fixtures, base: Path, jobs: int, log) -> DevBuild:
    started = time.monotonic()
    src, build = base / "src", base / "build"
    env = ccache_env(base)
    if src.exists():
        shutil.rmtree(src)
    _run(["git", "clone", "-q", "--no-checkout", fx.repo_local, str(src)], base, env, log)
    _run(["git", "-c", "advice.detachedHead=false", "checkout", "-q", "--detach", fx.commit],
         src, env, log)
    target = versions.rpc_server_target((src / versions.RPC_TOOL_CMAKELISTS).read_text())
    # The fixture repo has one commit: `rev-list --count` would say "build 1", which is false
    # and would trip the advisories check. 0 means "unknown" (the upstream number is not recorded).
    number = fx.build_number if fx.build_number is not None else 0
    nice = ["nice", "-n", "10"]
    _run(nice + ["cmake", "-S", str(src), "-B", str(build), *CMAKE_OPTIONS,
                 f"-DLLAMA_BUILD_NUMBER={number}", f"-DLLAMA_BUILD_COMMIT={fx.commit[:9]}"],
         base, env, log)
    _run(nice + ["cmake", "--build", str(build), "--target", target, LLAMA_SERVER,
                 "-j", str(jobs)], base, env, log)
    bin_dir = build / "bin"
    result = DevBuild(
        commit=fx.commit, source_dir=str(src), bin_dir=str(bin_dir),
        rpc_server=str(bin_dir / target), llama_server=str(bin_dir / LLAMA_SERVER),
        build_seconds=round(time.monotonic() - started, 1),
    )
    tmp = base / (STAMP + ".tmp")
    tmp.write_text(json.dumps(asdict(result), indent=2))
    os.replace(tmp, base / STAMP)
    return result


if __name__ == "__main__":  # pragma: no cover - a manual entry point for slow builds
    import sys

    b = ensure_dev_build(log=sys.stdout)
    print(json.dumps(asdict(b), indent=2))
