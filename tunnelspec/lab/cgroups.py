"""Own cgroups for each lab host, on every hierarchy.

On a cgroup-v1 host without systemd as PID 1, two `systemd-nspawn --keep-unit` started from the
same cgroup create the same payload/supervisor sub-cgroups and break each other. Starting each one
from its own cgroup keeps them apart.
"""

from __future__ import annotations

import os
from pathlib import Path

PARENT = "tunnelspec-lab"


def hierarchies() -> list[Path]:
    """Mount points of every cgroup (v1) and cgroup2 hierarchy."""
    points = []
    with open("/proc/self/mounts") as f:
        for line in f:
            fields = line.split()
            if len(fields) >= 3 and fields[2] in ("cgroup", "cgroup2"):
                points.append(Path(fields[1].replace("\\040", " ")))
    return points


def _inherit_cpuset(path: Path) -> None:
    # A new v1 cpuset cgroup has empty cpus/mems and refuses tasks until they are set.
    for name in ("cpuset.cpus", "cpuset.mems"):
        own, parent = path / name, path.parent / name
        if own.exists() and not own.read_text().strip():
            own.write_text(parent.read_text())


def create(name: str) -> list[Path]:
    paths = []
    for root in hierarchies():
        path = root / PARENT / name
        for p in (path.parent, path):
            if not p.exists():
                p.mkdir()
            _inherit_cpuset(p)
        paths.append(path)
    return paths


def join(paths: list[str]) -> None:
    """Move the calling process into `paths` (runs in the child just before exec)."""
    for path in paths:
        with open(os.path.join(path, "cgroup.procs"), "w") as f:
            f.write("0")


def pids(paths: list[str]) -> set[int]:
    """Every process in these cgroups and below (what is left of a host after a kill)."""
    found: set[int] = set()
    for path in paths:
        for dirpath, _dirs, files in os.walk(path):
            if "cgroup.procs" in files:
                try:
                    found.update(int(x) for x in Path(dirpath, "cgroup.procs").read_text().split())
                except OSError:
                    pass
    return found


def remove(paths: list[str]) -> list[str]:
    """rmdir bottom-up; returns the cgroups that could not be removed (still busy)."""
    left = []
    for path in paths:
        if not os.path.isdir(path):
            continue
        for dirpath, _dirs, _files in sorted(os.walk(path), key=lambda t: -len(t[0])):
            try:
                os.rmdir(dirpath)
            except OSError:
                left.append(dirpath)
        parent = os.path.dirname(path)
        if os.path.basename(parent) == PARENT:
            try:
                os.rmdir(parent)  # only succeeds when no other lab host remains
            except OSError:
                pass
    return left
