"""How the structured values of a host's build, its RPC server and llama-server are read, one value
alone: the tunnelspec root, the backend, CMake's and llama-server's extra arguments, the CUDA
architectures, the RPC server's environment. Each raises
VarValueError with the reason; the declaration table (vardecl.py) calls them, and the model
(host_sections.py) keeps what relates two variables."""

from __future__ import annotations

import re
from typing import Any

from tunnelspec.cluster import hub_ref as hub
from tunnelspec.core import vartypes
from tunnelspec.core.constants import OPT_DIR
from tunnelspec.core.vartypes import VarValueError

BACKENDS = ("cpu", "cuda", "hip", "vulkan", "metal")
# Names people write for a backend that llama.cpp calls otherwise (its CMake switch and device names).
BACKEND_ALIASES = {
    "rocm": "hip",  # ROCm is AMD's stack; llama.cpp's backend for it is HIP (GGML_HIP, devices ROCm0…)
    "nvidia": "cuda",
    "vk": "vulkan",
    "mps": "metal",
    "apple": "metal",
}


def root_dir(value: Any) -> str:
    """tunnelspec_root: an absolute directory of tunnelspec's own (teardown --purge empties it)."""
    root = vartypes.string(value)
    if not root.startswith("/") or root.rstrip("/") == "":
        raise VarValueError(f"must be an absolute directory other than '/', got {root!r}")
    root = root.rstrip("/")
    parts = [p for p in root.split("/") if p]
    if ".." in parts or "." in parts or "//" in root:
        raise VarValueError(f"{root!r}: write it without '.', '..' or '//'")
    if (
        len(parts) < 2
        or root.startswith(("/usr/", "/etc/", "/boot/", "/proc/", "/sys/", "/dev/", "/run/"))
        or (parts[0] == "home" and len(parts) == 2)
        or root in ("/var/lib", "/var/cache", "/var/log", "/var/tmp")
    ):
        raise VarValueError(
            f"{root!r} is not a directory of tunnelspec's own (teardown --purge removes "
            f"what tunnelspec put in it): use a dedicated one such as {OPT_DIR}"
        )
    return root


def backend(value: Any) -> str:
    text = vartypes.string(value)
    alias = BACKEND_ALIASES.get(text.lower())
    if text not in BACKENDS and alias:
        why = (
            " ROCm is llama.cpp's HIP backend (GGML_HIP; its devices are named ROCm0, ROCm1…)."
            if alias == "hip"
            else ""
        )
        raise VarValueError(
            f"{text!r} is not a backend name: did you mean {alias}?{why} (one of {', '.join(BACKENDS)})"
        )
    if text not in BACKENDS:
        raise VarValueError(f"must be one of {', '.join(BACKENDS)}; got {text!r}")
    return text


# One CMake CUDA architecture: 89, 90a, 120a-real, 86-virtual, or CMake's own words.
_CUDA_ARCH = re.compile(r"^(\d{2,3}[af]?(-real|-virtual)?|native|all|all-major)$")


def cuda_architectures(value: Any) -> str:
    """llama_cuda_architectures (`89`, `86,89`, `"86;89"`) → "86;89" as CMake wants it."""
    items = value if isinstance(value, list) else re.split(r"[,;\s]+", str(value))
    archs = [str(a).strip() for a in items if str(a).strip()]
    bad = [a for a in archs if not _CUDA_ARCH.match(a)]
    if not archs or bad:
        raise VarValueError(
            f"{(bad or [value])[0]!r} is not a CUDA architecture; give "
            "compute capabilities without the dot, e.g. 89 (RTX 40xx), 90 (H100/H200), 86,89"
        )
    return ";".join(archs)


# rpc_env: what selects or tunes the node's GPU runtime, set in the RPC server's unit (Environment=)
# and for its device listing. Only these prefixes: the variable is for device selection (e.g.
# GGML_VK_VISIBLE_DEVICES=0 — ggml-vulkan skips CPU-type Vulkan devices such as Mesa's llvmpipe
# unless told to use them; CUDA_VISIBLE_DEVICES; HIP_VISIBLE_DEVICES), not a way to inject a loader.
RPC_ENV_PREFIXES = ("GGML_", "CUDA_", "HIP_", "ROCR_", "HSA_", "GPU_", "VK_", "MESA_", "LP_", "RADV_", "ANV_")
_ENV_KEY = re.compile(r"^[A-Z][A-Z0-9_]*$")
_ENV_VALUE = re.compile(r"^[A-Za-z0-9_.,:/+-]*$")
# Variables with a runtime's prefix that make it load code from a path: CUDA's injection library,
# ROCm's tools library, Vulkan's driver (ICD) and layer lists, ggml's backend library path. They
# would run any library as the rpc-server's user: refused, whatever the prefix.
_ENV_LOADS_CODE = re.compile(
    r"INJECTION|PRELOAD|LIBRARY|_LIBS?$|_TOOLS_LIB|LAYER|ICD|DRIVER_FILES|BACKEND_PATH|BACKEND_DIR"
)


def rpc_env(raw: Any) -> list[tuple[str, str]]:
    """`NAME=VALUE NAME=VALUE` (space-separated: a value may hold commas, CUDA_VISIBLE_DEVICES=0,1),
    a list of `NAME=VALUE`, or a YAML mapping."""
    if isinstance(raw, dict):
        items = [f"{k}={v}" for k, v in raw.items()]
    elif isinstance(raw, list):
        items = [str(x) for x in raw]
    else:
        items = str(raw).split()
    out = []
    for item in items:
        key, eq, value = item.partition("=")
        key = key.strip()
        if not eq or not _ENV_KEY.match(key):
            raise VarValueError(f"{item!r} is not NAME=VALUE (like GGML_VK_VISIBLE_DEVICES=0)")
        if not key.startswith(RPC_ENV_PREFIXES):
            raise VarValueError(
                f"{key} is not a GPU runtime variable: rpc_env takes names starting with {', '.join(RPC_ENV_PREFIXES)}"
            )
        if _ENV_LOADS_CODE.search(key):
            raise VarValueError(
                f"{key} makes the runtime load a library or driver from a path: refused "
                "(code the RPC server would run); install drivers and layers system-wide instead"
            )
        if not _ENV_VALUE.match(value):
            raise VarValueError(f"{key}: the value {value!r} may hold letters, digits and _ . , : / + - only")
        out.append((key, value))
    return out


# Flags tunnelspec sets itself in the llama-server unit (llama/speculative.py OWNED_FLAGS, with the
# variable to use instead; read where llama_server_extra_args is checked): letting extra args repeat
# them would silently move the model, the draft or the listening address. Draft tuning flags tunnelspec
# does not set (--spec-draft-p-min, --spec-draft-type-k, ...) are allowed and checked against the
# built --help at plan time.
# llama-server's own downloaders fetch at every start, unpinned and unverified: the pinned
# hf:// form of llama_model / llama_draft_model replaces them.
DOWNLOAD_SERVER_FLAGS = (
    "-hf",
    "-hfr",
    "--hf-repo",
    "-hfd",
    "-hfrd",
    "--hf-repo-draft",
    "-hff",
    "--hf-file",
    "-hfv",
    "-hfrv",
    "--hf-repo-v",
    "-hffv",
    "--hf-file-v",
    "-hft",
    "--hf-token",
    "-mu",
    "--model-url",
    "-dr",
    "--docker-repo",
    "--spec-draft-hf",
    "--spec-draft-hf-repo",
    "--spec-draft-hf-file",
)
# CMake cache entries tunnelspec owns: RPC on, RDMA off (it never works through a tunnel and had
# a CVE), the build identity, and the backend (chosen with llama_backend).
OWNED_CMAKE_VARS = (
    "GGML_RPC",
    "GGML_RPC_RDMA",
    "LLAMA_BUILD_NUMBER",
    "LLAMA_BUILD_COMMIT",
    "GGML_CUDA",
    "GGML_HIP",
    "GGML_VULKAN",
    "GGML_METAL",
)


def cmake_args(args: list[str]) -> list[str]:
    """llama_cmake_args, split: -DNAME=VALUE cache entries only, none of those tunnelspec sets."""
    for arg in args:
        if not arg.startswith("-D"):
            raise VarValueError(f"{arg!r} is not a -D cache entry; only -DNAME=VALUE flags are allowed")
        name = arg[2:].split("=", 1)[0].split(":", 1)[0]
        if name in OWNED_CMAKE_VARS:
            raise VarValueError(f"{arg!r} is set by tunnelspec (use llama_backend for the backend); remove it")
    return args


def server_args(args: list[str]) -> list[str]:
    """llama_server_extra_args, split: no downloader flag and no flag tunnelspec sets itself."""
    from tunnelspec.llama.speculative import owned_variable  # lazy: llama/'s flag tables, for this variable only

    for arg in args:
        flag = arg.split("=", 1)[0]
        if flag in DOWNLOAD_SERVER_FLAGS or flag.startswith("--hf-"):
            raise VarValueError(
                f"{flag} makes llama-server download a model at every start, unpinned and unverified; "
                f"name the model as llama_model / llama_draft_model = {hub.FORM} instead (downloaded and "
                "checked on the controller, uploaded once)"
            )
        var = owned_variable(None, flag)
        if var is not None:
            raise VarValueError(f"{flag} is set by tunnelspec; use {var} instead (remove it here)")
    return args
