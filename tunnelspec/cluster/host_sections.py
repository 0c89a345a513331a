"""One host's part of the cluster model: the typed sections (users, build settings, source pin,
an rpc node, the main host) and how each is read and checked from that host's variables. Knows
nothing about the other hosts (cluster/model.py puts the sections together and checks across hosts)."""

from __future__ import annotations

from dataclasses import dataclass

from tunnelspec.core.constants import DEFAULT_TUNNEL_PORT, LOOPBACK
from tunnelspec.cluster.fields import HostVars
from tunnelspec.cluster.front_vars import FrontSettings, front_of
from tunnelspec.cluster.patches import Patch, patches_of
from tunnelspec.cluster.tls_vars import TlsSettings, tls_of
from tunnelspec.llama.devices import static_target_default

__all__ = ["Patch"]


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
    values = {var.split("_")[0]: hv.get(var) for var in ("rpc_user", "tunnel_user", "llama_user")}
    # Each service its own user: the isolation rules and file ownership tell them apart by uid
    # (front_user == llama_user would let the front listen on llama-server's port and read its key).
    seen: dict[str, str] = {}
    for var in ("rpc_user", "tunnel_user", "llama_user", "front_user"):
        name = values[var.split("_")[0]] if var != "front_user" else hv.get(var)
        if name in seen:
            raise hv.fail(var, f"{name!r} is {seen[name]} too: every service needs its own user")
        seen[name] = var
    return Users(**values)


def root_of(hv: HostVars) -> str:
    return hv.get("tunnelspec_root")


def build_of(hv: HostVars) -> BuildSettings:
    args = tuple(hv.get("llama_cmake_args"))
    return BuildSettings(
        backend=hv.get("llama_backend"),
        cmake_args=args,
        jobs=hv.get("llama_build_jobs"),
        force_clean=hv.get("llama_force_clean"),
        cuda_architectures=_cuda_architectures(hv, args),
    )


def _cuda_architectures(hv: HostVars, cmake_args: tuple[str, ...]) -> str | None:
    """llama_cuda_architectures as CMake wants it ("86;89"); None when unset (the build then targets
    the GPUs nvidia-smi reports on the host). Read on every host, used where the backend is cuda."""
    archs = hv.get("llama_cuda_architectures")
    if archs is not None and any(a.startswith("-DCMAKE_CUDA_ARCHITECTURES") for a in cmake_args):
        raise hv.fail(
            "llama_cuda_architectures",
            "is also given as -DCMAKE_CUDA_ARCHITECTURES in llama_cmake_args; keep one of the two",
        )
    return archs


def source_of(hv: HostVars) -> SourcePin:
    hv.raw("llama_repo"), hv.raw("llama_commit")  # required: "is required; set it ..." when missing
    repo, commit = hv.get("llama_repo"), hv.get("llama_commit")
    patches = patches_of(hv)
    # llama_repo=controller:PATH is checked against the controller's git once, for the whole
    # cluster, by the commands that send the source (components/source/controller_repo.py check_controller_source).
    return SourcePin(
        repo=repo,
        commit=commit,
        patches=patches,
        build_number=hv.get("llama_build_number"),
    )


def rpc_node_of(hv: HostVars, index: int) -> RpcNode:
    tunnel_port = hv.get("tunnel_port")
    return RpcNode(
        name=hv.host,
        index=index,
        env=tuple(hv.get("rpc_env") or ()),
        rpc_port=hv.get("rpc_port"),
        tunnel_port=DEFAULT_TUNNEL_PORT + index if tunnel_port is None else tunnel_port,
        role=hv.get("rpc_role"),
        target_share=hv.get("rpc_target_share"),
        devices=tuple(hv.get("rpc_devices") or ()),
        threads=hv.get("rpc_threads"),
        bind=hv.get("rpc_bind"),
        cache=hv.get("rpc_cache"),
        build=build_of(hv),
        root=root_of(hv),
        users=users_of(hv),
    )


def main_host_of(hv: HostVars) -> MainHost:
    host, public = hv.get("llama_server_host"), hv.get("llama_server_public_bind")
    key_file = hv.get("llama_server_api_key_file")
    if host != LOOPBACK and not (public and key_file):
        raise hv.fail(
            "llama_server_host",
            f"{host!r} refused: the API (the front of llama-server) listens on {LOOPBACK} unless you opt out with both "
            "llama_server_public_bind=true and llama_server_api_key_file=<path of a 0600 key file> "
            "(the API is then served over TLS only: docs/tls.md)",
        )
    extra = tuple(hv.get("llama_server_extra_args"))
    p_min = hv.get("spec_draft_p_min")
    for flag in (arg.split("=", 1)[0] for arg in extra):
        if p_min is not None and flag in ("--spec-draft-p-min", "--draft-p-min"):
            raise hv.fail("llama_server_extra_args", f"{flag} is also set by spec_draft_p_min; keep one of the two")
    spec_type = hv.get("spec_type")
    model, draft_model = hv.get("llama_model"), hv.get("llama_draft_model")
    build = build_of(hv)
    if spec_type == "draft-mtp" and draft_model is not None and draft_model == model:
        raise hv.fail(
            "spec_type",
            "draft-mtp with llama_draft_model = llama_model is MTP without a separate file: "
            "llama.cpp then runs the MTP heads on the target's devices and ignores the draft device; "
            "give the separate MTP GGUF (e.g. mtp-<model>.gguf) as llama_draft_model",
        )
    ngl = hv.get("spec_draft_ngl")
    port = hv.get("llama_server_port")
    return MainHost(
        name=hv.host,
        model=model,
        draft_model=draft_model,
        server_host=host,
        server_port=port,
        public_bind=public,
        api_key_file=key_file,
        extra_args=extra,
        # Unset: main's accelerator (its backend's first device, CUDA0 / ROCm0 / Vulkan0 / MTL0), the CPU
        # (`none`) for the cpu backend; `none` stays available explicitly (llama/devices.py).
        target_devices=",".join(hv.get("llama_target_devices") or ()) or static_target_default(build.backend),
        spec_draft_n_max=hv.get("spec_draft_n_max"),
        spec_draft_ngl=ngl,
        spec_type=spec_type,
        spec_draft_p_min=p_min,
        start_timeout=hv.get("llama_server_start_timeout"),
        build=build,
        root=root_of(hv),
        users=users_of(hv),
        tls=tls_of(hv) if public else None,
        front=front_of(hv, port),
    )
