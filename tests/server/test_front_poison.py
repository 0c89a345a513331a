"""The front (the real HAProxy with the front's configuration, rendered as the deploy renders it:
tests/support/front.py) in front of a stand-in llama-server that "crashes" on a marked request
(tests/support/crashing_llama.py: every request it was working on reset unanswered, nothing
listening for a second, as an abort and systemd's restart do). A request dropped twice is answered
502 and counted, not sent again; a request dropped once is answered after the restart — also one
that was in flight at the crash beside the crashing request, and one held through the restart and
released together with the crashing request's second try; another client asking all along gets
every answer (docs/degraded.md, "A request that crashes llama-server"). No llama.cpp: the proof with a real llama-server is the lab's."""

from __future__ import annotations

import importlib.machinery
import importlib.util
import json
import shutil
import socket
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from support import front as front_proc
from support.localserver import free_port, spawn
from tunnelspec.cluster.front_vars import MetricsSettings
from tunnelspec.components.front import model as front
from tunnelspec.core.constants import LOOPBACK

pytestmark = pytest.mark.skipif(shutil.which(front.HAPROXY) is None, reason="haproxy not installed (scripts/setup.sh)")

ROOT = Path(__file__).resolve().parents[2]
STAND_IN = ROOT / "tests" / "support" / "crashing_llama.py"
BODY_OF_502 = "dropped this request twice"


def post(port: int, prompt: str, timeout: float = 30) -> tuple[int, str, float]:
    """(status, body, seconds) of a completion through the front."""
    req = urllib.request.Request(f"http://{LOOPBACK}:{port}/completion", method="POST",
                                 data=json.dumps({"prompt": prompt, "n_predict": 4}).encode(),
                                 headers={"Content-Type": "application/json"})
    started = time.monotonic()
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, resp.read().decode(), time.monotonic() - started
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode(), time.monotonic() - started


def counts(internal: int, deadline_s: float = 15) -> dict:
    """The stand-in's counts, asked directly (it may be in its restart gap: polled)."""
    deadline = time.monotonic() + deadline_s
    while True:
        try:
            with urllib.request.urlopen(f"http://{LOOPBACK}:{internal}/counts", timeout=5) as r:
                return json.loads(r.read())
        except OSError:
            assert time.monotonic() < deadline, "the stand-in did not come back"
            time.sleep(0.05)  # poll interval of the deadline loop


def wait_for(pred, what: str, deadline_s: float = 15) -> None:
    deadline = time.monotonic() + deadline_s
    while not pred():
        assert time.monotonic() < deadline, what
        time.sleep(0.02)  # poll interval of the deadline loop


def exporter():
    loader = importlib.machinery.SourceFileLoader("tunnelspec_metrics", str(ROOT / "tunnelspec" / "hostprogs" / "metrics.py"))
    spec = importlib.util.spec_from_loader(loader.name, loader)
    mod = importlib.util.module_from_spec(spec)
    loader.exec_module(mod)
    return mod


def stat(sock: Path, backend: str) -> dict:
    """The backend's row of HAProxy's `show stat` on its stats socket."""
    with socket.socket(socket.AF_UNIX) as s:
        s.settimeout(5)
        s.connect(str(sock))
        s.sendall(b"show stat\n")
        data = b""
        for _ in range(1000):
            chunk = s.recv(65536)
            if not chunk:
                break
            data += chunk
    lines = data.decode().splitlines()
    head = lines[0].lstrip("# ").split(",")
    rows = [dict(zip(head, line.split(","))) for line in lines[1:] if line]
    return next(r for r in rows if r["pxname"] == backend and r["svname"] == "BACKEND")


class Burst:
    """Completions sent at once, each in its own thread."""

    def __init__(self, port: int, prompts: list[str]):
        self.results: dict[str, tuple[int, str, float]] = {}
        self.threads = [threading.Thread(target=lambda p=p: self.results.update({p: post(port, p)}), daemon=True)
                        for p in prompts]
        for t in self.threads:
            t.start()

    def finish(self) -> dict[str, int]:
        for t in self.threads:
            t.join(35)  # each request's own timeout bounds it
        assert not any(t.is_alive() for t in self.threads)
        return {p: r[0] for p, r in self.results.items()}


class Steady:
    """Another client: a completion every 0.3 s, each in its own thread (a request held through a
    restart does not delay the next one), until stopped (at most 300)."""

    def __init__(self, port: int):
        self.port, self.results, self.stop = port, [], threading.Event()
        self.sent: list[threading.Thread] = []
        self.thread = threading.Thread(target=self.run, daemon=True)

    def run(self):
        for i in range(300):
            if self.stop.is_set():
                return
            t = threading.Thread(target=lambda i=i: self.results.append(post(self.port, f"steady {i}")), daemon=True)
            t.start()
            self.sent.append(t)
            self.stop.wait(0.3)  # the client's own pace

    def answered(self) -> int:
        return sum(1 for r in self.results if r[0] == 200)

    def finish(self) -> None:
        self.stop.set()
        self.thread.join(5)
        for t in self.sent:
            t.join(35)  # each request's own timeout bounds it
        assert not self.thread.is_alive() and not any(t.is_alive() for t in self.sent)


def test_a_request_dropped_twice_is_answered_502_once_and_the_others_are_served(tmp_path):
    internal = free_port()
    stand_in = spawn([sys.executable, str(STAND_IN), str(internal), "120"], tmp_path / "stand-in.log")
    haproxy, port = front_proc.start(tmp_path / "front", internal, hold=20,
                                     metrics=MetricsSettings(port=free_port(), token_file=None))
    steady = Steady(port)
    try:
        wait_for(lambda: post(port, "warm-up", timeout=5)[0] == 200, "the front never answered through the stand-in")
        steady.thread.start()
        wait_for(lambda: steady.answered() >= 2, "the steady client got no answers")

        # Long completions in flight when the poison arrives: the crash drops them too (a dead process
        # answers no one). Each is sent once more, and answered.
        in_flight = Burst(port, [f"SLOW innocent {i}" for i in range(4)])
        wait_for(lambda: counts(internal)["in_flight"] >= 4, "the long completions never reached the stand-in")

        # The poison: dropped, held through the restart, dropped again → 502, after two attempts.
        poison: dict = {}
        t = threading.Thread(target=lambda: poison.update(result=post(port, "POISON please")), daemon=True)
        t.start()
        wait_for(lambda: "down" in stand_in.log(), "the stand-in never went down on the marked request")
        # Sent while nothing listens (llama-server restarting): held, not refused, then answered —
        # released when it is back, together with the poison's second try and the first drops' retries.
        held = Burst(port, [f"held innocent {i}" for i in range(4)])
        status, body, waited = post(port, "sent during the restart")
        assert status == 200 and "answer" in body, (status, body)
        assert waited > 0.2, waited  # it waited for the restart
        t.join(30)
        assert not t.is_alive()
        status, body, _ = poison["result"]
        assert status == 502 and BODY_OF_502 in json.loads(body)["error"]["message"], (status, body)
        assert counts(internal)["POISON"] == 2
        # Every innocent request was answered: only the poison was sent to two crashes.
        assert in_flight.finish() == {f"SLOW innocent {i}": 200 for i in range(4)}, in_flight.results
        assert held.finish() == {f"held innocent {i}": 200 for i in range(4)}, held.results
        assert stand_in.log().count("(crashed under it)") >= 4, stand_in.log()  # they were dropped
        # The front's journal names the client of each such 502 (a `PH` line of the outer layer).
        assert any(f"{front.FRONT_RETRY_BACKEND}/again" in line and " 502 " in line and " PH--" in line
                   for line in haproxy.log().splitlines()), haproxy.log()[-3000:]

        # The steady client's requests of those crashes answered too, before the next crash: a second
        # try still waiting its turn at another crash would be dropped twice (docs/degraded.md).
        pending = list(steady.sent)
        wait_for(lambda: not any(t.is_alive() for t in pending), "the steady client's second tries never ended", 35)

        # Dropped once (a crash caused by something else, a lost node): answered by the next one.
        status, body, _ = post(port, "DROP-ONCE")
        assert status == 200 and "DROP-ONCE" in body, (status, body)
        assert counts(internal)["DROP-ONCE"] == 2

        # The steady client was answered all along, before, between and after.
        before = steady.answered()
        wait_for(lambda: steady.answered() >= before + 2, "the steady client got no answers after the restarts")
        steady.finish()
        assert [r[0] for r in steady.results] == [200] * len(steady.results), steady.results
        assert len(steady.results) == len(steady.sent) >= 8, steady.results
        assert max(r[2] for r in steady.results) > 0.2  # some were held through a restart

        # Counted once: the responses the outer layer denied, which the exporter reports
        # (tunnelspec_front_requests_dropped_twice_total).
        assert stat(tmp_path / "front" / front.FRONT_STATS_NAME, front.FRONT_RETRY_BACKEND)["dresp"] == "1"
        exp = exporter()
        text = exp.front_metrics({"front": {"socket": str(tmp_path / "front" / front.METRICS_SOCKET_NAME)}})
        assert exp.SOURCES.dropped_twice(text, front.FRONT_RETRY_BACKEND) == 1
    finally:
        steady.stop.set()
        haproxy.stop()
        stand_in.stop()


def test_the_inner_socket_is_the_front_users_alone(tmp_path):
    """The inner layer's sockets reach llama-server past the loopback isolation: 0600, never abstract."""
    cfg = front_proc.render(tmp_path, free_port(), free_port(), hold=2).read_text()
    inner, again = tmp_path / front.FRONT_INNER_SOCKET_NAME, tmp_path / front.FRONT_AGAIN_SOCKET_NAME
    assert f"bind unix@{inner} mode 600" in cfg and f"server inner unix@{inner}" in cfg
    assert f"bind unix@{again} mode 600 maxconn 1" in cfg and f"server again unix@{again}" in cfg
    assert "abns@" not in cfg
    haproxy, _ = front_proc.start(tmp_path / "run", free_port(), hold=2)
    try:
        for name in (front.FRONT_INNER_SOCKET_NAME, front.FRONT_AGAIN_SOCKET_NAME):
            sock = tmp_path / "run" / name
            wait_for(sock.exists, f"no {name}")
            assert sock.stat().st_mode & 0o777 == 0o600, name
    finally:
        haproxy.stop()
