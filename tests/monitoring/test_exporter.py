"""The metrics exporter (tunnelspec/hostprogs/metrics.py) and the launcher's counters it reads
(tunnelspec/hostprogs/draftwatch.py), without a lab: mode files of both ages, a stand-in llama-server
/metrics on 127.0.0.1 that wants the API key, and `promtool check metrics` on what comes out."""

from __future__ import annotations

import http.server
import importlib.machinery
import importlib.util
import json
import shutil
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from tunnelspec.hostprogs import program_path

REPO = Path(__file__).resolve().parents[2]


def load(name, file):
    loader = importlib.machinery.SourceFileLoader(name, str(program_path(file)))
    spec = importlib.util.spec_from_loader(loader.name, loader)
    mod = importlib.util.module_from_spec(spec)
    loader.exec_module(mod)
    return mod


EXP = load("tunnelspec_metrics", "tunnelspec-metrics.py")
DW = load("tunnelspec_draftwatch", "tunnelspec-draftwatch.py")


def samples(text):
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            out[name] = float(value)
    return out


def cfg_for(tmp_path, **more):
    cfg = {"state": str(tmp_path / "mode.json"), "watch_state": str(tmp_path / "hello.json"),
           "llama_unit": "tunnelspec-llama-server.service", "tunnels": {}, "nodes": ["rpc-a", "rpc-b"]}
    cfg.update(more)
    return cfg


def test_a_mode_file_from_before_the_counters(tmp_path):
    (tmp_path / "mode.json").write_text(json.dumps({"mode": "degraded", "node": "rpc-a", "reason": "tunnel down",
                                                    "since": 1000.0, "at": 1000.0}))
    s = samples(EXP.scrape(cfg_for(tmp_path), now=1600.0))
    assert s['tunnelspec_serving_mode{mode="degraded"}'] == 1 and s['tunnelspec_serving_mode{mode="speculative"}'] == 0
    assert s['tunnelspec_serving_mode_seconds_total{mode="degraded"}'] == 600
    assert s['tunnelspec_serving_mode_entered_total{mode="degraded"}'] == 1
    assert s['tunnelspec_exporter_source_up{source="state"}'] == 1


def test_the_generation_and_its_rollbacks_from_the_deploys_status_file(tmp_path):
    """What components/generation/tasks.py writes (through tunnelspec.components.generation.record.next_status) is what is shown:
    generation 4 current since a deploy, then a failed deploy's return to it is counted."""
    from tunnelspec.components.generation import record as gen

    status = tmp_path / "generation.json"
    cfg = cfg_for(tmp_path, generation=str(status))
    assert samples(EXP.scrape(cfg, now=1.0))['tunnelspec_exporter_source_up{source="generation"}'] == 0
    doc = gen.next_status({}, 4, 1000.0)
    status.write_text(gen.status_text(doc))
    s = samples(EXP.scrape(cfg, now=1001.0))
    assert s["tunnelspec_generation"] == 4 and s["tunnelspec_generation_since_timestamp_seconds"] == 1000
    assert s["tunnelspec_rollbacks_total"] == 0 and "tunnelspec_last_rollback_timestamp_seconds" not in s
    assert s['tunnelspec_exporter_source_up{source="generation"}'] == 1
    status.write_text(gen.status_text(gen.next_status(gen.parse_status(status.read_text()), 4, 2000.0, rollback=True)))
    s = samples(EXP.scrape(cfg, now=2001.0))
    assert s["tunnelspec_generation"] == 4 and s["tunnelspec_generation_since_timestamp_seconds"] == 2000
    assert s["tunnelspec_rollbacks_total"] == 1 and s["tunnelspec_last_rollback_timestamp_seconds"] == 2000
    # A later deploy forward keeps the count; the same generation again keeps its `since`.
    doc = gen.next_status(gen.parse_status(status.read_text()), 5, 3000.0)
    assert (doc["generation"], doc["since"], doc["rollbacks"], doc["last_rollback"]) == (5, 3000.0, 1, 2000.0)
    assert gen.next_status(doc, 5, 4000.0)["since"] == 3000.0
    assert gen.parse_status("not json") == {} and gen.parse_status("[1]") == {}


def test_a_split_served_without_a_node_is_its_own_mode(tmp_path):
    """The launcher's split-degraded start (a seed 003 target node away, the rest hold the model)."""
    cfg = {"state": str(tmp_path / "mode.json")}
    DW.write_state(cfg, {"mode": "plain", "since": 100.0, "at": 100.0}, {}, {"rpc-a": ("3.0.0", "")}, start=True)
    DW.write_state(cfg, {"mode": DW.SPLIT_DEGRADED, "node": "rpc-a", "since": 160.0, "at": 160.0},
                   DW.read_state(cfg), {"rpc-a": (None, "refused")}, start=True)
    s = samples(EXP.scrape(cfg_for(tmp_path), now=220.0))
    assert s['tunnelspec_serving_mode{mode="split-degraded"}'] == 1 and s['tunnelspec_serving_mode{mode="plain"}'] == 0
    assert s['tunnelspec_serving_mode_seconds_total{mode="split-degraded"}'] == 60
    assert s['tunnelspec_serving_mode_seconds_total{mode="plain"}'] == 60
    assert s['tunnelspec_serving_mode_entered_total{mode="split-degraded"}'] == 1
    assert s['tunnelspec_node_rpc_hello_ok{node="rpc-a"}'] == 0


def test_launcher_counters_switches_seconds_starts_and_hello(tmp_path):
    cfg = {"state": str(tmp_path / "mode.json")}
    DW.write_state(cfg, {"mode": "speculative", "since": 100.0, "at": 100.0}, {}, {"rpc-a": ("3.0.0", "")}, start=True)
    prev = DW.read_state(cfg)
    DW.write_state(cfg, {"mode": "degraded", "since": 160.0, "at": 160.0}, prev, {"rpc-a": (None, "refused")}, start=True)
    prev = DW.read_state(cfg)
    DW.write_state(cfg, {"mode": "speculative", "since": 200.0, "at": 200.0}, prev, {"rpc-a": ("3.0.0", "")}, start=True)
    st = DW.read_state(cfg)
    assert st["seconds"] == {"speculative": 60.0, "degraded": 40.0}
    assert st["entered"] == {"speculative": 2, "degraded": 1} and st["starts"] == 3
    assert st["nodes"]["rpc-a"] == {"ok": True, "version": "3.0.0", "at": 200.0}
    assert (tmp_path / "mode.json").stat().st_mode & 0o777 == 0o644
    # The watcher's newer HELLO wins over the launcher's.
    (tmp_path / "hello.json").write_text(json.dumps({"nodes": {"rpc-a": {"ok": False, "version": "", "at": 250.0}}}))
    s = samples(EXP.scrape(cfg_for(tmp_path), now=230.0))
    assert s['tunnelspec_serving_mode_seconds_total{mode="speculative"}'] == 90
    assert s['tunnelspec_serving_mode_entered_total{mode="speculative"}'] == 2
    assert s["tunnelspec_llama_server_starts_total"] == 3
    assert s['tunnelspec_node_rpc_hello_ok{node="rpc-a"}'] == 0
    assert not any('node="rpc-b"' in k for k in s)


class _Llama(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        if self.headers.get("Authorization") != "Bearer s3cr3t-api-key":
            self.send_response(401)
            self.end_headers()
            return
        body = (b"# HELP llamacpp:spec_decode_num_draft_tokens_total x\n# TYPE llamacpp:spec_decode_num_draft_tokens_total counter\n"
                b"llamacpp:spec_decode_num_draft_tokens_total 42\nsomething_else 1\n")
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *a):
        pass


def test_llama_server_metrics_with_the_key_from_systemd_and_no_secret_out(tmp_path, monkeypatch):
    srv = http.server.HTTPServer(("127.0.0.1", 0), _Llama)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        creds = tmp_path / "creds"
        creds.mkdir()
        (creds / "api-key").write_text("s3cr3t-api-key\n")
        monkeypatch.setenv("CREDENTIALS_DIRECTORY", str(creds))
        (tmp_path / "mode.json").write_text(json.dumps({"mode": "speculative", "since": 1.0, "at": 1.0}))
        cfg = cfg_for(tmp_path, llama_server={"address": "127.0.0.1:%d" % srv.server_address[1], "api_key": True},
                      front={"socket": str(tmp_path / "absent.sock")})
        text = EXP.scrape(cfg, now=2.0)
        s = samples(text)
        assert s["llamacpp:spec_decode_num_draft_tokens_total"] == 42 and "something_else" not in s
        assert s['tunnelspec_exporter_source_up{source="llama_server"}'] == 1
        assert s['tunnelspec_exporter_source_up{source="front"}'] == 0
        assert "s3cr3t" not in text
        monkeypatch.setenv("CREDENTIALS_DIRECTORY", str(tmp_path))  # no key: 401, source down
        assert samples(EXP.scrape(cfg, now=2.0))['tunnelspec_exporter_source_up{source="llama_server"}'] == 0
    finally:
        srv.shutdown()


def test_requests_dropped_twice_are_the_outer_backends_denied_responses():
    text = ('# TYPE haproxy_backend_responses_denied_total counter\n'
            'haproxy_backend_responses_denied_total{proxy="retry_once"} 3\n'
            'haproxy_backend_responses_denied_total{proxy="llama"} 7\n'
            'haproxy_frontend_responses_denied_total{proxy="api"} 3\n')
    assert EXP.SOURCES.dropped_twice(text, "retry_once") == 3
    assert EXP.SOURCES.dropped_twice(text, "retry") is None  # a front from before the outer layer
    assert EXP.SOURCES.dropped_twice(text, None) is None  # a configuration from before it


def test_label_values_are_escaped():
    out = EXP.Out()
    out.add("tunnelspec_node_rpc_info", 1, node='a"b\\c\nd', version="1")
    assert 'node="a\\"b\\\\c\\nd"' in out.text()


def test_promtool_accepts_the_output(tmp_path):
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool not installed (scripts/setup.sh)")
    (tmp_path / "mode.json").write_text(json.dumps({"mode": "waiting", "node": "rpc-b", "since": 5.0, "at": 5.0}))
    text = EXP.scrape(cfg_for(tmp_path), now=9.0)
    res = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stdout + res.stderr


def test_the_exporter_survives_rendering_as_a_template():
    from tunnelspec.core.templating import render_file
    from tunnelspec.hostprogs import PARTS
    for name in ("tunnelspec-metrics.py", *PARTS["tunnelspec-metrics.py"]):  # the program and its parts
        text = program_path(name).read_text()
        assert render_file(text, {}) == text.rstrip("\n") or render_file(text, {}) == text, name


# ---- serving: any local user may connect ---------------------------------------------------------------
def _get(port, path="/metrics", method="GET", timeout=10.0):
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        s.sendall(f"{method} {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
        data = b""
        while True:
            chunk = s.recv(65536)
            if not chunk:
                return data
            data += chunk


def _closed_after(s, limit):
    """Seconds until the server closes `s` (it sends nothing first), or None past `limit`."""
    start = time.monotonic()
    s.settimeout(limit)
    try:
        data = s.recv(100)
    except TimeoutError:
        return None
    except ConnectionResetError:
        data = b""
    assert data == b"", data
    return time.monotonic() - start


@pytest.fixture
def exporter(tmp_path, monkeypatch):
    """The exporter's server in this process on 127.0.0.1:0, with a 1 s client timeout."""
    monkeypatch.setattr(EXP, "CLIENT_TIMEOUT", 1.0)
    (tmp_path / "mode.json").write_text(json.dumps({"mode": "plain", "since": 1.0, "at": 1.0}))
    cfg = tmp_path / "metrics.json"
    cfg.write_text(json.dumps(cfg_for(tmp_path, tunnels={}, listen=["127.0.0.1", 0])))
    monkeypatch.setattr(EXP.Handler, "cfg_path", str(cfg))
    srv = EXP.Server(("127.0.0.1", 0), EXP.Handler)
    t = threading.Thread(target=srv.serve, daemon=True)
    t.start()
    yield srv, srv.server_address[1]
    srv.stop()
    t.join(5)
    srv.server_close()


def test_idle_and_slow_clients_are_dropped_and_cost_no_thread(exporter):
    srv, port = exporter
    idle = socket.create_connection(("127.0.0.1", port))
    slow = socket.create_connection(("127.0.0.1", port))
    slow.sendall(b"GET /metr")  # a head that never ends
    flood = [socket.create_connection(("127.0.0.1", port)) for _ in range(EXP.MAX_CLIENTS * 4)]
    threads = threading.active_count()
    try:
        answer = _get(port)
        assert answer.startswith(b"HTTP/1.0 200") and b"tunnelspec_serving_mode{" in answer, answer[:200]
        assert threading.active_count() <= threads + 1
        for s in (idle, slow):
            took = _closed_after(s, 4.0)
            assert took is not None and took < 2.5, took
    finally:
        for s in [idle, slow, *flood]:
            s.close()


def test_more_idle_connections_than_it_keeps_close_the_oldest(exporter):
    srv, port = exporter
    first = socket.create_connection(("127.0.0.1", port))
    rest = [socket.create_connection(("127.0.0.1", port)) for _ in range(EXP.MAX_WAITING + 5)]
    try:
        took = _closed_after(first, 0.9)  # before its timeout: evicted by the newer ones
        assert took is not None, "the oldest idle connection was kept"
        assert _get(port).startswith(b"HTTP/1.0 200")
    finally:
        for s in [first, *rest]:
            s.close()


def test_requests_past_the_answering_threads_are_closed_at_once(exporter, monkeypatch):
    srv, port = exporter
    release, started = threading.Event(), threading.Semaphore(0)

    def slow_scrape(cfg, now=None):
        started.release()
        release.wait(10)
        return "tunnelspec_generation 1\n"

    monkeypatch.setattr(EXP, "scrape", slow_scrape)
    busy = []
    for _ in range(EXP.MAX_CLIENTS):
        s = socket.create_connection(("127.0.0.1", port))
        s.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        busy.append(s)
    try:
        for _ in range(EXP.MAX_CLIENTS):
            assert started.acquire(timeout=5)
        extra = socket.create_connection(("127.0.0.1", port))
        extra.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        took = _closed_after(extra, 3.0)
        assert took is not None and took < 0.5, took
        extra.close()
        release.set()
        for s in busy:
            s.settimeout(5)
            assert s.recv(100).startswith(b"HTTP/1.0 200")
        assert _get(port).startswith(b"HTTP/1.0 200")  # the slots came back
    finally:
        release.set()
        for s in busy:
            s.close()


def test_only_get_and_head_of_metrics_and_a_bounded_head(exporter):
    srv, port = exporter
    assert _get(port, "/").startswith(b"HTTP/1.0 404")
    assert _get(port, "/metrics", "POST").startswith(b"HTTP/1.0 501")
    head = _get(port, "/metrics", "HEAD")
    assert head.startswith(b"HTTP/1.0 200") and head.endswith(b"\r\n\r\n") and b"tunnelspec_" not in head
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        s.sendall(b"GET /metrics HTTP/1.1\r\n" + b"X-Pad: " + b"a" * (EXP.MAX_HEAD + 10) + b"\r\n\r\n")
        assert s.recv(100).startswith(b"HTTP/1.0 431")


def test_the_installed_program_serves_and_drops_an_idle_client(tmp_path):
    """`tunnelspec-metrics serve CONFIG` as the unit runs it: its default timeout (5 s) drops a
    client that sends nothing, and a scrape is answered meanwhile, many idle connections or not."""
    from support.localserver import free_port

    port = free_port()
    (tmp_path / "mode.json").write_text(json.dumps({"mode": "plain", "since": 1.0, "at": 1.0}))
    cfg = tmp_path / "metrics.json"
    cfg.write_text(json.dumps(cfg_for(tmp_path, tunnels={}, listen=["127.0.0.1", port])))
    proc = subprocess.Popen([sys.executable, str(REPO / "tunnelspec" / "hostprogs" / "metrics.py"), "serve", str(cfg)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    idle = []
    try:
        assert f"metrics on http://127.0.0.1:{port}/metrics" in proc.stdout.readline()
        idle = [socket.create_connection(("127.0.0.1", port)) for _ in range(64)]
        assert _get(port).startswith(b"HTTP/1.0 200")
        took = _closed_after(idle[-1], 8.0)  # CLIENT_TIMEOUT is 5 s
        assert took is not None and took < 6.5, took
    finally:
        for s in idle:
            s.close()
        proc.kill()
        proc.wait(10)
