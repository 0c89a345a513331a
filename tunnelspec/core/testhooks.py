"""TEST ONLY: kill the controller at a chosen point of a run, deterministically.

The resilience tests (tests/deploy/test_resilience.py) must show that a run SIGKILLed anywhere is
repaired by the next one; waiting a lucky number of seconds before `kill -9` proves nothing. So a
run started with TUNNELSPEC_TEST_KILL_AT set SIGKILLs its own process when it reaches that point:

  "<task name>"            as the task's apply starts (its check said changed; nothing applied yet)
  "<task name>:<N>"        after the N-th command of its apply returned (a multi-step apply half done)
  "<task name>:apply"      after its apply returned (before the re-check and the notified handlers)
  "<task name>:progress"   at its first progress event (in the middle of a long command: the build)
  "<task name>:progress:N" at its N-th progress event

SIGKILL, not an exception: no `finally`, no cleanup, no closing of connections — what a killed CI
runner does. Unset (always, outside tests) every function here returns at once.
"""

from __future__ import annotations

import os
import signal

ENV = "TUNNELSPEC_TEST_KILL_AT"


def _parse(spec: str) -> tuple[str, str, int]:
    """(task, point, count): "build:progress:2" → ("build", "progress", 2)."""
    task, sep, last = spec.rpartition(":")
    count = 1
    if sep and last.isdigit():
        head, sep2, point = task.rpartition(":")
        if sep2 and point == "progress":
            return head, "progress", int(last)
        return task, last, 1
    if sep and last in ("apply", "progress"):
        return task, last, count
    return spec, "", count


_spec = os.environ.get(ENV, "")
_task, _point, _count = _parse(_spec)
_commands_left: int | None = None


def _die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def reached(task: str, point: str) -> None:
    """The executor reached `point` ("start", "apply", "progress") of `task`."""
    global _commands_left, _count
    if not _spec or task != _task:
        return
    if point == "start":
        if not _point:
            _die()
        if _point.isdigit():
            _commands_left = int(_point)
    elif point == _point:
        _count -= 1
        if _count <= 0:
            _die()
    if point == "apply":
        _commands_left = None


def command_done() -> None:
    """A command of the connection layer returned (counted only while a `<task>:<N>` apply runs)."""
    global _commands_left
    if _commands_left is not None:
        _commands_left -= 1
        if _commands_left <= 0:
            _die()
