"""Reading ahead (engine/prefetch.py): while a run has changed nothing on any host, a play's batch
also reads every later play's probes on that host, so a no-op run reads each host in one batch; and a
change on *another* host ends it, so a later play never gets an answer read before that change.
Real run, real commands: two hosts with local connections, sharing this machine's files (so what
one host changes is what the other reads, as an rpc node's restart is what main's checks see)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from support import reads_task
from tunnelspec.engine.context import RunOptions
from tunnelspec.engine.executor import Run
from tunnelspec.engine.playbook import load_playbook
from tunnelspec.engine.registry import load_all
from tunnelspec.inventory import load_inventory

pytestmark = pytest.mark.unit


@pytest.fixture
def reads_spy(monkeypatch):
    """Every command each host's local connection ran or spawned, by host, in order."""
    yield from reads_task.reads_spy(monkeypatch)
load_all()


def _run(tmp_path: Path, plays: str) -> list[dict]:
    (tmp_path / "inv.ini").write_text("a ansible_connection=local\nb ansible_connection=local\n")
    (tmp_path / "play.yml").write_text(plays)
    events: list[dict] = []
    run = Run(load_inventory(tmp_path / "inv.ini"), RunOptions(lock=None), events.append)
    asyncio.run(run.run_playbook(load_playbook(tmp_path / "play.yml")))
    return [e for e in events if e["event"] == "task_result"]


def _reads(name: str, *paths: Path) -> str:
    return "".join(f"    - name: {name} {i}\n      test_reads: {{path: '{p}'}}\n" for i, p in enumerate(paths))


def test_a_no_op_run_reads_each_host_in_one_batch(tmp_path, reads_spy):
    files = [tmp_path / f"f{i}" for i in range(6)]
    for i, f in enumerate(files):
        f.write_text(f"v{i}\n")
    plays = "".join(
        f"- hosts: all\n  tasks:\n{_reads(f'play {k}', files[2 * k], files[2 * k + 1])}" for k in range(3)
    )
    results = _run(tmp_path, plays)
    assert [r["msg"] for r in results if r["host"] == "a"] == [f"read v{i}" for i in range(6)]
    assert all(r["status"] == "ok" for r in results)
    for host in ("a", "b"):
        assert len(reads_spy[host]) == 1, reads_spy[host]  # one batch for the three plays
        assert all(str(f) in reads_spy[host][0] for f in files)


def test_a_change_on_another_host_is_seen_by_a_later_play(tmp_path, reads_spy):
    shared = tmp_path / "shared"
    shared.write_text("before\n")
    other = tmp_path / "other"
    other.write_text("x\n")
    plays = (
        f"- hosts: all\n  tasks:\n{_reads('first', other)}"
        f"- hosts: b\n  tasks:\n    - name: b changes it\n      copy: {{dest: '{shared}', content: \"after\\n\"}}\n"
        f"- hosts: a\n  tasks:\n{_reads('a reads', shared)}"
    )
    results = _run(tmp_path, plays)
    changed = [r for r in results if r["host"] == "b" and r["task"] == "b changes it"]
    assert changed and changed[0]["status"] == "changed"
    assert shared.read_text() == "after\n"
    # a's first batch read `shared` ahead ("before"); b's change since drops that answer.
    assert any(str(shared) in cmd for cmd in reads_spy["a"][0])
    [late] = [r for r in results if r["host"] == "a" and r["task"] == "a reads 0"]
    assert late["msg"] == "read after"
