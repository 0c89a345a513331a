"""The launcher (tunnelspec/hostprogs/draftwatch.py `launch`) against a real ggml-rpc-server, and the
front (the real HAProxy configuration, templates/tunnelspec-front.cfg.j2) holding requests for a
real llama-server while it is down and while it loads. The watcher's switches (systemd units,
tunnels) are proven in the lab: tests/deploy/test_degraded_lab.py."""

from __future__ import annotations

import json
import re
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from support import front as front_proc
from tunnelspec.components.front import model as front
from tunnelspec.core.constants import LOOPBACK
from support.localserver import free_port, spawn, start_rpc_server, wait_health
from tunnelspec.llama.versions import RPC_HEADER, format_version, rpc_proto_version

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "tunnelspec" / "hostprogs" / "draftwatch.py"


def _load_script():
    import importlib.machinery
    import importlib.util

    loader = importlib.machinery.SourceFileLoader("tunnelspec_draftwatch", str(SCRIPT))
    spec = importlib.util.spec_from_loader(loader.name, loader)
    mod = importlib.util.module_from_spec(spec)
    loader.exec_module(mod)
    return mod


def test_script_has_no_template_syntax():
    # Installed with the `template` task, the program and each of its parts: jinja must render them unchanged.
    from tunnelspec.hostprogs import PARTS, program_path
    for name in ("tunnelspec-draftwatch.py", *PARTS["tunnelspec-draftwatch.py"]):
        text = program_path(name).read_text()
        assert "{{" not in text and "{%" not in text and "{#" not in text, name


def test_rejoin_waits_longer_only_while_the_node_flaps():
    """A loss soon after a rejoin doubles the next wait; a loss after the node held a while is a new
    fault and waits the base time again (faults a minute apart each come back after 20 s)."""
    clock = [1000.0]
    flaps = _load_script().Flaps(20.0, now=lambda: clock[0])
    assert flaps.wait() == 20.0
    flaps.lost()  # the first loss: nothing came back before it
    assert flaps.wait() == 20.0
    flaps.rejoin()
    clock[0] += 10  # lost 10 s after coming back: a flap
    flaps.lost()
    assert flaps.wait() == 40.0
    flaps.rejoin()
    clock[0] += 35  # within the 40 s that rejoin waited
    flaps.lost()
    assert flaps.wait() == 80.0
    flaps.rejoin()
    clock[0] += 300  # held five minutes: a separate fault
    flaps.lost()
    assert flaps.wait() == 20.0
    for _ in range(12):  # capped at ten minutes
        flaps.rejoin()
        clock[0] += 1
        flaps.lost()
    assert flaps.wait() == 600.0


def _config(tmp_path: Path, draft_port: int, expect: str | None, wait: list[tuple[str, int]] = (),
            timeout: float = 5) -> Path:
    cfg = {
        "schema": 1, "unit": "tunnelspec-llama-server.service", "state": str(tmp_path / "mode.json"),
        "rejoin_flag": str(tmp_path / "rejoin"), "expect": expect,
        "wait": {"nodes": [n for n, _ in wait], "endpoints": [f"{LOOPBACK}:{p}" for _, p in wait], "timeout": timeout},
        "draft": {"node": "rpc-a", "endpoint": f"{LOOPBACK}:{draft_port}", "port": draft_port,
                  # No such unit here: the launcher reads its state as systemd reports it (inactive).
                  "tunnel_unit": "tunnelspec-tunnel-test-absent.service", "devices": ["RPC0"]},
        "modes": {"speculative": [sys.executable, "-c", "print('RAN speculative')"],
                  "degraded": [sys.executable, "-c", "print('RAN degraded')"]},
        "rejoin_after": 20, "grace": 0, "front": {"stats": "", "backend": "llama"},
    }
    path = tmp_path / "llama-server.json"
    path.write_text(json.dumps(cfg))
    return path


def _launch(cfg: Path):
    return subprocess.run([sys.executable, str(SCRIPT), "launch", str(cfg)], capture_output=True, text=True,
                          timeout=60)


def _state(tmp_path: Path) -> dict:
    return json.loads((tmp_path / "mode.json").read_text())


@pytest.mark.llama
def test_launch_picks_the_mode_from_the_draft_nodes_answer(llama_bin, tmp_path):
    expect = format_version(rpc_proto_version((Path(llama_bin.source_dir) / RPC_HEADER).read_text()))
    rpc = start_rpc_server(llama_bin.rpc_server, free_port(), tmp_path / "rpc.log")
    try:
        cfg = _config(tmp_path, rpc.port, expect)
        r = _launch(cfg)
        assert r.returncode == 0, r.stderr
        assert "tunnelspec: mode speculative: draft on RPC0 (rpc-a)" in r.stdout and "RAN speculative" in r.stdout
        st = _state(tmp_path)
        assert st["mode"] == "speculative" and st["node"] == "rpc-a"
        first_since = st["since"]
        # Started again in the same mode: no new switch line, the same `since`.
        r = _launch(cfg)
        assert "tunnelspec: mode" not in r.stdout and "RAN speculative" in r.stdout
        assert _state(tmp_path)["since"] == first_since
        # Another protocol version: llama-server would abort (or compute wrong results): degraded.
        r = _launch(_config(tmp_path, rpc.port, "0.0.1"))
        assert "RAN degraded" in r.stdout
        assert "protocol mismatch (rpc-a speaks RPC v%s, main v0.0.1)" % expect in _state(tmp_path)["reason"]
    finally:
        rpc.stop()
    # The node gone: the target alone, with the reason, and one journal line for the switch.
    r = _launch(_config(tmp_path, rpc.port, expect))
    assert r.returncode == 0 and "RAN degraded" in r.stdout
    st = _state(tmp_path)
    assert st["mode"] == "degraded" and st["reason"].startswith("tunnel down (tunnelspec-tunnel-test-absent.service")
    assert r.stdout.count("tunnelspec: mode degraded: serving the target alone, without the draft on rpc-a") == 0
    # (it was already degraded by the mismatch: no second switch line)


def test_launch_waits_for_target_nodes_and_says_which(tmp_path):
    closed = free_port()
    cfg = _config(tmp_path, free_port(), None, wait=[("rpc-b", closed)], timeout=1)
    r = _launch(cfg)
    assert r.returncode == 1 and "RAN" not in r.stdout
    assert "tunnelspec: serving waits for rpc-b (it holds target layers) since " in r.stdout
    st = _state(tmp_path)
    assert st["mode"] == "waiting" and st["node"] == "rpc-b" and st["since"]
    since = st["since"]
    _launch(cfg)
    assert _state(tmp_path)["since"] == since  # still waiting on the same node: since stays


def test_launch_switch_lines_once_per_change(tmp_path):
    # No rpc-server at all: degraded; the line is written when the mode changes, not at every start.
    cfg = _config(tmp_path, free_port(), None)
    first = _launch(cfg)
    assert "tunnelspec: mode degraded: serving the target alone, without the draft on rpc-a: tunnel down" in first.stdout
    again = _launch(cfg)
    assert "tunnelspec: mode" not in again.stdout and "RAN degraded" in again.stdout


def test_watch_sees_the_tunnels_listener_and_a_connection_closed_by_the_other_end():
    # What the watcher reads four times a second while speculative, on real sockets: the tunnel's ssh
    # listening on its port, and llama-server's connection through it closed by the node (CLOSE-WAIT).
    mod = _load_script()
    server = socket.socket()
    server.bind((LOOPBACK, 0))
    port = server.getsockname()[1]
    assert mod.tunnel_sockets(port) == (False, 0)
    server.listen(1)
    client = socket.create_connection((LOOPBACK, port), timeout=5)
    try:
        peer, _ = server.accept()
        assert mod.tunnel_sockets(port) == (True, 0)
        peer.close()  # the other end goes away; the client has not closed its side yet
        deadline = time.monotonic() + 5
        while mod.tunnel_sockets(port)[1] != 1 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert mod.tunnel_sockets(port) == (True, 1)
        server.close()  # ssh exited: no listener any more
        assert mod.tunnel_sockets(port)[0] is False
    finally:
        client.close()
        server.close()


# ---- the front ---------------------------------------------------------------------------------------
def _post(port: int, timeout: float = 120) -> tuple[int, dict]:
    req = urllib.request.Request(f"http://{LOOPBACK}:{port}/completion", method="POST",
                                 data=json.dumps({"prompt": "Once upon a time", "n_predict": 4}).encode(),
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as e:
        return e.code, {}


@pytest.mark.llama
def test_front_holds_requests_while_llama_server_is_down_and_loading(llama_bin, llama_fixtures, tmp_path):
    dw = _load_script()
    internal = free_port()
    argv = [llama_bin.llama_server, "-m", llama_fixtures.model_local, "-dev", "none", "--host", LOOPBACK,
            "--port", str(internal), "-c", "256"]
    server = spawn(argv, tmp_path / "llama-1.log")
    haproxy, port = front_proc.start(tmp_path, internal)
    try:
        wait_health(internal, 60, server)
        status, body = _post(port)
        assert status == 200 and body.get("content") is not None
        assert dw.front_busy({"front": {"stats": str(tmp_path / "stats.sock"), "backend": front.FRONT_RETRY_BACKEND}}) is False
        # llama-server goes away (a switch, a crash): a request sent now is held, not refused ...
        server.stop()
        result = {}
        t = threading.Thread(target=lambda: result.update(zip(("status", "body"), _post(port))))
        t.start()
        # ... the front shows it waiting (what the watcher reads before switching back) ...
        busy = None
        for _ in range(100):
            busy = dw.front_busy({"front": {"stats": str(tmp_path / "stats.sock"), "backend": front.FRONT_RETRY_BACKEND}})
            if busy:
                break
            time.sleep(0.05)
        assert busy is True
        # ... and answered once llama-server is back and has loaded its model (it answers 503 while
        # loading: the front's health check keeps the request away until /health says 200).
        server = spawn(argv, tmp_path / "llama-2.log")
        t.join(120)
        assert not t.is_alive()
        assert result["status"] == 200 and result["body"].get("content") is not None, result
        # The front's log shows it: the request was tried again (retries "N", "+N" when redispatched)
        # until llama-server was up.
        held = [l for l in haproxy.log().splitlines() if '"POST /completion' in l and " 200 " in l]
        assert any(re.search(r" \d+/\d+/\d+/\d+/\+?[1-9]\d* ", l) for l in held), held
    finally:
        server.stop()
        haproxy.stop()


def test_front_gives_up_after_the_hold(tmp_path):
    haproxy, port = front_proc.start(tmp_path, free_port(), hold=2)
    try:
        started = time.monotonic()
        status, _ = _post(port, timeout=60)
        waited = time.monotonic() - started
        assert status == 503 and 1.5 <= waited < 30, (status, waited)
    finally:
        haproxy.stop()


def _aborting_backend(port: int, aborts: int):
    """A plain HTTP server on 127.0.0.1:port that reads each request whole and, for the first
    `aborts` non-health requests, dies on it the way an aborting llama-server does (the connection
    reset with no byte answered); then answers 200."""
    import struct

    seen = {"n": 0}
    srv = socket.socket()
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind((LOOPBACK, port))
    srv.listen(16)
    srv.settimeout(0.2)
    stop = threading.Event()

    def handle(c):
        with c:
            data = b""
            for _ in range(1000):
                if b"\r\n\r\n" in data:
                    head, _, body = data.partition(b"\r\n\r\n")
                    n = int(next((l.split(b":")[1] for l in head.split(b"\r\n") if l.lower().startswith(b"content-length")), 0))
                    if len(body) >= n:
                        break
                chunk = c.recv(65536)
                if not chunk:
                    return
                data += chunk
            if data.startswith(b"GET /health"):
                c.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok")
                return
            seen["n"] += 1
            if seen["n"] <= aborts:
                c.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                return
            c.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 9\r\nConnection: close\r\n\r\nanswered!")

    def loop():
        for _ in range(100000):
            if stop.is_set():
                break
            try:
                c, _ = srv.accept()
            except socket.timeout:
                continue
            threading.Thread(target=handle, args=(c,), daemon=True).start()
        srv.close()

    threading.Thread(target=loop, daemon=True).start()
    return stop, seen


def test_front_retries_a_dropped_request_whose_body_came_late(tmp_path):
    # A client that sends the body after the headers (urllib and many others do): the front must
    # hold the whole request before it picks a server, else it cannot send it again once llama-server
    # dropped it (seen in the lab: a 502 'SH' with no retry).
    internal = free_port()
    stop, seen = _aborting_backend(internal, aborts=1)
    haproxy, port = front_proc.start(tmp_path, internal)
    try:
        body = b'{"prompt": "Once upon a time", "n_predict": 4}'
        with socket.create_connection((LOOPBACK, port), timeout=30) as c:
            c.sendall(b"POST /completion HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                      b"Content-Length: %d\r\n\r\n" % len(body))
            time.sleep(0.5)  # the body follows later, as a slow client sends it
            c.sendall(body)
            c.settimeout(30)
            got = b""
            for _ in range(100):
                chunk = c.recv(65536)
                got += chunk
                if not chunk or got.endswith(b"answered!"):
                    break
        assert got.startswith(b"HTTP/1.1 200") and got.endswith(b"answered!"), got
        assert seen["n"] == 2  # dropped once, sent again
    finally:
        stop.set()
        haproxy.stop()
