"""Where a host is reached: the one reading of `ansible_host`/`ansible_port` (the controller's SSH)
and of `tunnel_ssh_host`/`tunnel_ssh_port` (the main host's tunnel ssh to an rpc node, when main
sees the node under another address than the controller does)."""

from __future__ import annotations

from collections.abc import Mapping


def ssh_host(name: str, host_vars: Mapping) -> str:
    """The address the controller connects to; the inventory name when ansible_host is unset."""
    return str(host_vars.get("ansible_host", name))


def ssh_address(name: str, host_vars: Mapping) -> tuple[str, int]:
    """(address, port) the controller connects to (ansible_port raises ValueError when not a number)."""
    return ssh_host(name, host_vars), int(host_vars.get("ansible_port", 22))


def tunnel_address(name: str, host_vars: Mapping) -> tuple[str, int]:
    """(address, port) main's tunnel ssh connects to: tunnel_ssh_host/port, else the controller's view."""
    host, port = ssh_address(name, host_vars)
    return str(host_vars.get("tunnel_ssh_host", host)), int(host_vars.get("tunnel_ssh_port", port))
