"""The ways a task fails, as the executor reports them: a wrong argument is the playbook's
mistake (file:line), a TaskFailed is the task's own message, any other exception is an internal
error (never blamed on the playbook, even a ValueError), and a task refusing its input (UsageError)
in a preflight play makes the run's exit code 2, an input error. Real run, local connection."""

from __future__ import annotations

import asyncio
from pathlib import Path

from tunnelspec.engine.context import RunOptions
from tunnelspec.engine.executor import Run
from tunnelspec.engine.playbook import load_playbook
from tunnelspec.core.errors import EXIT_FAILED, EXIT_USAGE, ClusterError, TaskFailed
from tunnelspec.inventory import load_inventory
from tunnelspec.engine.registry import load_all
from tunnelspec.modules import TASKS, Arg, Task, ok, register_task

load_all()


class _Raises(Task):
    """Test-only module: raises what `kind` says from its check (a real task class, not a mock)."""

    module = "test_raises"
    args = {"kind": Arg(str, required=True, choices=("value", "failed", "none", "usage"), help="What to raise.")}

    async def check(self, ctx):
        if self.p["kind"] == "value":
            raise ValueError("a bug inside the task")
        if self.p["kind"] == "failed":
            raise TaskFailed("the host said no")
        if self.p["kind"] == "usage":
            raise ClusterError("inv.ini:1: host h1: spec_type: this build has no such type (no host was changed)")
        return ok("fine")


def run(tmp_path: Path, tasks: str, play: str = "", summaries: list | None = None) -> list[dict]:
    register_task(_Raises)
    try:
        (tmp_path / "inv.ini").write_text("h1 ansible_connection=local\n")
        (tmp_path / "play.yml").write_text(f"- hosts: all\n{play}  tasks:\n{tasks}"
                                           "- hosts: all\n  tasks:\n    - name: after\n      test_raises: {kind: none}\n")
        events: list[dict] = []
        r = Run(load_inventory(tmp_path / "inv.ini"), RunOptions(), events.append)
        summary = asyncio.run(r.run_playbook(load_playbook(tmp_path / "play.yml")))
        if summaries is not None:
            summaries.append(summary)
        return [e for e in events if e["event"] == "task_result"]
    finally:
        TASKS.pop(_Raises.module, None)


def test_argument_error_names_the_playbook_line(tmp_path):
    # The choice is checked after templating, at run time: still the playbook's mistake.
    res = run(tmp_path, '    - name: bad choice\n      test_raises: {kind: "{{ \'other\' }}"}\n')
    assert res[0]["status"] == "failed"
    assert res[0]["msg"].startswith("argument 'kind' must be one of value, failed, none")
    assert res[0]["msg"].endswith(f"({tmp_path / 'play.yml'}:3)")


def test_value_error_inside_a_task_is_an_internal_error_not_a_playbook_line(tmp_path):
    res = run(tmp_path, "    - name: buggy\n      test_raises: {kind: value}\n")
    assert res[0]["status"] == "failed"
    assert res[0]["msg"].startswith("internal error: ValueError: a bug inside the task")
    assert "play.yml" not in res[0]["msg"]


def test_task_failed_is_the_tasks_own_message(tmp_path):
    res = run(tmp_path, "    - name: refused\n      test_raises: {kind: failed}\n"
                        "    - name: never runs\n      test_raises: {kind: none}\n")
    assert [(e["task"], e["status"], e["msg"]) for e in res] == [("refused", "failed", "the host said no")]


def test_refused_input_in_a_preflight_play_is_exit_2_and_stops_the_run(tmp_path):
    summaries: list = []
    res = run(tmp_path, "    - name: settings\n      test_raises: {kind: usage}\n", "  preflight: true\n", summaries)
    # Nothing after the preflight play ran; the run's exit code is an input error's.
    assert [(e["task"], e["status"]) for e in res] == [("settings", "failed")]
    assert summaries[0].exit_code() == EXIT_USAGE
    assert summaries[0].refusals == ["inv.ini:1: host h1: spec_type: this build has no such type (no host was changed)"]


def test_refused_input_outside_a_preflight_play_is_a_failed_task(tmp_path):
    # Past the preflight plays something may have changed: a failure like any other (exit 1).
    summaries: list = []
    res = run(tmp_path, "    - name: settings\n      test_raises: {kind: usage}\n", "", summaries)
    assert [(e["task"], e["status"]) for e in res] == [("settings", "failed")]
    assert summaries[0].exit_code() == EXIT_FAILED and summaries[0].refusals == []


def test_on_is_true_for_a_task_argument_as_for_the_inventory(tmp_path):
    # One truthy(): `on` was refused as a task argument while ansible_become=on worked.
    cls = TASKS["absent"]
    assert cls.validate({"path": "/x", "recurse": "on"})["recurse"] is True
    assert cls.validate({"path": "/x", "recurse": "Off"})["recurse"] is False
