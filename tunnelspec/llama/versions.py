"""What a llama.cpp source tree says about itself: RPC protocol version, RPC server target name.

Pure functions over file text, so they work on a local checkout or on text read from a remote host.
"""

from __future__ import annotations

import re

from tunnelspec.core.errors import TaskFailed

RPC_HEADER = "ggml/include/ggml-rpc.h"
RPC_TOOL_CMAKELISTS = "tools/rpc/CMakeLists.txt"
# Older trees kept the server under examples/.
RPC_TOOL_CMAKELISTS_OLD = "examples/rpc/CMakeLists.txt"

_DEFINE = re.compile(r"^\s*#\s*define\s+RPC_PROTO_(MAJOR|MINOR|PATCH)_VERSION\s+(\d+)\b", re.M)


def rpc_proto_version(header_text: str) -> tuple[int, int, int]:
    """(major, minor, patch) from `ggml-rpc.h`. Raises TaskFailed when any part is missing: a tree
    without a HELLO version cannot be probed safely."""
    found = {part: int(num) for part, num in _DEFINE.findall(header_text)}
    missing = [p for p in ("MAJOR", "MINOR", "PATCH") if p not in found]
    if missing:
        raise TaskFailed(f"{RPC_HEADER}: no RPC_PROTO_{'/'.join(missing)}_VERSION define")
    return found["MAJOR"], found["MINOR"], found["PATCH"]


def format_version(version: tuple[int, int, int]) -> str:
    return ".".join(str(v) for v in version)


_TARGET = re.compile(r"^\s*set\s*\(\s*TARGET\s+([A-Za-z0-9_.-]+)\s*\)", re.M)


def rpc_server_target(cmakelists_text: str) -> str:
    """`ggml-rpc-server` in new trees, `rpc-server` before the rename (≈b98xx, PR #25045)."""
    m = _TARGET.search(cmakelists_text)
    if not m or m.group(1) not in ("ggml-rpc-server", "rpc-server"):
        raise TaskFailed(f"{RPC_TOOL_CMAKELISTS}: no rpc server target found")
    return m.group(1)
