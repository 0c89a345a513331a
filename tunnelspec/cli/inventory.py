"""`tunnelspec inventory`: inspect an inventory."""

from __future__ import annotations

import json

import click

from tunnelspec.cli.options import inventory_argument
from tunnelspec.core.secrets import masked


@click.group()
def inventory() -> None:
    """Inspect an Ansible inventory (INI or YAML)."""


@inventory.command("list")
@inventory_argument
@click.option(
    "--show-secrets",
    is_flag=True,
    help="Print the values of secret-named variables (…_password, …_token, api_key, …) too; masked as *** by default.",
)
def inventory_list(inventory_file: str, show_secrets: bool) -> None:
    """Print the inventory as JSON, in the structure of `ansible-inventory --list` (secret-named
    variables masked unless --show-secrets)."""
    from tunnelspec.inventory import load_inventory  # lazy: CLI startup

    inv = load_inventory(inventory_file)
    data = inv.to_ansible_list()
    click.echo(json.dumps(data if show_secrets else masked(data), indent=4, sort_keys=True))
