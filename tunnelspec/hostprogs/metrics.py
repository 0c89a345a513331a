#!/usr/bin/python3
# Installed by tunnelspec on the main host when `metrics=true` (docs/metrics.md). Python 3 standard
# library only, like the draft watch next to it.
#
#   tunnelspec-metrics serve CONFIG   tunnelspec-metrics.service (the front's user): answers GET /metrics
#                                     on 127.0.0.1:<metrics_port> in Prometheus' text format.
#   tunnelspec-metrics show CONFIG    prints one scrape on stdout (for a person on main, and tests).
#
# What it reads, at each scrape (nothing is cached, nothing is written):
# - the serving mode and its counters from the launcher's state file (tunnelspec-draftwatch), and the
#   watcher's last HELLO of the draft node: no RPC connection of its own (b11434's rpc-server serves one
#   client at a time, and llama-server is that client);
# - the generation serving runs and the returns to one so far (/var/lib/tunnelspec/generation.json,
#   written by the deploy and the rollback: docs/generations.md);
# - each tunnel unit's ActiveState and NRestarts, and llama-server's unit, from systemd;
# - the front's certificate (public) for its end date;
# - llama-server's own /metrics (`llamacpp:*`) on its loopback port: the front's user is the one the
#   loopback isolation lets through, and the API key comes from systemd (LoadCredential=), never from a
#   file this user could read;
# - the front's own figures (HAProxy's built-in exporter on a unix socket in the front's runtime directory).
# Why the front's user: it alone may reach llama-server's port, it owns the front's sockets and reads
#
# This file serves; what one scrape reads and renders is its part next to it, tunnelspec-metrics-sources
# (tunnelspec/hostprogs/__init__.py).
import http.server
import importlib.machinery
import importlib.util
import io
import os
import selectors
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def _part(installed, source, name):
    """A part of this program, installed next to this file as `installed` (`source` in tunnelspec's
    source tree), loaded as module `name` and registered under it for the parts loaded after it."""
    path = os.path.join(HERE, installed)
    if not os.path.exists(path):
        path = os.path.join(HERE, source)  # running from tunnelspec's source (tests)
    loader = importlib.machinery.SourceFileLoader(name, path)
    spec = importlib.util.spec_from_loader(name, loader)
    if spec is None:
        raise ImportError(f"cannot load {path}")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    loader.exec_module(mod)
    return mod


SOURCES = _part("tunnelspec-metrics-sources", "metrics_sources.py", "tunnelspec_metrics_sources")

# What serving uses, and what tests reach, as this module's own names: a test that replaces `scrape`
# here changes what the handler below answers with.
MODES, METRICS, Out = SOURCES.MODES, SOURCES.METRICS, SOURCES.Out
load_config, scrape, front_metrics, llama_metrics = (
    SOURCES.load_config,
    SOURCES.scrape,
    SOURCES.front_metrics,
    SOURCES.llama_metrics,
)
_read_json, connect_unix_nofollow = SOURCES._read_json, SOURCES.connect_unix_nofollow


# ---- serving -----------------------------------------------------------------------------------------
# Any local user may connect to 127.0.0.1:<metrics_port>, so each connection costs a bounded share: a
# connection waits in one selector, with no thread, until its request's head is complete (request line
# and headers: a GET has no body); only then does a thread answer it. Connections that send nothing, or
# too slowly, cost a file descriptor for CLIENT_TIMEOUT at most and never keep a scrape out.
MAX_CLIENTS = 8  # requests answered at once (a thread each); a request past them is closed unanswered
MAX_WAITING = 128  # connections whose head is not complete yet; past them the oldest is closed
CLIENT_TIMEOUT = 5.0  # seconds from the connect to the head's end; and for each write of the answer
MAX_HEAD = 8192  # bytes of request line and headers (HAProxy's GET of /metrics takes a few hundred)


class Handler(http.server.BaseHTTPRequestHandler):
    """One request whose head the server has read already (Server.heads): GET or HEAD of /metrics."""

    server: "Server"  # the Server below (its heads), not any socketserver
    cfg_path = None
    server_version = "tunnelspec-metrics"
    sys_version = ""

    def setup(self):
        super().setup()
        self.rfile.close()
        self.rfile = io.BytesIO(self.server.heads.pop(self.request, b""))

    def _metrics_only(self):
        if self.path.split("?")[0] != "/metrics":
            self.send_error(404)
            return False
        return True

    def do_GET(self):
        if not self._metrics_only():
            return
        body = scrape(load_config(self.cfg_path)).encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_HEAD(self):
        # The headers of a scrape without making one: a HEAD costs nothing.
        if self._metrics_only():
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
            self.end_headers()

    def log_message(self, fmt, *args):
        pass  # one line per scrape would flood the journal


class Server(http.server.HTTPServer):
    """Reads each connection's head in one selector loop (serve), then answers it in a thread of at
    most MAX_CLIENTS. stop() ends the loop (from another thread)."""

    request_queue_size = 64  # the listen backlog: a burst of connections is accepted, not refused

    def __init__(self, address, handler):
        super().__init__(address, handler)
        self.socket.setblocking(False)
        self.slots = threading.BoundedSemaphore(MAX_CLIENTS)
        self.waiting = {}  # socket -> [head so far, deadline, address], oldest first
        self.heads = {}  # socket -> its whole head, for the Handler
        self._stopping = threading.Event()

    def stop(self):
        self._stopping.set()

    def serve(self):
        with selectors.DefaultSelector() as sel:
            sel.register(self.socket, selectors.EVENT_READ)
            while not self._stopping.is_set():
                now = time.monotonic()
                first = min((w[1] for w in self.waiting.values()), default=now + 0.5)
                for key, _ in sel.select(max(0.0, min(first - now, 0.5))):
                    if key.fileobj is self.socket:
                        self._accept(sel)
                    elif key.fileobj in self.waiting:
                        self._read(sel, key.fileobj)
                now = time.monotonic()
                for conn in [c for c, w in self.waiting.items() if w[1] <= now]:
                    self._drop(sel, conn)  # its head did not come within CLIENT_TIMEOUT
            for conn in list(self.waiting):
                self._drop(sel, conn)

    def _accept(self, sel):
        while True:
            try:
                conn, address = self.socket.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                return  # out of file descriptors, say: the connection waits in the backlog
            if len(self.waiting) >= MAX_WAITING:
                self._drop(sel, next(iter(self.waiting)))
            conn.setblocking(False)
            self.waiting[conn] = [b"", time.monotonic() + CLIENT_TIMEOUT, address]
            sel.register(conn, selectors.EVENT_READ)

    def _drop(self, sel, conn):
        self.waiting.pop(conn, None)
        sel.unregister(conn)
        self.shutdown_request(conn)

    def _read(self, sel, conn):
        try:
            data = conn.recv(4096)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        entry = self.waiting[conn]
        entry[0] += data
        head = entry[0]
        if not data or len(head) > MAX_HEAD:
            if data:
                try:
                    conn.send(b"HTTP/1.0 431 Request Header Fields Too Large\r\nConnection: close\r\n\r\n")
                except OSError:
                    pass
            self._drop(sel, conn)
            return
        if b"\r\n\r\n" not in head and b"\n\n" not in head:
            return
        del self.waiting[conn]
        sel.unregister(conn)
        if not self.slots.acquire(blocking=False):
            self.shutdown_request(conn)  # MAX_CLIENTS answers under way: closed at once, unanswered
            return
        conn.setblocking(True)
        conn.settimeout(CLIENT_TIMEOUT)
        self.heads[conn] = head
        try:
            threading.Thread(target=self._answer, args=(conn, entry[2]), daemon=True).start()
        except RuntimeError:
            self.heads.pop(conn, None)
            self.shutdown_request(conn)
            self.slots.release()

    def _answer(self, conn, address):
        try:
            self.finish_request(conn, address)
        except Exception:  # noqa: BLE001 - one client's failure ends its connection, not the exporter
            pass
        finally:
            self.heads.pop(conn, None)
            self.shutdown_request(conn)
            self.slots.release()


def serve(cfg_path):
    cfg = load_config(cfg_path)
    host, port = cfg["listen"]
    if host != "127.0.0.1":
        print(f"tunnelspec-metrics: listens on 127.0.0.1 only, not {host!r}", file=sys.stderr)
        return 2
    Handler.cfg_path = cfg_path
    srv = Server((host, int(port)), Handler)
    print(f"tunnelspec: metrics on http://{host}:{int(port)}/metrics", flush=True)
    srv.serve()
    return 0


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 2 or argv[0] not in ("serve", "show"):
        print("usage: tunnelspec-metrics serve|show CONFIG", file=sys.stderr)
        return 2
    if argv[0] == "serve":
        return serve(argv[1])
    sys.stdout.write(scrape(load_config(argv[1])))
    return 0


if __name__ == "__main__":
    sys.exit(main())
