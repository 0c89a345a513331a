"""What the controller keeps of a host's facts between runs: the version lines of its last full
gather (`systemd=`, `sshd_version=`, `ssh_version=`, `gcc=`, `cmake=`, `nvcc=`) and the versions
key the host computed for them (facts/host.py: `stat` of the binaries those lines come from).

The next gather passes the key; a host whose binaries are unchanged skips its version commands and
says so, and the lines kept here stand in for them (components/host/host.py `gather`). Nothing else
is kept: disk, memory, CPUs and sudo are read on every run.

One file per connection (login, address, port, jump hosts): `$XDG_CACHE_HOME/tunnelspec/facts/
<hash>.json` (default `~/.cache/...`). The rule is the build record's (components/server/
preflight.py): best effort, the cache root itself is never created (a CI runner's ephemeral home
has no `~/.cache`, and a run leaves nothing there), the file is written whole (a temporary file
renamed over it) with mode 0600, and a file that cannot be read, or is not a record of this
version for this connection, is no record. Records not written for PRUNE_DAYS (a host gone, a
test's sshd on a random port) are removed when another is written, so the directory stays small.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

from tunnelspec.core.cachedir import cache_root, write_record
from tunnelspec.facts.host import VERSION_LINES

RECORD_VERSION = 1
PRUNE_DAYS = 30


@dataclass(frozen=True)
class Record:
    key: str
    lines: tuple[str, ...]


def identity(conn) -> tuple[str, ...] | None:
    """The connection's identity (connection/base.py `cache_identity`), None for one without."""
    get = getattr(conn, "cache_identity", None)
    ident = get() if callable(get) else None
    return tuple(ident) if ident else None


def record_path(ident: tuple[str, ...]) -> Path | None:
    root = cache_root()
    if root is None:
        return None
    name = hashlib.sha256(json.dumps([RECORD_VERSION, *ident]).encode()).hexdigest()[:24]
    return Path(root) / "tunnelspec" / "facts" / f"{name}.json"


def _line_ok(line) -> bool:
    return isinstance(line, str) and "\n" not in line and line.partition("=")[0] in VERSION_LINES


def load(ident: tuple[str, ...] | None) -> Record | None:
    path = record_path(ident) if ident else None
    if path is None:
        return None
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(doc, dict) or doc.get("version") != RECORD_VERSION or doc.get("identity") != list(ident or ()):
        return None
    key, lines = doc.get("key"), doc.get("lines")
    if not isinstance(key, str) or not key or not isinstance(lines, list) or not all(map(_line_ok, lines)):
        return None
    return Record(key, tuple(lines))


def save(ident: tuple[str, ...] | None, key: str, lines: tuple[str, ...]) -> None:
    """Best effort: a controller that cannot write its cache only runs the version commands again."""
    path = record_path(ident) if ident and key else None
    if path is None:
        return
    doc = {"version": RECORD_VERSION, "identity": list(ident or ()), "key": key, "lines": list(lines)}
    write_record(path, json.dumps(doc), PRUNE_DAYS)
