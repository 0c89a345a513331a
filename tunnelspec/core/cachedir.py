"""Where the controller keeps what it may forget (the build records, the host facts' version lines, the
templates' compiled code): `$XDG_CACHE_HOME/tunnelspec/...`, default `~/.cache/tunnelspec/...`.

One rule for all of them: the cache root itself is never created. An ephemeral home (a CI runner's, a
container's) has no `~/.cache`, and a run there keeps nothing and leaves nothing behind."""

from __future__ import annotations

import os


def cache_root() -> str | None:
    """`$XDG_CACHE_HOME` or `~/.cache`; None when neither is set up (the root is never created)."""
    xdg = os.environ.get("XDG_CACHE_HOME")
    if xdg:
        return xdg
    home = os.path.join(os.path.expanduser("~"), ".cache")
    return home if os.path.isdir(home) else None
