"""A stand-in for llama-server behind the front (tests/server/test_front_poison.py), run as its own
process: `python crashing_llama.py PORT LIFETIME_S`. Plain HTTP on 127.0.0.1:PORT:

- `GET /health` → 200; `GET /counts` → how many requests carrying each marker reached it (JSON);
- `POST /completion` → 200 with a JSON body, except when the body holds a marker:
  `POISON` — every time: the connection is reset without a byte answered and the listener closed for
  `RESTART_S` (refused connections meanwhile), as llama-server aborting on a request and systemd
  starting it again do; `DROP-ONCE` — the same, the first time only.

Each connection gets its own thread, so a request accepted before a "crash" is still answered: only
the marked one is dropped. It exits by itself after LIFETIME_S (the test also stops it by PID).
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


class StandIn:
    def __init__(self, port: int):
        self.port = port
        self.counts = {m: 0 for m in MARKERS} | {"normal": 0}
        self.lock = threading.Lock()
        self.crash = threading.Event()

    def handle(self, c: socket.socket) -> None:
        with c:
            c.settimeout(10)
            try:
                req = read_request(c)
            except OSError:
                return
            if req is None:
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
                c.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                self.crash.set()
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
            threading.Thread(target=self.handle, args=(c,), daemon=True).start()
        srv.close()


if __name__ == "__main__":
    StandIn(int(sys.argv[1])).run(float(sys.argv[2]))
