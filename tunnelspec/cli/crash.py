"""An unexpected exception (a bug) is one line on the terminal and a file holding its traceback.

The user sees what broke and where the details are, never a traceback in the middle of a run's
output (exit 70, docs/ci.md). The file goes to ~/.cache/tunnelspec (XDG_CACHE_HOME), else to the
temporary directory; it carries the command line with every -e value masked, since extra variables
are where secrets come from."""

from __future__ import annotations

import os
import platform
import sys
import tempfile
import time
import traceback
from pathlib import Path

from tunnelspec import __version__


def _mask(value: str) -> str:
    return value if value.startswith("@") else value.split("=", 1)[0] + "=***"


def masked_argv(argv: list[str]) -> list[str]:
    """The command line, each -e/--extra-vars value reduced to its key (KEY=***); @FILE is kept."""
    out, mask_next = [], False
    for a in argv:
        if mask_next:
            out.append(_mask(a))
            mask_next = False
        elif a in ("-e", "--extra-vars"):
            out.append(a)
            mask_next = True
        elif a.startswith("--extra-vars="):
            out.append("--extra-vars=" + _mask(a[len("--extra-vars="):]))
        elif a.startswith("-e") and not a.startswith("--"):
            out.append("-e" + _mask(a[2:]))
        else:
            out.append(a)
    return out


def _candidates() -> list[Path]:
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return [Path(cache) / "tunnelspec", Path(tempfile.gettempdir())]


def write_report(exc: BaseException, argv: list[str] | None = None) -> str | None:
    """Writes the traceback; returns the file's path, or None when no directory took it."""
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    text = (f"tunnelspec {__version__}, Python {platform.python_version()}, {platform.platform()}\n"
            f"command: {' '.join(masked_argv(list(argv if argv is not None else sys.argv[1:])))}\n\n"
            + "".join(traceback.format_exception(type(exc), exc, exc.__traceback__)))
    for d in _candidates():
        try:
            d.mkdir(parents=True, exist_ok=True)
            path = d / f"tunnelspec-crash-{stamp}-{os.getpid()}.txt"
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "w") as f:
                f.write(text)
            return str(path)
        except OSError:
            continue
    return None


def one_line(exc: BaseException) -> str:
    msg = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {msg[0]}" if msg else type(exc).__name__
