"""`llama_repo=controller:PATH`: the llama.cpp git repository lives on the controller, and hosts get
the pinned commit as a git bundle instead of cloning (GPU boxes on lab networks often have no route
to GitHub; the controller has the source, the hosts only need the objects).

The bundle holds the pinned commit with its history, the commits of `pr`/`remote` patches (they
must be in the controller's repository: the host never fetches), and the nearest `bNNNN` tag (so
the build number comes out as from a clone). It is built in a scratch repository that borrows the
controller repository's objects (git alternates): the user's repository gets no ref and no write.
"""

from __future__ import annotations

import asyncio
import hashlib
import subprocess
import tempfile
from collections.abc import Sequence
from pathlib import Path
from tunnelspec.cluster.fields import cluster_error
from tunnelspec.core.gitenv import git_env
from tunnelspec.connection.upload import upload_file

PREFIX = "controller:"
# Refs the bundle carries; the host fetches them into the same names.
BASE_REF = "refs/tunnelspec/base"
PATCH_REF = "refs/tunnelspec/patch-{}"
_TIMEOUT = 1800


class ControllerRepoError(ValueError):
    pass


def is_controller_repo(repo: str | None) -> bool:
    return isinstance(repo, str) and repo.startswith(PREFIX)


def path_of(repo: str, base_dir: Path) -> Path:
    """`controller:PATH` → absolute path (relative paths are relative to the inventory's directory)."""
    raw = Path(repo[len(PREFIX) :]).expanduser()
    return (raw if raw.is_absolute() else base_dir / raw).resolve()


def canonical(repo: str, base_dir: Path) -> str:
    """What the host records as its origin: the absolute form, the same whatever the cwd."""
    return PREFIX + str(path_of(repo, base_dir))


def _git(path: Path, *args: str, check: bool = True, **kw) -> subprocess.CompletedProcess:
    # Not the repository a hook of the user's runs in (core/gitenv.py): `path`'s.
    env = git_env(GIT_TERMINAL_PROMPT="0", LC_ALL="C")
    return subprocess.run(
        ["git", "-C", str(path), *args], capture_output=True, text=True, env=env, timeout=_TIMEOUT, check=check, **kw
    )


def resolve(path: Path, rev: str) -> str | None:
    res = _git(path, "rev-parse", "-q", "--verify", f"{rev}^{{commit}}", check=False)
    return res.stdout.strip() if res.returncode == 0 else None


def _resolved(path: Path, rev: str) -> str:
    """`rev`'s commit, which check() found in the repository before any bundle is made."""
    sha = resolve(path, rev)
    if sha is None:
        raise ControllerRepoError(f"commit {rev} is not in the controller repository {path}")
    return sha


def check(path: Path, commit: str, patch_commits: Sequence[str | None] = ()) -> None:
    """The repository exists and holds the pinned commit and every patch commit."""
    if not path.exists():
        raise ControllerRepoError(
            f"controller path {path} does not exist (relative paths are relative to the inventory's directory)"
        )
    res = _git(path, "rev-parse", "--is-bare-repository", "--absolute-git-dir", check=False)
    if res.returncode != 0:
        raise ControllerRepoError(
            f"controller path {path} is not a git repository; point llama_repo at a "
            "clone of llama.cpp (bare or not): llama_repo=controller:/path/to/llama.cpp"
        )
    bare, git_dir = res.stdout.split()[:2]
    top = _git(path, "rev-parse", "--show-toplevel", check=False).stdout.strip()
    if Path(git_dir).resolve() != path and (bare == "true" or Path(top).resolve() != path):
        # A directory inside some other repository (the inventory's own, say) is not the source.
        raise ControllerRepoError(
            f"controller path {path} is not a git repository itself (it lies inside "
            f"{top or git_dir}); point llama_repo at the llama.cpp clone"
        )
    if resolve(path, commit) is None:
        raise ControllerRepoError(
            f"the repository {path} on the controller does not contain commit {commit}; "
            f"fetch it there first (git -C {path} fetch origin {commit})"
        )
    for sha in patch_commits:
        if sha and resolve(path, sha) is None:
            raise ControllerRepoError(
                f"patch commit {sha} is not in the controller repository {path}; the hosts "
                "get every commit from it, so fetch the PR or branch there first"
            )


def nearest_tag(path: Path, commit: str) -> str | None:
    res = _git(path, "describe", "--tags", "--match", "b[0-9]*", "--abbrev=0", commit, check=False)
    return res.stdout.strip() if res.returncode == 0 and res.stdout.strip() else None


def make_bundle(path: Path, commit: str, patch_commits: list[str], dest: Path, basis: Sequence[str] = ()) -> list[str]:
    """Write the bundle to `dest`; returns the refs it carries. `basis`: commits the host already
    has (and the controller too): left out with their history, so a bump of the pinned commit
    sends only the new commits (the bundle names them as prerequisites, which git checks)."""
    objects = _git(path, "rev-parse", "--path-format=absolute", "--git-path", "objects").stdout.strip()
    with tempfile.TemporaryDirectory(prefix="tunnelspec-bundle-") as tmp:
        scratch = Path(tmp) / "scratch.git"
        subprocess.run(["git", "init", "-q", "--bare", str(scratch)], check=True, capture_output=True, env=git_env())
        (scratch / "objects" / "info" / "alternates").write_text(objects + "\n")
        refs = {BASE_REF: _resolved(path, commit)}
        for i, sha in enumerate(patch_commits):
            refs[PATCH_REF.format(i)] = _resolved(path, sha)
        tag = nearest_tag(path, commit)
        if tag:
            refs[f"refs/tags/{tag}"] = _git(path, "rev-parse", f"refs/tags/{tag}").stdout.strip()
        for ref, sha in refs.items():
            _git(scratch, "update-ref", ref, sha)
        _git(scratch, "bundle", "create", str(dest), *refs, *(f"^{b}" for b in basis))
    return list(refs)


# ---- the host side -------------------------------------------------------------------------------
BUNDLE_FILE = ".git/tunnelspec-source.bundle"


async def missing_on_host(conn, d: str, shas: list[str]) -> list[str]:
    """The commits of `shas` the host's checkout does not hold (one read-only command: a probe, so
    the play's batched reads stay valid after it)."""
    script = 'd=$1; shift; for s; do git -C "$d" cat-file -e "$s^{commit}" 2>/dev/null || echo "$s"; done'
    res = await conn.probe(["sh", "-c", script, "sh", d, *shas], check=True)
    return res.stdout.split()


async def host_basis(conn, d: str, path: Path) -> list[str]:
    """Commits the host's checkout holds that the controller repository has too: HEAD and what
    earlier bundles brought (a host that was never given anything has none)."""
    script = (
        'cd -- "$1" 2>/dev/null || exit 0; git rev-parse -q --verify HEAD 2>/dev/null; '
        'git for-each-ref --format="%(objectname)" refs/tunnelspec/bundle/ 2>/dev/null; exit 0'
    )
    res = await conn.run(["sh", "-c", script, "sh", d], check=True)
    shas = sorted({s for s in res.stdout.split() if len(s) == 40})
    return [s for s in shas if resolve(path, s) == s]


async def send_bundle(
    conn, d: str, path: Path, commit: str, patch_commits: list[str], progress=None
) -> tuple[int, int]:
    """Build the bundle on the controller, upload it into the host's .git (atomic, sha256 checked),
    fetch its refs there and remove it. Returns (bundle size in bytes, prerequisites used)."""
    basis = await host_basis(conn, d, path)
    with tempfile.TemporaryDirectory(prefix="tunnelspec-bundle-out-") as tmp:
        local = Path(tmp) / "source.bundle"
        await asyncio.to_thread(make_bundle, path, commit, patch_commits, local, basis)
        h = hashlib.sha256()
        with local.open("rb") as f:
            for block in iter(lambda: f.read(2**20), b""):
                h.update(block)
        dest = f"{d}/{BUNDLE_FILE}"
        await upload_file(conn, local, dest, h.hexdigest(), progress=progress)
        size = local.stat().st_size
    try:
        res = await conn.run(
            [
                "git",
                "-C",
                d,
                "fetch",
                "--quiet",
                "--no-tags",
                "--",
                dest,
                "+refs/tunnelspec/*:refs/tunnelspec/bundle/*",
                "+refs/tags/*:refs/tags/*",
            ],
            timeout=3600,
        )
        if res.rc != 0:
            raise RuntimeError(f"git fetch from the bundle failed: {res.stderr.strip()[-600:]}")
    finally:
        await conn.run(["rm", "-f", "--", dest])
    return size, len(basis)


def check_controller_source(inv, main_name: str, source) -> None:
    """llama_repo=controller:PATH: the controller's repository holds the pinned commit and every
    patch commit (the hosts get them from it). Local git only; no network. The cluster model's
    `source_check` for the commands that send the source."""
    if not is_controller_repo(source.repo):
        return
    try:
        check(
            path_of(source.repo, inv.path.parent), source.commit, [p.pinned for p in source.patches if p.kind != "file"]
        )
    except ControllerRepoError as err:
        raise cluster_error(inv, main_name, "llama_repo", str(err)) from None
