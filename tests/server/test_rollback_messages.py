"""What a failed deploy says about returning to the last generation (tunnelspec/commands/rollback.py): the
decision (nothing serving changed / --no-rollback / roll back) and the last line, with the rollback
playbook's runs replaced by their events (the lab test runs the real ones)."""

from __future__ import annotations

import pytest

from tunnelspec.commands import rollback as rb
from tunnelspec.engine.context import RunOptions
from tunnelspec.reporting.summary import Summary

FAILED = {"event": "task_result", "host": "main", "task": "health, completion", "status": "failed",
          "msg": "llama-server died: tunnelspec-test: deliberate abort; systemd: Main process exited"}
PICKED = {"event": "task_result", "host": "main", "task": "generation picked", "status": "ok",
          "msg": "generation 3: tree abc + 0 patch(es); main build/k1 (current)"}


def _restore(status: str) -> dict:
    return {"event": "task_result", "host": "main", "task": "main at the generation", "status": status,
            "msg": "back to generation 3: build k2 → k1"}


events_passed: list = []  # the rollback_event each fake run was given (None: not counted)


def fake_runs(monkeypatch, *runs: list[dict]) -> list[RunOptions]:
    """Each call of the rollback playbook emits the next list of events; returns the options seen."""
    seen, queue = [], list(runs)
    events_passed.clear()

    def run(_inv, _cluster, options, emit, _conn, _to, event=None):
        seen.append(options)
        events_passed.append(event)
        summary = Summary(check=options.check)
        for ev in queue.pop(0):
            summary.record(ev)
            emit(ev)
        return summary

    monkeypatch.setattr(rb, "_run", run)
    return seen


def _call(enabled=True) -> list[str]:
    out: list[dict] = []
    rb.after_failed_deploy("inv.ini", RunOptions(), out.append, None, None, [FAILED], enabled=enabled)
    return [e["msg"] for e in out if e.get("event") == "message"]


def test_a_failure_after_serving_changed_rolls_back_and_says_which_generation(monkeypatch):
    seen = fake_runs(monkeypatch, [PICKED, _restore("changed")], [PICKED, _restore("changed")])
    msgs = _call()
    assert seen[0].check and not seen[1].check and seen[1].lock == "rollback"
    # Only the real return is counted for the metrics, never the read-only look first.
    assert events_passed[0] is None and events_passed[1].startswith("deploy-failed-")
    assert msgs[0].startswith("ROLLBACK: the deploy failed (main: health, completion: llama-server died: "
                              "tunnelspec-test: deliberate abort")
    assert "deliberate abort" in msgs[-1] and msgs[-1].endswith("rolled back: serving generation 3 again (verified)")


def test_a_rollback_that_fails_says_so(monkeypatch):
    fake_runs(monkeypatch, [PICKED, _restore("changed")], [PICKED, _restore("failed")])
    assert _call()[-1].startswith("ROLLBACK FAILED: returning to generation 3 failed: main: main at the generation")


@pytest.mark.parametrize("enabled,dry,expect", [
    (True, [PICKED, _restore("ok")], "no rollback needed"),
    (False, [PICKED, _restore("changed")], "--no-rollback: the hosts are left as the failed deploy left them"),
    (True, [{**PICKED, "status": "failed", "msg": "no generation recorded on main yet"}], "ROLLBACK NOT POSSIBLE"),
])
def test_no_rollback_when_nothing_changed_when_asked_or_without_a_generation(monkeypatch, enabled, dry, expect):
    seen = fake_runs(monkeypatch, dry)
    msgs = _call(enabled)
    assert len(seen) == 1 and seen[0].check and expect in msgs[-1], msgs


def test_rollback_on_purpose_ends_with_the_generation_it_serves(monkeypatch):
    fake_runs(monkeypatch, [PICKED, _restore("changed")], [PICKED, _restore("failed")])
    out: list[dict] = []
    assert rb.rollback("inv.ini", None, RunOptions(), out.append, None, 3) == 0
    assert out[-1]["msg"] == "serving generation 3 (verified)"
    assert rb.rollback("inv.ini", None, RunOptions(), out.append, None, 3) == 1
    assert out[-1]["msg"].startswith("ROLLBACK FAILED: returning to generation 3 failed: main: main at the generation")
