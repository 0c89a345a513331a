"""What a llama.cpp build on a host should be, as pure data: cmake options, the build key, the
targets a role needs, the stamp, and the parsers of the host's report and of cmake's progress.

A build directory is `{root}/build/<key>` where key = hash(tree, options that change the output):
the same tree and options always map to the same directory, so going back to an earlier patch
stack reuses its finished build instead of compiling again.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, field

from tunnelspec.llama import versions

STAMP = ".tunnelspec-stamp"
LLAMA_SERVER = "llama-server"
# Bump when the recipe (options, stamp contents) changes: every host rebuilds once.
BUILD_RECIPE = 1

# Checked against the fixture tree (0.5.0-dev): GGML_RPC_RDMA is declared in ggml-rpc's CMakeLists
# and turns itself on when libibverbs is found; LLAMA_USE_PREBUILT_UI defaults ON and downloads the
# web UI at build time; GGML_CCACHE is disabled because the launcher is set explicitly with our
# ccache environment. LLAMA_CURL is only passed when the tree still declares it as an option
# (newer trees deprecate it and warn).
BASE_OPTIONS = (
    "-DCMAKE_BUILD_TYPE=Release",
    "-DGGML_RPC=ON",
    "-DGGML_RPC_RDMA=OFF",
    "-DLLAMA_BUILD_TESTS=OFF",
    "-DLLAMA_BUILD_EXAMPLES=OFF",
    "-DLLAMA_USE_PREBUILT_UI=OFF",
    "-DLLAMA_BUILD_UI=OFF",
    "-DGGML_CCACHE=OFF",
)
BACKEND_OPTIONS = {
    "cpu": (),
    "cuda": ("-DGGML_CUDA=ON",),
    "hip": ("-DGGML_HIP=ON",),
    "vulkan": ("-DGGML_VULKAN=ON",),
    "metal": ("-DGGML_METAL=ON",),
}
_CURL_OPTION = re.compile(r"^\s*option\s*\(\s*LLAMA_CURL\b", re.M)


def ccache_env(root: str) -> list[str]:
    """`env` assignments that let hosts share ccache hits: paths below `root` are hashed relative
    to the build directory, compilers compared by content (not mtime), `__DATE__` ignored."""
    return [f"CCACHE_BASEDIR={root}", "CCACHE_COMPILERCHECK=content", "CCACHE_NOHASHDIR=1",
            "CCACHE_SLOPPINESS=time_macros"]


def keyed_options(commit: str, build_number: int | None, backend: str, extra: list[str]) -> list[str]:
    """Options that change the binaries (part of the key). Build number 0 = unknown to build-info."""
    return [*BASE_OPTIONS, f"-DLLAMA_BUILD_NUMBER={build_number or 0}", f"-DLLAMA_BUILD_COMMIT={commit[:9]}",
            *BACKEND_OPTIONS[backend], *extra]


def tree_options(cmakelists_text: str) -> list[str]:
    """Options that depend on the tree (so already covered by the tree hash in the key)."""
    return ["-DLLAMA_CURL=OFF"] if _CURL_OPTION.search(cmakelists_text or "") else []


def launcher_options(ccache: bool, backend: str) -> list[str]:
    """ccache changes how fast, never what is built: not part of the key."""
    if not ccache:
        return []
    out = ["-DCMAKE_C_COMPILER_LAUNCHER=ccache", "-DCMAKE_CXX_COMPILER_LAUNCHER=ccache"]
    if backend == "cuda":
        out.append("-DCMAKE_CUDA_COMPILER_LAUNCHER=ccache")
    return out


def build_key(tree: str, options: list[str]) -> str:
    doc = json.dumps({"recipe": BUILD_RECIPE, "tree": tree, "options": options})
    return hashlib.sha256(doc.encode()).hexdigest()[:16]


def targets_for(role: str, rpc_target: str | None) -> list[str]:
    """Only what the role runs: rpc nodes the RPC server, main llama-server."""
    if role == "rpc":
        if not rpc_target:
            raise ValueError("no RPC server target in this tree")
        return [rpc_target]
    return [LLAMA_SERVER]


_PERCENT = re.compile(r"^\[\s*(\d{1,3})%\]")


def progress_percent(line: str) -> int | None:
    """cmake's Makefile/Ninja progress `[ 42%] Building CXX object ...` → 42."""
    m = _PERCENT.match(line)
    return int(m.group(1)) if m else None


# ---- the host's report -------------------------------------------------------------------------

# One round trip. Arguments: root, key, source dir.
STATE_SCRIPT = r"""
root=$1 key=$2 src=$3 dir=$1/build/$2
echo "tree $(git -C "$src" rev-parse -q --verify 'HEAD^{tree}' 2>/dev/null || echo none)"
echo "nproc $(nproc 2>/dev/null || echo 1)"
if command -v ccache >/dev/null 2>&1; then echo "ccache yes"; else echo "ccache no"; fi
echo "current $(readlink -- "$root/current" 2>/dev/null || echo none)"
for b in "$dir"/bin/*; do [ -f "$b" ] && [ -x "$b" ] && echo "bin ${b##*/}"; done
echo "--- stamp"
cat -- "$dir/.tunnelspec-stamp" 2>/dev/null
echo "--- rpc-cmakelists"
cat -- "$src/tools/rpc/CMakeLists.txt" 2>/dev/null || cat -- "$src/examples/rpc/CMakeLists.txt" 2>/dev/null
echo "--- cmakelists"
grep -E '^[[:space:]]*option[[:space:]]*\([[:space:]]*LLAMA_CURL' -- "$src/CMakeLists.txt" 2>/dev/null
exit 0
"""


@dataclass
class BuildState:
    tree: str | None = None
    nproc: int = 1
    ccache: bool = False
    current: str | None = None
    bins: set[str] = field(default_factory=set)
    stamp: dict | None = None
    rpc_target: str | None = None
    cmakelists: str = ""


def split_sections(text: str) -> tuple[list[str], dict[str, list[str]]]:
    """Host reports are `key value` lines, then `--- name` sections of raw lines."""
    head: list[str] = []
    sections: dict[str, list[str]] = {}
    section = None
    for line in text.splitlines():
        if line.startswith("--- "):
            section = line[4:].strip()
            sections[section] = []
        elif section is not None:
            sections[section].append(line)
        else:
            head.append(line)
    return head, sections


def parse_state(text: str) -> BuildState:
    st = BuildState()
    head, sections = split_sections(text)
    for line in head:
        key, _, value = line.partition(" ")
        if key == "tree":
            st.tree = None if value == "none" else value
        elif key == "nproc":
            st.nproc = int(value) if value.isdigit() else 1
        elif key == "ccache":
            st.ccache = value == "yes"
        elif key == "current":
            st.current = None if value == "none" else value
        elif key == "bin":
            st.bins.add(value)
    raw = "\n".join(sections.get("stamp", [])).strip()
    try:
        st.stamp = json.loads(raw) if raw else None
    except ValueError:
        st.stamp = None
    rpc = "\n".join(sections.get("rpc-cmakelists", []))
    try:
        st.rpc_target = versions.rpc_server_target(rpc) if rpc.strip() else None
    except Exception:  # noqa: BLE001 - an unknown layout is reported when an rpc node needs it
        st.rpc_target = None
    st.cmakelists = "\n".join(sections.get("cmakelists", []))
    return st


def stamp_ok(stamp: dict | None, key: str, targets: list[str], bins: set[str]) -> bool:
    """A finished build: the stamp (written last) names this key and every wanted target, and the
    binaries are still there."""
    if not stamp or stamp.get("key") != key:
        return False
    built = set(stamp.get("targets", []))
    return set(targets) <= built and set(targets) <= bins
