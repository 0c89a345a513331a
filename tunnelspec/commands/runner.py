"""Glue between the CLI and the engine: load, validate, run, report. No click here."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path

from tunnelspec.connection import ConnectOptions
from tunnelspec.engine.context import RunOptions
from tunnelspec.engine.executor import Run
from tunnelspec.engine.playbook import load_playbook
from tunnelspec.core.errors import EXIT_FAILED, ClusterError, UsageError
from tunnelspec.reporting.human import HumanReporter
from tunnelspec.reporting.jsonl import JsonReporter
from tunnelspec.core.secrets import Secret
from tunnelspec.inventory import load_inventory
from tunnelspec.connection.factory import check_known_hosts
# What only a deploy needs is imported inside run_playbook_file (`# lazy: deploy only`): the light
# commands (status, logs, certs, client-config, …) import this module for connect_options_from_env.


def reporter(fmt: str, verbose: int = 0, stream=None):
    if fmt == "json":
        return JsonReporter(stream)
    if fmt == "human":
        return HumanReporter(stream, verbose)
    raise UsageError(f"unknown output format {fmt!r} (human or json)")


def connect_options_from_env(accept_new_host_keys: bool = False) -> ConnectOptions:
    """Credentials from the environment: CI never prompts and never writes a secret to disk."""
    key = os.environ.get("TUNNELSPEC_SSH_KEY")
    known = os.environ.get("TUNNELSPEC_KNOWN_HOSTS")
    return ConnectOptions(
        known_hosts=known or None, accept_new_host_keys=accept_new_host_keys, private_key=Secret(key) if key else None
    )


def load_cluster(inv):
    """The typed cluster view when the inventory describes one (main + rpc), else None."""
    if "main" not in inv.groups and "rpc" not in inv.groups:
        return None
    # A play on hosts alone never reads the cluster model: ≈ 60 ms of start-up (it imports x509) spared.
    from tunnelspec.cluster.model import Cluster  # lazy: start-up cost

    return Cluster.from_inventory(inv)


def run_playbook_file(
    inventory_path: str,
    playbook_path: str | Path,
    options: RunOptions,
    fmt: str = "human",
    connect_options: ConnectOptions | None = None,
    require_cluster: bool = False,
    stream=None,
    require_models: bool = False,
    check_first: bool = False,
    rollback: bool | None = None,
) -> int:
    """`rollback`: a deploy — True returns every host to the last verified generation when the run
    fails (docs/generations.md); False (--no-rollback) leaves them as the failure left them, and says
    so; None: not a deploy."""
    inv = cluster = None
    if check_first:
        # deploy: every mistake of the inventory at once (`tunnelspec check`), before any connection.
        # The inventory and cluster it read are the run's: the file is read once per command.
        from tunnelspec.commands.check import check_inventory  # lazy: deploy only
        from tunnelspec.core.secrets import mask_text, seen  # lazy: deploy only

        report = check_inventory(inventory_path, options.extra_vars)
        if report.errors:
            raise ClusterError(report.error_text())
        if fmt == "human":
            for warning in report.warnings:
                print(f"WARNING: {warning.message}", file=sys.stderr)
            if report.settings is not None:
                print(report.settings, file=sys.stderr)
            if options.check and report.plan is not None:
                # deploy --check: the whole change, from the inventory alone, before any host is asked
                # (so it is there even when every host is unreachable).
                print(mask_text(report.render(), seen()), flush=True)  # a vaulted value stays hidden
        inv, cluster = report.loaded, report.cluster
    if inv is None:
        # -e KEY=VALUE on top of the inventory, once: the typed cluster and the run read the same view.
        inv = load_inventory(inventory_path).with_extra_vars(options.extra_vars)
    if cluster is None and not require_cluster:
        cluster = load_cluster(inv)
    elif cluster is None:
        from tunnelspec.cluster.model import Cluster  # lazy: deploy only
        from tunnelspec.components.source.controller_repo import check_controller_source  # lazy: deploy only

        # The controller's llama.cpp repository matters to the deploy, which sends the source from it.
        cluster = Cluster.from_inventory(inv, source_check=check_controller_source if require_models else None)
        if require_models:
            # deploy ends with llama-server: a missing model must stop the run before any host is touched.
            cluster.require_models()
    playbook = load_playbook(playbook_path)
    if options.limit and not inv.match(options.limit):
        raise UsageError(f"--limit {options.limit!r} matches no host in {inventory_path}")
    connect_options = connect_options or connect_options_from_env()

    check_known_hosts(inv, inv.match(options.limit or "all"), connect_options)
    emit = reporter(fmt, options.verbose, stream or sys.stdout)
    failures: list[dict] = []

    def tee(event: dict) -> None:
        if event.get("status") == "failed" or (event.get("event") == "gate" and event.get("status") == "failed"):
            failures.append(event)
        emit(event)

    run = Run(inv, options, tee if rollback is not None else emit, connect_options, cluster)

    summary = asyncio.run(run.run_playbook(playbook))
    code = summary.exit_code()
    for refusal in summary.refusals:
        # An input error found by a preflight play: said as every input error is (the task's result
        # carries it too, for --format json).
        print(f"ERROR: {refusal}", file=sys.stderr)
    if rollback is not None and code == EXIT_FAILED and not options.check:
        from tunnelspec.commands.rollback import after_failed_deploy  # lazy: deploy only

        after_failed_deploy(inv, options, emit, connect_options, cluster, failures, enabled=rollback)
    return code


def list_playbook(
    inventory_path: str,
    playbook_path: str | Path,
    extra_vars: dict,
    limit: str | None,
    hosts: bool = True,
    tags: bool = False,
    fmt: str = "human",
) -> str:
    """`--list-hosts` / `--list-tags` (ansible-playbook's): each play's hosts after --limit and its tasks'
    tags, from the inventory and the playbook alone; nothing is contacted."""
    inv = load_inventory(inventory_path).with_extra_vars(extra_vars)
    playbook = load_playbook(playbook_path)
    allowed = set(inv.match(limit)) if limit else None
    if allowed is not None and not allowed:
        raise UsageError(f"--limit {limit!r} matches no host in {inventory_path}")
    plays = []
    for p in playbook.plays:
        matched = [h for h in inv.match(p.hosts) if allowed is None or h in allowed]
        task_tags = sorted({str(t) for t in (*p.tags, *(t for task in p.tasks + p.handlers for t in task.tags))})
        plays.append(
            {
                "name": p.name,
                "pattern": p.hosts,
                "hosts": matched,
                "play_tags": [str(t) for t in p.tags],
                "task_tags": task_tags,
            }
        )
    if fmt == "json":
        return json.dumps(
            {
                "playbook": str(playbook.path),
                "plays": [
                    {k: v for k, v in pl.items() if (hosts or k != "hosts") and (tags or k != "task_tags")}
                    for pl in plays
                ],
            },
            sort_keys=True,
        )
    out = [f"playbook: {playbook.path}", ""]
    for i, pl in enumerate(plays, 1):
        out.append(f"  play #{i} ({pl['pattern']}): {pl['name']}\tTAGS: [{', '.join(pl['play_tags'])}]")
        if hosts:
            out.append(f"    pattern: {pl['pattern']}")
            out.append(f"    hosts ({len(pl['hosts'])}):")
            out.extend(f"      {h}" for h in pl["hosts"])
        if tags:
            out.append(f"      TASK TAGS: [{', '.join(pl['task_tags'])}]")
        out.append("")
    return "\n".join(out).rstrip("\n")
