"""One declaration per variable: its type, default, doc line, whether it is a secret and which
hosts read it (a first slice). `tunnelspec check` and the cluster model validate every
declared variable's value by its type, offline, at the line it was written; the connection layer
reads the Ansible connection variables through `value()`, so a value means the same in both.

Not every variable of cluster/fields.py's KNOWN_VARS is declared yet: the rest are read (and
typed) by the model's own readers (host_sections.py, front_vars.py, tls_vars.py) and listed in
NOT_YET_DECLARED, which later work shrinks (tests/inventory/test_schema.py holds the two together).

Ansible's connection variables are either honoured or refused with the reason — never accepted
and ignored: `refused` holds the reason, `ignored` a variable that is Ansible's business only.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from tunnelspec.cluster.fields import HostVars, cluster_error
from tunnelspec.core import ssh_args, vartypes
from tunnelspec.core.secrets import Secret
from tunnelspec.core.vartypes import VarValueError

TYPES = (
    "port",
    "int",
    "seconds",
    "bool",
    "repo",
    "file",
    "string",
    "address",
    "choice",
    "ssh_args",
    "refused",
    "ignored",
)


@dataclass(frozen=True)
class Var:
    name: str
    type: str  # one of TYPES
    doc: str  # one line: what it does
    default: Any = None  # None: required, or unset means "not used" (the doc says which)
    secret: bool = False  # never printed, not even in an error
    hosts: str = "all"  # "all", "main" or "rpc": the hosts that read it
    minimum: int | None = None
    maximum: int | None = None
    choices: tuple[str, ...] = ()
    reason: str = ""  # type "refused": why, and what to write instead


_KEYS_ONLY = (
    "refused: tunnelspec logs in with keys only (ansible_ssh_private_key_file, TUNNELSPEC_SSH_KEY or "
    "ssh-agent); remove it (a sudo password is ansible_become_password)"
)


def _old(new: str) -> str:
    return f"refused: an old Ansible spelling tunnelspec does not read; write {new}"


DECLARED: dict[str, Var] = {
    v.name: v
    for v in (
        # ---- Ansible's connection variables ---------------------------------------------------------
        Var("ansible_host", "address", "The address the controller's ssh connects to.", default="the inventory name"),
        Var("ansible_port", "port", "The SSH port of the host.", default=22),
        Var("ansible_user", "string", "The login name on the host.", default="the controller's user"),
        Var(
            "ansible_connection",
            "choice",
            "ssh, or local: the controller itself is this host.",
            default="ssh",
            choices=("ssh", "smart", "local"),
        ),
        Var("ansible_become", "bool", "Run commands as root through sudo when the login is not root.", default=False),
        Var("ansible_become_user", "choice", "Whom become runs as: root only.", default="root", choices=("root",)),
        Var(
            "ansible_become_method",
            "choice",
            "How to become root: only sudo is supported.",
            default="sudo",
            choices=("sudo",),
        ),
        Var("ansible_become_password", "string", "The sudo password of the login, when sudo asks one.", secret=True),
        Var("ansible_become_pass", "string", "Ansible's other name for ansible_become_password.", secret=True),
        Var("ansible_sudo_pass", "string", "Ansible's old name for ansible_become_password.", secret=True),
        Var(
            "ansible_ssh_private_key_file", "file", "The private key file to log in with (else ssh-agent, ~/.ssh/id_*)."
        ),
        Var("ansible_private_key_file", "file", "Ansible's other name for ansible_ssh_private_key_file."),
        Var("ansible_ssh_timeout", "seconds", "Seconds to wait for the TCP connect to the host.", default=10),
        Var("ansible_timeout", "seconds", "Ansible's other name for ansible_ssh_timeout.", default=10),
        Var(
            "ansible_python_interpreter",
            "ignored",
            "Ansible's only: tunnelspec runs no Ansible module on the hosts; accepted so an Ansible inventory works.",
        ),
        Var(
            "ansible_ssh_common_args",
            "ssh_args",
            "ssh arguments: a jump host (-J, ProxyJump, ProxyCommand 'ssh -W'), ConnectTimeout, ServerAlive*; others refused.",
        ),
        Var("ansible_ssh_extra_args", "ssh_args", "More ssh arguments, read as ansible_ssh_common_args."),
        Var("ansible_password", "refused", "A login password.", secret=True, reason=_KEYS_ONLY),
        Var("ansible_ssh_pass", "refused", "A login password.", secret=True, reason=_KEYS_ONLY),
        Var("ansible_ssh_host", "refused", "Old spelling of ansible_host.", reason=_old("ansible_host")),
        Var("ansible_ssh_port", "refused", "Old spelling of ansible_port.", reason=_old("ansible_port")),
        Var("ansible_ssh_user", "refused", "Old spelling of ansible_user.", reason=_old("ansible_user")),
        # ---- tunnelspec's ---------------------------------------------------------------------------
        Var(
            "llama_repo",
            "repo",
            "The llama.cpp git repository: a URL, user@host:path, a path on the hosts, or controller:PATH.",
        ),
        Var(
            "tunnelspec_known_hosts",
            "file",
            "The known_hosts file host keys are checked against and pinned to.",
            default="~/.ssh/known_hosts",
        ),
        Var(
            "rpc_local_isolation",
            "bool",
            "Guard the loopback ports of tunnelspec's services with nftables.",
            default=True,
        ),
        Var(
            "tunnelspec_install_packages", "bool", "Install missing packages (false: stop and name them).", default=True
        ),
        Var("llama_keep_builds", "int", "Builds kept on each host (older ones are removed).", default=3, minimum=1),
        Var(
            "tunnelspec_keep_generations",
            "int",
            "Generations kept on each host (docs/generations.md).",
            default=3,
            minimum=1,
            hosts="main",
        ),
        Var(
            "tunnel_ssh_host",
            "address",
            "Where main's tunnel ssh reaches this node (default ansible_host).",
            hosts="rpc",
        ),
        Var("tunnel_ssh_port", "port", "The port of that ssh (default ansible_port).", hosts="rpc"),
    )
}

# Read by the model's own readers, not declared here yet; a name leaves this set when it is declared.
# fmt: off
NOT_YET_DECLARED = frozenset({
    "rpc_port", "tunnel_port", "rpc_role", "rpc_devices", "rpc_threads", "rpc_bind", "rpc_cache", "rpc_env",
    "llama_commit", "llama_patches", "llama_build_number", "llama_force_clean", "llama_backend",
    "llama_cmake_args", "llama_build_jobs", "tunnelspec_root", "llama_cuda_architectures", "llama_model",
    "llama_draft_model", "llama_server_host", "llama_server_port", "llama_server_public_bind",
    "llama_server_api_key_file", "llama_server_extra_args", "llama_server_start_timeout",
    "llama_server_tls_names", "llama_server_tls_cert_file", "llama_server_tls_key_file",
    "llama_server_tls_ca_file", "tunnelspec_tls_dir", "llama_target_devices", "spec_draft_n_max",
    "spec_draft_ngl", "spec_draft_p_min", "spec_type", "llama_split_mode", "llama_tensor_split",
    "rpc_target_share", "rpc_user", "tunnel_user", "llama_user", "tunnelspec_lock_dir",
    "tunnelspec_pending_dir", "llama_server_internal_port", "llama_server_hold_timeout", "draft_rejoin_after",
    "front_user", "metrics", "metrics_port", "metrics_token_file", "metrics_readers", "bench_port",
    "tunnel_from", "tunnel_nodes", "tunnel_key_rotation", "tunnelspec_purge",
})
# fmt: on

ANSIBLE_NAMES = tuple(n for n in DECLARED if n.startswith("ansible_"))
# Ansible's own variables that tunnelspec does not read and that are not typos of a declared one:
# `tunnelspec check` warns that they have no effect here (an error would refuse harmless ones).
# fmt: off
ANSIBLE_NOT_READ = frozenset({
    "ansible_become_exe", "ansible_become_flags", "ansible_ssh_executable", "ansible_ssh_pipelining",
    "ansible_pipelining", "ansible_shell_type", "ansible_shell_executable", "ansible_sftp_extra_args",
    "ansible_scp_extra_args", "ansible_ssh_transfer_method", "ansible_ssh_retries",
    "ansible_connection_timeout", "ansible_group_priority",
})
# fmt: on


def parse(var: Var, value: Any, base_dir=None) -> Any:
    """The value read by its type; VarValueError with the reason (a secret's value never in it)."""
    try:
        return _parse(var, value, base_dir)
    except VarValueError as err:
        if var.secret and var.type != "refused":
            raise VarValueError("must be text (the value is a secret and is not shown)") from None
        if isinstance(value, Secret):  # a vault-encrypted value: the reason without the value
            reason = str(err).split(", got ", 1)[0]
            raise VarValueError(f"{reason} (the value is vault-encrypted and is not shown)") from None
        raise err from None


def _parse(var: Var, value: Any, base_dir) -> Any:
    kind = var.type
    if kind == "refused":
        raise VarValueError(var.reason)
    if kind == "ignored":
        return value
    if kind == "port":
        return vartypes.port(value)
    if kind == "int":
        return vartypes.integer(value, var.minimum, var.maximum)
    if kind == "seconds":
        return vartypes.number(value)
    if kind == "bool":
        return vartypes.boolean(value)
    if kind == "repo":
        return vartypes.repo(value)
    if kind == "file":
        return vartypes.file_path(value, base_dir)
    if kind == "address":
        return vartypes.address(value)
    if kind == "ssh_args":
        try:
            return ssh_args.parse(value)
        except ssh_args.SshArgsError as err:
            raise VarValueError(str(err)) from None
    text = vartypes.string(value)
    if kind == "choice" and text not in var.choices:
        only = "only " if len(var.choices) == 1 else "one of "
        raise VarValueError(f"{text!r} is not supported: {only}{', '.join(var.choices)}")
    return text


def value(name: str, host_vars: Mapping, base_dir=None, default: Any = None) -> Any:
    """A declared variable of one host, parsed (`default` when unset); VarValueError when bad."""
    if name not in host_vars:
        return default
    return parse(DECLARED[name], host_vars[name], base_dir)


def ansible_typo(name: str) -> str | None:
    """The declared Ansible variable an unknown `ansible_*` name is surely a typo of, else None."""
    if not name.startswith("ansible_") or name in DECLARED or name in ANSIBLE_NOT_READ:
        return None
    close = difflib.get_close_matches(name, ANSIBLE_NAMES, n=1, cutoff=0.85)
    return close[0] if close else None


def problems(host_vars: Mapping, base_dir=None) -> list[tuple[str, str]]:
    """(variable, reason) for every declared variable whose value its type refuses, and every
    `ansible_*` name that is a typo of a declared one, in the order the variables are written."""
    out = []
    for name, raw in host_vars.items():
        var = DECLARED.get(name)
        if var is None:
            near = ansible_typo(name)
            if near:
                out.append((name, f"unknown Ansible variable; did you mean '{near}'? (tunnelspec would ignore it)"))
            continue
        try:
            parse(var, raw, base_dir)
        except VarValueError as err:
            out.append((name, str(err)))
    return out


def check_hosts(inv, hosts) -> list:
    """A ClusterError (file:line, host, variable) per bad value of `hosts`; a value written once for
    several hosts (a group's, -e) is reported once, for the first host that reads it."""

    out, seen = [], set()
    for host in hosts:
        hv = HostVars(inv, host)
        for var, reason in problems(hv.values, inv.path.parent):
            where = inv.var_origin(host, var)  # None for -e
            if (where, var) in seen:
                continue
            seen.add((where, var))
            out.append(cluster_error(inv, host, var, reason))
    return out
