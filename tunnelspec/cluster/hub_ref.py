"""A pinned Hugging Face model reference, as the inventory writes it: `hf://ORG/REPO/PATH/IN/REPO.gguf@<40-hex
commit>`. Pure parsing; the download is tunnelspec/components/models/hub.py."""

from __future__ import annotations

import re
from dataclasses import dataclass

from tunnelspec.core.vartypes import is_full_sha

SCHEME = "hf://"
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
_SPLIT = re.compile(r"^(?P<stem>.+)-(?P<index>\d{5})-of-(?P<count>\d{5})\.gguf$")
FORM = "hf://ORG/REPO/PATH/IN/REPO.gguf@<40-hex commit>"


class HubRefError(ValueError):
    """The text is not a valid pinned Hub reference (the inventory wraps it with file:line)."""


def is_hub_ref(text: str | None) -> bool:
    return isinstance(text, str) and text.startswith(SCHEME)


@dataclass(frozen=True)
class HubRef:
    repo_id: str  # ORG/REPO
    path: str  # path in the repo of the file (the first part of a split GGUF)
    revision: str  # full commit SHA

    def __str__(self) -> str:
        return f"{SCHEME}{self.repo_id}/{self.path}@{self.revision}"

    @property
    def parts(self) -> list[str]:
        """Every file llama.cpp needs, in order: the file itself, or all parts of a split GGUF."""
        folder = self.path.rpartition("/")[0]
        names = split_parts(self.path.rsplit("/", 1)[-1])
        return [f"{folder}/{n}" if folder else n for n in names] or [self.path]


def split_parts(name: str) -> list[str]:
    """`X-00001-of-00003.gguf` → the three part names; [] for a file that is not split."""
    m = _SPLIT.match(name)
    if not m:
        return []
    count = int(m["count"])
    return [f"{m['stem']}-{i:05d}-of-{count:05d}.gguf" for i in range(1, count + 1)]


def parse_ref(text: str) -> HubRef:
    """`hf://ORG/REPO/PATH.gguf@SHA` → HubRef; HubRefError with what to write instead."""
    if not text.startswith(SCHEME):
        raise HubRefError(f"{text!r} is not a Hub reference; write {FORM}")
    body = text[len(SCHEME) :]
    location, at, revision = body.rpartition("@")
    if not at:
        raise HubRefError(
            f"{text!r} has no pinned revision; write {FORM} (the commit SHA from the "
            "repo's 'Files and versions' history, or `hf download ... --revision`)"
        )
    revision = revision.strip().lower()
    if not is_full_sha(revision):
        raise HubRefError(
            f"revision {revision!r} of {text!r} is not a full 40-hex commit SHA; branches and "
            f"tags (main, v1) move: pin the commit, {FORM}"
        )
    segments = location.split("/")
    if len(segments) < 3 or not all(segments):
        raise HubRefError(f"{text!r} must name an organisation, a repository and a file in it: {FORM}")
    org, repo, path = segments[0], segments[1], "/".join(segments[2:])
    if not (_NAME.match(org) and _NAME.match(repo)) or any(s in (".", "..") for s in segments[2:]):
        raise HubRefError(f"{text!r}: {org}/{repo} is not a Hub repository name, or the path has '.'/'..'")
    if not path.endswith(".gguf"):
        raise HubRefError(f"{text!r} must name a .gguf file (llama-server loads GGUF models)")
    m = _SPLIT.match(path)
    if m and (int(m["index"]) != 1 or int(m["count"]) < 1):
        raise HubRefError(
            f"{text!r} is part {int(m['index'])} of a split GGUF; name the first part "
            f"(-00001-of-{m['count']}.gguf): every part is brought along"
        )
    return HubRef(repo_id=f"{org}/{repo}", path=path, revision=revision)
