"""Every event tunnelspec emits is built here: one constructor per kind, the schema version
stamped in one place (`_event`). The engine, the CLI and `hostkeys scan` call these instead of
writing dict literals, so a field is named once; reporting/schema.py describes the same kinds and
tests/ci/test_json_schema.py checks each constructor's output against it."""

from __future__ import annotations

from tunnelspec.reporting import SCHEMA_VERSION


def _event(kind: str, **fields) -> dict:
    return {"schema": SCHEMA_VERSION, "event": kind, **fields}


def run_start(playbook: str, check: bool) -> dict:
    return _event("run_start", playbook=playbook, check=check)


def play_start(play: str, hosts: list[str]) -> dict:
    return _event("play_start", play=play, hosts=hosts)


def task_result(
    host: str,
    task: str,
    play: str,
    status: str,
    msg: str,
    *,
    module: str | None = None,
    no_log: bool = False,
    duration: float | None = None,
    diff=None,
    would_change: bool = False,
    after: list[str] | None = None,
) -> dict:
    """`diff`: a tasks.base.Diff or None. Optional fields appear only when they say something."""
    ev = _event("task_result", host=host, task=task, play=play, status=status, msg=msg)
    if module is not None:
        ev["module"] = module
    if no_log:
        ev["no_log"] = True
    if duration is not None:
        ev["duration"] = round(duration, 3)
    if diff is not None:
        ev["diff"] = {"path": diff.path, "before": diff.before, "after": diff.after}
    if would_change:
        ev["would_change"] = True
    if after:
        ev["after"] = list(after)  # --check: the earlier would-change steps this one needs
    return ev


def task_failed(host: str, task: str, play: str, msg: str, **kw) -> dict:
    return task_result(host, task, play, "failed", msg, **kw)


def unreachable(host: str, play: str, msg: str, task: str | None = None) -> dict:
    ev = _event("unreachable", host=host, play=play, msg=msg)
    if task is not None:
        ev["task"] = task
    return ev


def progress(host: str, task: str, msg: str, **data) -> dict:
    return _event("progress", host=host, task=task, msg=msg, **data)


def gate(play: str, status: str, msg: str) -> dict:
    return _event("gate", play=play, status=status, msg=msg)


def host_key_pinned(host: str, line: str) -> dict:
    return _event("host_key_pinned", host=host, msg=f"pinned new host key: {line}")


def message(msg: str) -> dict:
    return _event("message", msg=msg)


def error(msg: str, exit_code: int) -> dict:
    """An error that stopped a command before or outside a run (the CLI prints it with --format json)."""
    return _event("error", msg=msg, exit_code=exit_code)


def run_lock_waiting(host: str, holder: dict | None, msg: str) -> dict:
    """Another run holds a host's run lock (engine/runlock.py); repeated while waiting."""
    return _event("run_lock", host=host, status="waiting", holder=holder, msg=msg)


def recap(hosts: dict, exit_code: int) -> dict:
    return _event("recap", hosts=hosts, exit_code=exit_code)


def host_keys(
    host: str, address: str, port: int, keys: list[dict], error: str | None = None, skipped: str | None = None
) -> dict:
    """`hostkeys scan --format json`: one per host."""
    return _event("host_keys", host=host, address=address, port=port, keys=keys, error=error, skipped=skipped)


# Every constructor, by the kind it builds (the schema test walks this).
CONSTRUCTORS = {
    "run_start": run_start,
    "play_start": play_start,
    "task_result": task_result,
    "unreachable": unreachable,
    "progress": progress,
    "gate": gate,
    "host_key_pinned": host_key_pinned,
    "message": message,
    "error": error,
    "run_lock": run_lock_waiting,
    "recap": recap,
    "host_keys": host_keys,
}
