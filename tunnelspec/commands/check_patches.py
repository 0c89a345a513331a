"""`tunnelspec check`'s look at the file patches: `git apply --check` of each, in order, on the
pinned tree, when the controller holds that tree (llama_repo=controller:PATH)."""

from __future__ import annotations

import subprocess
import tempfile
from pathlib import Path

from tunnelspec.components.source import controller_repo
from tunnelspec.core.gitenv import git_env


def patches_problem(cluster) -> str | None:
    """Why the file patches do not apply to the pinned tree, or None. Only when the controller
    holds the tree and no commit patch comes first (its changes would be needed under the
    files'); None, quietly, otherwise."""
    source = cluster.source
    files = [p for p in source.patches if p.kind == "file"]
    if not files or not controller_repo.is_controller_repo(source.repo):
        return None
    kinds = [p.kind for p in source.patches]
    last_file = max(i for i, k in enumerate(kinds) if k == "file")
    if any(k != "file" for k in kinds[:last_file]):
        return None
    repo = controller_repo.path_of(source.repo, cluster.inventory.path.parent)
    return _apply_in_scratch(repo, source.commit, [p.file for p in files])


def _apply_in_scratch(repo: Path, commit: str, patches: list[Path]) -> str | None:
    """The patches applied, in order, to the commit's tree in a scratch index: the user's
    repository gets no write (the scratch repository borrows its objects, as the bundle does)."""
    env = git_env(GIT_TERMINAL_PROMPT="0", LC_ALL="C")  # never the index of a hook's repository

    def git(*args, cwd):
        return subprocess.run(["git", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=120)

    objects = git("rev-parse", "--path-format=absolute", "--git-path", "objects", cwd=repo)
    if objects.returncode != 0:
        return None
    with tempfile.TemporaryDirectory(prefix="tunnelspec-check-") as tmp:
        scratch = Path(tmp) / "scratch.git"
        if git("init", "-q", "--bare", str(scratch), cwd=tmp).returncode != 0:
            return None
        (scratch / "objects" / "info" / "alternates").write_text(objects.stdout.strip() + "\n")
        if git("read-tree", commit, cwd=scratch).returncode != 0:
            return None
        for path in patches:
            res = git("apply", "--cached", str(path), cwd=scratch)
            if res.returncode != 0:
                why = res.stderr.strip().splitlines()
                return (
                    f"the patch file {path} does not apply to the pinned tree {commit[:12]} "
                    f"(git apply: {why[0] if why else 'failed'}); regenerate it for this commit"
                )
    return None
