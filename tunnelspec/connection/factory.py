"""Turn a host's inventory variables into an open connection."""

from __future__ import annotations

import dataclasses
import getpass
import os

from tunnelspec.connection.become import password_from
from tunnelspec.connection.base import ConnectOptions, ConnectSession, Connection, expand_user_path
from tunnelspec.connection.local import LocalConnection
from tunnelspec.errors import UsageError
from tunnelspec.inventory.addresses import ssh_address
from tunnelspec.truth import truthy


def known_hosts_for(host_vars: dict, opts: ConnectOptions, inventory_dir) -> tuple[str | None, str | None]:
    """(spec, pin_path): the known_hosts to check against and where new keys would be pinned."""
    if opts.known_hosts:
        spec = opts.known_hosts
        return spec, (spec if "\n" not in spec else None)
    path = host_vars.get("tunnelspec_known_hosts")
    if path:
        p = expand_user_path(str(path), inventory_dir)
        return p, p
    p = os.path.expanduser("~/.ssh/known_hosts")
    return p, p


def ssh_target(name: str, host_vars: dict) -> tuple[str, int]:
    return ssh_address(name, host_vars)


def is_ssh(host_vars: dict) -> bool:
    return str(host_vars.get("ansible_connection", "ssh")) in ("ssh", "smart")


async def connect(name: str, host_vars: dict, opts: ConnectOptions, inventory_dir=None,
                  session: ConnectSession | None = None) -> Connection:
    """`session`: shared by the connections of one run (a fresh one when not given)."""
    kind = str(host_vars.get("ansible_connection", "ssh"))
    become = truthy(host_vars.get("ansible_become", False))
    password = password_from(host_vars) if become else None
    if kind == "local":
        return LocalConnection(name, become=become, become_password=password)
    if not is_ssh(host_vars):
        raise UsageError(f"{name}: ansible_connection={kind} is not supported (use ssh or local)")
    # Imported here, not at the top: a run starts its TCP connects (connection/preconnect.py) before
    # asyncssh is imported, so the hosts' sshd start-up overlaps that import.
    from tunnelspec.connection.ssh import SSHConnection

    address, port = ssh_target(name, host_vars)
    user = str(host_vars.get("ansible_user", getpass.getuser()))
    key = expand_user_path(host_vars.get("ansible_ssh_private_key_file"), inventory_dir)
    spec, pin = known_hosts_for(host_vars, opts, inventory_dir)
    local_opts = dataclasses.replace(opts, known_hosts=spec)
    return await SSHConnection.open(name, address, port, user, [key] if key else [], become, local_opts, pin,
                                    session if session is not None else ConnectSession(), become_password=password)
