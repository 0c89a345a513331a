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
BUILD_RECIPE = 2

# Options every tree gets. GGML_RPC_RDMA is declared in ggml-rpc's CMakeLists and turns itself on
# when libibverbs is found: RDMA never negotiates through a tunnel and carried CVE-2026-118375, so
# it is always off (passed even where a tree does not declare it). GGML_CCACHE is off because the
# launcher is set explicitly with our ccache environment.
BASE_OPTIONS = (
    "-DCMAKE_BUILD_TYPE=Release",
    "-DGGML_RPC=ON",
    "-DGGML_RPC_RDMA=OFF",
    "-DLLAMA_BUILD_TESTS=OFF",
    "-DLLAMA_BUILD_EXAMPLES=OFF",
    "-DGGML_CCACHE=OFF",
)
# Options turned off only where the tree declares them (read from its CMakeLists on the host, so
# the choice follows the pinned tree, never a guess about its age):
# - LLAMA_BUILD_WEBUI (older trees, e.g. b9093): ON by default, and a tree without the UI sources
#   (tools/server/public) fails at 96 % with "No rule to make target …/loading.html";
# - LLAMA_USE_PREBUILT_UI (newer trees): ON by default, downloads the web UI at build time (offline
#   hosts wait out its timeouts); LLAMA_BUILD_UI: building the UI needs node/npm;
# - LLAMA_CURL: deprecated in newer trees (they warn when it is passed).
TREE_OFF_OPTIONS = ("LLAMA_BUILD_WEBUI", "LLAMA_USE_PREBUILT_UI", "LLAMA_BUILD_UI", "LLAMA_CURL")
# The CMakeLists files whose option() names are read (paths inside the tree).
OPTION_FILES = (
    "CMakeLists.txt",
    "ggml/CMakeLists.txt",
    "tools/server/CMakeLists.txt",
    "examples/server/CMakeLists.txt",
)
BACKEND_OPTIONS = {
    "cpu": (),
    "cuda": ("-DGGML_CUDA=ON",),
    "hip": ("-DGGML_HIP=ON",),
    "vulkan": ("-DGGML_VULKAN=ON",),
    "metal": ("-DGGML_METAL=ON",),
}
_OPTION = re.compile(r"^\s*option\s*\(\s*([A-Za-z0-9_]+)", re.M)


def ccache_env(root: str) -> list[str]:
    """`env` assignments that let hosts share ccache hits: paths below `root` are hashed relative
    to the build directory, compilers compared by content (not mtime), `__DATE__` ignored, and one
    locale: ccache hashes LANG, LC_ALL, LC_CTYPE and LC_MESSAGES (they change compiler messages), and
    an SSH session and a desktop shell rarely agree on them."""
    return [
        f"CCACHE_BASEDIR={root}",
        "CCACHE_COMPILERCHECK=content",
        "CCACHE_NOHASHDIR=1",
        "CCACHE_SLOPPINESS=time_macros",
        *LOCALE_ENV,
    ]


# The compiler's locale for every build (the C locale exists everywhere; sources are read as UTF-8
# whatever the locale).
LOCALE_ENV = ("LANG=C", "LC_ALL=C", "LC_CTYPE=C", "LC_MESSAGES=C")


def keyed_options(commit: str, build_number: int | None, backend: str, extra: list[str]) -> list[str]:
    """Options that change the binaries (part of the key). Build number 0 = unknown to build-info."""
    return [
        *BASE_OPTIONS,
        f"-DLLAMA_BUILD_NUMBER={build_number or 0}",
        f"-DLLAMA_BUILD_COMMIT={commit[:9]}",
        *BACKEND_OPTIONS[backend],
        *extra,
    ]


# ---- CUDA architectures --------------------------------------------------------------------------
CUDA_ARCH_VAR = "CMAKE_CUDA_ARCHITECTURES"


def cmake_sets(extra: list[str], name: str) -> str | None:
    """The value `-D<name>[:TYPE]=VALUE` in `extra` gives, else None."""
    for arg in extra:
        if arg.startswith("-D"):
            key, _, value = arg[2:].partition("=")
            if key.split(":", 1)[0] == name:
                return value
    return None


def cuda_arch_plan(
    backend: str, extra: list[str], inventory_archs: str | None, detected: list[str] | None, gpus: str = ""
) -> tuple[list[str], str]:
    """(options to add, what the build step says) for CMAKE_CUDA_ARCHITECTURES.

    The inventory wins (`-DCMAKE_CUDA_ARCHITECTURES` in llama_cmake_args, or llama_cuda_architectures);
    otherwise the architectures of the GPUs nvidia-smi reports on the host (8.9 → 89; several GPUs →
    their distinct list). Never `native`: it would need the GPU at configure time and resolve behind
    the build key (a build directory keyed without the architecture it was compiled for), and where
    the tree cannot use it (CMake < 3.24, GGML_NATIVE=OFF) ggml builds its long default list — tens
    of minutes for GPUs the host does not have. Explicit architectures are part of the build key, show
    in the build step, and compile once per architecture."""
    if backend != "cuda":
        return [], ""
    given = cmake_sets(extra, CUDA_ARCH_VAR)
    if given is not None:
        return [], f"CUDA architectures {given} (llama_cmake_args)"
    if inventory_archs:
        return [
            f"-D{CUDA_ARCH_VAR}={inventory_archs}"
        ], f"CUDA architectures {inventory_archs} (llama_cuda_architectures)"
    if not detected:
        raise ValueError("no CUDA architecture: nvidia-smi reported no GPU; set llama_cuda_architectures")
    archs = ";".join(detected)
    return [f"-D{CUDA_ARCH_VAR}={archs}"], f"CUDA architectures {archs} (nvidia-smi: {gpus or 'detected'})"


# Directories a non-interactive login's PATH has on Debian and Ubuntu: an nvcc elsewhere (NVIDIA's
# installer: /usr/local/cuda/bin) is not found by CMake unless named.
DEFAULT_PATH_DIRS = ("/usr/local/sbin", "/usr/local/bin", "/usr/sbin", "/usr/bin", "/sbin", "/bin")


def cuda_compiler_options(nvcc_path: str | None, extra: list[str]) -> list[str]:
    """`-DCMAKE_CUDA_COMPILER=<path>` when the host's nvcc lies off the default PATH (the facts look in
    /usr/local/cuda/bin too), unless llama_cmake_args names a compiler itself; CMake finds the toolkit
    from the compiler's place."""
    if not nvcc_path or cmake_sets(extra, "CMAKE_CUDA_COMPILER") is not None:
        return []
    if nvcc_path.rsplit("/", 1)[0] in DEFAULT_PATH_DIRS:
        return []
    return [f"-DCMAKE_CUDA_COMPILER={nvcc_path}"]


def option_names(cmake_text: str) -> set[str]:
    """Names declared with `option(NAME ...)` in CMakeLists text."""
    return set(_OPTION.findall(cmake_text or ""))


def tree_options(names: set[str]) -> list[str]:
    """Options that depend on the tree (so already covered by the tree hash in the key)."""
    return [f"-D{n}=OFF" for n in TREE_OFF_OPTIONS if n in names]


def check_tree(names: set[str], where: str) -> None:
    """Refuse a tree tunnelspec cannot build, naming what is missing (rather than a cmake error
    deep in the build or binaries without RPC)."""
    if "GGML_RPC" not in names:
        raise ValueError(
            f"{where}: the tree declares no GGML_RPC option (ggml/CMakeLists.txt): "
            "it has no RPC backend tunnelspec can build"
        )


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
echo "--- options"
for f in CMakeLists.txt ggml/CMakeLists.txt tools/server/CMakeLists.txt examples/server/CMakeLists.txt; do
  grep -E '^[[:space:]]*option[[:space:]]*\(' -- "$src/$f" 2>/dev/null
done
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
    options: set[str] = field(default_factory=set)  # option() names the tree declares


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
    st.options = option_names("\n".join(sections.get("options", [])))
    return st


def stamp_ok(stamp: dict | None, key: str, targets: list[str], bins: set[str]) -> bool:
    """A finished build: the stamp (written last) names this key and every wanted target, and the
    binaries are still there."""
    if not stamp or stamp.get("key") != key:
        return False
    built = set(stamp.get("targets", []))
    return set(targets) <= built and set(targets) <= bins
