"""Compiled code kept on the controller's disk between runs, like Python's own __pycache__: what
core/templating.py compiles from each task argument, `when:` expression and template file (about 165
sources per deploy, each 0.3 to 1 ms of parsing, code generation and `compile()`).

One file, `$XDG_CACHE_HOME/tunnelspec/<name>/code.marshal` (default `~/.cache/...`), holds every
entry: `{key: marshal((key, code, names))}`, most recently used first. A run reads it once, at its
first template, and unmarshals only the entries it uses. One file rather than one per source: reading
and unmarshalling 165 entries took ≈ 1.7 ms from one file, ≈ 9 ms from 165 (the opens and checks).
A run that compiled something writes the file once, at exit: the entries it used first, then those
of the file as it finds it then, up to CAP (≈ 2 kB an entry). So the file stays bounded without ages
or a pruning pass, an entry no run uses falls off the end, and a run whose sources were all found
writes nothing. Two runs that exit at the same moment may lose one's new entries: compiled again.

A key is the sha256 of everything that decides the code: VERSION (bump it when the way the code is
made changes), Python's bytecode magic number and marshal version, the caller's context (jinja2's
version and the environment's settings and filter names), the kind of source and the source itself.

Best effort, the rule of the build record (components/server/preflight.py): a controller that cannot
read or write the cache only compiles again. The cache root itself is never created: with no
`$XDG_CACHE_HOME` and no `~/.cache` (an ephemeral CI home) there is no disk cache, and a run leaves
nothing behind. Directories are made 0700, the file 0600, written to a temporary name and renamed.
"""

from __future__ import annotations

import atexit
import hashlib
import importlib.util
import marshal
import os
import stat
from types import CodeType

from tunnelspec.core.cachedir import cache_root

VERSION = 1
CAP = 1000
FILE = "code.marshal"
FORMAT = "tunnelspec-codecache"

Entry = tuple[CodeType, frozenset[str]]


class CodeCache:
    def __init__(self, name: str, context: str) -> None:
        self.name = name
        self._prefix = hashlib.sha256(repr((VERSION, importlib.util.MAGIC_NUMBER, marshal.version, context)).encode())
        self._dir: str | None = None
        self._loaded: dict[bytes, bytes] | None = None  # the file as read at the first lookup
        self._used: dict[bytes, bytes] = {}  # the entries this run used, found or new, in order
        self._new = False
        self._registered = False

    def key(self, kind: str, source: str) -> bytes:
        h = self._prefix.copy()
        h.update(f"{kind}\0{source}".encode("utf-8", "surrogatepass"))
        return h.digest()

    def get(self, key: bytes) -> Entry | None:
        if self._loaded is None:
            root = cache_root()
            self._dir = os.path.join(root, "tunnelspec", self.name) if root else None
            self._loaded = _read(self._dir) if self._dir else {}
        blob = self._loaded.get(key)
        if blob is None:
            return None
        try:
            k, code, names = marshal.loads(blob)
        except Exception:  # noqa: BLE001 - any unreadable entry is a miss
            return None
        if k != key or not isinstance(code, CodeType) or not _strings(names):
            return None
        self._used[key] = blob
        return code, names

    def put(self, key: bytes, code: CodeType, names: frozenset[str]) -> None:
        if not self._dir:  # no disk cache (or no lookup yet): nothing to keep
            return
        self._used[key] = marshal.dumps((key, code, names))
        self._new = True
        if not self._registered:
            self._registered = True
            atexit.register(self.flush)

    def flush(self) -> None:
        """Write the file when this run compiled something (at exit; tests call it). Never raises:
        a cache that cannot be written must not turn the end of a run into a traceback."""
        if not (self._new and self._dir):
            return
        self._new = False
        try:
            os.makedirs(os.path.dirname(self._dir), mode=0o700, exist_ok=True)  # tunnelspec/ (0700 if new)
            if not os.path.isdir(self._dir):
                os.mkdir(self._dir, 0o700)
            previous = _read(self._dir) or self._loaded or {}
            merged = dict(list(self._used.items())[:CAP])
            for k, v in previous.items():
                if len(merged) >= CAP:
                    break
                merged.setdefault(k, v)
            _write(self._dir, marshal.dumps((FORMAT, merged)))
        except Exception:  # noqa: BLE001 - best effort, see above
            pass


def _strings(names: object) -> bool:
    return isinstance(names, frozenset) and all(isinstance(n, str) for n in names)


def _ours(st: os.stat_result) -> bool:
    return st.st_uid == os.geteuid() and not st.st_mode & (stat.S_IWGRP | stat.S_IWOTH)


def _open_dir(path: str) -> int | None:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return None
    if _ours(os.fstat(fd)):
        return fd
    os.close(fd)
    return None


def _read(path: str) -> dict[bytes, bytes]:
    """The file's entries, or {} when there is none to trust.

    Loading marshalled code is running it: whoever can write this file runs code as the user of the
    next tunnelspec run. So it is read only from a directory owned by this user (the effective uid)
    that neither group nor others may write, and only when it is a regular file (opened with
    O_NOFOLLOW, so a symbolic link is never followed; O_NONBLOCK, so a FIFO does not hang the run),
    owned by this user and not writable by group or others. Anything else is ignored (a miss), never
    followed; the next write replaces the file, when the directory is ours. A file that does not
    unmarshal, or not to our format, is a miss too, and so is an entry (CodeCache.get)."""
    dfd = _open_dir(path)
    if dfd is None:
        return {}
    try:
        fd = os.open(FILE, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dfd)
    except OSError:
        return {}
    finally:
        os.close(dfd)
    try:
        with os.fdopen(fd, "rb") as f:
            st = os.fstat(f.fileno())
            if not (stat.S_ISREG(st.st_mode) and _ours(st)):
                return {}
            tag, entries = marshal.loads(f.read())
    except Exception:  # noqa: BLE001 - a corrupt or foreign file is a miss
        return {}
    if tag != FORMAT or not isinstance(entries, dict):
        return {}
    return {k: v for k, v in entries.items() if isinstance(k, bytes) and isinstance(v, bytes)}


def _write(path: str, data: bytes) -> None:
    dfd = _open_dir(path)
    if dfd is None:  # not ours to write in (nor to read from)
        return
    tmp = f".{FILE}.{os.getpid()}.tmp"
    try:
        try:
            os.unlink(tmp, dir_fd=dfd)  # left by a killed run that had this pid
        except FileNotFoundError:
            pass
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=dfd)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            os.replace(tmp, FILE, src_dir_fd=dfd, dst_dir_fd=dfd)
        except BaseException:
            os.unlink(tmp, dir_fd=dfd)
            raise
    finally:
        os.close(dfd)
