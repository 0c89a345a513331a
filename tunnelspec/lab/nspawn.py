"""systemd-nspawn's runtime directory for the lab's hosts: a tmpfs at /run/systemd/nspawn where /run
is not one (mounted by the lab, and released by it), and what a stopped host leaves there."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from tunnelspec.lab import host, state

NSPAWN_RUN = Path("/run/systemd/nspawn")
TMPFS_MARKER = state.STATE_ROOT / "nspawn-tmpfs.mounted"


def ensure_runtime_tmpfs() -> None:
    """nspawn needs /run/systemd/nspawn on a tmpfs; /run is a plain directory here."""
    run_fs = subprocess.run(["stat", "-f", "-c", "%T", "/run"], capture_output=True, text=True)
    if run_fs.stdout.strip() == "tmpfs" or host.is_mounted(NSPAWN_RUN):
        return
    NSPAWN_RUN.mkdir(parents=True, exist_ok=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", "mode=0755", "tunnelspec-lab", str(NSPAWN_RUN)], check=True)
    TMPFS_MARKER.parent.mkdir(parents=True, exist_ok=True)
    TMPFS_MARKER.write_text("mounted by tunnelspec lab\n")


def remove_runtime(machine: str) -> None:
    for sub in ("propagate", "unix-export", "incoming"):
        path = NSPAWN_RUN / sub / machine
        if path.exists():
            host.unmount(path)
            shutil.rmtree(path, ignore_errors=True)


def release_runtime_tmpfs() -> None:
    if TMPFS_MARKER.exists():
        host.unmount(NSPAWN_RUN)
        TMPFS_MARKER.unlink()
