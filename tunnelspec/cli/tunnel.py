"""`tunnelspec tunnel` and `tunnelspec keys`: the persistent SSH tunnels on main and their key."""

from __future__ import annotations

import json
import sys

import click

from tunnelspec.cli.options import (
    _extra_vars,
    _extra_vars_option,
    _tunnel_fmt,
    _tunnel_play,
    inventory_argument,
    lock_options,
    shown,
)


@click.group()
def tunnel() -> None:
    """Persistent SSH tunnels on the main host (one systemd unit per rpc node)."""


_tunnel_limit = click.option("--limit", "-l", "nodes", default="", help="Only these rpc nodes (comma-separated).")


@tunnel.command("open")
@inventory_argument
@_tunnel_limit
@_tunnel_fmt
@_extra_vars_option
@lock_options
def tunnel_open(inventory_file, nodes, fmt, extra_vars, lock_timeout, no_wait):
    """Install, start and check the tunnels (HELLO through each one); start llama-server again if
    closing the tunnels stopped it (deployed, enabled, and all of its tunnels open)."""
    _tunnel_play(
        inventory_file,
        "tunnel-open.yml",
        fmt,
        [f"tunnel_nodes={nodes}"] if nodes else [],
        "tunnel open",
        lock_timeout,
        no_wait,
        extra_vars,
    )


@tunnel.command("close")
@inventory_argument
@_tunnel_limit
@_tunnel_fmt
@_extra_vars_option
@lock_options
def tunnel_close(inventory_file, nodes, fmt, extra_vars, lock_timeout, no_wait):
    """Stop and disable the tunnel units (keys and files stay)."""
    _tunnel_play(
        inventory_file,
        "tunnel-close.yml",
        fmt,
        [f"tunnel_nodes={nodes}"] if nodes else [],
        "tunnel close",
        lock_timeout,
        no_wait,
        extra_vars,
    )


@tunnel.command("status")
@inventory_argument
@_tunnel_limit
@_tunnel_fmt
@_extra_vars_option
def tunnel_status_cmd(inventory_file, nodes, fmt, extra_vars):
    """Per tunnel: unit state, local port, remote RPC version and devices (or busy)."""
    import asyncio  # lazy: CLI startup

    from tunnelspec.commands.runner import connect_options_from_env  # lazy: CLI startup
    from tunnelspec.commands.tunnel_status import format_status, tunnel_status  # lazy: CLI startup

    rows = asyncio.run(
        tunnel_status(inventory_file, nodes, connect_options_from_env(), extra_vars=_extra_vars(extra_vars))
    )
    click.echo(shown(json.dumps(rows) if fmt == "json" else format_status(rows)))
    sys.exit(0 if all(r["state"] == "active" and r["rpc"] in ("ok", "busy") for r in rows) else 1)


@click.group()
def keys() -> None:
    """Tunnel keys."""


@keys.command("rotate")
@inventory_argument
@_tunnel_fmt
@_extra_vars_option
@lock_options
def keys_rotate(inventory_file, fmt, extra_vars, lock_timeout, no_wait):
    """Replace the tunnel key on main and its authorized_keys line on every node; restart tunnels."""
    from tunnelspec.components.tunnel.keypair import new_rotation_token  # lazy: CLI startup

    _tunnel_play(
        inventory_file,
        "tunnel-open.yml",
        fmt,
        [f"tunnel_key_rotation={new_rotation_token()}"],
        "keys rotate",
        lock_timeout,
        no_wait,
        extra_vars,
    )
