"""Where a host is reached: the one reading of `ansible_host`/`ansible_port` (the controller's SSH)
and of `tunnel_ssh_host`/`tunnel_ssh_port` (the main host's tunnel ssh to an rpc node, when main
sees the node under another address than the controller does)."""

from __future__ import annotations

from collections.abc import Mapping

from tunnelspec.core import vartypes


def ssh_host(name: str, host_vars: Mapping) -> str:
    """The address the controller connects to; the inventory name when ansible_host is unset."""
    return str(host_vars.get("ansible_host", name))


def ssh_address(name: str, host_vars: Mapping) -> tuple[str, int]:
    """(address, port) the controller connects to. A port its type refuses (`nine`, `22.5`, 99999:
    core/vartypes.py, as `tunnelspec check` reads it) raises VarValueError (a usage error, exit 2)."""
    return ssh_host(name, host_vars), _port(name, host_vars, "ansible_port", 22)


def tunnel_address(name: str, host_vars: Mapping) -> tuple[str, int]:
    """(address, port) main's tunnel ssh connects to: tunnel_ssh_host/port, else the controller's view."""
    host, port = ssh_address(name, host_vars)
    return str(host_vars.get("tunnel_ssh_host", host)), _port(name, host_vars, "tunnel_ssh_port", port)


def _port(name: str, host_vars: Mapping, var: str, default: int) -> int:
    if var not in host_vars:
        return default
    try:
        return vartypes.port(host_vars[var])
    except vartypes.VarValueError as err:
        raise vartypes.VarValueError(f"host {name}: variable {var}: {err} (tunnelspec check shows the line)") from None
