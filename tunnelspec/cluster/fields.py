"""Reading one cluster variable of one host: type checks, defaults, and errors that point at the
line where the value was written. Used by cluster.py; knows nothing about the cluster's shape."""

from __future__ import annotations

import difflib
import re
import shlex
from typing import Any, overload

from tunnelspec.core.errors import ClusterError
from tunnelspec.inventory.model import Inventory
from tunnelspec.inventory.values import parse_value
from tunnelspec.core.booleans import parse_bool

# Every variable tunnelspec reads; the typo check suggests one of these.
KNOWN_VARS = frozenset(
    {
        "rpc_port",
        "tunnel_port",
        "rpc_role",
        "rpc_devices",
        "rpc_threads",
        "rpc_bind",
        "rpc_cache",
        "rpc_env",  # host_sections.py: the GPU runtime's environment of the RPC server
        "llama_repo",
        "llama_commit",
        "llama_patches",
        "llama_build_number",
        "llama_force_clean",
        "llama_backend",
        "llama_cmake_args",
        "llama_build_jobs",
        "tunnelspec_root",
        "llama_cuda_architectures",  # host_sections.py BuildSettings (llama_build: else nvidia-smi's)
        "llama_model",
        "llama_draft_model",
        "llama_server_host",
        "llama_server_port",
        "llama_server_public_bind",
        "llama_server_api_key_file",
        "llama_server_extra_args",
        "llama_server_start_timeout",  # host_sections.py: verify's wait for /health (components/server/verify.py)
        "llama_server_tls_names",
        "llama_server_tls_cert_file",
        "llama_server_tls_key_file",
        "llama_server_tls_ca_file",
        "tunnelspec_tls_dir",  # cluster/tls_vars.py (public bind = TLS)
        "llama_target_devices",
        "spec_draft_n_max",
        "spec_draft_ngl",
        "spec_draft_p_min",
        "spec_type",
        "llama_split_mode",
        "llama_tensor_split",
        "rpc_target_share",
        "rpc_user",
        "tunnel_user",
        "llama_user",
        "tunnelspec_known_hosts",  # read by the connection layer (the lab writes it)
        "rpc_local_isolation",  # playbooks/isolation*.yml, status
        "tunnelspec_lock_dir",  # read by the run lock (engine/runlock.py)
        "tunnelspec_pending_dir",  # read by the executor (engine/pending.py)
        "tunnelspec_install_packages",  # playbooks/hosts.yml, prerequisites.yml (components/host/host.py)
        "tunnel_ssh_host",
        "tunnel_ssh_port",  # main's tunnel ssh to a node (inventory/addresses.py)
        "llama_server_internal_port",
        "llama_server_hold_timeout",
        "draft_rejoin_after",
        "front_user",  # cluster/front_vars.py: the front (HAProxy) and the draft's return
        "metrics",
        "metrics_port",
        "metrics_token_file",  # cluster/front_vars.py (docs/metrics.md)
        "metrics_readers",  # cluster/front_vars.py: who besides root and the front may connect to metrics_port
        "bench_port",  # cluster/front_vars.py: bench's baseline llama-server (cluster/ports.py)
        "llama_keep_builds",
        "tunnel_from",  # playbooks/build.yml, tunnel.yml
        "tunnelspec_keep_generations",  # playbooks/server.yml (components/generation/tasks.py, docs/generations.md)
        "tunnel_nodes",
        "tunnel_key_rotation",
        "tunnelspec_purge",  # set by commands with -e (cli/main.py)
    }
)
# The user's own variables (for their own playbooks, templates or notes): tunnelspec reads none of
# them and `tunnelspec check` does not call them unknown. Ansible's own `ansible_*` are fine too.
USER_VAR_PREFIX = "my_"


def is_unknown_var(name: str) -> bool:
    return not (name in KNOWN_VARS or name.startswith(("ansible_", USER_VAR_PREFIX)))


def nearest_var(name: str, cutoff: float = 0.8) -> str | None:
    close = difflib.get_close_matches(name, KNOWN_VARS, n=1, cutoff=cutoff)
    return close[0] if close else None


_MISSING = object()


def cluster_error(
    inv: Inventory, host: str | None, var: str | None, message: str, line: int | None = None
) -> ClusterError:
    """`file:line: host H: variable V: message`, with whatever parts are known.

    The line is where the variable was written; for a variable that is missing, the line of the
    host (or the `line` given: a group's); for the inventory as a whole, line 1.
    The error keeps .host, .var, .file and .line so callers (and tests) need not parse text."""
    origin = inv.var_origin(host, var) if host in inv.hosts and var else None
    from_cli = bool(var) and var in inv.extra_vars
    if not origin and not from_cli:
        if line is None and host in inv.hosts:
            line = inv.hosts[host].line
        origin = (str(inv.path), line or 1)
    parts = []
    if origin:
        parts.append(f"{origin[0]}:{origin[1]}:")
    else:
        parts.append(f"-e {var}:")  # given on the command line, not written in the inventory
    if host:
        parts.append(f"host {host}:")
    if var:
        parts.append(f"variable {var}:")
    err = ClusterError(" ".join(parts + [message]))
    # ClusterError (core/errors.py) declares none of these four attributes; they are set here only.
    err.host, err.var = host, var
    err.file, err.line = origin if origin else ("-e" if from_cli else str(inv.path), None)
    return err


class HostVars:
    """Typed access to one host's merged variables (inventory layers and -e, Inventory.host_vars).

    A `-e KEY=VALUE` value is text; it is read here the way the INI parser reads a value
    (`-e rpc_threads=3` is the number 3, `-e 'llama_patches=[...]'` a list), so a variable means
    the same whether it was written in the inventory or given with -e."""

    def __init__(self, inv: Inventory, host: str):
        self.inv = inv
        self.host = host
        self.values = inv.host_vars(host)
        for var, value in inv.extra_vars.items():
            if isinstance(value, str):
                self.values[var] = parse_value(value)

    def fail(self, var: str | None, message: str) -> ClusterError:
        return cluster_error(self.inv, self.host, var, message)

    def has(self, var: str) -> bool:
        return var in self.values

    def raw(self, var: str, default: Any = _MISSING) -> Any:
        if var in self.values:
            return self.values[var]
        if default is _MISSING:
            raise self.fail(var, "is required; set it in the inventory (see inventory.example.ini or .yml)")
        return default

    # The overloads state what callers rely on: no default (required) or a text default gives
    # text, a None default may give None. (A variable written as None itself also comes back as
    # None, whatever the default: the overloads do not model that case.)
    @overload
    def string(self, var: str) -> str: ...
    @overload
    def string(self, var: str, default: str) -> str: ...
    @overload
    def string(self, var: str, default: str | None) -> str | None: ...
    def string(self, var: str, default: Any = _MISSING) -> str | None:
        value = self.raw(var, default)
        if value is None or value is default:
            return value
        if isinstance(value, bool) or not isinstance(value, (str, int, float)):
            raise self.fail(var, f"must be a string, got {value!r}")
        text = str(value).strip()
        if not text:
            raise self.fail(var, "is empty; give a value or remove the line")
        return text

    # As for string(): no default or a number as default gives a number, a None default may give None.
    @overload
    def integer(self, var: str, *, minimum: int | None = None) -> int: ...
    @overload
    def integer(self, var: str, default: int, minimum: int | None = None) -> int: ...
    @overload
    def integer(self, var: str, default: int | None, minimum: int | None = None) -> int | None: ...
    def integer(self, var: str, default: Any = _MISSING, minimum: int | None = None) -> int | None:
        value = self.raw(var, default)
        if value is None or value is default:
            return value
        if isinstance(value, bool) or not isinstance(value, int):
            if isinstance(value, str) and value.strip().isdigit():
                value = int(value)
            else:
                raise self.fail(var, f"must be an integer, got {value!r}")
        if minimum is not None and value < minimum:
            raise self.fail(var, f"must be at least {minimum}, got {value}")
        return value

    def boolean(self, var: str, default: bool) -> bool:
        value = self.raw(var, default)
        parsed = parse_bool(value)
        if parsed is not None:
            return parsed
        raise self.fail(var, f"must be true or false, got {value!r}")

    def port(self, var: str, default: int) -> int:
        value = self.integer(var, default)
        if not 1 <= value <= 65535:
            raise self.fail(var, f"port {value} is out of range; use 1024..65535")
        if value < 1024:
            raise self.fail(
                var, f"port {value} is privileged (< 1024); tunnelspec services run unprivileged, use 1024..65535"
            )
        return value

    def choice(self, var: str, choices: tuple[str, ...], default: str) -> str:
        value = self.string(var, default)
        if value not in choices:
            raise self.fail(var, f"must be one of {', '.join(choices)}; got {value!r}")
        return value

    def words(self, var: str) -> tuple[str, ...]:
        """A string split like a shell command line, or a list literal of strings."""
        value = self.raw(var, None)
        if value is None:
            return ()
        if isinstance(value, list) and all(isinstance(v, str) for v in value):
            return tuple(value)
        if not isinstance(value, str):
            raise self.fail(var, f"must be a string of arguments, got {value!r}")
        try:
            return tuple(shlex.split(value))
        except ValueError as err:
            raise self.fail(var, f"cannot split into arguments ({err}); check the quotes") from None

    def csv(self, var: str) -> tuple[str, ...]:
        """`CUDA0,CUDA1` (or a list literal) -> ("CUDA0", "CUDA1")."""
        value = self.raw(var, None)
        if value is None:
            return ()
        items = value if isinstance(value, list) else str(value).split(",")
        return tuple(str(item).strip() for item in items if str(item).strip())

    def check_typos(self) -> None:
        for name in self.values:
            if not is_unknown_var(name):
                continue
            close = nearest_var(name)
            if close:
                raise self.fail(
                    name,
                    f"unknown variable; did you mean '{close}'? (rename it; a variable of your own "
                    f"starts with {USER_VAR_PREFIX})",
                )


def is_full_sha(text: str) -> bool:
    return re.fullmatch(r"[0-9a-f]{40}", text) is not None
