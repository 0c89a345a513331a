"""`tunnelspec certs` and `tunnelspec client-config`: TLS of llama-server's API (public bind)."""

from __future__ import annotations

import json

import click

from tunnelspec.cli.options import (
    _cluster_and_opts,
    _extra_vars_option,
    _tunnel_fmt,
    _tunnel_play,
    inventory_argument,
    lock_options,
    shown,
)


@click.group()
def certs() -> None:
    """The inventory's certificate authority and llama-server's certificate (llama_server_public_bind=true)."""


@certs.command("rotate")
@inventory_argument
@_tunnel_fmt
@_extra_vars_option
@lock_options
def certs_rotate(inventory_file, fmt, extra_vars, lock_timeout, no_wait):
    """A new CA for this inventory (the old key is deleted), main's certificate re-issued by it and
    the front reloaded (llama-server keeps running); clients must pin the new ca.crt (the old one no
    longer validates)."""
    from tunnelspec.commands import certs as certs_mod  # lazy: CLI startup

    _, cluster, _ = _cluster_and_opts(inventory_file, extra_vars=extra_vars, connects=False)
    old, new = certs_mod.rotate(cluster)
    click.echo(f"CA rotated: {old or '(none)'} → {new}; clients pin {cluster.main.tls.ca_file}", err=True)
    _tunnel_play(inventory_file, "certs-rotate.yml", fmt, [], "certs rotate", lock_timeout, no_wait, extra_vars)


@certs.command("show")
@inventory_argument
@_tunnel_fmt
@_extra_vars_option
def certs_show(inventory_file, fmt, extra_vars):
    """The CA clients pin (subject, end, fingerprint) and where main's certificate and key are. No key is shown."""
    from tunnelspec.commands import certs as certs_mod  # lazy: CLI startup

    _, cluster, _ = _cluster_and_opts(inventory_file, extra_vars=extra_vars, connects=False)
    d = certs_mod.show(cluster)
    click.echo(shown(json.dumps(d, sort_keys=True) if fmt == "json" else certs_mod.render_show(d)), nl=fmt == "json")


@click.command("client-config")
@inventory_argument
@_tunnel_fmt
@_extra_vars_option
def client_config_cmd(inventory_file, fmt, extra_vars):
    """What a client needs: the base URL (https://…/v1), the CA file to pin, where the API key lives
    on main (never the key itself)."""
    from tunnelspec.commands import certs as certs_mod  # lazy: CLI startup
    from tunnelspec.commands.client_config import render  # lazy: CLI startup

    _, cluster, _ = _cluster_and_opts(inventory_file, extra_vars=extra_vars, connects=False)
    cfg = certs_mod.config_for(cluster)
    click.echo(shown(json.dumps(cfg, sort_keys=True, indent=2) if fmt == "json" else render(cfg)), nl=fmt == "json")
