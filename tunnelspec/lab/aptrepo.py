"""The lab's package repository: what a bare lab host installs its prerequisites from.

Lab hosts have no route out, so `lab up` serves, on the lab bridge's own address, a subset of
Debian's archive for each image: the release's signed `InRelease` and its `Packages` index as
debootstrap fetched them, and the `.deb`s that the prerequisites need on top of the image (apt in
the freshly bootstrapped tree computes them: `apt-get install --print-uris`). Hosts keep Debian's
archive key and verify its signature and every hash, as against any mirror — the same shape a
user's air-gapped hosts need. Built once with the image (lab/image.py), cached under
`/var/cache/tunnelspec/apt/<image key>/debian`; the `.deb`s are shared between keys in `pool/`.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import signal
import subprocess
import sys
import urllib.parse
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from collections.abc import Callable

from tunnelspec.core.errors import LabError

CACHE_DIR = Path("/var/cache/tunnelspec")
REPO_ROOT = CACHE_DIR / "apt"
POOL_DIR = CACHE_DIR / "apt-pool"
PORT = 3142
MIRROR_PREFIX = "http://deb.debian.org/debian/"
_URI = re.compile(r"^'(?P<uri>[^']+)' (?P<file>\S+) (?P<size>\d+) (?P<algo>\w+):(?P<hash>[0-9a-f]+)")
_FETCH_TIMEOUT_S = 120


def repo_dir(key: str) -> Path:
    return REPO_ROOT / key


def is_complete(key: str) -> bool:
    return (repo_dir(key) / ".complete").exists()


def source_line(gateway: str, key: str, release: str) -> str:
    return f"deb http://{gateway}:{PORT}/{key}/debian {release} main\n"


def _chroot_apt(root: Path, args: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["chroot", str(root), "env", "LC_ALL=C", "DEBIAN_FRONTEND=noninteractive", "apt-get", "-q", *args],
        capture_output=True,
        text=True,
    )


def _uris(root: Path, packages: tuple[str, ...], log: Callable[[str], None]) -> list[re.Match]:
    """The archive files apt would fetch to install `packages` in `root` (a release may lack some
    of them: those are left out, and said)."""
    wanted = list(packages)
    for _ in range(len(packages) + 1):
        res = _chroot_apt(root, ["install", "--print-uris", "-y", "--no-install-recommends", *wanted])
        if res.returncode == 0:
            return [m for m in (_URI.match(row) for row in res.stdout.splitlines()) if m]
        absent = set(re.findall(r"Unable to locate package (\S+)", res.stderr)) | set(
            re.findall(r"Package '?(\S+?)'? has no installation candidate", res.stderr)
        )
        if not absent & set(wanted):
            raise LabError(f"apt in the image cannot plan the prerequisites:\n{res.stderr[-2000:]}")
        log(f"lab: not in this release, left out of its repository: {', '.join(sorted(absent))}")
        wanted = [p for p in wanted if p not in absent]
    raise LabError("apt in the image keeps refusing the prerequisites")


def _fetch(m: re.Match, release: str) -> Path:
    uri = m["uri"]
    if not uri.startswith(MIRROR_PREFIX):
        raise LabError(f"unexpected package source {uri} (only {MIRROR_PREFIX} is used)")
    cached = POOL_DIR / release / m["file"]
    algo = m["algo"].lower().replace("sum", "")
    if not cached.exists():
        cached.parent.mkdir(parents=True, exist_ok=True)
        tmp = cached.with_name(cached.name + ".part")
        with urllib.request.urlopen(uri, timeout=_FETCH_TIMEOUT_S) as r, open(tmp, "wb") as out:
            shutil.copyfileobj(r, out)
        os.replace(tmp, cached)
    h = hashlib.new(algo)
    with open(cached, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    if h.hexdigest() != m["hash"]:
        cached.unlink()
        raise LabError(f"{m['file']}: {algo} mismatch (fetched from {uri}); run `lab up` again")
    return cached


def build_repo(
    root: Path, key: str, release: str, packages: tuple[str, ...], log: Callable[[str], None] = print
) -> int:
    """Fill `repo_dir(key)` from the freshly bootstrapped `root` (whose apt lists are debootstrap's);
    returns the number of packages in the repository."""
    final = repo_dir(key)
    staging = final.with_name(key + ".partial")
    shutil.rmtree(staging, ignore_errors=True)
    lists = root / "var/lib/apt/lists"
    inrelease = next(iter(lists.glob(f"*_dists_{release}_InRelease")), None)
    index = next(iter(lists.glob(f"*_dists_{release}_main_binary-*_Packages")), None)
    if inrelease is None or index is None:
        raise LabError(f"debootstrap left no InRelease/Packages for {release} in {lists}")
    arch = index.name.rsplit("_binary-", 1)[1].split("_")[0]
    uris = _uris(root, packages, log)
    with ThreadPoolExecutor(4) as pool:
        files = list(pool.map(lambda m: (m, _fetch(m, release)), uris))
    base = staging / "debian"
    dists = base / "dists" / release
    bindir = dists / "main" / f"binary-{arch}"
    (bindir / "by-hash" / "SHA256").mkdir(parents=True)
    shutil.copy2(inrelease, dists / "InRelease")
    shutil.copy2(index, bindir / "Packages")
    digest = hashlib.sha256((bindir / "Packages").read_bytes()).hexdigest()
    os.link(bindir / "Packages", bindir / "by-hash" / "SHA256" / digest)
    for m, cached in files:
        # The URI is percent-encoded (`g%2b%2b`); the file is named as apt asks for it decoded.
        dest = base / urllib.parse.unquote(m["uri"][len(MIRROR_PREFIX) :])
        dest.parent.mkdir(parents=True, exist_ok=True)
        os.link(cached, dest)
    (staging / ".complete").write_text(f"{release}\n{len(files)} packages\n")
    shutil.rmtree(final, ignore_errors=True)
    staging.rename(final)
    return len(files)


# ---- serving ----------------------------------------------------------------------------------
def _is_server(pid: int | None, gateway: str) -> bool:
    if not pid:
        return False
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    return b"http.server" in argv and gateway.encode() in argv


def serve(gateway: str, pid: int | None, log_path: Path) -> int:
    """The repository server on the lab bridge's address (`pid`: one started earlier, kept when it
    still runs). Stdlib's http.server, one process, started in its own session; returns its PID."""
    if _is_server(pid, gateway):
        return pid  # type: ignore[return-value]
    REPO_ROOT.mkdir(parents=True, exist_ok=True)
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "http.server", "--bind", gateway, "--directory", str(REPO_ROOT), str(PORT)],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=log,
            start_new_session=True,
            close_fds=True,
        )
    return proc.pid


def stop(pid: int | None, gateway: str) -> None:
    if _is_server(pid, gateway):
        os.kill(pid, signal.SIGTERM)  # type: ignore[arg-type]
