"""The declarations of the variables every host reads (the source pin, the build, the service users,
the host's own settings) and those of an rpc node, and the variables tunnelspec's commands set with
-e. The main host's are in vars_main.py; what a declaration holds is in vardecl.py."""

from __future__ import annotations

from tunnelspec.cluster.vardecl import Var
from tunnelspec.core.constants import DEFAULT_RPC_PORT, DEFAULT_TUNNEL_PORT, LOOPBACK, OPT_DIR, STATE_DIR

ROLES = ("draft", "target")

HOST_VARS: tuple[Var, ...] = (
    # ---- the source every host builds ----------------------------------------------------------------
    Var(
        "llama_repo",
        "repo",
        "The llama.cpp git repository: a URL, user@host:path, a path on the hosts, or controller:PATH (required).",
    ),
    Var("llama_commit", "sha", "The pinned llama.cpp commit: a full 40-hex SHA, quoted (required)."),
    Var(
        "llama_patches",
        "patches",
        "The patch stack on llama_commit: a list of {pr, commit}, {pr, head}, {remote, ref, commit} or {file}.",
        default=[],
    ),
    Var("llama_build_number", "int", "The build number (bNNNN) to stamp.", minimum=0, derived="from the source"),
    # ---- the build -----------------------------------------------------------------------------------
    Var("llama_backend", "backend", "The GPU backend: cpu, cuda, hip, vulkan or metal.", default="cpu"),
    Var(
        "llama_cmake_args", "cmake_args", "Extra -DNAME=VALUE CMake cache entries (a shell line or a list).", default=[]
    ),
    Var("llama_build_jobs", "int", "Parallel build jobs.", minimum=1, derived="the host's cores"),
    Var("llama_force_clean", "bool", "Reset a modified llama.cpp checkout instead of stopping.", default=False),
    Var(
        "llama_cuda_architectures",
        "cuda_archs",
        "CUDA architectures to build for (89, 86,89) with the cuda backend.",
        derived="what nvidia-smi reports on the host",
    ),
    Var("llama_keep_builds", "int", "Builds kept on each host (older ones are removed).", default=3, minimum=1),
    # ---- the host ------------------------------------------------------------------------------------
    Var("tunnelspec_root", "root", "tunnelspec's own directory on the host (sources, builds).", default=OPT_DIR),
    Var("rpc_user", "user", "The RPC server's system user.", default="tunnelspec-rpc"),
    Var(
        "tunnel_user",
        "user",
        "The tunnel's system user (main's ssh client, the node's login).",
        default="tunnelspec-tunnel",
    ),
    Var("llama_user", "user", "llama-server's system user.", default="tunnelspec-llama"),
    Var(
        "tunnelspec_known_hosts",
        "file",
        "The known_hosts file host keys are checked against and pinned to (on the controller).",
        default="~/.ssh/known_hosts",
    ),
    Var(
        "rpc_local_isolation", "bool", "Guard the loopback ports of tunnelspec's services with nftables.", default=True
    ),
    Var("tunnelspec_install_packages", "bool", "Install missing packages (false: stop and name them).", default=True),
    Var("tunnelspec_lock_dir", "string", "Where the run lock lives on the host.", default="/run/tunnelspec"),
    Var(
        "tunnelspec_pending_dir",
        "string",
        "Where handlers still owed after a failed run are kept on the host.",
        default=f"{STATE_DIR}/pending",
    ),
    # ---- an rpc node ---------------------------------------------------------------------------------
    Var(
        "rpc_role",
        "choice",
        "draft (the draft model runs here) or target (layers of the target).",
        default="draft",
        choices=ROLES,
        hosts="rpc",
    ),
    Var(
        "rpc_port",
        "service_port",
        "The RPC server's port on the node, on 127.0.0.1.",
        default=DEFAULT_RPC_PORT,
        hosts="rpc",
    ),
    Var(
        "tunnel_port",
        "service_port",
        "The local end of the node's tunnel on the main host.",
        hosts="rpc",
        derived=f"{DEFAULT_TUNNEL_PORT} + the node's index in [rpc]",
    ),
    Var(
        "rpc_devices",
        "devices",
        "Devices the RPC server serves (CUDA0,CUDA1).",
        hosts="rpc",
        derived="the server's own choice",
    ),
    Var("rpc_threads", "int", "CPU threads of the RPC server.", minimum=1, hosts="rpc", derived="the server's own"),
    Var("rpc_cache", "bool", "Keep the RPC server's tensor cache (fast reloads).", default=True, hosts="rpc"),
    Var("rpc_bind", "loopback", "The RPC server's address: 127.0.0.1 only.", default=LOOPBACK, hosts="rpc"),
    Var("rpc_env", "env", "The GPU runtime's environment of the RPC server (NAME=VALUE ...).", hosts="rpc"),
    Var(
        "rpc_target_share",
        "share",
        "Proportion of the target model's layers on this node (0 = none).",
        hosts="rpc",
        derived="llama.cpp splits by free memory",
    ),
    Var(
        "tunnel_ssh_host",
        "address",
        "Where main's tunnel ssh reaches this node.",
        hosts="rpc",
        derived="ansible_host",
    ),
    Var("tunnel_ssh_port", "port", "The port of that ssh.", hosts="rpc", derived="ansible_port, else 22"),
    Var(
        "tunnel_from",
        "string",
        "Where the node accepts the tunnel key from (authorized_keys from=).",
        hosts="rpc",
        derived="main's source address towards the node, when it is an IP",
    ),
    # ---- set by tunnelspec's commands with -e ---------------------------------------------------------
    Var(
        "tunnelspec_purge",
        "bool",
        "teardown --purge: remove sources, builds and models too.",
        default=False,
        by_command=True,
    ),
    Var(
        "tunnel_nodes",
        "string",
        "tunnel open|close NODES: the nodes whose tunnels to touch.",
        default="all",
        hosts="main",
        by_command=True,
    ),
    Var(
        "tunnel_key_rotation",
        "string",
        "keys rotate: a new token replaces the tunnel key once.",
        default="",
        hosts="main",
        by_command=True,
    ),
    Var(
        "rollback_to",
        "int",
        "rollback --to N: the generation to go back to (0: the current one).",
        default=0,
        minimum=0,
        by_command=True,
    ),
    Var(
        "rollback_after_failed_deploy",
        "bool",
        "The rollback a failed deploy runs (a vulnerable build warns).",
        default=False,
        by_command=True,
    ),
    Var(
        "rollback_event",
        "string",
        "Why a rollback runs, counted in the metrics (set by deploy's own rollback).",
        default="",
        by_command=True,
        hosts="main",
    ),
)
