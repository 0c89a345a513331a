"""A stdlib-only script run *inside* a host (`python3 -c SCRIPT HOST PORT N`): connect, HELLO (proto
>= 4: 24 zero caps bytes), device memory, then N small round trips (DEVICE_COUNT) on the same
connection. Prints one JSON object: version, devices [(free, total)], connect_hello_ms, hello_ms,
p50, p95, max (ms). Used by the tunnel tests and benchmarks to measure from the host's own loopback."""

SCRIPT = r"""
import json, socket, struct, sys, time
host, port, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
t0 = time.perf_counter()
s = socket.create_connection((host, port), timeout=10)
s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
def rx(k):
    b = b""
    while len(b) < k:
        c = s.recv(k - len(b))
        if not c:
            raise SystemExit("closed")
        b += c
    return b
def call(cmd, payload=b""):
    s.sendall(struct.pack("<BQ", cmd, len(payload)) + payload)
    size, = struct.unpack("<Q", rx(8))
    return rx(size)
t1 = time.perf_counter(); v = call(14, bytes(24)); t2 = time.perf_counter()
count, = struct.unpack("<I", call(15))
mem = [struct.unpack("<QQ", call(11, struct.pack("<I", i))) for i in range(count)]
rtts = []
for _ in range(n):
    t = time.perf_counter(); call(15); rtts.append((time.perf_counter() - t) * 1e3)
rtts.sort()
pct = lambda q: rtts[min(len(rtts) - 1, int(q * len(rtts)))] if rtts else None
print(json.dumps({"version": "%d.%d.%d" % tuple(v[:3]), "devices": mem,
                  "connect_hello_ms": (t2 - t0) * 1e3, "hello_ms": (t2 - t1) * 1e3,
                  "p50": pct(0.5), "p95": pct(0.95), "max": rtts[-1] if rtts else None}))
"""
