"""Helpers for the TLS tests: a CA in a temporary directory, HTTPS and plain HTTP servers on 127.0.0.1."""

from __future__ import annotations

import json
import ssl
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from tunnelspec.core.constants import LOOPBACK
from tunnelspec.components.tls import ca as C


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *a):
        pass

    def do_GET(self):
        if self.path == "/big":  # several TLS records, chunked: the pump and the HTTP framing together
            body = json.dumps({"x": "y" * 300_000}).encode()
            self.send_response(200)
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            for i in range(0, len(body), 50_000):
                part = body[i:i + 50_000]
                self.wfile.write(b"%x\r\n%s\r\n" % (len(part), part))
            self.wfile.write(b"0\r\n\r\n")
            return
        body = json.dumps({"status": "ok", "path": self.path,
                           "auth": self.headers.get("Authorization", "")}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self):
        n = int(self.headers["Content-Length"])
        data = self.rfile.read(n)
        body = json.dumps({"echo": json.loads(data)}).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


class _TlsServer(ThreadingHTTPServer):
    daemon_threads = True
    ctx: ssl.SSLContext | None = None

    def get_request(self):
        sock, addr = super().get_request()
        if self.ctx is not None:
            sock.settimeout(10)
            try:
                sock = self.ctx.wrap_socket(sock, server_side=True)
            except (ssl.SSLError, OSError):
                sock.close()
                raise
        return sock, addr

    def handle_error(self, request, client_address):  # failed handshakes are the point of some tests
        pass


def serve(tmp_path, cert: C.ServerCert | None):
    """(server, port): Python's ssl server with `cert` (None: plain HTTP), in a thread."""
    srv = _TlsServer((LOOPBACK, 0), _Handler)
    if cert is not None:
        (tmp_path / "srv.crt").write_text(cert.cert_pem)
        key = tmp_path / "srv.key"
        key.write_text(cert.key_pem.reveal())
        key.chmod(0o600)
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(tmp_path / "srv.crt", key)
        srv.ctx = ctx
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return srv, srv.server_address[1]


@pytest.fixture
def ca(tmp_path):
    return C.ensure_ca(tmp_path / "inventory.ini.tls")[0]


@pytest.fixture
def other_ca(tmp_path):
    return C.ensure_ca(tmp_path / "other.ini.tls")[0]


@pytest.fixture
def https_server(tmp_path, ca):
    srv, port = serve(tmp_path, C.issue_server_cert(ca, ["main.test", "127.0.0.1", "::1"]))
    yield port
    srv.shutdown()
    srv.server_close()


@pytest.fixture
def http_server(tmp_path):
    srv, port = serve(tmp_path, None)
    yield port
    srv.shutdown()
    srv.server_close()
