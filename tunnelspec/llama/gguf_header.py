"""What a GGUF's first bytes say: its key/value metadata and its tensors (name, shape, type, offset),
and whether a file of a given size holds every tensor's data. Pure: it parses bytes (`head -c` of the
file on a host) and nothing else — except when run as a program on a host, below.

The layout (gguf-py's `GGUFReader`, llama.cpp's gguf.cpp): "GGUF", u32 version, u64 tensor count,
u64 key count; each key a string, a u32 value type and the value (strings are u64 length + bytes,
arrays u32 item type + u64 count + items); then each tensor's info: name, u32 dims, u64 × dims,
u32 type, u64 offset. All little-endian. The token list is the metadata's largest part (a few MiB
for a 150k vocabulary), so a header read of 16 MiB holds every tensor name of a real model.
The tensor data starts after the infos, at the next multiple of `general.alignment` (32 when absent);
each tensor's offset is relative to that start and itself a multiple of the alignment. llama.cpp
refuses a tensor whose data ends past the file ("data is not within the file bounds, model is
corrupted or incomplete") only when it loads the model — after the old llama-server was stopped.

Run as a program (`python3 -I -c <this source> MODE CACHE PATH...`, stdlib only, Python 3.7+: the
host's python3), it reads each file where it lies and prints one JSON line per file (`inspect`):
MODE `check` is read-only (a file whose size, mtime and inode match CACHE's entry is not read
again); MODE `record` reads each file whole for its sha256 and writes CACHE (components/models/files.py).
Each line also carries `header_sha256`: the sha256 of every byte before the tensor data (the key/value
metadata, the tensor infos and their padding) — what tells a model swapped at its path from the one
a generation recorded without reading the tensor data (components/generation/model_ids.py).
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
import sys
from dataclasses import dataclass

_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
DEFAULT_ALIGNMENT = 32

# ggml type → (elements per block, bytes per block), as ggml's type traits (gguf-py GGML_QUANT_SIZES).
# A type missing here (one newer than this table) has its start checked, not its end.
TYPE_SIZES = {
    0: (1, 4),
    1: (1, 2),
    2: (32, 18),
    3: (32, 20),
    6: (32, 22),
    7: (32, 24),
    8: (32, 34),
    9: (32, 40),
    10: (256, 84),
    11: (256, 110),
    12: (256, 144),
    13: (256, 176),
    14: (256, 210),
    15: (256, 292),
    16: (256, 66),
    17: (256, 74),
    18: (256, 98),
    19: (256, 50),
    20: (32, 18),
    21: (256, 110),
    22: (256, 82),
    23: (256, 136),
    24: (1, 1),
    25: (1, 2),
    26: (1, 4),
    27: (1, 8),
    28: (1, 8),
    29: (256, 56),
    30: (1, 2),
    34: (256, 54),
    35: (256, 66),
    39: (32, 17),
    40: (64, 36),
    41: (128, 18),
}


class _Short(Exception):
    pass


@dataclass(frozen=True)
class TensorInfo:
    name: str
    dims: tuple[int, ...]  # ggml's ne order: dims[0] is the row length
    type: int  # ggml type
    offset: int  # from the start of the tensor data


@dataclass(frozen=True)
class Header:
    kv: dict[str, object]  # arrays: their length
    tensors: tuple[str, ...] | None  # None: the bytes ended before the tensor infos did
    infos: tuple[TensorInfo, ...] | None = None
    data_start: int | None = None  # where the tensor data begins (the infos' end, aligned)

    @property
    def arch(self) -> str | None:
        a = self.kv.get("general.architecture")
        return a if isinstance(a, str) else None

    def arch_int(self, suffix: str) -> int | None:
        """`<arch>.<suffix>` as an int, None when absent or not a number."""
        v = self.kv.get(f"{self.arch}.{suffix}") if self.arch else None
        return int(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


class _Cursor:
    """GGUF's little-endian values read from `data` at `pos` on; _Short when the bytes end first."""

    def __init__(self, data: bytes, pos: int = 0) -> None:
        self.data, self.pos = data, pos

    def take(self, fmt: str):
        size = struct.calcsize(fmt)
        if self.pos + size > len(self.data):
            raise _Short
        out = struct.unpack_from(fmt, self.data, self.pos)[0]
        self.pos += size
        return out

    def string(self) -> str:
        n = self.take("<Q")
        if self.pos + n > len(self.data):
            raise _Short
        out = self.data[self.pos : self.pos + n].decode("utf-8", "replace")
        self.pos += n
        return out

    def value(self, vtype: int):
        if vtype in _SCALARS:
            return self.take(_SCALARS[vtype])
        if vtype == 8:
            return self.string()
        if vtype == 9:
            itype, count = self.take("<I"), self.take("<Q")
            if itype in _SCALARS:
                size = struct.calcsize(_SCALARS[itype]) * count
                if self.pos + size > len(self.data):
                    raise _Short
                self.pos += size
            else:
                for _ in range(count):
                    self.value(itype)
            return count  # arrays: their length (the token list's is the vocabulary size)
        raise ValueError(f"unknown GGUF value type {vtype}")


def _preamble(data: bytes) -> tuple[_Cursor, int, int]:
    """(a cursor at the first key, tensor count, key count); ValueError when `data` is no GGUF."""
    if data[:4] != b"GGUF":
        raise ValueError("not a GGUF file (no GGUF magic)")
    c = _Cursor(data, 4)
    version = c.take("<I")
    if version < 2:
        raise ValueError(f"GGUF version {version} is too old")
    n_tensors, n_kv = c.take("<Q"), c.take("<Q")
    return c, n_tensors, n_kv


def _key_values(c: _Cursor, n_kv: int, kv: dict[str, object]) -> None:
    for _ in range(n_kv):
        key = c.string()
        kv[key] = c.value(c.take("<I"))


def read_kv(data: bytes) -> tuple[dict[str, object], int | None]:
    """The key/value section alone, from a GGUF's first bytes: {key: value} (arrays: their length)
    and the offset where the tensor infos start, None when the bytes end before the section does
    (the keys read before the cut are kept). The tensor infos are not read, so a damaged one does
    not matter here. ValueError when the bytes are not a GGUF; struct.error when they end before the
    key count."""
    try:
        c, _, n_kv = _preamble(data)
    except _Short:
        raise struct.error("the GGUF header ends before its key count") from None
    kv: dict[str, object] = {}
    try:
        _key_values(c, n_kv, kv)
    except _Short:
        return kv, None
    return kv, c.pos


def parse(data: bytes) -> Header:
    """The header from the file's first bytes; ValueError when they are not a GGUF. Keys read before
    a cut are kept; the tensor names only when every one was read."""
    c, n_tensors, n_kv = _preamble(data)
    kv: dict[str, object] = {}
    infos: list[TensorInfo] = []
    try:
        _key_values(c, n_kv, kv)
        for _ in range(n_tensors):
            name = c.string()
            n_dims = c.take("<I")
            if n_dims > 8:
                raise ValueError(f"tensor {name} has {n_dims} dimensions (a damaged header)")
            dims = tuple(c.take("<Q") for _ in range(n_dims))
            infos.append(TensorInfo(name, dims, c.take("<I"), c.take("<Q")))
    except _Short:
        return Header(kv, None)
    align = kv.get("general.alignment", DEFAULT_ALIGNMENT)
    if not isinstance(align, int) or isinstance(align, bool) or align <= 0 or align & (align - 1):
        raise ValueError(f"general.alignment {align!r} is not a power of two")
    return Header(kv, tuple(i.name for i in infos), tuple(infos), _pad(c.pos, align))


def _pad(n: int, align: int) -> int:
    return (n + align - 1) // align * align


def alignment(h: Header) -> int:
    a = h.kv.get("general.alignment", DEFAULT_ALIGNMENT)
    return a if isinstance(a, int) else DEFAULT_ALIGNMENT


def nbytes(t: TensorInfo) -> int | None:
    """The tensor's data size in bytes; None for a type TYPE_SIZES does not know. ValueError when the
    row length is no multiple of the type's block (ggml refuses such a tensor too)."""
    if t.type not in TYPE_SIZES:
        return None
    block, size = TYPE_SIZES[t.type]
    row = t.dims[0] if t.dims else 1
    if row % block:
        raise ValueError(f"tensor {t.name}: row length {row} is not a multiple of its type's block of {block}")
    n = row // block * size
    for d in t.dims[1:]:
        n *= d
    return n


@dataclass(frozen=True)
class Extent:
    need: int  # bytes the file must hold: the data's start + the furthest tensor end
    last: str  # the tensor that ends furthest
    unsized: tuple[str, ...]  # tensors of a type TYPE_SIZES does not know: only their start counts


def extent(h: Header) -> Extent:
    """How long a file with this header must be. ValueError for a header llama.cpp refuses as well:
    a tensor offset that is no multiple of the alignment, a row that is no whole number of blocks."""
    if h.infos is None or h.data_start is None:
        raise ValueError("the header ends before its tensor infos do")
    align = alignment(h)
    need, last, unsized = h.data_start, "", []
    for t in h.infos:
        if t.offset % align:
            raise ValueError(f"tensor {t.name}: data offset {t.offset} is not a multiple of the alignment {align}")
        size = nbytes(t)
        if size is None:
            unsized.append(t.name)
            size = 1  # its first byte at least
        end = h.data_start + t.offset + size
        if end > need:
            need, last = end, t.name
    return Extent(need, last, tuple(unsized))


def shortfall(size: int, ext: Extent) -> str | None:
    """Why a file of `size` bytes cannot hold the tensors, or None when it can."""
    if size >= ext.need:
        return None
    return (
        f"cut short: {size} bytes, its tensors need {ext.need} ({ext.need - size} bytes missing; "
        f"tensor {ext.last} ends past the end of the file)"
    )


# ---- run on the host -----------------------------------------------------------------------------
FIRST_READ = 2**20


def read_whole_header(f, size: int) -> Header:
    """The header of an open file: the first MiB, more (×4 each time) while the infos go on."""
    n = FIRST_READ
    while True:
        f.seek(0)
        h = parse(f.read(n))
        if h.infos is not None or n >= size:
            return h
        n *= 4


def header_sha256(f, h: Header, size: int) -> str:
    """The sha256 of an open file's bytes before its tensor data (`h` is its header, infos read;
    `size` the file's: a huge alignment never makes it read more than the file)."""
    f.seek(0)
    return hashlib.sha256(f.read(min(h.data_start or 0, size))).hexdigest()


def _cached_header(path: str, known: dict) -> dict:
    """A cached proof from before header_sha256 was kept: the header read for it (never the data)."""
    try:
        with open(path, "rb") as f:
            h = read_whole_header(f, known.get("size") or 0)
            # Only when the file read is still the one the cache entry proved.
            if h.infos is not None and identity(os.fstat(f.fileno())) == known.get("id"):
                return {**known, "header_sha256": header_sha256(f, h, known.get("size") or 0)}
    except (OSError, ValueError):
        pass
    return known


def identity(st) -> list:
    """What tells that a file changed since it was read: size, mtime (ns) and inode."""
    return [st.st_size, st.st_mtime_ns, st.st_ino]


def inspect(path: str, cache: dict, whole: bool = False) -> dict:
    """One file: {"path", "size", "need", "sha256" (cached or `whole`), "cached"} or {"path", "error"}.
    A file whose identity matches its `cache` entry is not opened."""
    try:
        st = os.stat(path)
    except OSError as e:
        return {"path": path, "error": f"cannot read it: {e.strerror}"}
    known = cache.get(path)
    if not whole and isinstance(known, dict) and known.get("id") == identity(st) and known.get("sha256"):
        if not known.get("header_sha256"):
            known = _cached_header(path, known)
        return {**known, "path": path, "cached": True}
    out = {"path": path, "size": st.st_size, "id": identity(st), "cached": False}
    try:
        with open(path, "rb") as f:
            h = read_whole_header(f, st.st_size)
            if h.infos is None:
                return {**out, "error": f"cut short inside its header: {st.st_size} bytes"}
            out["header_sha256"] = header_sha256(f, h, st.st_size)
            ext = extent(h)
            out.update(need=ext.need, tensors=len(h.infos), unsized=list(ext.unsized))
            why = shortfall(st.st_size, ext)
            if why:
                return {**out, "error": why}
            if whole:
                digest = hashlib.sha256()
                f.seek(0)
                for block in iter(lambda: f.read(2**20), b""):
                    digest.update(block)
                if identity(os.fstat(f.fileno())) != out["id"]:
                    return {**out, "error": "it changed while it was read; run again"}
                out["sha256"] = digest.hexdigest()
    except ValueError as e:
        return {**out, "error": str(e)}
    except OSError as e:
        return {**out, "error": f"cannot read it: {e.strerror}"}
    return out


def _main(argv: list[str]) -> int:
    mode, cache_path, paths = argv[0], argv[1], argv[2:]
    try:
        with open(cache_path) as f:
            cache = json.load(f)
        cache = cache if isinstance(cache, dict) else {}
    except (OSError, ValueError):
        cache = {}
    results = [inspect(p, cache, whole=(mode == "record")) for p in paths]
    for r in results:
        print(json.dumps(r, sort_keys=True))
    if mode == "record":
        for r in results:
            if "error" not in r and r.get("sha256"):
                cache[r["path"]] = {k: r[k] for k in ("header_sha256", "id", "need", "sha256", "size")}
        os.makedirs(os.path.dirname(cache_path), exist_ok=True)
        tmp = cache_path + ".tmp"
        with open(tmp, "w") as f:
            json.dump(cache, f, indent=1, sort_keys=True)
        os.chmod(tmp, 0o644)
        os.replace(tmp, cache_path)
    return 0


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
