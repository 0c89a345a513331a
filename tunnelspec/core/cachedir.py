"""Where the controller keeps what it may forget (the build records, the host facts' version lines, the
templates' compiled code): `$XDG_CACHE_HOME/tunnelspec/...`, default `~/.cache/tunnelspec/...`.

One rule for all of them: the cache root itself is never created. An ephemeral home (a CI runner's, a
container's) has no `~/.cache`, and a run there keeps nothing and leaves nothing behind."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def cache_root() -> str | None:
    """`$XDG_CACHE_HOME` or `~/.cache`; None when neither is set up (the root is never created)."""
    xdg = os.environ.get("XDG_CACHE_HOME")
    if xdg:
        return xdg
    home = os.path.join(os.path.expanduser("~"), ".cache")
    return home if os.path.isdir(home) else None


def prune(folder: Path, keep: str, days: int) -> None:
    """Remove the `*.json` records of `folder` not written for `days`, but `keep` (best effort: each
    cache calls it when it writes one, so its directory stays small)."""
    import time  # lazy: only when a record is written

    old = time.time() - days * 86400
    for entry in os.scandir(folder):
        try:
            if entry.name != keep and entry.name.endswith(".json") and entry.is_file(follow_symlinks=False):
                if entry.stat(follow_symlinks=False).st_mtime < old:
                    os.unlink(entry.path)
        except OSError:
            continue


def write_record(path: Path, text: str, days: int) -> None:
    """Best effort: `text` to `path` whole (a 0600 temporary file in its directory, renamed over it),
    then the directory's records not written for `days` pruned. A controller that cannot write its
    cache only does the work again next time."""
    tmp = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.parent.name}-", suffix=".tmp")  # mode 0600
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, path)
        prune(path.parent, keep=path.name, days=days)
    except OSError:
        if tmp is not None:
            try:
                os.unlink(tmp)
            except OSError:
                pass
