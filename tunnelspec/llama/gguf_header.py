"""What a GGUF's first bytes say: its key/value metadata and the names of its tensors. Pure: it parses
bytes (`head -c` of the file on a host) and nothing else.

The layout (gguf-py's `GGUFReader`, llama.cpp's gguf.cpp): "GGUF", u32 version, u64 tensor count,
u64 key count; each key a string, a u32 value type and the value (strings are u64 length + bytes,
arrays u32 item type + u64 count + items); then each tensor's info: name, u32 dims, u64 × dims,
u32 type, u64 offset. All little-endian. The token list is the metadata's largest part (a few MiB
for a 150k vocabulary), so a header read of 16 MiB holds every tensor name of a real model.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}


class _Short(Exception):
    pass


@dataclass(frozen=True)
class Header:
    kv: dict[str, object]  # arrays: their length
    tensors: tuple[str, ...] | None  # None: the bytes ended before the tensor infos did

    @property
    def arch(self) -> str | None:
        a = self.kv.get("general.architecture")
        return a if isinstance(a, str) else None

    def arch_int(self, suffix: str) -> int | None:
        """`<arch>.<suffix>` as an int, None when absent or not a number."""
        v = self.kv.get(f"{self.arch}.{suffix}") if self.arch else None
        return int(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def parse(data: bytes) -> Header:
    """The header from the file's first bytes; ValueError when they are not a GGUF. Keys read before
    a cut are kept; the tensor names only when every one was read."""
    if data[:4] != b"GGUF":
        raise ValueError("not a GGUF file (no GGUF magic)")
    pos = 4

    def take(fmt: str):
        nonlocal pos
        size = struct.calcsize(fmt)
        if pos + size > len(data):
            raise _Short
        out = struct.unpack_from(fmt, data, pos)[0]
        pos += size
        return out

    def string() -> str:
        nonlocal pos
        n = take("<Q")
        if pos + n > len(data):
            raise _Short
        out = data[pos:pos + n].decode("utf-8", "replace")
        pos += n
        return out

    def value(vtype: int):
        nonlocal pos
        if vtype in _SCALARS:
            return take(_SCALARS[vtype])
        if vtype == 8:
            return string()
        if vtype == 9:
            itype, count = take("<I"), take("<Q")
            if itype in _SCALARS:
                size = struct.calcsize(_SCALARS[itype]) * count
                if pos + size > len(data):
                    raise _Short
                pos += size
            else:
                for _ in range(count):
                    value(itype)
            return count
        raise ValueError(f"unknown GGUF value type {vtype}")

    version = take("<I")
    if version < 2:
        raise ValueError(f"GGUF version {version} is too old")
    n_tensors, n_kv = take("<Q"), take("<Q")
    kv: dict[str, object] = {}
    names: list[str] = []
    try:
        for _ in range(n_kv):
            key = string()
            kv[key] = value(take("<I"))
        for _ in range(n_tensors):
            names.append(string())
            dims = take("<I")
            pos += 8 * dims + 4 + 8
            if pos > len(data):
                raise _Short
    except _Short:
        return Header(kv, None)
    return Header(kv, tuple(names))
