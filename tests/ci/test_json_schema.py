"""Every line of `--format json` validates against the documented schema (tunnelspec.reporting.schema),
for a run that changes, a --check --diff run, and a run with an unreachable host."""

from __future__ import annotations

import re
from pathlib import Path

import jsonschema

from support.ci_cli import ci_env, cli
from tunnelspec.reporting import SCHEMA_VERSION
from tunnelspec.reporting.schema import EVENT_SCHEMA, EVENTS

SMALL = str(Path(__file__).parent / "small.yml")
DOCS = Path(__file__).resolve().parents[2] / "docs" / "output.md"


def _validate_stream(res):
    lines = res.stdout.splitlines()
    assert lines, res.stderr
    for line in lines:
        assert line.startswith("{"), f"not a JSON line: {line!r}"
    for ev in res.events:
        jsonschema.validate(ev, EVENT_SCHEMA)
    assert res.events[0]["event"] == "run_start" and res.events[-1]["event"] == "recap"
    assert res.events[-1]["exit_code"] == res.rc


def test_runs_validate(sshd_target, tmp_path):
    t = sshd_target
    env = ci_env(tmp_path / "home", TUNNELSPEC_SSH_KEY=t.key_text, TUNNELSPEC_KNOWN_HOSTS=t.known_hosts_text)
    check = cli("play", str(t.inventory), SMALL, "--check", "--diff", "--format", "json", env=env)
    assert check.rc == 3
    _validate_stream(check)
    assert any("diff" in e for e in check.of("task_result"))
    run = cli("play", str(t.inventory), SMALL, "--format", "json", env=env)
    assert run.rc == 0
    _validate_stream(run)
    bad = cli("play", str(t.inventory), SMALL, "--format", "json", env=ci_env(tmp_path / "h2"))
    assert bad.rc == 4
    _validate_stream(bad)


def test_schema_rejects_a_renamed_field():
    ok = {"schema": SCHEMA_VERSION, "event": "gate", "play": "p", "status": "ok", "msg": "m"}
    jsonschema.validate(ok, EVENT_SCHEMA)
    renamed = {**{k: v for k, v in ok.items() if k != "msg"}, "message": "m"}
    try:
        jsonschema.validate(renamed, EVENT_SCHEMA)
    except jsonschema.ValidationError:
        pass
    else:
        raise AssertionError("schema accepted a renamed field")


def test_every_event_kind_is_documented():
    text = DOCS.read_text()
    assert re.search(rf"schema version.*\b{SCHEMA_VERSION}\b", text, re.I | re.S)
    for kind in EVENTS:
        assert f"`{kind}`" in text, f"event {kind} missing from docs/output.md"


def test_every_event_is_built_by_the_events_module_and_validates():
    # reporting/events.py builds every kind the schema knows (and only those); each constructor's
    # output, with the schema version it stamps, validates against that kind's schema.
    from tunnelspec.reporting import events
    from tunnelspec.modules.base import Diff

    assert set(events.CONSTRUCTORS) == set(EVENTS)
    samples = {
        "run_start": events.run_start("p.yml", True),
        "play_start": events.play_start("play", ["h1"]),
        "task_result": events.task_result("h1", "t", "play", "changed", "m", module="copy", no_log=True,
                                          duration=0.1234, diff=Diff("a", "b", "/x"), would_change=True),
        "unreachable": events.unreachable("h1", "play", "m", task="t"),
        "progress": events.progress("h1", "t", "42%", percent=42, draft_n=3),
        "gate": events.gate("play", "failed", "m"),
        "host_key_pinned": events.host_key_pinned("h1", "h1 ssh-ed25519 AAAA"),
        "message": events.message("m"),
        "error": events.error("m", 2),
        "run_lock": events.run_lock_waiting("h1", {"command": "deploy", "pid": 1}, "waiting"),
        "recap": events.recap({"h1": dict.fromkeys(("ok", "changed", "failed", "skipped", "unreachable"), 0)}, 0),
        "host_keys": events.host_keys("h1", "10.0.0.1", 22, []),
    }
    assert set(samples) == set(EVENTS)
    for kind, ev in samples.items():
        assert ev["schema"] == SCHEMA_VERSION and ev["event"] == kind
        jsonschema.validate(ev, EVENTS[kind])
    assert events.task_result("h", "t", "p", "ok", "m") == {
        "schema": SCHEMA_VERSION, "event": "task_result", "host": "h", "task": "t", "play": "p", "status": "ok",
        "msg": "m"}
