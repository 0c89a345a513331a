"""A stand-in for llama-server behind the front (tests/server/test_front_poison.py), run as its own
process: `python crashing_llama.py PORT LIFETIME_S`. Plain HTTP on 127.0.0.1:PORT:

- `GET /health` → 200; `GET /counts` → how many requests carrying each marker reached it, and how
  many completions are in flight now (`in_flight`) (JSON);
- `POST /completion` → 200 with a JSON body after `WORK_S` (a generation takes time: several are in
  flight at once; `SLOW` in the body: `SLOW_S`), except when the body holds a marker: `POISON` — every time: a "crash", as
  llama-server aborting on a request and systemd starting it again do: **every** connection accepted
  and not yet answered is reset without a byte answered (the marked one and all the others: a dead
  process answers none of them), and the listener is closed for `RESTART_S` (refused connections
  meanwhile; those waiting in its backlog are reset too); `DROP-ONCE` — the same, the first time only.

Each connection gets its own thread; a crash starts a new generation, and a request of an older
one is reset the moment it crashed. It exits by itself after LIFETIME_S (the test also stops it by PID).
"""

from __future__ import annotations

import json
import socket
import struct
import sys
import threading
import time

LOOPBACK = "127.0.0.1"
RESTART_S = 1.0
WORK_S = (0.3, 0.5)  # a completion's time, by its number: 0.3, 0.4, 0.5, 0.3, …
SLOW_S = 1.5  # a long generation's: surely still in flight when the test sends the next request
MARKERS = ("POISON", "DROP-ONCE")


def read_request(c: socket.socket) -> bytes | None:
    """One whole request (headers and Content-Length body), or None if the peer closed first."""
    data = b""
    for _ in range(10000):
        if b"\r\n\r\n" in data:
            head, _, body = data.partition(b"\r\n\r\n")
            n = next((int(v) for k, _, v in (l.partition(b":") for l in head.split(b"\r\n")[1:])
                      if k.strip().lower() == b"content-length"), 0)
            if len(body) >= n:
                return data
        chunk = c.recv(65536)
        if not chunk:
            return None
        data += chunk
    return None


def answer(c: socket.socket, status: str, body: dict) -> None:
    raw = json.dumps(body).encode()
    c.sendall(f"HTTP/1.1 {status}\r\nContent-Type: application/json\r\nContent-Length: {len(raw)}\r\n"
              "Connection: close\r\n\r\n".encode() + raw)


def reset(c: socket.socket) -> None:
    """Closed with a reset, as the kernel does to a dead process's connections (close() follows)."""
    c.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))


class StandIn:
    def __init__(self, port: int):
        self.port = port
        self.counts = {m: 0 for m in MARKERS} | {"normal": 0, "in_flight": 0}
        self.lock = threading.Lock()
        self.crash = threading.Event()
        # Set at a crash, then replaced: each connection holds the one of its generation.
        self.crashed = threading.Event()

    def do_crash(self) -> None:
        with self.lock:
            self.crashed.set()
            self.crashed = threading.Event()
        self.crash.set()

    def handle(self, c: socket.socket, crashed: threading.Event) -> None:
        with c:
            c.settimeout(10)
            try:
                req = read_request(c)
            except OSError:
                return
            if req is None:
                return
            if crashed.is_set():  # its process died before it was read
                reset(c)
                return
            if req.startswith(b"GET /health"):
                answer(c, "200 OK", {"status": "ok"})
                return
            if req.startswith(b"GET /counts"):
                with self.lock:
                    answer(c, "200 OK", dict(self.counts))
                return
            marker = next((m for m in MARKERS if m.encode() in req), None)
            with self.lock:
                self.counts[marker or "normal"] += 1
                n = self.counts[marker or "normal"]
            if marker == "POISON" or (marker == "DROP-ONCE" and n == 1):
                print(f"dropping {marker} #{n}", flush=True)
                reset(c)
                self.do_crash()
                return
            # The generation's time; a crash meanwhile resets this request too, unanswered.
            work = SLOW_S if b"SLOW" in req else WORK_S[0] + (n % 3) * (WORK_S[1] - WORK_S[0]) / 2
            with self.lock:
                self.counts["in_flight"] += 1
            try:
                crashed_under_it = crashed.wait(work)
            finally:
                with self.lock:
                    self.counts["in_flight"] -= 1
            if crashed_under_it:
                print(f"dropping {marker or 'normal'} #{n} (crashed under it)", flush=True)
                reset(c)
                return
            answer(c, "200 OK", {"content": f"answer {n}", "marker": marker})

    def listen(self) -> socket.socket:
        srv = socket.socket()
        srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        srv.bind((LOOPBACK, self.port))
        srv.listen(64)
        srv.settimeout(0.05)
        return srv

    def run(self, lifetime: float) -> None:
        deadline = time.monotonic() + lifetime
        srv = self.listen()
        print(f"listening on {self.port}", flush=True)
        while time.monotonic() < deadline:
            if self.crash.is_set():
                srv.close()
                print("down", flush=True)
                time.sleep(RESTART_S)  # the restart's gap: nothing listens
                self.crash.clear()
                srv = self.listen()
                print("up", flush=True)
            try:
                c, _ = srv.accept()
            except socket.timeout:
                continue
            with self.lock:
                crashed = self.crashed
            if self.crash.is_set():  # accepted after the crash, before the listener closed: dead too
                reset(c)
                c.close()
                continue
            threading.Thread(target=self.handle, args=(c, crashed), daemon=True).start()
        srv.close()


if __name__ == "__main__":
    StandIn(int(sys.argv[1])).run(float(sys.argv[2]))
