"""Lab fixtures: a llama.cpp git repository and a tiny GGUF model, both reproducible byte for byte.

The llama.cpp source comes from the `llama-cpp-python` sdist on PyPI (its `vendor/llama.cpp` is a
complete tree), because PyPI is reachable and GitHub is not. The tree is committed with fixed
author/committer identity and dates so the commit SHA is the same on every machine and every run:
tests and inventories can pin it. A second commit on a side branch gives patch-stack tests something
to cherry-pick by SHA.

Everything is cached under `fixtures_dir`; a finished fixture is marked by a stamp written last, so
re-running is instant and an interrupted run starts over cleanly.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import tarfile
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

from tunnelspec.errors import LabError
from tunnelspec.lab import gguf_tiny

FIXTURES_DIR = "/var/cache/tunnelspec/fixtures"
DOWNLOADS_DIR = "/var/cache/tunnelspec/downloads"
# Where the lab bind-mounts `fixtures_dir` (read-only) inside every host.
HOST_MOUNT = "/srv/tunnelspec-fixtures"

SDIST_PROJECT = "llama-cpp-python"
SDIST_VERSION = "0.3.36"
SDIST_FILE = "llama_cpp_python-0.3.36.tar.gz"
SDIST_SHA256 = "832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e"
SDIST_VENDOR_DIR = "llama_cpp_python-0.3.36/vendor/llama.cpp"
# The upstream commit the sdist vendors: named by its CHANGELOG ("update llama.cpp to
# ggml-org/llama.cpp@0c1e57098") and by the shallow submodule git dir it ships. The clone is
# shallow, so the upstream build number (`git rev-list --count`) is not recorded anywhere.
UPSTREAM_COMMIT = "0c1e57098bba43ac29e6e3b677cdceebdd22334f"
UPSTREAM_BUILD_NUMBER: int | None = None

REPO_NAME = "llama.cpp.git"
MAIN_BRANCH = "master"
SIDE_BRANCH = "tunnelspec-test/patch-a"
MODEL_RELPATH = "models/tiny-llama.gguf"
STAMP_NAME = ".tunnelspec-fixtures.json"
# Bump when the recipe changes, so caches made by an older recipe are rebuilt.
RECIPE_VERSION = 1

_GIT_IDENTITY = {
    "GIT_AUTHOR_NAME": "tunnelspec fixtures",
    "GIT_AUTHOR_EMAIL": "fixtures@tunnelspec.invalid",
    "GIT_COMMITTER_NAME": "tunnelspec fixtures",
    "GIT_COMMITTER_EMAIL": "fixtures@tunnelspec.invalid",
}
_MAIN_DATE = "2026-10-01T00:00:00+00:00"
_SIDE_DATE = "2026-10-02T00:00:00+00:00"
SIDE_FILE = "README.md"
SIDE_LINE = "\n<!-- tunnelspec-test/patch-a: harmless patch for patch-stack tests -->\n"


@dataclass(frozen=True)
class Fixtures:
    repo: str  # path of the bare repo inside lab hosts
    repo_local: str  # same repo on this machine
    commit: str  # 40-hex SHA of the main commit (branch `master`)
    side_commit: str  # SHA of the commit on SIDE_BRANCH (child of `commit`)
    side_branch: str
    build_number: int | None  # upstream build number of the vendored tree, None: unknown
    upstream_commit: str  # upstream llama.cpp commit the sdist vendors
    model: str  # tiny GGUF path inside lab hosts
    model_local: str
    model_sha256: str


def ensure_fixtures(fixtures_dir: str = FIXTURES_DIR, downloads_dir: str = DOWNLOADS_DIR) -> Fixtures:
    """Create (once) and return the fixtures; later calls read the stamp and return at once."""
    root = Path(fixtures_dir)
    stamp = root / STAMP_NAME
    return made_once(root, stamp, _read_stamp, lambda: _create(root, stamp, downloads_dir))


def made_once(root: Path, stamp: Path, read_stamp, create):
    """What `read_stamp(stamp)` returns when a finished fixture is there, else `create()`'s result.
    The lab and a test session may both ask at once: one creates, the other waits and reuses."""
    cached = read_stamp(stamp)
    if cached is not None:
        return cached
    root.mkdir(parents=True, exist_ok=True)
    with open(root / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        cached = read_stamp(stamp)
        if cached is not None:
            return cached
        return create()


def _create(root: Path, stamp: Path, downloads_dir: str) -> Fixtures:
    stamp.unlink(missing_ok=True)
    sdist = ensure_sdist(downloads_dir)
    commit, side_commit = build_repo(sdist, root / REPO_NAME)
    model_path = root / MODEL_RELPATH
    model_sha = gguf_tiny.write_tiny_llama(model_path)
    fx = Fixtures(
        repo=f"{HOST_MOUNT}/{REPO_NAME}",
        repo_local=str(root / REPO_NAME),
        commit=commit,
        side_commit=side_commit,
        side_branch=SIDE_BRANCH,
        build_number=UPSTREAM_BUILD_NUMBER,
        upstream_commit=UPSTREAM_COMMIT,
        model=f"{HOST_MOUNT}/{MODEL_RELPATH}",
        model_local=str(model_path),
        model_sha256=model_sha,
    )
    write_stamp(stamp, RECIPE_VERSION, fx)
    return fx


def _read_stamp(stamp: Path) -> Fixtures | None:
    return read_stamp(stamp, RECIPE_VERSION, lambda data: Fixtures(**data))


def read_stamp(stamp: Path, recipe: int, make):
    """The fixture `make(data)` builds from a stamp of this `recipe`, else None (no stamp, another
    recipe, a stamp of another shape, or files that vanished: someone cleaned the cache by hand)."""
    try:
        data = json.loads(stamp.read_text())
    except (OSError, ValueError):
        return None
    if data.pop("recipe", None) != recipe:
        return None
    try:
        fx = make(data)
    except TypeError:
        return None
    if not (Path(fx.repo_local).is_dir() and Path(fx.model_local).is_file()):
        return None
    return fx


def write_stamp(stamp: Path, recipe: int, fx) -> None:
    """Written last, to a temp name then renamed: a crash never leaves a stamp of a half-made fixture."""
    tmp = stamp.with_suffix(".tmp")
    tmp.write_text(json.dumps({"recipe": recipe, **asdict(fx)}, indent=2, sort_keys=True))
    os.replace(tmp, stamp)


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def ensure_sdist(downloads_dir: str = DOWNLOADS_DIR) -> Path:
    """The verified sdist, downloaded with pip when missing. A wrong checksum is an error, never
    silently accepted: the fixture SHA depends on these exact bytes."""
    dest = Path(downloads_dir)
    path = dest / SDIST_FILE
    if path.is_file() and sha256_file(path) == SDIST_SHA256:
        return path
    dest.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=dest, prefix=".pip-") as tmp:
        argv = [
            "pip", "download", "--no-deps", "--no-binary", ":all:",
            f"{SDIST_PROJECT}=={SDIST_VERSION}", "--dest", tmp,
        ]
        try:
            res = subprocess.run(argv, capture_output=True, text=True, timeout=900)
        except subprocess.TimeoutExpired as exc:
            raise LabError(f"pip download of {SDIST_PROJECT}=={SDIST_VERSION} timed out") from exc
        got = Path(tmp) / SDIST_FILE
        if res.returncode != 0 or not got.is_file():
            raise LabError(
                f"pip download of {SDIST_PROJECT}=={SDIST_VERSION} failed (rc={res.returncode}): "
                f"{res.stderr.strip()[-2000:]}"
            )
        digest = sha256_file(got)
        if digest != SDIST_SHA256:
            raise LabError(f"{SDIST_FILE}: sha256 {digest} != expected {SDIST_SHA256}")
        os.replace(got, path)
    return path


def _git_env(date: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    env.update(_GIT_IDENTITY)
    env.update(GIT_AUTHOR_DATE=date, GIT_COMMITTER_DATE=date)
    # Ignore the machine's git config (templates, hooks, autocrlf, signing): they could change bytes.
    env.update(GIT_CONFIG_NOSYSTEM="1", GIT_CONFIG_GLOBAL="/dev/null", HOME="/nonexistent")
    return env


def _git(cwd: Path, *args: str, date: str = _MAIN_DATE) -> str:
    res = subprocess.run(
        ["git", "-c", "core.autocrlf=false", "-c", "commit.gpgsign=false", *args],
        cwd=cwd, env=_git_env(date), capture_output=True, text=True, timeout=600,
    )
    if res.returncode != 0:
        raise LabError(f"git {' '.join(args)} in {cwd} failed: {res.stderr.strip()}")
    return res.stdout.strip()


def _extract_vendor_tree(sdist: Path, dest: Path) -> None:
    """Extract vendor/llama.cpp only, without the sdist's own `.git` link file (it points into the
    sdist's submodule dir) and with normalised modes (git records only the exec bit)."""
    prefix = SDIST_VENDOR_DIR + "/"
    with tarfile.open(sdist, "r:gz") as tar:
        members = []
        for m in tar.getmembers():
            if not m.name.startswith(prefix):
                continue
            rel = m.name[len(prefix):]
            if rel == ".git" or rel.startswith(".git/"):
                continue
            if not (m.isfile() or m.isdir() or m.issym()):
                continue
            m.name = rel
            members.append(m)
        tar.extractall(dest, members=members, filter="data")


def build_repo(sdist: Path, bare_dest: Path) -> tuple[str, str]:
    """Commit the vendored tree deterministically and publish it as a bare repo at `bare_dest`.
    Returns (main commit, side commit). Work happens in a temp dir; the result is moved in place."""
    parent = bare_dest.parent
    parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=parent, prefix=".repo-") as tmp:
        work = Path(tmp) / "work"
        work.mkdir()
        _extract_vendor_tree(sdist, work)
        _git(work, "init", "-q", "-b", MAIN_BRANCH)
        # -f: the tree's own .gitignore must not drop files the sdist ships.
        _git(work, "add", "-A", "-f", ".")
        _git(work, "commit", "-q", "--no-verify", "-m",
             f"llama.cpp {UPSTREAM_COMMIT[:9]} as vendored by {SDIST_PROJECT} {SDIST_VERSION}")
        commit = _git(work, "rev-parse", "HEAD")
        _git(work, "checkout", "-q", "-b", SIDE_BRANCH)
        with open(work / SIDE_FILE, "a", encoding="utf-8") as f:
            f.write(SIDE_LINE)
        _git(work, "commit", "-q", "--no-verify", "-a", "-m", "tunnelspec test: harmless README patch",
             date=_SIDE_DATE)
        side = _git(work, "rev-parse", "HEAD")
        _git(work, "checkout", "-q", MAIN_BRANCH)
        bare = Path(tmp) / "bare.git"
        _git(Path(tmp), "clone", "-q", "--bare", "--no-local", str(work), str(bare))
        _git(bare, "fetch", "-q", str(work), f"+refs/heads/{SIDE_BRANCH}:refs/heads/{SIDE_BRANCH}")
        # Hosts read it through a read-only mount as another user: no safe.directory surprises for
        # plain reads, but make every file world-readable.
        for p in [bare, *bare.rglob("*")]:
            p.chmod(0o755 if p.is_dir() else 0o644)
        if bare_dest.exists():
            shutil.rmtree(bare_dest)
        os.replace(bare, bare_dest)
    return commit, side
