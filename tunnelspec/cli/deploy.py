"""The commands that run a playbook: play, deploy, rollback, teardown, verify."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from tunnelspec.cli.options import (
    _INVENTORY_HELP,
    _builtin,
    _cluster_and_opts,
    _extra_vars_option,
    _play,
    _run_options,
    inventory_argument,
    lock_options,
    playbook_options,
    run_options,
    vault_options,
)
from tunnelspec.llama import advisories


@click.command("play")
@click.option(
    "-i",
    "--inventory",
    "inventory_option",
    metavar="INVENTORY",
    type=click.Path(dir_okay=False),
    help=_INVENTORY_HELP + " The one argument is then the PLAYBOOK.",
)
@click.argument("paths", nargs=-1, metavar="[INVENTORY] PLAYBOOK", type=click.Path(dir_okay=False))
@run_options
@vault_options
def play_cmd(inventory_option, paths, **kw):
    """Run any playbook against INVENTORY (like ansible-playbook; `play -i INVENTORY PLAYBOOK` too)."""
    if inventory_option is not None:
        if len(paths) != 1:
            raise click.UsageError(
                f"the inventory is given twice (-i {inventory_option!r} and {paths[0]!r}): with "
                "-i INVENTORY, not both, the one argument is the PLAYBOOK"
                if paths
                else "Missing argument 'PLAYBOOK'."
            )
        inventory_file, playbook = inventory_option, paths[0]
    elif len(paths) == 2:
        inventory_file, playbook = paths
    else:
        raise click.UsageError(
            {
                0: "Missing argument 'INVENTORY' (or -i INVENTORY) and 'PLAYBOOK'.",
                1: "Missing argument 'PLAYBOOK'.",
            }.get(
                len(paths), f"Got unexpected extra argument(s) {' '.join(paths[2:])!r}: play takes INVENTORY PLAYBOOK"
            )
        )
    _play(inventory_file, playbook, lock=f"play {Path(playbook).name}", **kw)


@click.command("deploy")
@inventory_argument
@click.option(
    "--allow-vulnerable-llama",
    is_flag=True,
    help="Deploy even when the pinned build is in a known-vulnerable range (see `tunnelspec advisories`).",
)
@click.option(
    "--no-rollback",
    is_flag=True,
    help="On failure, leave the hosts as the failure left them (debugging) instead of returning to the "
    "last verified generation (docs/generations.md).",
)
@run_options
def deploy_cmd(inventory_file, allow_vulnerable_llama, no_rollback, **kw):
    """Converge every host: same llama.cpp source, built, RPC services, tunnels, llama-server."""
    _play(
        inventory_file,
        _builtin("deploy.yml"),
        require_cluster=True,
        require_models=True,
        check_first=True,
        accepted=frozenset({advisories.ACCEPT_VULNERABLE} if allow_vulnerable_llama else ()),
        lock="deploy",
        rollback=not no_rollback,
        **kw,
    )


@click.command("rollback")
@inventory_argument
@click.option(
    "--to",
    "to",
    type=click.IntRange(1),
    default=None,
    help="The kept generation to return to (`tunnelspec status` lists them); default: the current one.",
)
@click.option(
    "--allow-vulnerable-llama",
    is_flag=True,
    help="Return even when the generation's build is in a known-vulnerable range (see `tunnelspec advisories`).",
)
@click.option("--format", "fmt", type=click.Choice(["human", "json"]), default="human", show_default=True)
@_extra_vars_option
@lock_options
def rollback_cmd(inventory_file, to, allow_vulnerable_llama, fmt, extra_vars, lock_timeout, no_wait):
    """Return every host to a kept generation (its build, files and source; no compile, no download) and verify."""
    from tunnelspec.commands.rollback import rollback  # lazy: CLI startup
    from tunnelspec.commands.runner import reporter  # lazy: CLI startup

    inv, cluster, opts = _cluster_and_opts(inventory_file, extra_vars=extra_vars)
    options = _run_options(
        False,
        False,
        None,
        (),
        (),
        20,
        0,
        extra_vars=extra_vars,
        lock=f"rollback{f' --to {to}' if to else ''}",
        lock_timeout=lock_timeout,
        lock_wait=not no_wait,
        accepted=frozenset({advisories.ACCEPT_VULNERABLE} if allow_vulnerable_llama else ()),
    )
    sys.exit(rollback(inv, cluster, options, reporter(fmt), opts, to or 0))


@click.command("teardown")
@inventory_argument
@click.option("--purge", is_flag=True, help="Also remove sources, builds, caches and uploaded models.")
@run_options
def teardown_cmd(inventory_file, purge, **kw):
    """Remove everything tunnelspec installed; prove nothing it started still listens."""
    kw["extra_vars"] = tuple(kw.get("extra_vars") or ()) + (f"tunnelspec_purge={'true' if purge else 'false'}",)
    _play(inventory_file, _builtin("teardown.yml"), require_cluster=True, lock="teardown", **kw)


@click.command("verify")
@inventory_argument
@playbook_options
def verify_cmd(inventory_file, **kw):
    """Read-only: /health, a completion with draft tokens and the draft buffer on the remote device (no draft:
    a completion and the target's layers per device from its load lines)."""
    _play(inventory_file, _builtin("verify.yml"), require_cluster=True, **kw)
