"""`tunnelspec advisories`: known-vulnerable llama.cpp builds."""

from __future__ import annotations

import sys

import click


@click.command("advisories")
@click.option(
    "--build",
    "build_number",
    type=int,
    default=None,
    help="Check one llama.cpp build number (bNNNN) instead of printing the table.",
)
def advisories_cmd(build_number: int | None) -> None:
    """Known-vulnerable llama.cpp build ranges touching RPC."""
    from tunnelspec.llama import advisories  # lazy: CLI startup

    if build_number is None:
        click.echo(advisories.format_table())
        return
    result = advisories.check(build_number)
    click.echo(f"{result.verdict}: {result.message}")
    if result.verdict == advisories.AFFECTED:
        sys.exit(1)
