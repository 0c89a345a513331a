#!/usr/bin/python3
# Installed by tunnelspec on the main host; run as ExecStartPre= of tunnelspec-llama-server.service.
# Waits until every RPC endpoint (the local ends of the SSH tunnels) answers the ggml RPC HELLO.
# llama-server aborts when an --rpc endpoint is unreachable and never reconnects, so it must only
# start once every tunnel carries a live rpc-server. Python 3 standard library only.
#
#   tunnelspec-rpc-wait [--timeout 90] [--expect 7.0.0] 127.0.0.1:15052 127.0.0.1:15053
#
# Exit 0: every endpoint answered; 1: deadline passed (each endpoint's last state is printed).
import argparse
import socket
import struct
import sys
import time

HELLO = 14
CAPS = 24  # proto >= 4.0: 24 bytes of connection capabilities, all zero = plain TCP


def recv_exact(sock, n):
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            raise ConnectionError("closed by server")
        data += chunk
    return data


def hello(host, port, legacy, timeout):
    with socket.create_connection((host, port), timeout=timeout) as s:
        s.settimeout(timeout)
        payload = b"" if legacy else bytes(CAPS)
        s.sendall(struct.pack("<BQ", HELLO, len(payload)) + payload)
        want = 3 if legacy else 4 + CAPS
        (size,) = struct.unpack("<Q", recv_exact(s, 8))
        if size != want:
            raise ConnectionError(f"unexpected HELLO reply size {size}")
        reply = recv_exact(s, size)
        return f"{reply[0]}.{reply[1]}.{reply[2]}"


def probe(endpoint, timeout):
    host, _, port = endpoint.rpartition(":")
    try:
        return hello(host, int(port), False, timeout), ""
    except (ConnectionError, socket.timeout, OSError) as e:
        first = str(e) or type(e).__name__
    try:
        # A pre-4.0 server closes on the 24-byte HELLO: try the legacy empty one.
        return hello(host, int(port), True, timeout), ""
    except (ConnectionError, socket.timeout, OSError) as e:
        return None, f"{first} / legacy: {str(e) or type(e).__name__}"


def main(argv=None):
    ap = argparse.ArgumentParser(prog="tunnelspec-rpc-wait")
    ap.add_argument("--timeout", type=float, default=90.0, help="overall deadline in seconds")
    ap.add_argument("--interval", type=float, default=0.5)
    ap.add_argument("--expect", default=None, help="required RPC protocol version major.minor.patch")
    ap.add_argument("endpoints", nargs="+")
    a = ap.parse_args(argv)
    deadline = time.monotonic() + a.timeout
    pending = list(a.endpoints)
    state = {}
    for _ in range(int(a.timeout / max(a.interval, 0.05)) + 2):
        for ep in list(pending):
            version, err = probe(ep, timeout=min(5.0, max(0.5, deadline - time.monotonic())))
            if version is None:
                state[ep] = err
            elif a.expect and version != a.expect:
                # A different protocol makes llama-server abort: waiting will not fix it.
                print(f"{ep}: RPC v{version}, expected v{a.expect}", file=sys.stderr)
                return 2
            else:
                print(f"{ep}: RPC v{version} ready")
                pending.remove(ep)
        if not pending:
            return 0
        if time.monotonic() >= deadline:
            break
        time.sleep(a.interval)
    for ep in pending:
        print("{}: not ready after {:g}s ({})".format(ep, a.timeout, state.get(ep, "?")), file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())
