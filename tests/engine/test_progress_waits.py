"""Progress on long waits, pure: the /health wait's report line and its event, as the human
output and `--format json` render them; when wait_health reports (at the first unhealthy answer, then
on a fixed schedule, never once healthy) against a real local HTTP server; the heartbeat of a command
that says nothing while it runs."""

from __future__ import annotations

import asyncio
import io
import json

import jsonschema

from tunnelspec.engine.heartbeat import Heartbeat
from tunnelspec.core import http
from tunnelspec.components.server.verify import health_progress_line
from tunnelspec.reporting import events
from tunnelspec.reporting.human import HumanReporter
from tunnelspec.reporting.schema import EVENTS

TASK = "health, completion with draft tokens, draft buffer on the remote device"


def _health_event(elapsed: float, last: str, journal: str) -> dict:
    return events.progress("main", TASK, health_progress_line(elapsed, 195, last, journal), waiting_for="/health",
                           elapsed_s=round(elapsed, 1), budget_s=195, journal=journal)


def test_health_progress_renders_elapsed_budget_and_the_journal_line():
    ev = _health_event(12.4, 'HTTP 503 {"error":{"code":503,"message":"Loading model","type":"unavailable_error"}}',
                       "llama_model_load: loading model tensors, this can take a while... (mmap = true)")
    out = io.StringIO()
    HumanReporter(out, color=False)(ev)
    line = out.getvalue()
    assert line.startswith(f"  .. [main] {TASK}: llama-server not healthy yet: 12 s of 195 s (HTTP 503 ")
    assert line.rstrip().endswith("; journal: llama_model_load: loading model tensors, this can take a while... "
                                  "(mmap = true)")
    assert "\n" not in line.rstrip("\n")
    # JSON: the same event, valid against the documented schema, numbers as numbers.
    jsonschema.validate(json.loads(json.dumps(ev)), EVENTS["progress"])
    assert (ev["elapsed_s"], ev["budget_s"], ev["waiting_for"]) == (12.4, 195, "/health")


def test_health_progress_line_is_short_whatever_it_quotes():
    line = health_progress_line(0.2, 195, "x" * 500, "y" * 500)
    assert line.startswith("llama-server not healthy yet: 0 s of 195 s (")
    assert len(line) < 300
    assert health_progress_line(7, 30, "no answer", "") == "llama-server not healthy yet: 7 s of 30 s (no answer)"


def test_a_progress_event_without_the_new_fields_still_validates():
    # Existing producers (build percent, upload) are unchanged: the new fields are optional.
    jsonschema.validate(events.progress("h", "t", "build 42%", percent=42), EVENTS["progress"])


async def _serve(healthy_after: int, hold: asyncio.Event | None = None):
    """A real HTTP server on 127.0.0.1 answering /health 503 for the first `healthy_after` requests;
    with `hold`, each answer waits for that event first (as the front holds a request)."""
    seen = {"n": 0}

    async def handle(reader, writer):
        await reader.readuntil(b"\r\n\r\n")
        if hold is not None:
            await hold.wait()
        seen["n"] += 1
        ok = seen["n"] > healthy_after
        body = b'{"status":"ok"}' if ok else b'{"error":{"code":503,"message":"Loading model"}}'
        writer.write(b"HTTP/1.1 %d X\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s"
                     % (200 if ok else 503, len(body), body))
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    return server, server.sockets[0].getsockname()[1]


def test_wait_health_reports_at_the_first_unhealthy_answer_then_on_schedule():
    async def go():
        server, port = await _serve(healthy_after=8)
        reports = []

        async def report(elapsed, last):
            reports.append((elapsed, last))

        async with server:
            r = await http.wait_health(http.tcp_opener(port), 30, interval=0.05, report=report, report_every=0.15)
        return r, reports

    r, reports = asyncio.run(go())
    assert r.status == 200
    assert reports, "no report during an unhealthy wait"
    assert reports[0][0] < 0.15 and reports[0][1].startswith("HTTP 503")
    # Then one per 0.15 s mark at most: 8 polls 0.05 s apart span ~0.4 s → 2-4 reports, never one per poll.
    assert 2 <= len(reports) <= 4, reports
    assert all(b[0] - a[0] >= 0.1 for a, b in zip(reports, reports[1:])), reports


def test_wait_health_reports_while_a_request_is_held():
    """Through the front, /health is held until llama-server is up: the reports go on meanwhile."""
    async def go():
        hold = asyncio.Event()
        server, port = await _serve(healthy_after=0, hold=hold)
        reports = []

        async def report(elapsed, last):
            reports.append((elapsed, last))
            if len(reports) == 3:
                hold.set()  # llama-server is up: the held request is answered

        async with server:
            r = await http.wait_health(http.tcp_opener(port), 30, report=report, report_every=0.1, first_report=0.05)
        return r, reports

    r, reports = asyncio.run(go())
    assert r.status == 200 and len(reports) == 3
    assert [last for _, last in reports] == ["no answer yet"] * 3
    assert reports[0][0] >= 0.05 and all(b[0] > a[0] for a, b in zip(reports, reports[1:]))


def test_wait_health_says_nothing_when_healthy_at_once():
    async def go():
        server, port = await _serve(healthy_after=0)
        reports = []

        async def report(elapsed, last):
            reports.append(elapsed)

        async with server:
            await http.wait_health(http.tcp_opener(port), 5, report=report)
        return reports

    assert asyncio.run(go()) == []


def test_heartbeat_says_when_it_starts_and_then_how_long_it_has_taken():
    lines: list[tuple[str, dict]] = []

    async def go():
        beats = asyncio.Event()

        def progress(msg, **data):
            lines.append((msg, data))
            if len(lines) >= 3:
                beats.set()

        beat = Heartbeat(progress, "git clone https://example.invalid/llama.cpp", every=0.2)
        async with beat:
            await asyncio.wait_for(beats.wait(), 10)  # the body "runs" until two beats came
        # After the body no further line can come: the beating task is gone.
        return len(lines), beat._task.done()

    n, stopped = asyncio.run(go())
    assert stopped and len(lines) == n
    assert lines[0] == ("git clone https://example.invalid/llama.cpp", {"elapsed_s": 0.0})
    assert [m for m, _ in lines[1:3]] == ["git clone https://example.invalid/llama.cpp: 0 s so far"] * 2
    assert 0 < lines[1][1]["elapsed_s"] < lines[2][1]["elapsed_s"]
