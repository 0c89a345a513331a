"""A loopback TCP server owned by root that lets only uid 0 in, as the hosts' nftables rules do.

On each accept it reads the connecting socket's owner from the kernel (/proc/net/tcp: the entry
whose local address is the peer and whose remote address is this server; its `uid` column is the
uid that created the socket). Another uid is recorded and reset (SO_LINGER 0), root is served:
`http` answers one request with {"uid": 0}, `rpc` speaks enough of llama.cpp's RPC protocol for
tunnelspec's probe (HELLO, DEVICE_COUNT, GET_DEVICE_MEMORY), `bye` sends b"bye" and closes, `echo`
echoes until EOF."""

from __future__ import annotations

import json
import socket
import struct
import threading
import time


def _hex_addr(ip: str, port: int) -> str:
    return "%08X:%04X" % (struct.unpack("<I", socket.inet_aton(ip))[0], port)


def socket_owner_uid(local: tuple[str, int], remote: tuple[str, int]) -> int | None:
    want_l, want_r = _hex_addr(*local), _hex_addr(*remote)
    with open("/proc/net/tcp") as f:
        next(f)
        for line in f:
            parts = line.split()
            if parts[1] == want_l and parts[2] == want_r:
                return int(parts[7])
    return None


def _recv_exact(conn: socket.socket, n: int) -> bytes | None:
    buf = b""
    while len(buf) < n:
        chunk = conn.recv(n - len(buf))
        if not chunk:
            return None
        buf += chunk
    return buf


class GuardedServer:
    def __init__(self, mode: str = "http"):
        self.mode = mode
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.sock.settimeout(0.2)
        self.port = self.sock.getsockname()[1]
        self.seen: list[int | None] = []       # owner uid of every connection, in order
        self.served = 0
        self._stop = False
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop:
            try:
                conn, peer = self.sock.accept()
            except socket.timeout:
                continue
            except OSError:
                return
            uid = None
            for _ in range(20):
                uid = socket_owner_uid(peer, ("127.0.0.1", self.port))
                if uid is not None:
                    break
                time.sleep(0.01)
            self.seen.append(uid)
            if uid != 0:
                conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                conn.close()
                continue
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        self.served += 1
        try:
            getattr(self, "_" + self.mode)(conn)
        except OSError:
            pass
        finally:
            conn.close()

    def _http(self, conn):
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = conn.recv(4096)
            if not chunk:
                return
            data += chunk
        body = json.dumps({"uid": 0, "request": data.split(b"\r\n")[0].decode()}).encode()
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n"
                     b"Connection: close\r\n\r\n" % len(body) + body)

    def _rpc(self, conn):
        while True:
            head = _recv_exact(conn, 9)
            if head is None:
                return
            cmd, size = struct.unpack("<BQ", head)
            if size and _recv_exact(conn, size) is None:
                return
            if cmd == 14:                  # HELLO (4.0: 24 bytes of capabilities each way)
                reply = bytes([3, 6, 0, 0]) + bytes(24)
            elif cmd == 15:                # DEVICE_COUNT
                reply = struct.pack("<I", 1)
            elif cmd == 11:                # GET_DEVICE_MEMORY
                reply = struct.pack("<QQ", 2**30, 2**31)
            else:
                return
            conn.sendall(struct.pack("<Q", len(reply)) + reply)

    def _bye(self, conn):
        conn.sendall(b"bye")

    def _echo(self, conn):
        while True:
            chunk = conn.recv(65536)
            if not chunk:
                return
            conn.sendall(chunk)

    def close(self) -> None:
        self._stop = True
        self.sock.close()
        self._thread.join(2)
