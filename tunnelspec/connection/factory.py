"""Turn a host's inventory variables into an open connection."""

from __future__ import annotations

import dataclasses
import getpass
import os

from tunnelspec.connection.become import password_from
from tunnelspec.connection.base import ConnectOptions, ConnectSession, Connection, expand_user_path
from tunnelspec.connection.local import LocalConnection
from tunnelspec.core.errors import UsageError
from tunnelspec.inventory.addresses import ssh_address
from tunnelspec.cluster import schema
from tunnelspec.core import ssh_args
from tunnelspec.core.vartypes import VarValueError


def known_hosts_for(host_vars: dict, opts: ConnectOptions, inventory_dir) -> tuple[str | None, str | None]:
    """(spec, pin_path): the known_hosts to check against and where new keys would be pinned."""
    if opts.known_hosts:
        from tunnelspec.connection.hostkeys import (
            is_known_hosts_content,
        )  # lazy: asyncssh (start-up cost: the first hosts are pre-connected before it loads)

        spec = opts.known_hosts
        if is_known_hosts_content(spec):
            return spec, None
        spec = os.path.abspath(os.path.expanduser(spec))
        return spec, spec
    path = host_vars.get("tunnelspec_known_hosts")
    if path:
        # Absolute: `known_hosts` next to an inventory given as `inventory.ini` would otherwise be the
        # bare word "known_hosts", which is neither clearly a path nor known_hosts content.
        expanded = expand_user_path(str(path), inventory_dir)
        assert expanded is not None  # None only for "", and str() of a non-empty value is not ""
        p = os.path.abspath(expanded)
        return p, p
    p = os.path.expanduser("~/.ssh/known_hosts")
    return p, p


def check_known_hosts(inventory, hosts, opts: ConnectOptions) -> None:
    """Before any host is contacted: every known_hosts the hosts name can be read (a missing file is an
    empty one), and with --accept-new-host-keys the file to pin to can be created. Raises UsageError
    (exit 2) naming the file."""
    from tunnelspec.connection.hostkeys import (
        load_known_hosts_text,
    )  # lazy: asyncssh (start-up cost: the first hosts are pre-connected before it loads)

    seen = set()
    for name in hosts:
        hv = inventory.host_vars(name)
        if not is_ssh(hv):
            continue
        spec, pin = known_hosts_for(hv, opts, inventory.path.parent)
        if (spec, pin) in seen:
            continue
        seen.add((spec, pin))
        load_known_hosts_text(spec)
        if opts.accept_new_host_keys and pin and not os.path.isdir(os.path.dirname(os.path.abspath(pin)) or "."):
            raise UsageError(
                f"{name}: --accept-new-host-keys would pin to {pin}, but its directory "
                f"{os.path.dirname(os.path.abspath(pin))} does not exist; create it first"
            )


def ssh_target(name: str, host_vars: dict) -> tuple[str, int]:
    return ssh_address(name, host_vars)


def is_ssh(host_vars: dict) -> bool:
    return str(host_vars.get("ansible_connection", "ssh")) in ("ssh", "smart")


# The connection variables read here, by their declared types (cluster/schema.py): the values
# `tunnelspec check` passed, read the same way; a refused one (ansible_password, extra ssh
# arguments, ansible_become_method=su) stops the connection with its reason (exit 2).
_READ = (
    "ansible_user",
    "ansible_become",
    "ansible_become_user",
    "ansible_become_method",
    "ansible_ssh_private_key_file",
    "ansible_private_key_file",
    "ansible_ssh_timeout",
    "ansible_timeout",
    "ansible_ssh_common_args",
    "ansible_ssh_extra_args",
    *(n for n, v in schema.DECLARED.items() if v.type == "refused" and n.startswith("ansible_")),
)


def settings_for(name: str, host_vars: dict, inventory_dir) -> dict:
    """The connection variables of one host, read by their declared types, and what follows from them:
    `key_files`, `ssh_args` (the two ssh-argument variables as one command line), `timeout`."""
    out = {}
    for var in _READ:
        try:
            out[var] = schema.value(var, host_vars, inventory_dir)
        except VarValueError as err:
            raise VarValueError(f"host {name}: variable {var}: {err} (tunnelspec check shows the line)") from None
    out["ansible_become"] = bool(out["ansible_become"])
    # Read above by their type (an SshArgs each, or None): combined here as one ssh command line.
    args = ssh_args.combined(out["ansible_ssh_common_args"], out["ansible_ssh_extra_args"])
    out["ssh_args"] = args
    key = out["ansible_ssh_private_key_file"] or out["ansible_private_key_file"]
    out["key_files"] = [key] if key else []
    # ansible_ssh_timeout wins over a ConnectTimeout in the ssh arguments, as Ansible's -o ConnectTimeout
    # from its timeout setting comes before the user's arguments on ssh's command line.
    out["timeout"] = out["ansible_ssh_timeout"] or out["ansible_timeout"] or args.connect_timeout
    return out


def connect_timeout_for(name: str, host_vars: dict, opts: ConnectOptions, inventory_dir=None) -> float:
    """ansible_ssh_timeout (or ansible_timeout) when the inventory sets it, else the run's."""
    return settings_for(name, host_vars, inventory_dir)["timeout"] or opts.connect_timeout


async def connect(
    name: str, host_vars: dict, opts: ConnectOptions, inventory_dir=None, session: ConnectSession | None = None
) -> Connection:
    """`session`: shared by the connections of one run (a fresh one when not given)."""
    kind = str(host_vars.get("ansible_connection", "ssh"))
    settings = settings_for(name, host_vars, inventory_dir)
    become = settings["ansible_become"]
    password = password_from(host_vars) if become else None
    if kind == "local":
        return LocalConnection(name, become=become, become_password=password)
    if not is_ssh(host_vars):
        raise UsageError(f"{name}: ansible_connection={kind} is not supported (use ssh or local)")
    # Imported here, not at the top: a run starts its TCP connects (connection/preconnect.py) before
    # asyncssh is imported, so the hosts' sshd start-up overlaps that import.
    from tunnelspec.connection.ssh import (
        SSHConnection,
    )  # lazy: asyncssh (start-up cost: the first hosts are pre-connected before it loads)

    address, port = ssh_target(name, host_vars)
    user = settings["ansible_user"] or getpass.getuser()
    spec, pin = known_hosts_for(host_vars, opts, inventory_dir)
    local_opts = dataclasses.replace(opts, known_hosts=spec)
    if settings["timeout"]:
        local_opts = dataclasses.replace(local_opts, connect_timeout=settings["timeout"])
    args = settings["ssh_args"]
    if args.keepalive_interval is not None:
        local_opts = dataclasses.replace(local_opts, keepalive_interval=args.keepalive_interval)
    if args.keepalive_count_max is not None:
        local_opts = dataclasses.replace(local_opts, keepalive_count_max=args.keepalive_count_max)
    return await SSHConnection.open(
        name,
        address,
        port,
        user,
        settings["key_files"],
        become,
        local_opts,
        pin,
        session if session is not None else ConnectSession(),
        become_password=password,
        jump=args.jump,
    )
