"""Command line. The only module that imports click; it holds no logic of its own."""

from __future__ import annotations

import sys

import click

from tunnelspec import __version__
from tunnelspec.errors import EXIT_USAGE, TunnelspecError


def _fail(err: TunnelspecError) -> None:
    click.echo(f"ERROR: {err}", err=True)
    sys.exit(err.exit_code)


class _Group(click.Group):
    """Turns TunnelspecError into a message and its exit code; never a traceback."""

    def invoke(self, ctx):  # noqa: D401
        try:
            return super().invoke(ctx)
        except TunnelspecError as err:
            _fail(err)


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="tunnelspec")
def main() -> None:
    """Deploy llama.cpp distributed inference securely: RPC servers on loopback, reached only
    through SSH tunnels from the main host."""


# ---- inventory -------------------------------------------------------------------------------
@main.group()
def inventory() -> None:
    """Inspect an Ansible-style INI inventory."""


@inventory.command("list")
@click.argument("inventory_file", metavar="INVENTORY", type=click.Path(dir_okay=False))
def inventory_list(inventory_file: str) -> None:
    """Print the inventory as JSON, in the structure of `ansible-inventory --list`."""
    import json

    from tunnelspec.inventory import load_inventory

    inv = load_inventory(inventory_file)
    click.echo(json.dumps(inv.to_ansible_list(), indent=4, sort_keys=True))


# ---- lab -------------------------------------------------------------------------------------
@main.group()
def lab() -> None:
    """A local lab of real hosts (systemd-nspawn containers) to try everything."""


# ---- end of command groups -------------------------------------------------------------------
if __name__ == "__main__":  # pragma: no cover
    main()
