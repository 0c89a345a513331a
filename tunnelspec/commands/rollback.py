"""Returning to a kept generation (docs/generations.md): after a failed deploy, automatically, or on
purpose with `tunnelspec rollback [--to N]`. Both run playbooks/rollback.yml: every host back to the
generation's build, files and source checkout, then the deploy's own proof."""

from __future__ import annotations

import asyncio
import dataclasses
import time

from tunnelspec.engine.context import RunOptions
from tunnelspec.engine.executor import Run
from tunnelspec.engine.playbook import builtin_playbook, load_playbook
from tunnelspec.reporting import events
from tunnelspec.reporting.summary import Summary
from tunnelspec.inventory.model import Inventory


def _run(
    inv: Inventory, cluster, options: RunOptions, emit, connect_options, to: int, event: str | None = None
) -> Summary:
    """`inv`: the command's inventory as it loaded it (with its -e); never read again from the file."""
    extra = {**options.extra_vars, "rollback_to": to, **({"rollback_event": event} if event else {})}
    opts = dataclasses.replace(options, extra_vars=extra, tags=[], skip_tags=[], limit=None)
    run = Run(inv.with_extra_vars(extra), opts, emit, connect_options, cluster)
    return asyncio.run(run.run_playbook(load_playbook(builtin_playbook("rollback.yml"))))


def _failure_text(event: dict) -> str:
    msg = str(event.get("msg", "")).strip()
    where = f"{event.get('host')}: {event.get('task')}" if event.get("host") else f"gate {event.get('play')}"
    return f"{where}: {msg}"


def _picked(collected: list[dict]) -> str:
    for ev in collected:
        if ev.get("task") == "generation picked" and ev.get("status") == "ok":
            return ev.get("msg", "").split(":", 1)[0]  # "generation 3"
    return "the last verified generation"


def rollback(inv: Inventory, cluster, options: RunOptions, emit, connect_options, to: int = 0) -> int:
    """`tunnelspec rollback`: every host to generation `to` (0: the current one), verified."""
    seen: list[dict] = []

    def tee(ev: dict) -> None:
        seen.append(ev)
        emit(ev)

    summary = _run(inv, cluster, options, tee, connect_options, to)
    code = summary.exit_code()
    which = _picked(seen)
    bad = [ev for ev in seen if ev.get("status") == "failed" or ev.get("event") == "unreachable"]
    if code == 0:
        emit(events.message(f"serving {which} (verified)"))
    elif bad:
        emit(events.message(f"ROLLBACK FAILED: returning to {which} failed: {_failure_text(bad[0])}"))
    return code


def after_failed_deploy(
    inv: Inventory, options: RunOptions, emit, connect_options, cluster, failures: list[dict], enabled: bool = True
) -> bool:
    """The deploy failed: when a host no longer runs what the current generation recorded (the serving
    path started to change), return every host to it, verify, and say so. True when serving the
    generation again."""
    failed = _failure_text(failures[0]) if failures else "a task failed"
    # Back to what served until the deploy started: a known-vulnerable build there is a warning, not a
    # refusal that would leave the hosts half switched (playbooks/rollback.yml, generation_pick).
    options = dataclasses.replace(options, extra_vars={**options.extra_vars, "rollback_after_failed_deploy": True})
    # What would change, read-only and silent: nothing means the serving path was never touched.
    dry: list[dict] = []
    try:
        plan = _run(inv, cluster, dataclasses.replace(options, check=True, lock=""), dry.append, connect_options, 0)
    except Exception as e:  # noqa: BLE001 - the deploy's own failure is what matters; say why no rollback
        emit(events.message(f"ROLLBACK NOT POSSIBLE: cannot read the generations ({type(e).__name__}: {e})"))
        return False
    refused = [ev for ev in dry if ev.get("status") == "failed"]
    which = _picked(dry)
    if refused:
        emit(
            events.message(
                f"ROLLBACK NOT POSSIBLE after the failed deploy ({failed.splitlines()[0]}): {_failure_text(refused[0])}"
            )
        )
        return False
    drift = [
        f"{ev['host']}: {ev['msg']}"
        for ev in dry
        if ev.get("status") == "changed" and ev.get("task") in ("node at the generation", "main at the generation")
    ]
    if not plan.total("changed") or not drift:
        emit(
            events.message(
                f"deploy failed before the serving path changed: every host still runs {which} (no rollback needed)"
            )
        )
        return True
    if not enabled:
        emit(
            events.message(
                f"--no-rollback: the hosts are left as the failed deploy left them ({'; '.join(drift)}); "
                f"`tunnelspec rollback INVENTORY` returns to {which}"
            )
        )
        return False
    emit(
        events.message(
            f"ROLLBACK: the deploy failed ({failed.splitlines()[0]}); returning every host to {which} "
            f"({'; '.join(drift)})"
        )
    )
    real: list[dict] = []

    def tee(ev: dict) -> None:
        real.append(ev)
        emit(ev)

    summary = _run(
        inv,
        cluster,
        dataclasses.replace(options, lock="rollback"),
        tee,
        connect_options,
        0,
        event=f"deploy-failed-{time.time_ns()}",
    )
    bad = [ev for ev in real if ev.get("status") == "failed" or ev.get("event") == "unreachable"]
    if summary.exit_code() != 0 or bad:
        why = _failure_text(bad[0]) if bad else f"exit {summary.exit_code()}"
        emit(events.message(f"ROLLBACK FAILED: returning to {which} failed: {why}"))
        return False
    emit(events.message(f"deploy failed: {failed}\nrolled back: serving {which} again (verified)"))
    return True
