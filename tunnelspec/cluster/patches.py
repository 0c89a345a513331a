"""llama_patches as the cluster model reads it: each entry a commit of a PR, a whole PR up to a
pinned head, a commit of another remote's ref, or a patch file beside the inventory. Every entry's
mistake is reported at once. SHAs are full (core/vartypes.full_sha says why)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tunnelspec.cluster.fields import HostVars
from tunnelspec.llama.source_stack import short_sha_error


@dataclass(frozen=True)
class Patch:
    """One entry of llama_patches. kind "pr": one `commit` of GitHub PR `pr` cherry-picked, or with
    `head` the whole PR (every commit from the merge base with llama_commit up to that head);
    kind "remote": one `commit` of `ref` of `remote`; kind "file": a patch file on the controller
    (absolute path). SHAs are full (source_stack.short_sha_error says why)."""

    kind: str
    commit: str | None = None
    pr: int | None = None
    remote: str | None = None
    ref: str | None = None
    file: Path | None = None
    head: str | None = None

    @property
    def pinned(self) -> str | None:
        """The commit the hosts must have: the single commit, or the PR's head."""
        return self.commit or self.head


def patches_of(hv: HostVars) -> tuple[Patch, ...]:
    value = hv.get("llama_patches")
    patches, problems = [], []
    for i, entry in enumerate(value):
        try:
            patches.append(_patch(hv, i, entry))
        except _PatchEntryError as err:
            problems.append(str(err))
    if problems:
        # Every entry's mistake at once: a short SHA in one entry and a tag in another are one fix.
        raise hv.fail("llama_patches", "; ".join(problems))
    return tuple(patches)


class _PatchEntryError(ValueError):
    """One llama_patches entry's mistake; _patches reports every entry's together."""


def _patch(hv: HostVars, index: int, entry: Any) -> Patch:
    where = f"entry {index}"
    if not isinstance(entry, dict):
        raise _PatchEntryError(f'{where} must be a dict like {{"pr": 123, "commit": "<sha>"}}, got {entry!r}')
    keys = set(entry)
    forms = {
        frozenset({"pr", "commit"}): "pr",
        frozenset({"pr", "head"}): "pr",
        frozenset({"remote", "ref", "commit"}): "remote",
        frozenset({"file"}): "file",
    }
    kind = forms.get(frozenset(keys))
    if kind is None:
        raise _PatchEntryError(
            f"{where} has keys {sorted(keys)}; use one of {{pr, commit}} (one commit of a PR), {{pr, head}} "
            "(the whole PR, up to that head), {remote, ref, commit} or {file}",
        )
    if kind == "file":
        rel = entry["file"]
        if not isinstance(rel, str) or not rel:
            raise _PatchEntryError(f"{where}: file must be a path string")
        path = (hv.inv.path.parent / rel).resolve()
        if not path.is_file():
            raise _PatchEntryError(
                f"{where}: patch file {path} does not exist (paths are relative to the inventory's directory)"
            )
        if not is_patch_text(path.read_text(encoding="utf-8", errors="replace")):
            raise _PatchEntryError(
                f"{where}: {path} is not a patch: no unified diff in it (`--- a/…`, "
                "`+++ b/…` and `@@` hunks, as `git diff` or `git format-patch` write); give the patch file"
            )
        return Patch(kind="file", file=path)
    key = "head" if "head" in keys else "commit"
    # Full SHAs only, as for llama_commit: the one rule and its reason live in short_sha_error.
    bad = short_sha_error(entry[key], key)
    if bad:
        raise _PatchEntryError(f"{where}: {bad}")
    sha = entry[key].strip().lower()
    if kind == "pr":
        pr = entry["pr"]
        if isinstance(pr, bool) or not isinstance(pr, int) or pr < 1:
            raise _PatchEntryError(f"{where}: pr must be a positive PR number, got {pr!r}")
        return Patch(kind="pr", pr=pr, head=sha) if key == "head" else Patch(kind="pr", pr=pr, commit=sha)
    for key in ("remote", "ref"):
        if not isinstance(entry[key], str) or not entry[key].strip() or entry[key].startswith("-"):
            raise _PatchEntryError(f"{where}: {key} must be a non-empty string not starting with '-'")
    return Patch(kind="remote", remote=entry["remote"], ref=entry["ref"], commit=sha)


_HUNK = re.compile(r"^@@ -\d+(,\d+)? \+\d+(,\d+)? @@", re.M)
_FILE_PAIR = re.compile(r"^--- \S.*\n\+\+\+ \S", re.M)
_GIT_ONLY = re.compile(r"^(rename from|new file mode|deleted file mode|GIT binary patch|old mode)", re.M)


def is_patch_text(text: str) -> bool:
    """A unified diff as `git apply` takes it: file headers and hunks, or a git diff of renames,
    modes or binaries (which has no hunk)."""
    if _FILE_PAIR.search(text) and _HUNK.search(text):
        return True
    return "\ndiff --git " in "\n" + text and bool(_GIT_ONLY.search(text))
