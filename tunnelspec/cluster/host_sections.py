"""One host's part of the cluster model: the typed sections (users, build settings, source pin,
an rpc node, the main host) and how each is read and checked from that host's variables. Knows
nothing about the other hosts (cluster.py puts the sections together and checks across hosts)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tunnelspec.core import writable
from tunnelspec.core.constants import DEFAULT_HTTP_PORT, DEFAULT_RPC_PORT, DEFAULT_TUNNEL_PORT, LOOPBACK, OPT_DIR
from tunnelspec.cluster.fields import HostVars, is_full_sha
from tunnelspec.cluster.placement import node_share
from tunnelspec.cluster.front_vars import DEFAULT_FRONT_USER, FrontSettings, front_of
from tunnelspec.cluster.tls_vars import TlsSettings, tls_of
from tunnelspec.inventory.values import USER_NAME
from tunnelspec.llama.devices import static_target_default
from tunnelspec.llama.source_stack import short_sha_error
from tunnelspec.llama.speculative import DRAFT_TYPES, OWNED_FLAGS, owned_variable
from tunnelspec.cluster import hub_ref as hub

BACKENDS = ("cpu", "cuda", "hip", "vulkan", "metal")
ROLES = ("draft", "target")
# Names people write for a backend that llama.cpp calls otherwise (its CMake switch and device names).
BACKEND_ALIASES = {
    "rocm": "hip",  # ROCm is AMD's stack; llama.cpp's backend for it is HIP (GGML_HIP, devices ROCm0…)
    "nvidia": "cuda",
    "vk": "vulkan",
    "mps": "metal",
    "apple": "metal",
}
# Flags tunnelspec sets itself in the llama-server unit (llama/speculative.py OWNED_FLAGS, with the
# variable to use instead); letting extra args repeat them would silently move the model, the draft
# or the listening address. Draft tuning flags tunnelspec does not set (--spec-draft-p-min,
# --spec-draft-type-k, ...) are allowed and checked against the built --help at plan time.
OWNED_SERVER_FLAGS = tuple(OWNED_FLAGS)
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
_DEVICE = re.compile(r"^[A-Za-z][A-Za-z0-9_]*$")


@dataclass(frozen=True)
class Patch:
    """One entry of llama_patches. kind "pr": one `commit` of GitHub PR `pr` cherry-picked, or with
    `head` the whole PR (every commit from the merge base with llama_commit up to that head);
    kind "remote": one `commit` of `ref` of `remote`; kind "file": a patch file on the controller
    (absolute path). SHAs are full (source_stack.short_sha_error says why)."""

    kind: str
    commit: str | None = None
    pr: int | None = None
    remote: str | None = None
    ref: str | None = None
    file: Path | None = None
    head: str | None = None

    @property
    def pinned(self) -> str | None:
        """The commit the hosts must have: the single commit, or the PR's head."""
        return self.commit or self.head


@dataclass(frozen=True)
class SourcePin:
    """The llama.cpp source every host must build: identical on all hosts (checked here)."""

    repo: str
    commit: str
    patches: tuple[Patch, ...]
    build_number: int | None


@dataclass(frozen=True)
class BuildSettings:
    backend: str
    cmake_args: tuple[str, ...]
    jobs: int | None
    force_clean: bool
    # llama_cuda_architectures as CMake wants it ("86;89"); None: detected on the host (nvidia-smi)
    cuda_architectures: str | None = None


@dataclass(frozen=True)
class Users:
    rpc: str
    tunnel: str
    llama: str


@dataclass(frozen=True)
class RpcNode:
    name: str
    index: int  # position in the rpc group; also the order of --rpc endpoints on main
    rpc_port: int
    tunnel_port: int
    role: str  # "draft" | "target"
    target_share: float | None  # rpc_target_share: proportion of the target's layers (None: not given)
    devices: tuple[str, ...]  # () = the rpc-server's default devices
    env: tuple[tuple[str, str], ...]  # rpc_env: the GPU runtime's environment (GGML_VK_VISIBLE_DEVICES=0, ...)
    threads: int | None
    bind: str  # always LOOPBACK
    cache: bool
    build: BuildSettings
    root: str
    users: Users

    @property
    def endpoint(self) -> str:
        """The address llama-server on main uses: the local end of this node's tunnel."""
        return f"{LOOPBACK}:{self.tunnel_port}"


@dataclass(frozen=True)
class MainHost:
    name: str
    model: str | None
    draft_model: str | None
    server_host: str
    server_port: int
    public_bind: bool
    api_key_file: str | None
    extra_args: tuple[str, ...]
    target_devices: str
    spec_draft_n_max: int | None  # None: the build's own default
    spec_draft_ngl: str  # "all" or a layer count as text
    spec_type: str | None  # None: draft-simple where the build has it (see llama/speculative.py)
    spec_draft_p_min: float | None
    build: BuildSettings
    root: str
    users: Users
    # llama_server_public_bind=true: TLS, always (cluster/tls_vars.py); None on loopback.
    tls: TlsSettings | None = None
    # Seconds verify waits for /health after a (re)start; None: from the models' sizes
    # (components/server/verify.py start_timeout).
    start_timeout: int | None = None
    # The front (HAProxy) on llama_server_host:llama_server_port; llama-server behind it on loopback.
    front: FrontSettings | None = None


# ---- per-host sections -----------------------------------------------------------------------------
def users_of(hv: HostVars) -> Users:
    values = {}
    for var, default in (
        ("rpc_user", "tunnelspec-rpc"),
        ("tunnel_user", "tunnelspec-tunnel"),
        ("llama_user", "tunnelspec-llama"),
    ):
        name = hv.string(var, default)
        if not USER_NAME.match(name) or name == "root":
            raise hv.fail(var, f"{name!r} is not a valid unprivileged system user name (e.g. {default})")
        values[var.split("_")[0]] = name
    # Each service its own user: the isolation rules and file ownership tell them apart by uid
    # (front_user == llama_user would let the front listen on llama-server's port and read its key).
    seen: dict[str, str] = {}
    for var in ("rpc_user", "tunnel_user", "llama_user", "front_user"):
        name = values[var.split("_")[0]] if var != "front_user" else hv.string(var, DEFAULT_FRONT_USER)
        if name in seen:
            raise hv.fail(var, f"{name!r} is {seen[name]} too: every service needs its own user")
        seen[name] = var
    return Users(**values)


def root_of(hv: HostVars) -> str:
    root = hv.string("tunnelspec_root", OPT_DIR)
    if not root.startswith("/") or root.rstrip("/") == "":
        raise hv.fail("tunnelspec_root", f"must be an absolute directory other than '/', got {root!r}")
    root = root.rstrip("/")
    parts = [p for p in root.split("/") if p]
    if ".." in parts or "." in parts or "//" in root:
        raise hv.fail("tunnelspec_root", f"{root!r}: write it without '.', '..' or '//'")
    if (
        len(parts) < 2
        or root.startswith(("/usr/", "/etc/", "/boot/", "/proc/", "/sys/", "/dev/", "/run/"))
        or (parts[0] == "home" and len(parts) == 2)
        or root in ("/var/lib", "/var/cache", "/var/log", "/var/tmp")
    ):
        raise hv.fail(
            "tunnelspec_root",
            f"{root!r} is not a directory of tunnelspec's own (teardown --purge removes "
            f"what tunnelspec put in it): use a dedicated one such as {OPT_DIR}",
        )
    return root


def build_of(hv: HostVars) -> BuildSettings:
    args = hv.words("llama_cmake_args")
    for arg in args:
        if not arg.startswith("-D"):
            raise hv.fail("llama_cmake_args", f"{arg!r} is not a -D cache entry; only -DNAME=VALUE flags are allowed")
        name = arg[2:].split("=", 1)[0].split(":", 1)[0]
        if name in OWNED_CMAKE_VARS:
            raise hv.fail(
                "llama_cmake_args",
                f"{arg!r} is set by tunnelspec (use llama_backend for the backend); remove it",
            )
    return BuildSettings(
        backend=backend_of(hv),
        cmake_args=args,
        jobs=hv.integer("llama_build_jobs", None, minimum=1),
        force_clean=hv.boolean("llama_force_clean", False),
        cuda_architectures=_cuda_architectures(hv, args),
    )


# One CMake CUDA architecture: 89, 90a, 120a-real, 86-virtual, or CMake's own words.
_CUDA_ARCH = re.compile(r"^(\d{2,3}[af]?(-real|-virtual)?|native|all|all-major)$")


def _cuda_architectures(hv: HostVars, cmake_args: tuple[str, ...]) -> str | None:
    """llama_cuda_architectures (`89`, `86,89`, `"86;89"`) → "86;89"; None when unset (the build then
    targets the GPUs nvidia-smi reports on the host). Read on every host, used where the backend is cuda."""
    value = hv.raw("llama_cuda_architectures", None)
    if value is None:
        return None
    items = value if isinstance(value, list) else re.split(r"[,;\s]+", str(value))
    archs = [str(a).strip() for a in items if str(a).strip()]
    bad = [a for a in archs if not _CUDA_ARCH.match(a)]
    if not archs or bad:
        raise hv.fail(
            "llama_cuda_architectures",
            f"{(bad or [value])[0]!r} is not a CUDA architecture; give "
            "compute capabilities without the dot, e.g. 89 (RTX 40xx), 90 (H100/H200), 86,89",
        )
    if any(a.startswith("-DCMAKE_CUDA_ARCHITECTURES") for a in cmake_args):
        raise hv.fail(
            "llama_cuda_architectures",
            "is also given as -DCMAKE_CUDA_ARCHITECTURES in llama_cmake_args; keep one of the two",
        )
    return ";".join(archs)


def backend_of(hv: HostVars) -> str:
    value = hv.string("llama_backend", "cpu")
    alias = BACKEND_ALIASES.get(str(value).strip().lower())
    if value not in BACKENDS and alias:
        why = (
            " ROCm is llama.cpp's HIP backend (GGML_HIP; its devices are named ROCm0, ROCm1…)."
            if alias == "hip"
            else ""
        )
        raise hv.fail(
            "llama_backend",
            f"{value!r} is not a backend name: did you mean {alias}?{why} (one of {', '.join(BACKENDS)})",
        )
    return hv.choice("llama_backend", BACKENDS, "cpu")


def source_of(hv: HostVars) -> SourcePin:
    repo = hv.string("llama_repo")
    commit = hv.raw("llama_commit")
    commit = str(commit).strip().lower() if isinstance(commit, (str, int)) and not isinstance(commit, bool) else commit
    if not isinstance(commit, str) or not is_full_sha(commit):
        raise hv.fail(
            "llama_commit",
            f"{commit!r} is not a full 40-hex commit SHA; tags, branches and short SHAs can move or "
            "collide: pin the full SHA (git rev-parse '<tag>^{commit}'), quoted: llama_commit=\"<sha>\"",
        )
    patches = _patches(hv)
    # llama_repo=controller:PATH is checked against the controller's git once, for the whole
    # cluster, by the commands that send the source (cluster.py check_controller_source).
    return SourcePin(
        repo=repo,
        commit=commit,
        patches=patches,
        build_number=hv.integer("llama_build_number", None, minimum=0),
    )


def _patches(hv: HostVars) -> tuple[Patch, ...]:
    value = hv.raw("llama_patches", None)
    if value is None:
        return ()
    if not isinstance(value, list):
        raise hv.fail(
            "llama_patches",
            'must be a list literal, e.g. [{"pr": 123, "commit": "<sha>"}, {"file": "patches/x.patch"}]',
        )
    patches, problems = [], []
    for i, entry in enumerate(value):
        try:
            patches.append(_patch(hv, i, entry))
        except _PatchEntryError as err:
            problems.append(str(err))
    if problems:
        # Every entry's mistake at once: a short SHA in one entry and a tag in another are one fix.
        raise hv.fail("llama_patches", "; ".join(problems))
    return tuple(patches)


class _PatchEntryError(ValueError):
    """One llama_patches entry's mistake; _patches reports every entry's together."""


def _patch(hv: HostVars, index: int, entry: Any) -> Patch:
    where = f"entry {index}"
    if not isinstance(entry, dict):
        raise _PatchEntryError(f'{where} must be a dict like {{"pr": 123, "commit": "<sha>"}}, got {entry!r}')
    keys = set(entry)
    forms = {
        frozenset({"pr", "commit"}): "pr",
        frozenset({"pr", "head"}): "pr",
        frozenset({"remote", "ref", "commit"}): "remote",
        frozenset({"file"}): "file",
    }
    kind = forms.get(frozenset(keys))
    if kind is None:
        raise _PatchEntryError(
            f"{where} has keys {sorted(keys)}; use one of {{pr, commit}} (one commit of a PR), {{pr, head}} "
            "(the whole PR, up to that head), {remote, ref, commit} or {file}",
        )
    if kind == "file":
        rel = entry["file"]
        if not isinstance(rel, str) or not rel:
            raise _PatchEntryError(f"{where}: file must be a path string")
        path = (hv.inv.path.parent / rel).resolve()
        if not path.is_file():
            raise _PatchEntryError(
                f"{where}: patch file {path} does not exist (paths are relative to the inventory's directory)"
            )
        if not is_patch_text(path.read_text(encoding="utf-8", errors="replace")):
            raise _PatchEntryError(
                f"{where}: {path} is not a patch: no unified diff in it (`--- a/…`, "
                "`+++ b/…` and `@@` hunks, as `git diff` or `git format-patch` write); give the patch file"
            )
        return Patch(kind="file", file=path)
    key = "head" if "head" in keys else "commit"
    # Full SHAs only, as for llama_commit: the one rule and its reason live in short_sha_error.
    bad = short_sha_error(entry[key], key)
    if bad:
        raise _PatchEntryError(f"{where}: {bad}")
    sha = entry[key].strip().lower()
    if kind == "pr":
        pr = entry["pr"]
        if isinstance(pr, bool) or not isinstance(pr, int) or pr < 1:
            raise _PatchEntryError(f"{where}: pr must be a positive PR number, got {pr!r}")
        return Patch(kind="pr", pr=pr, head=sha) if key == "head" else Patch(kind="pr", pr=pr, commit=sha)
    for key in ("remote", "ref"):
        if not isinstance(entry[key], str) or not entry[key].strip() or entry[key].startswith("-"):
            raise _PatchEntryError(f"{where}: {key} must be a non-empty string not starting with '-'")
    return Patch(kind="remote", remote=entry["remote"], ref=entry["ref"], commit=sha)


_HUNK = re.compile(r"^@@ -\d+(,\d+)? \+\d+(,\d+)? @@", re.M)
_FILE_PAIR = re.compile(r"^--- \S.*\n\+\+\+ \S", re.M)
_GIT_ONLY = re.compile(r"^(rename from|new file mode|deleted file mode|GIT binary patch|old mode)", re.M)


def is_patch_text(text: str) -> bool:
    """A unified diff as `git apply` takes it: file headers and hunks, or a git diff of renames,
    modes or binaries (which has no hunk)."""
    if _FILE_PAIR.search(text) and _HUNK.search(text):
        return True
    return "\ndiff --git " in "\n" + text and bool(_GIT_ONLY.search(text))


def rpc_node_of(hv: HostVars, index: int) -> RpcNode:
    bind = hv.string("rpc_bind", LOOPBACK)
    if bind != LOOPBACK:
        raise hv.fail(
            "rpc_bind",
            f"{bind!r} refused: the RPC protocol is unauthenticated remote code execution, so "
            f"ggml-rpc-server only listens on {LOOPBACK} and is reached through the SSH tunnel; "
            "remove rpc_bind",
        )
    devices = hv.csv("rpc_devices")
    for device in devices:
        if not _DEVICE.match(device):
            raise hv.fail("rpc_devices", f"{device!r} is not a device name (like CPU, CUDA0, Vulkan1)")
    return RpcNode(
        name=hv.host,
        index=index,
        env=rpc_env_of(hv),
        rpc_port=hv.port("rpc_port", DEFAULT_RPC_PORT),
        tunnel_port=hv.port("tunnel_port", DEFAULT_TUNNEL_PORT + index),
        role=hv.choice("rpc_role", ROLES, "draft"),
        target_share=node_share(hv),
        devices=devices,
        threads=hv.integer("rpc_threads", None, minimum=1),
        bind=bind,
        cache=hv.boolean("rpc_cache", True),
        build=build_of(hv),
        root=root_of(hv),
        users=users_of(hv),
    )


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
    r"INJECTION|PRELOAD|LIBRARY|_LIBS?$|_TOOLS_LIB|LAYER|ICD|DRIVER_FILES|BACKEND_PATH|"
    r"BACKEND_DIR"
)


def rpc_env_of(hv: HostVars) -> tuple[tuple[str, str], ...]:
    """`NAME=VALUE NAME=VALUE` (space-separated: a value may hold commas, CUDA_VISIBLE_DEVICES=0,1),
    a list of `NAME=VALUE`, or a YAML mapping."""
    raw = hv.raw("rpc_env", None)
    if raw is None:
        return ()
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
            raise hv.fail("rpc_env", f"{item!r} is not NAME=VALUE (like GGML_VK_VISIBLE_DEVICES=0)")
        if not key.startswith(RPC_ENV_PREFIXES):
            raise hv.fail(
                "rpc_env",
                f"{key} is not a GPU runtime variable: rpc_env takes names starting with {', '.join(RPC_ENV_PREFIXES)}",
            )
        if _ENV_LOADS_CODE.search(key):
            raise hv.fail(
                "rpc_env",
                f"{key} makes the runtime load a library or driver from a path: refused "
                "(code the RPC server would run); install drivers and layers system-wide instead",
            )
        if not _ENV_VALUE.match(value):
            raise hv.fail("rpc_env", f"{key}: the value {value!r} may hold letters, digits and _ . , : / + - only")
        out.append((key, value))
    return tuple(out)


# The llama-server unit runs with ProtectHome=yes and PrivateTmp=yes: a key file below these is
# invisible to it (the server would fail to start, seen only as "not healthy" minutes later).
SANDBOX_HIDDEN_DIRS = ("/home/", "/root/", "/run/user/", "/tmp/", "/var/tmp/")


def main_host_of(hv: HostVars) -> MainHost:
    host = hv.string("llama_server_host", LOOPBACK)
    public = hv.boolean("llama_server_public_bind", False)
    key_file = hv.string("llama_server_api_key_file", None)
    if host != LOOPBACK and not (public and key_file):
        raise hv.fail(
            "llama_server_host",
            f"{host!r} refused: the API (the front of llama-server) listens on {LOOPBACK} unless you opt out with both "
            "llama_server_public_bind=true and llama_server_api_key_file=<path of a 0600 key file> "
            "(the API is then served over TLS only: docs/tls.md)",
        )
    if key_file is not None and not key_file.startswith("/"):
        raise hv.fail("llama_server_api_key_file", f"must be an absolute path on the main host, got {key_file!r}")
    hidden = next((d for d in SANDBOX_HIDDEN_DIRS if key_file and key_file.startswith(d)), None)
    if hidden:
        raise hv.fail(
            "llama_server_api_key_file",
            f"{key_file!r} is under {hidden}, which llama-server's sandbox hides (ProtectHome=yes, "
            "PrivateTmp=yes): it could not read the key; use e.g. /etc/tunnelspec/llama-api-key",
        )
    place = writable.place_of(key_file) if key_file else None
    if place is not None:
        raise hv.fail(
            "llama_server_api_key_file",
            f"{key_file!r} is in {place.path}, which a service user can write: root reads the key there "
            "(systemd's LoadCredential=, verify) and would follow a link put in its place (SECURITY.md, "
            "invariant A); use e.g. /etc/tunnelspec/llama-api-key",
        )
    extra = hv.words("llama_server_extra_args")
    p_min = _p_min(hv)
    for arg in extra:
        flag = arg.split("=", 1)[0]
        if flag in DOWNLOAD_SERVER_FLAGS or flag.startswith("--hf-"):
            raise hv.fail(
                "llama_server_extra_args",
                f"{flag} makes llama-server download a model at every start, unpinned and unverified; "
                f"name the model as llama_model / llama_draft_model = {hub.FORM} instead (downloaded and "
                "checked on the controller, uploaded once)",
            )
        var = owned_variable(None, flag)
        if var is not None:
            raise hv.fail("llama_server_extra_args", f"{flag} is set by tunnelspec; use {var} instead (remove it here)")
        if p_min is not None and flag in ("--spec-draft-p-min", "--draft-p-min"):
            raise hv.fail("llama_server_extra_args", f"{flag} is also set by spec_draft_p_min; keep one of the two")
    spec_type = hv.string("spec_type", None)
    if spec_type is not None and spec_type not in DRAFT_TYPES:
        raise hv.fail(
            "spec_type",
            f"must be one of {', '.join(DRAFT_TYPES)} (a draft model on the remote device); got {spec_type!r}",
        )
    model, draft_model = _model(hv, "llama_model"), _model(hv, "llama_draft_model")
    build = build_of(hv)
    if spec_type == "draft-mtp" and draft_model is not None and draft_model == model:
        raise hv.fail(
            "spec_type",
            "draft-mtp with llama_draft_model = llama_model is MTP without a separate file: "
            "llama.cpp then runs the MTP heads on the target's devices and ignores the draft device; "
            "give the separate MTP GGUF (e.g. mtp-<model>.gguf) as llama_draft_model",
        )
    ngl = hv.raw("spec_draft_ngl", "all")
    if not (ngl == "all" or (isinstance(ngl, int) and not isinstance(ngl, bool) and ngl >= 0)):
        raise hv.fail("spec_draft_ngl", f"must be 'all' or a number of layers (0 or more), got {ngl!r}")
    return MainHost(
        name=hv.host,
        model=model,
        draft_model=draft_model,
        server_host=host,
        server_port=hv.port("llama_server_port", DEFAULT_HTTP_PORT),
        public_bind=public,
        api_key_file=key_file,
        extra_args=extra,
        # Unset: main's accelerator (its backend's first device, CUDA0 / ROCm0 / Vulkan0 / MTL0), the CPU
        # (`none`) for the cpu backend; `none` stays available explicitly (llama/devices.py).
        target_devices=",".join(hv.csv("llama_target_devices")) or static_target_default(build.backend),
        spec_draft_n_max=hv.integer("spec_draft_n_max", None, minimum=1),
        spec_draft_ngl=str(ngl),
        spec_type=spec_type,
        spec_draft_p_min=p_min,
        start_timeout=hv.integer("llama_server_start_timeout", None, minimum=10),
        build=build,
        root=root_of(hv),
        users=users_of(hv),
        tls=tls_of(hv) if public else None,
        front=front_of(hv, hv.port("llama_server_port", DEFAULT_HTTP_PORT)),
    )


def _p_min(hv: HostVars) -> float | None:
    value = hv.raw("spec_draft_p_min", None)
    if value is None:
        return None
    try:
        out = float(value) if not isinstance(value, bool) else None
    except (TypeError, ValueError):
        out = None
    if out is None or not 0.0 <= out <= 1.0:
        raise hv.fail("spec_draft_p_min", f"must be a probability between 0 and 1, got {value!r}")
    return out


def _model(hv: HostVars, var: str) -> str | None:
    value = hv.string(var, None)
    if value is not None and (hub.is_hub_ref(value) or value.lower().startswith(("hf:", "huggingface:"))):
        try:
            return str(hub.parse_ref(value))
        except hub.HubRefError as err:
            raise hv.fail(var, str(err)) from None
    return value
