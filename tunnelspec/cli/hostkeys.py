"""`tunnelspec hostkeys`: review SSH host keys."""

from __future__ import annotations

import sys

import click

from tunnelspec.cli.options import _extra_vars, _extra_vars_option, inventory_argument


@click.group("hostkeys")
def hostkeys() -> None:
    """Review SSH host keys before trusting them."""


@hostkeys.command("scan")
@inventory_argument
@click.option("--limit", "-l", help="Only hosts matching this pattern.")
@click.option("--format", "fmt", type=click.Choice(["human", "json"]), default="human", show_default=True)
@_extra_vars_option
def hostkeys_scan(inventory_file: str, limit: str | None, fmt: str, extra_vars: tuple[str, ...]) -> None:
    """Print each host's keys and SHA256 fingerprints, marked pinned / not pinned / CHANGED against
    known_hosts. Trusts nothing and writes nothing; exit 4 when a host fails or a key changed."""
    from tunnelspec.commands.hostkeys_scan import run_scan  # lazy: CLI startup
    from tunnelspec.commands.runner import connect_options_from_env  # lazy: CLI startup

    sys.exit(run_scan(inventory_file, limit, fmt, connect_options_from_env(), sys.stdout, _extra_vars(extra_vars)))
