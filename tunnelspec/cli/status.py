"""The commands that read hosts or the inventory and change nothing: status, logs, bench, check."""

from __future__ import annotations

import json
import sys

import click

from tunnelspec.cli.options import (
    _cluster_and_opts,
    _extra_vars,
    _extra_vars_option,
    _one_inventory,
    inventory_argument,
    shown,
)
from tunnelspec.core.errors import EXIT_UNREACHABLE, UsageError


@click.command("status")
@inventory_argument
@click.option("--format", "fmt", type=click.Choice(["human", "json"]), default="human", show_default=True)
@_extra_vars_option
def status_cmd(inventory_file, fmt, extra_vars):
    """One screen: sources, builds, services, tunnels, RPC versions/devices, llama-server health, draft acceptance."""
    import asyncio  # lazy: CLI startup

    from tunnelspec.commands import status  # lazy: CLI startup

    inv, cluster, opts = _cluster_and_opts(inventory_file, extra_vars=extra_vars)
    report = asyncio.run(status.gather(inv, cluster, opts))
    click.echo(shown(json.dumps(report, sort_keys=True) if fmt == "json" else status.render(report)))
    sys.exit(status.status_exit_code(report))


@click.command("logs")
@inventory_argument
@click.option(
    "--output",
    "-o",
    "output",
    default=None,
    type=click.Path(),
    help="Directory, or a .tar.gz file, to write (default ./tunnelspec-logs-<UTC time>).",
)
@click.option(
    "--since",
    default=None,
    help="Journal lines since this time (journalctl --since syntax, e.g. '1 hour ago'); default: the current boot.",
)
@_extra_vars_option
def logs_cmd(inventory_file, output, since, extra_vars):
    """Read-only bug-report bundle: every host's tunnelspec journals, unit files, llama-server version
    and devices, load/placement lines, status; secrets masked. Unreachable hosts are listed."""
    from tunnelspec.commands import logs  # lazy: CLI startup

    inv, cluster, opts = _cluster_and_opts(inventory_file, extra_vars=extra_vars)
    where, hosts = logs.run(inv, cluster, opts, output, since)
    click.echo(logs.summary(hosts, where), nl=False)
    unreachable = [b.name for b in hosts if b.unreachable]
    if unreachable:  # the bundle holds what could be collected; the exit code says it is not everything
        click.echo(f"ERROR: unreachable: {', '.join(unreachable)} (the bundle {where} has the other hosts)", err=True)
        sys.exit(EXIT_UNREACHABLE)


@click.command("bench")
@inventory_argument
@click.option(
    "--n-predict", default=64, show_default=True, type=click.IntRange(1, 4096), help="Tokens generated per completion."
)
@click.option(
    "--runs",
    default=3,
    show_default=True,
    type=click.IntRange(1, 50),
    help="Measured completions per side, after one warm-up; speeds are their median.",
)
@click.option("--prompt", default=None, help="Prompt text, the same for both sides (a fixed story prompt by default).")
@click.option(
    "--same-placement",
    is_flag=True,
    help="Baseline keeps the deployed target placement (--rpc, -dev, -ts) and drops only the draft. "
    "INTERRUPTS SERVING: stops the deployed llama-server meanwhile; needs --yes.",
)
@click.option("--yes", is_flag=True, help="Allow an option that interrupts serving (--same-placement); never asked.")
@click.option(
    "--format",
    "fmt",
    type=click.Choice(["human", "json"]),
    default="human",
    show_default=True,
    help="A side-by-side table, or one JSON object (schema 2, docs/cli.md).",
)
@_extra_vars_option
def bench_cmd(inventory_file, n_predict, runs, prompt, same_placement, yes, fmt, extra_vars):
    """The cluster as deployed vs. the same model on main alone (when it fits main; else why, with both
    figures): load time, prompt and generation tokens/s, draft accepted, time waiting on the network.
    Read-only unless --same-placement (docs/cli.md, "tunnelspec bench")."""
    from tunnelspec.commands.bench import command as bench  # lazy: CLI startup

    if same_placement:
        bench.refuse_same_placement(yes)  # before anything is read or contacted
    inv, cluster, opts = _cluster_and_opts(inventory_file, extra_vars=extra_vars)
    kw = {"n_predict": n_predict, "runs": runs, "same_placement": same_placement, "yes": yes}
    if prompt:
        kw["prompt"] = prompt
    result = bench.bench_sync(inv, cluster, opts, **kw)
    click.echo(shown(json.dumps(result, sort_keys=True) if fmt == "json" else bench.render(result)))
    sys.exit(bench.exit_code(result))


@click.command("check")
@inventory_argument(deferred=True)
@click.option(
    "--format",
    "fmt",
    type=click.Choice(["human", "json"]),
    default="human",
    show_default=True,
    help="Errors, warnings and the plan as text, or one JSON object.",
)
@_extra_vars_option
def check_cmd(inventory_file, fmt, extra_vars):
    """Offline: every inventory mistake at once (file:line), then what systemd will run on each host.
    Contacts nothing. Errors and warnings on stderr, the plan and the summary on stdout (--format json:
    one object on stdout, always). Exit 2 on errors, 0 otherwise (warnings alone are fine)."""
    from tunnelspec.commands.check import Report, check_inventory, usage_finding  # lazy: CLI startup

    positional, option = inventory_file
    try:
        path = _one_inventory(positional, option)
        report = check_inventory(path, _extra_vars(extra_vars))
    except (click.UsageError, UsageError) as err:  # -e =x, -e @missing, no inventory or two
        report = Report(positional or option or "")
        report.add(usage_finding(err.format_message() if isinstance(err, click.UsageError) else str(err)))
    # A vault-encrypted value the inventory or -e @FILE held (a Secret) is never shown, wherever a
    # message or the plan would quote it.
    diagnostics = shown(report.diagnostics())
    if diagnostics:
        click.echo(diagnostics, err=True)
    click.echo(shown(json.dumps(report.as_json(), sort_keys=True) if fmt == "json" else report.render()))
    sys.exit(report.exit_code())
