"""Pinned Hugging Face models: `hf://ORG/REPO/PATH/IN/REPO.gguf@<40-hex commit>`.

The controller asks the Hub (HF_ENDPOINT, default huggingface.co) for the sha256 and size of the
file(s) at that commit, downloads them with huggingface_hub into its cache (HF_HOME/HF_HUB_CACHE),
verifies every byte against the sha256 the Hub reported, and only then hands the local paths to the
upload. A split GGUF (`NAME-00001-of-00003.gguf`) always brings every part: llama.cpp opens the
first one and looks for the others next to it by name.

The revision must be a full commit SHA: a branch or tag moves, and "the same deploy" would then
mean different bytes. With HF_HUB_OFFLINE=1 nothing is asked of the Hub: the files must be in the
cache, and the sha256 is the name of the cached blob (huggingface_hub names an LFS blob by the
sha256 the Hub reported when it was downloaded, which is the value this module verified then).

HF_TOKEN (or the token saved by `hf auth login`) is used by huggingface_hub itself; tunnelspec never
stores, prints or passes it on, and scrubs it from every error message.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import re
from dataclasses import dataclass
from pathlib import Path
from collections.abc import Callable

from tunnelspec.core.errors import TaskFailed
from tunnelspec.core.booleans import truthy
from tunnelspec.cluster.hub_ref import (  # noqa: F401  (this module's API)
    FORM,
    SCHEME,
    HubRef,
    HubRefError,
    is_hub_ref,
    parse_ref,
    split_parts,
)


class HubError(TaskFailed):
    """The Hub could not give the pinned file: unreachable, missing, or bytes that do not match."""


@dataclass(frozen=True)
class HubFile:
    path: str  # in the repo
    size: int
    sha256: str

    @property
    def name(self) -> str:
        return self.path.rsplit("/", 1)[-1]


# ---- settings from the environment (read at call time: tests and CI set them per run) -------------
def _offline() -> bool:
    return truthy(os.environ.get("HF_HUB_OFFLINE", ""))


def _endpoint() -> str:
    return (os.environ.get("HF_ENDPOINT") or "https://huggingface.co").rstrip("/")


def _cache_dir() -> Path:
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"]).expanduser()
    home = os.environ.get("HF_HOME") or os.path.join(os.environ.get("XDG_CACHE_HOME") or "~/.cache", "huggingface")
    return Path(home).expanduser() / "hub"


def _scrub(text: str) -> str:
    token = os.environ.get("HF_TOKEN") or os.environ.get("HUGGING_FACE_HUB_TOKEN")
    return text.replace(token, "***") if token else text


def _describe(err: BaseException) -> str:
    msg = " ".join(str(err).split()) or type(err).__name__
    return _scrub(msg[:400])


def _hub():
    """huggingface_hub, imported on first use (it is only needed for hf:// models) and quiet: its
    progress bars would interleave with tunnelspec's output; tunnelspec reports its own."""
    import huggingface_hub  # lazy: slow import, hf:// models only
    from huggingface_hub.utils import disable_progress_bars  # lazy: slow import, hf:// models only

    disable_progress_bars()
    return huggingface_hub


def _repo_dir(ref: HubRef) -> Path:
    return _cache_dir() / ("models--" + ref.repo_id.replace("/", "--"))


# ---- metadata --------------------------------------------------------------------------------------
def resolve(ref: HubRef, var: str) -> list[HubFile]:
    """The files of `ref` with the size and sha256 the Hub reports (or, offline, the cache holds)."""
    if _offline():
        return [_cached_file(ref, p, var) for p in ref.parts]
    hub = _hub()
    from huggingface_hub import errors as hub_errors  # lazy: slow import, hf:// models only

    try:
        infos = hub.HfApi(endpoint=_endpoint()).get_paths_info(
            ref.repo_id, ref.parts, revision=ref.revision, repo_type="model"
        )
    except hub_errors.RevisionNotFoundError:
        raise HubError(
            f"{var}: revision {ref.revision} is not in {ref.repo_id} on HF_ENDPOINT={_endpoint()}; check the commit SHA"
        ) from None
    except hub_errors.RepositoryNotFoundError:
        raise HubError(
            f"{var}: repository {ref.repo_id} not found on HF_ENDPOINT={_endpoint()} (or it is "
            "private/gated: set HF_TOKEN)"
        ) from None
    except Exception as err:  # noqa: BLE001 - network errors come from several libraries
        raise HubError(
            f"{var}: cannot reach the Hub at HF_ENDPOINT={_endpoint()} for {ref}: {_describe(err)}; "
            "check the network or HF_ENDPOINT, or set HF_HUB_OFFLINE=1 to use the cache"
        ) from None
    by_path = {getattr(i, "path", None): i for i in infos}
    out = []
    for part in ref.parts:
        info = by_path.get(part)
        if info is None or not hasattr(info, "size"):
            raise HubError(
                f"{var}: {part} is not a file in {ref.repo_id} at {ref.revision[:12]}"
                + (" (a split GGUF needs every part)" if len(ref.parts) > 1 else "")
            )
        lfs = getattr(info, "lfs", None)
        if not lfs or not re.fullmatch(r"[0-9a-f]{64}", str(lfs.sha256)):
            # Only LFS files carry a sha256; a GGUF model always is one on the Hub.
            raise HubError(
                f"{var}: the Hub reports no sha256 for {part} in {ref.repo_id} (not an LFS file); "
                "tunnelspec only deploys files it can verify"
            )
        out.append(HubFile(path=part, size=int(lfs.size), sha256=str(lfs.sha256)))
    return out


def _cached_file(ref: HubRef, part: str, var: str) -> HubFile:
    pointer = _repo_dir(ref) / "snapshots" / ref.revision / part
    blob = Path(os.path.realpath(pointer))
    if not pointer.is_file() or not re.fullmatch(r"[0-9a-f]{64}", blob.name):
        raise HubError(
            f"{var}: HF_HUB_OFFLINE is set and {part} of {ref} is not in the cache {_cache_dir()}; "
            "download it once with network (a deploy, or `hf download`), or unset HF_HUB_OFFLINE"
        )
    return HubFile(path=part, size=blob.stat().st_size, sha256=blob.name)


# ---- download and verification -------------------------------------------------------------------
def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(2**20), b""):
            h.update(block)
    return h.hexdigest()


def _forget(path: Path) -> None:
    """A cached file with the wrong bytes must not be found again by the next run."""
    real = Path(os.path.realpath(path))
    for p in (path, real):
        try:
            p.unlink()
        except OSError:
            pass


def _download_one(ref: HubRef, f: HubFile, var: str) -> Path:
    hub = _hub()
    from huggingface_hub import errors as hub_errors  # lazy: slow import, hf:// models only

    try:
        local = Path(
            hub.hf_hub_download(
                ref.repo_id,
                f.path,
                revision=ref.revision,
                repo_type="model",
                cache_dir=str(_cache_dir()),
                endpoint=_endpoint(),
                local_files_only=_offline(),
            )
        )
    except (hub_errors.EntryNotFoundError, hub_errors.RevisionNotFoundError, hub_errors.RepositoryNotFoundError):
        raise HubError(
            f"{var}: {f.path} is not in {ref.repo_id} at {ref.revision[:12]} (HF_ENDPOINT={_endpoint()})"
        ) from None
    except Exception as err:  # noqa: BLE001
        raise HubError(f"{var}: download of {f.path} from HF_ENDPOINT={_endpoint()} failed: {_describe(err)}") from None
    got = _sha256(local)
    if got != f.sha256:
        _forget(local)
        raise HubError(
            f"{var}: {f.path} from {ref.repo_id}@{ref.revision[:12]} has sha256 {got}, but the Hub "
            f"reports {f.sha256}: refusing it (the cached copy was removed; nothing was uploaded)"
        )
    return local


async def download(
    ref: HubRef, files: list[HubFile], var: str, progress: Callable[[str, int], None] | None = None
) -> list[Path]:
    """Every file of `files` in the controller's cache, verified; a progress line every second
    while bytes arrive (the download runs in a thread: other hosts' tasks go on)."""
    out = []
    blobs = _repo_dir(ref) / "blobs"
    for f in files:
        if progress:
            progress(f"download {f.name} ({f.size / 2**20:.1f} MiB) from {ref.repo_id}@{ref.revision[:12]}", 0)
        job = asyncio.ensure_future(asyncio.to_thread(_download_one, ref, f, var))
        for _ in range(7 * 24 * 3600):  # bounded: a week of one-second polls
            done, _pending = await asyncio.wait({job}, timeout=1.0)
            if done:
                break
            if progress and f.size:
                have = sum(p.stat().st_size for p in blobs.glob("*.incomplete")) if blobs.is_dir() else 0
                pct = min(100, 100 * have // f.size)
                progress(f"download {f.name} {pct}% of {f.size / 2**20:.1f} MiB", pct)
        out.append(await job)
        if progress:
            progress(f"{f.name}: sha256 {f.sha256[:12]} verified", 100)
    return out
