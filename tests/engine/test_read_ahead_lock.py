"""Reading ahead and the run lock (engine/runlock.py `try_now`, engine/executor.py): a run takes every
host's lock before it reads anything when all are free; when another run holds one, what it read
before its lock (its preflight play's batch, which reads the later plays' probes ahead) is read again
once it holds the lock, so a change the other run made meanwhile is seen, not an answer from before.
Real runs, real commands, real flock: two hosts with local connections, each its own lock directory;
"another run" is the lock script itself, holding a host's lock in a process of this test."""

from __future__ import annotations

import asyncio
import subprocess
from pathlib import Path

import pytest

from support import reads_task
from tunnelspec.engine.context import RunOptions
from tunnelspec.engine.executor import Run
from tunnelspec.engine.playbook import load_playbook
from tunnelspec.engine.runlock import _SCRIPT, holder_record
from tunnelspec.inventory import load_inventory

pytestmark = pytest.mark.unit


@pytest.fixture
def reads_spy(monkeypatch):
    """Every command each host's local connection ran or spawned, by host, in order."""
    yield from reads_task.reads_spy(monkeypatch)


def _inventory(tmp_path: Path, one_lock: bool = False, fresh: bool = False) -> Path:
    """Hosts a and b, each its own lock directory; or one for both (two names for one machine).
    The lock files are there, as an earlier run leaves them, unless `fresh`."""
    if not fresh:
        for d in ("lock",) if one_lock else ("lock-a", "lock-b"):
            (tmp_path / d).mkdir(exist_ok=True)
            (tmp_path / d / "run.lock").touch()
    inv = tmp_path / "inv.ini"
    inv.write_text(
        "".join(
            f"{h} ansible_connection=local tunnelspec_lock_dir={tmp_path / ('lock' if one_lock else 'lock-' + h)}\n"
            for h in "ab"
        )
    )
    return inv


def _plays(tmp_path: Path, shared: Path) -> Path:
    pb = tmp_path / "play.yml"
    pb.write_text(
        f"- name: look\n  hosts: all\n  preflight: true\n  tasks:\n"
        f"    - name: early\n      test_reads: {{path: '{tmp_path / 'other'}'}}\n"
        f"- name: work\n  hosts: all\n  tasks:\n"
        f"    - name: late\n      test_reads: {{path: '{shared}'}}\n"
    )
    return pb


def _hold(lock_dir: Path) -> subprocess.Popen:
    """Another run's lock on a host: the lock script, holding until its stdin closes."""
    p = subprocess.Popen(
        ["sh", "-c", _SCRIPT, "sh", str(lock_dir), holder_record("deploy", "0" * 16), "0" * 16, "0", "1", ""],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )
    assert p.stdout is not None and p.stdout.readline().strip() == "LOCKED"
    return p


async def _run(inv: Path, pb: Path, events: list) -> None:
    run = Run(load_inventory(inv), RunOptions(lock="deploy", lock_timeout=60), events.append)
    await run.run_playbook(load_playbook(pb))


def test_a_run_that_waited_for_the_lock_reads_again_what_it_read_before(tmp_path, reads_spy):
    (tmp_path / "other").write_text("x\n")
    shared = tmp_path / "shared"
    shared.write_text("before\n")
    inv, pb = _inventory(tmp_path), _plays(tmp_path, shared)
    other_run = _hold(tmp_path / "lock-b")
    events: list[dict] = []

    async def scenario():
        ours = asyncio.create_task(_run(inv, pb, events))
        # Bounded: until this run says it waits for b's lock (its preflight has read `shared` ahead).
        for _ in range(600):
            if any(e["event"] == "run_lock" for e in events) or ours.done():
                break
            await asyncio.sleep(0.05)
        assert any(e["event"] == "run_lock" and e["status"] == "waiting" for e in events), events
        assert any(str(shared) in " ".join(cmd) for cmd in reads_spy["a"])  # read ahead, before the lock
        shared.write_text("after\n")  # the other run's change, made while it holds the lock
        assert other_run.stdin is not None
        other_run.stdin.close()
        await asyncio.wait_for(ours, 60)

    try:
        asyncio.run(scenario())
    finally:
        if other_run.poll() is None:
            other_run.kill()
        other_run.wait(10)
    late = {e["host"]: e["msg"] for e in events if e["event"] == "task_result" and e["task"] == "late"}
    assert late == {"a": "read after", "b": "read after"}, late


@pytest.mark.parametrize("one_lock", [False, True], ids=["own locks", "one lock for both names"])
def test_free_locks_are_taken_before_the_first_read_and_one_batch_still_reads_every_play(
    tmp_path, reads_spy, one_lock
):
    (tmp_path / "other").write_text("x\n")
    shared = tmp_path / "shared"
    shared.write_text("v\n")
    events: list[dict] = []
    asyncio.run(_run(_inventory(tmp_path, one_lock), _plays(tmp_path, shared), events))
    assert not any(e["event"] == "run_lock" for e in events)  # nothing waited for
    for host in "ab":
        cmds = [" ".join(c) for c in reads_spy[host]]
        lock = next(i for i, c in enumerate(cmds) if "run.lock" in c)
        batches = [i for i, c in enumerate(cmds) if str(shared) in c]
        assert batches and lock < batches[0], cmds  # locked, then read
        assert len(batches) == 1, cmds  # the preflight's batch read the later play's probe too
    late = {e["host"]: e["msg"] for e in events if e["event"] == "task_result" and e["task"] == "late"}
    assert late == {"a": "read v", "b": "read v"}


def test_a_first_run_creates_nothing_before_its_preflight_and_locks_after_it(tmp_path, reads_spy):
    """No lock file yet (a host's first run, or after a reboot): the first try creates nothing (a host
    the preflight then refuses is left as it was); the run locks after its preflight, then reads again."""
    (tmp_path / "other").write_text("x\n")
    shared = tmp_path / "shared"
    shared.write_text("v\n")
    events: list[dict] = []
    inv, pb = _inventory(tmp_path, fresh=True), _plays(tmp_path, shared)
    asyncio.run(_run(inv, pb, events))
    for host in "ab":
        cmds = [" ".join(c) for c in reads_spy[host]]
        locks = [i for i, c in enumerate(cmds) if "run.lock" in c]
        reads = [i for i, c in enumerate(cmds) if str(shared) in c]
        assert len(locks) == 2 and len(reads) == 2, cmds  # the try (NEW), the lock; read ahead, again
        assert reads[0] < locks[1] < reads[1], cmds
        assert (tmp_path / f"lock-{host}" / "run.lock").exists()
    late = {e["host"]: e["msg"] for e in events if e["event"] == "task_result" and e["task"] == "late"}
    assert late == {"a": "read v", "b": "read v"}


def test_the_first_try_leaves_a_host_without_a_lock_directory_as_it_was(tmp_path):
    """The try alone, on a host the preflight may still refuse: NEW, and no directory made."""
    lock_dir = tmp_path / "lock"
    out = subprocess.run(
        ["sh", "-c", _SCRIPT, "sh", str(lock_dir), holder_record("deploy", "1" * 16), "1" * 16, "0", "1", "", "try"],
        capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL,
    )
    assert out.stdout.strip() == "NEW" and not lock_dir.exists(), out
