"""The HTTP client against a real HTTP server on 127.0.0.1 (stdlib http.server in a thread)."""

from __future__ import annotations

import asyncio
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from tunnelspec.core.constants import LOOPBACK
from tunnelspec.core import http


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    health_calls = 0

    def log_message(self, *a):  # keep test output clean
        pass

    def _send(self, code, body: bytes, chunked=False):
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        if chunked:
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            for i in range(0, len(body), 7):
                part = body[i:i + 7]
                self.wfile.write(b"%x\r\n%s\r\n" % (len(part), part))
            self.wfile.write(b"0\r\n\r\n")
        else:
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    def do_GET(self):
        if self.path == "/health":
            type(self).health_calls += 1
            # 503 while "loading", like llama-server, then ok.
            if type(self).health_calls < 3:
                return self._send(503, b'{"error":{"code":503,"message":"Loading model"}}')
            return self._send(200, b'{"status":"ok"}')
        if self.path == "/chunked":
            return self._send(200, json.dumps({"x": list(range(50))}).encode(), chunked=True)
        self._send(404, b"{}")

    # POST /completion answers, chosen by the prompt: (status, raw body bytes, chunked?).
    REPLIES = {
        "timings": (200, json.dumps({"content": "h\u00e9", "timings": {"draft_n": 13, "draft_n_accepted": 0,
                                                                    "predicted_per_second": 41.5}}).encode(), False),
        "chunked": (200, json.dumps({"content": "\u65e5\u672c", "timings": {"draft_n": 257}}).encode(), True),
        "not-json": (200, b'{"content": "hi", "timings": {"draft_n": 8', False),
        "server-error": (500, b'{"error":{"code":500,"message":"Failed to parse input at pos 0"}}', False),
        "bad-utf8": (200, b'{"content": "\xff\xfe"}', False),
    }

    def do_POST(self):
        n = int(self.headers["Content-Length"])
        req = json.loads(self.rfile.read(n))
        auth = self.headers.get("Authorization")
        if auth != "Bearer s3cret":
            return self._send(401, b'{"error":"invalid api key"}')
        if req["prompt"] == "echo":
            return self._send(200, json.dumps({"echo": req}).encode())
        if req["prompt"] == "short":  # promises more than it sends, then closes
            self.send_response(200)
            self.send_header("Content-Length", "100")
            self.end_headers()
            self.wfile.write(b'{"content": ')
            self.close_connection = True
            return None
        status, body, chunked = self.REPLIES[req["prompt"]]
        self._send(status, body, chunked=chunked)


@pytest.fixture
def server():
    _Handler.health_calls = 0
    srv = ThreadingHTTPServer((LOOPBACK, 0), _Handler)
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    yield srv.server_address[1]
    srv.shutdown()
    srv.server_close()


def test_wait_health_polls_through_503(server):
    r = asyncio.run(http.wait_health(http.tcp_opener(server), deadline_s=10, interval=0.05))
    assert r.status == 200 and r.json() == {"status": "ok"}
    assert _Handler.health_calls == 3


def _completion(port, prompt, **kw):
    return asyncio.run(http.completion(http.tcp_opener(port), prompt, 5, api_key="s3cret", **kw))


def test_completion_sends_json_and_bearer_key(server):
    sent = _completion(server, "echo", extra={"n_probs": 2})["echo"]
    # What the client puts in the request (greedy, seeded, no stream, the caller's extras on top).
    assert sent == {"prompt": "echo", "n_predict": 5, "temperature": 0.0, "top_k": 1, "seed": 1,
                    "cache_prompt": False, "stream": False, "n_probs": 2}


def test_completion_parses_the_reply_body(server):
    # Values the client must read back as sent: types kept (13 an int, 41.5 a float), UTF-8 decoded,
    # a chunked body reassembled across chunk boundaries (7-byte chunks split "日本").
    body = _completion(server, "timings")
    assert body == {"content": "hé", "timings": {"draft_n": 13, "draft_n_accepted": 0, "predicted_per_second": 41.5}}
    assert type(body["timings"]["draft_n"]) is int and type(body["timings"]["predicted_per_second"]) is float
    assert _completion(server, "chunked") == {"content": "日本", "timings": {"draft_n": 257}}
    # Bytes that are not UTF-8 are replaced, not an exception.
    assert _completion(server, "bad-utf8") == {"content": "\ufffd\ufffd"}


def test_completion_errors_name_what_went_wrong(server):
    with pytest.raises(http.HttpError, match=r"HTTP 200: body is not JSON: b'\{\"content\": \"hi\"") as e:
        _completion(server, "not-json")
    assert "draft_n" in str(e.value)
    with pytest.raises(http.HttpError, match="/completion: HTTP 500: .*Failed to parse input at pos 0"):
        _completion(server, "server-error")
    with pytest.raises(http.HttpError, match="connection closed mid-response"):
        _completion(server, "short")


def test_completion_without_key_reports_status(server):
    with pytest.raises(http.HttpError, match="HTTP 401"):
        asyncio.run(http.completion(http.tcp_opener(server), "Once", 5))


def test_chunked_body(server):
    r = asyncio.run(http.request(http.tcp_opener(server), "GET", "/chunked"))
    assert r.json() == {"x": list(range(50))}


def test_refused_and_deadline():
    from support.localserver import free_port

    port = free_port()  # nothing listens there
    with pytest.raises(http.HttpError, match="cannot connect"):
        asyncio.run(http.request(http.tcp_opener(port), "GET", "/health", timeout=2))
    with pytest.raises(http.HttpError, match="not ok within"):
        asyncio.run(http.wait_health(http.tcp_opener(port), deadline_s=0.3, interval=0.1))


def test_silent_server_times_out():
    import socket

    s = socket.socket()
    s.bind((LOOPBACK, 0))
    s.listen(1)  # accepts (kernel backlog) but never answers
    try:
        with pytest.raises(http.HttpError, match="no answer within"):
            asyncio.run(http.request(http.tcp_opener(s.getsockname()[1]), "GET", "/health", timeout=0.5))
    finally:
        s.close()
