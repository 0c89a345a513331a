"""A build that generates text and then refuses it (HTTP 500 from its output parser) gets one clear
verify message, and is not mistaken for a lost RPC connection (no restart-and-retry).

The server here is a stand-in for such builds: a real HTTP server on 127.0.0.1 answering /health
and, for /completion, the 500 bodies b9093 and b10001 send (as seen from those builds in the lab
with a byte-vocabulary model; tests/deploy/test_builds.py has b9093 itself produce one)."""

from __future__ import annotations

import asyncio
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from tunnelspec.connection.local import LocalConnection
from tunnelspec.core.errors import TaskFailed
from tunnelspec.core import http
from tunnelspec.components.server.verify import verify_server
from tunnelspec.llama.served_plan import ServedPlan

B9093 = {"error": {"code": 500, "message": "Failed to parse input at pos 0: QgAuz\ufffd\ufffdsAuz",
                   "type": "server_error"}}
B10001 = {"error": {"code": 500, "message": "The model produced output that does not match the expected "
                    "Content-only format", "type": "server_error"}}
OTHER = {"error": {"code": 500, "message": "Invalid input batch.", "type": "server_error"}}


def serve(body: dict):
    calls = {"completion": 0}

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *a):
            pass

        def _send(self, status, payload):
            data = json.dumps(payload).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self):
            self._send(200, {"status": "ok"})

        def do_POST(self):
            self.rfile.read(int(self.headers.get("Content-Length", 0)))
            calls["completion"] += 1
            self._send(500, body)

    srv = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return srv, calls


@pytest.mark.parametrize("body", [B9093, B10001])
def test_output_parser_500_is_named_once(body):
    srv, calls = serve(body)
    try:
        plan = ServedPlan(argv=("llama-server",), kind="speculative", build="b9093 (05c5349)")
        with pytest.raises(TaskFailed) as e:
            asyncio.run(verify_server(LocalConnection("local"), srv.server_port, plan, health_timeout=10))
    finally:
        srv.shutdown()
    msg = str(e.value)
    assert "b9093 (05c5349)" in msg and "output parser" in msg and body["error"]["message"] in msg, msg
    assert "valid UTF-8" in msg and "What to do" in msg, msg
    assert "llama-server died" not in msg and "restarted" not in msg, msg
    assert calls["completion"] == 1  # a refused output is not a lost connection: no second try


def test_other_500_is_not_the_parser():
    assert http.output_parser_message(500, json.dumps(OTHER).encode()) is None
    assert http.output_parser_message(400, json.dumps(B9093).encode()) is None
    assert http.output_parser_message(500, json.dumps(B10001).encode()) == B10001["error"]["message"]
    # Not JSON (a proxy's page): read as text.
    assert http.output_parser_message(500, b"<html>Failed to parse input at pos 3</html>")
