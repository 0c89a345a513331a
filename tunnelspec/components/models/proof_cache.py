"""The models' proofs without python3 when nothing changed: one `stat` of each model file next to
the proof cache model_proof wrote (`files.PROOFS`), read in one `sh` that a play's batch answers
(a task lists `stat_argv` in its probes). Only a file whose size, mtime (ns) and inode are its
cache entry's, in a cache that only the writer of the proofs (root, or the login itself) can
change, is served from here: the answer is then exactly what `python3 … check` prints for it
(`gguf_header.inspect` of a cached entry). Anything else — a file touched, replaced or gone, no
cache, a cache that is a link, writable by others or owned by someone else, an entry of another
shape, a `stat` that does not print nanoseconds — answers None, and the caller runs the python3
reader as before, which reads the header again and says what changed."""

from __future__ import annotations

import json
import re
import stat
from typing import TypeGuard

# The login that reads (root under sudo), the cache and its directory without following a link,
# then each model (`-L`: python3's os.stat follows links too) by name, then the cache's text.
# The cache absent or unreadable: "none", exit 0 (a batch keeps only results with exit 0).
_SCRIPT = r"""
c=$1; shift
id -u || exit 1
stat -c '%u %f %h' -- "$c" 2>/dev/null || { echo none; exit 0; }
stat -c '%u %f' -- "${c%/*}" || exit 1
stat -L -c '%s %.9Y %i %f %n' -- "$@" 2>/dev/null
echo @
exec head -c 4194305 -- "$c"
"""
CAP = 4 * 2**20  # a cache longer than this is not trusted (python3 reads it then)
_SHA256 = re.compile(r"[0-9a-f]{64}")
_MTIME = re.compile(r"(\d+)\.(\d{9})")


def stat_argv(paths: list[str], cache: str) -> list[str]:
    """The probe: `paths` are the files `read_proofs` is asked about, in the same order."""
    return ["sh", "-c", _SCRIPT, "sh", cache, *paths]


def _int(x) -> TypeGuard[int]:
    return isinstance(x, int) and not isinstance(x, bool)


def _owner_ok(uid: str, me: str) -> bool:
    return uid.isdigit() and int(uid) in (0, int(me))


def _mode(hexmode: str) -> int | None:
    try:
        return int(hexmode, 16)
    except ValueError:
        return None


def _trusted_cache(me: str, cache_line: str, dir_line: str) -> bool:
    """The cache a regular file with one name, its directory a directory; both owned by root or by
    the reader itself and writable by no one else."""
    c, d = cache_line.split(" "), dir_line.split(" ")
    if len(c) != 3 or len(d) != 2 or not me.isdigit():
        return False
    c_mode, d_mode = _mode(c[1]), _mode(d[1])
    if c_mode is None or d_mode is None or c[2] != "1":
        return False
    return (
        stat.S_ISREG(c_mode)
        and stat.S_ISDIR(d_mode)
        and not (c_mode | d_mode) & 0o022
        and _owner_ok(c[0], me)
        and _owner_ok(d[0], me)
    )


def _identities(lines: list[str]) -> dict[str, list[int]]:
    """{name: [size, mtime_ns, inode]} of the regular files `stat -L` printed."""
    out = {}
    for line in lines:
        parts = line.split(" ", 4)
        if len(parts) != 5:
            continue
        size, mtime, ino, hexmode, name = parts
        m, mode = _MTIME.fullmatch(mtime), _mode(hexmode)
        if not (m and size.isdigit() and ino.isdigit() and mode is not None and stat.S_ISREG(mode)):
            continue
        out[name] = [int(size), int(m.group(1)) * 10**9 + int(m.group(2)), int(ino)]
    return out


def _entry(known) -> dict | None:
    """A cache entry as `gguf_header` records it, every field of its type, else None."""
    if not isinstance(known, dict):
        return None
    ident, size, need = known.get("id"), known.get("size"), known.get("need")
    if not (isinstance(ident, list) and len(ident) == 3 and all(_int(x) and x >= 0 for x in ident)):
        return None
    if not (_int(size) and _int(need)):
        return None
    if size != ident[0] or not 0 <= need <= size:
        return None
    sums = [known.get("sha256"), known.get("header_sha256")]
    if not all(isinstance(s, str) and _SHA256.fullmatch(s) for s in sums):
        return None
    return {"header_sha256": sums[1], "id": list(ident), "need": need, "sha256": sums[0], "size": size}


def parse(out: str, paths: list[str]) -> dict[str, dict] | None:
    """{path: its proof line, as `python3 … check` prints it for an unchanged file} for every path
    of `paths`, or None when any one of them cannot be served from the cache."""
    head, sep, text = out.partition("\n@\n")
    lines = head.split("\n")
    if not sep or len(lines) < 3 or len(text) > CAP or not _trusted_cache(*lines[:3]):
        return None
    try:
        cache = json.loads(text)
    except ValueError:
        return None
    if not isinstance(cache, dict):
        return None
    ids = _identities(lines[3:])
    got = {}
    for path in paths:
        entry = _entry(cache.get(path)) if path.startswith("/") else None
        if entry is None or ids.get(path) != entry["id"]:
            return None
        got[path] = {**entry, "path": path, "cached": True}
    return got


async def cached_proofs(conn, paths: list[str], cache: str) -> dict[str, dict] | None:
    """Every path's proof from the cache (read-only; batched when a task named `stat_argv`), or None:
    then the python3 reader decides."""
    if not paths:
        return None
    res = await conn.probe(stat_argv(paths, cache), timeout=60)
    return parse(res.stdout, paths) if res.rc == 0 else None
