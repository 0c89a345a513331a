"""The on-disk state of files, to prove a cached call touched nothing."""

from __future__ import annotations

from pathlib import Path


def files_state(*paths) -> dict[str, tuple[int, int, int]]:
    """(inode, size, mtime in ns) of each path and of everything under it: a call that downloads,
    rebuilds the repo, rewrites the model or the stamp, or takes the creation lock changes it."""
    state = {}
    for path in map(Path, paths):
        for p in [path, *(sorted(path.rglob("*")) if path.is_dir() else ())]:
            if p.exists() or p.is_symlink():
                st = p.lstat()
                state[str(p)] = (st.st_ino, st.st_size, st.st_mtime_ns)
    return state
