"""The wanted llama.cpp source on a host, as pure data: the pinned base commit plus an ordered
patch stack, its fingerprint, and the parser of the one-round-trip state report a host sends back.

The fingerprint (base SHA + every patch spec + sha256 of every patch file) is stored on the host
in `.git/tunnelspec-stack` together with the HEAD and tree the stack produced. A later run compares
fingerprints and HEAD instead of re-applying anything, so "no change" needs one read-only command.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from pathlib import Path

from tunnelspec.core.errors import TaskFailed
from tunnelspec.core.vartypes import FULL_SHA as FULL_SHA  # the one rule; checkout.py reads it here
from tunnelspec.core.vartypes import VarValueError, full_sha

STACK_FILE = ".git/tunnelspec-stack"
# Present from the first change of an apply until its stack record is written: a run killed in
# between left a half-done checkout (a clone without its files, a partial checkout or patch stack)
# that the next run must redo, not refuse as the user's local modifications.
APPLYING_FILE = ".git/tunnelspec-applying"
PATCH_DIR = ".git/tunnelspec-patches"
# Bump when the way a stack is applied changes (identity, dates, commands): old stacks re-apply.
STACK_RECIPE = 1
# A whole-PR entry brings at most this many commits: GitHub itself lists no more than 250 commits
# of a pull request, and a longer range almost always means llama_commit is older than the PR's
# base (the range then holds upstream commits too): said, not cherry-picked by the thousand.
PR_MAX_COMMITS = 250

# Cherry-picks and file-patch commits get this identity and date, so the same stack gives the
# same commit SHAs on every host and every run (the tree hash would be equal anyway).
GIT_IDENTITY_ENV = {
    "GIT_AUTHOR_NAME": "tunnelspec",
    "GIT_AUTHOR_EMAIL": "tunnelspec@tunnelspec.invalid",
    "GIT_AUTHOR_DATE": "2001-01-01T00:00:00+00:00",
    "GIT_COMMITTER_NAME": "tunnelspec",
    "GIT_COMMITTER_EMAIL": "tunnelspec@tunnelspec.invalid",
    "GIT_COMMITTER_DATE": "2001-01-01T00:00:00+00:00",
}
# Host git config must not change bytes or prompt: no signing, no CRLF conversion, no editor.
GIT_CONFIG_ARGS = [
    "-c",
    "commit.gpgsign=false",
    "-c",
    "core.autocrlf=false",
    "-c",
    "core.editor=true",
    "-c",
    "advice.detachedHead=false",
]


@dataclass(frozen=True)
class PatchSpec:
    """One llama_patches entry, normalised. For kind "file", `data` holds the patch bytes read on
    the controller and `sha256` their digest (the host never reads the controller's disk)."""

    kind: str  # "pr" | "remote" | "file"
    commit: str | None = None  # pr/remote: the pinned full SHA (one commit, or a PR's head when whole)
    whole: bool = False  # pr only: every commit of the PR from llama_commit up to `commit` (its head)
    pr: int | None = None
    remote: str | None = None
    ref: str | None = None
    name: str | None = None
    sha256: str | None = None
    data: bytes | None = None

    @property
    def id(self) -> str:
        """Human-readable and unique: what the fingerprint hashes and errors show."""
        if self.kind == "pr":
            return f"pr {self.pr} head {self.commit}" if self.whole else f"pr {self.pr} @{self.commit}"
        if self.kind == "remote":
            return f"remote {self.remote} {self.ref} @{self.commit}"
        return f"file {self.name} sha256:{(self.sha256 or '')[:16]}"  # a file patch always has its sum

    @property
    def fingerprint_part(self) -> str:
        return self.id if self.kind != "file" else f"file sha256:{self.sha256}"


def short_sha_error(value, key: str) -> str | None:
    """Why `value` is not a pinned commit (None when it is one): core/vartypes.full_sha's rule."""
    try:
        full_sha(value, key)
    except VarValueError as err:
        return str(err)
    return None


def parse_patches(entries, base_dir: Path) -> list[PatchSpec]:
    """llama_patches entries (dicts as written in the inventory, or cluster `Patch` objects) →
    PatchSpecs. File paths are relative to the inventory's directory. Forms: {pr, commit} one
    commit of a PR; {pr, head} the whole PR up to that head; {remote, ref, commit}; {file}."""
    out = []
    for i, e in enumerate(entries or []):
        if not isinstance(e, dict):  # a cluster Patch dataclass
            e = {k: v for k, v in vars(e).items() if v is not None and k != "kind"}
        keys = frozenset(e)
        where = f"llama_patches entry {i}"
        if keys == {"file"}:
            path = Path(str(e["file"]))
            path = path if path.is_absolute() else (base_dir / path)
            try:
                data = path.read_bytes()
            except OSError as err:
                raise TaskFailed(f"{where}: cannot read patch file {path}: {err.strerror}") from None
            out.append(PatchSpec("file", name=path.name, sha256=hashlib.sha256(data).hexdigest(), data=data))
            continue
        key = "head" if keys == {"pr", "head"} else "commit"
        bad = short_sha_error(e.get(key, ""), key)
        if bad and keys in ({"pr", "commit"}, {"pr", "head"}, {"remote", "ref", "commit"}):
            raise TaskFailed(f"{where}: {bad}")
        commit = str(e.get(key, "")).strip().lower()
        if keys in ({"pr", "commit"}, {"pr", "head"}):
            pr = e["pr"]
            if isinstance(pr, bool) or not str(pr).isdigit() or int(pr) < 1:
                raise TaskFailed(f"{where}: pr must be a positive PR number, got {pr!r}")
            out.append(PatchSpec("pr", commit=commit, pr=int(pr), whole=key == "head"))
        elif keys == {"remote", "ref", "commit"}:
            remote, ref = str(e["remote"]), str(e["ref"])
            if not remote or not ref or remote.startswith("-") or ref.startswith("-"):
                raise TaskFailed(f"{where}: remote and ref must be non-empty and not start with '-'")
            out.append(PatchSpec("remote", commit=commit, remote=remote, ref=ref))
        else:
            raise TaskFailed(
                f"{where} has keys {sorted(keys)}; use {{pr, commit}} (one commit of a PR), "
                "{pr, head} (the whole PR), {remote, ref, commit} or {file}"
            )
    return out


def pr_commits(rev_list: str, spec: PatchSpec, base: str, host: str) -> list[str]:
    """The commits a whole-PR entry cherry-picks, oldest first, from the host's
    `git rev-list --reverse --topo-order --parents BASE..HEAD` (one line per commit: its SHA, then
    its parents): every commit reachable from the PR's head and not from llama_commit, i.e. from
    their merge base up to the head. A merge among them is refused: replaying a PR commit by commit
    cannot replay a merge, and what a merge brings in (most often a newer master) is not the PR's."""
    rows = [line.split() for line in rev_list.splitlines() if line.strip()]
    what = f"patch {spec.id} on {host}"
    merges = [r[0] for r in rows if len(r) > 2]
    if merges:
        shown = ", ".join(m[:12] for m in merges[:5]) + (f" and {len(merges) - 5} more" if len(merges) > 5 else "")
        raise TaskFailed(
            f"{what}: the PR holds {len(merges)} merge commit(s) ({shown}) between llama_commit {base[:12]} "
            "and its head; a whole-PR entry replays the PR's own commits one by one, and a merge would bring "
            "the other branch's commits in as if they were the PR's. Rebase the PR onto llama_commit and pin "
            'the new head, or list the commits you want as {"pr": N, "commit": SHA} entries, oldest first'
        )
    if not rows:
        raise TaskFailed(
            f"{what}: head {(spec.commit or '')[:12]} is already contained in llama_commit {base[:12]}: "
            "nothing to apply (the PR was merged before that commit?); remove the entry"
        )
    if len(rows) > PR_MAX_COMMITS:
        raise TaskFailed(
            f"{what}: {len(rows)} commits lie between llama_commit {base[:12]} and the PR's head, more than "
            f"a PR holds (GitHub lists at most {PR_MAX_COMMITS}); llama_commit is probably older than the "
            "commit the PR branches from, so upstream commits would come along: pin a llama_commit at or "
            'after the PR\'s base (git merge-base), or list the PR\'s commits as {"pr", "commit"} entries'
        )
    return [r[0] for r in rows]


def fingerprint(base: str, patches: list[PatchSpec]) -> str:
    doc = {"recipe": STACK_RECIPE, "base": base, "patches": [p.fingerprint_part for p in patches]}
    return hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()


# ---- the host's state report ---------------------------------------------------------------------

# One round trip: HEAD, tree, origin URL, an interrupted operation, local modifications, the nearest
# `bNNNN` tag of the base, and the stored stack record. Arguments: dir, base commit. Read-only for
# real: `git status` without its optional index refresh, so it never holds the index's lock that a
# checkout or patch of this or another run needs (a batch reads it beside other probes).
STATE_SCRIPT = r"""
d=$1
[ -e "$d/.git" ] || { echo absent; exit 0; }
cd -- "$d" || exit 2
echo "head $(git rev-parse -q --verify HEAD 2>/dev/null || echo none)"
echo "tree $(git rev-parse -q --verify 'HEAD^{tree}' 2>/dev/null || echo none)"
echo "origin $(git config --get remote.origin.url 2>/dev/null || echo none)"
echo "shallow $(git rev-parse --is-shallow-repository 2>/dev/null || echo unknown)"
[ -e .git/tunnelspec-applying ] && echo "op tunnelspec checkout"
[ -e .git/CHERRY_PICK_HEAD ] && echo "op cherry-pick"
[ -d .git/rebase-apply ] || [ -d .git/rebase-merge ] && echo "op rebase"
git --no-optional-locks status --porcelain=v1 2>/dev/null | head -n 20 | sed 's/^/dirty /'
git describe --tags --match 'b[0-9]*' --long "$2" 2>/dev/null | sed 's/^/describe /'
echo "--- stack"
cat .git/tunnelspec-stack 2>/dev/null
exit 0
"""


@dataclass
class SourceState:
    absent: bool
    head: str | None = None
    tree: str | None = None
    origin: str | None = None
    shallow: bool = False
    operation: str | None = None
    dirty: tuple[str, ...] = ()
    describe: str | None = None
    stack: dict | None = None


def parse_state(text: str) -> SourceState:
    lines = text.splitlines()
    if lines and lines[0].strip() == "absent":
        return SourceState(absent=True)
    st = SourceState(absent=False)
    dirty = []
    for i, line in enumerate(lines):
        if line == "--- stack":
            raw = "\n".join(lines[i + 1 :]).strip()
            try:
                st.stack = json.loads(raw) if raw else None
            except ValueError:
                st.stack = None  # a damaged record is no record: the stack is re-applied
            break
        key, _, value = line.partition(" ")
        if key == "head":
            st.head = None if value == "none" else value
        elif key == "tree":
            st.tree = None if value == "none" else value
        elif key == "origin":
            st.origin = None if value == "none" else value
        elif key == "shallow":
            st.shallow = value == "true"
        elif key == "op":
            st.operation = value
        elif key == "dirty":
            dirty.append(value)
        elif key == "describe":
            st.describe = value
    st.dirty = tuple(dirty)
    return st


def build_number_from_describe(describe: str | None) -> int | None:
    """`b4589-12-gabcdef0` → 4601: upstream tags every master build `bN` and N is the commit count,
    so the nearest tag plus the distance is the build number. None when there is no such tag."""
    if not describe:
        return None
    m = re.match(r"^b(\d+)-(\d+)-g[0-9a-f]+$", describe.strip())
    return int(m.group(1)) + int(m.group(2)) if m else None


def stack_record(fp: str, base: str, head: str, tree: str, steps: list[dict]) -> str:
    """The `.git/tunnelspec-stack` file: what the stack produced, written after the last patch."""
    return (
        json.dumps(
            {"recipe": STACK_RECIPE, "fingerprint": fp, "base": base, "head": head, "tree": tree, "patches": steps},
            indent=2,
            sort_keys=True,
        )
        + "\n"
    )
