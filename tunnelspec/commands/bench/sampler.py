"""How long llama-server waits on its RPC tunnels, sampled on the main host while bench measures.

This file runs on main (`python3 -I -c <this source> PID PORTS INTERVAL MAX_SECONDS MAX_SAMPLES`,
stdlib only, Python 3.7+: Debian 11's python3 is 3.9) and stops at EOF on stdin, after MAX_SECONDS
or MAX_SAMPLES, or when the process exits; then it prints one JSON line (bench_netwait.summarize
reads it). Before sampling it prints `ready`.

At a fixed interval it reads /proc/PID/task/TID/syscall of llama-server's threads: a blocked thread
shows the system call it sleeps in and its arguments. For the read/recv/write/send family the first
argument is the file descriptor; /proc/PID/fd/FD names its socket inode, and /proc/PID/net/tcp{,6}
that socket's remote port. A sample counts as waiting when some thread is blocked on a socket whose
remote port is a tunnel port (ggml-rpc's sockets are blocking send()/recv(): b11434 has one
dispatcher thread per endpoint, b9093 does it on the compute thread). Every thread is read every
FULL_EVERY samples, and at every sample until a thread has been seen blocked on each tunnel port; in
between only the threads seen blocked on a tunnel, so the sampler costs main little CPU at a 1 ms
interval. (Each endpoint has its own thread: with a remote draft on rpc-a and target layers on
rpc-b, rpc-b's thread waits long on each target pass and is found at once, while rpc-a's waits
a fraction of a millisecond per draft round trip. Reading only the threads found so far, with a
full read every FULL_EVERY samples, missed rpc-a's thread in the lab: a bench's measured
completions take tens of milliseconds, a handful of full reads.)

What "waiting" holds: the bytes crossing the tunnel and the node's own work on the request (a remote
draft's forward pass, a remote share of the target's layers): main only sees a thread blocked on a
socket and cannot tell the two apart. Sampling instead of tracing: no perf/eBPF/strace on the hosts,
and ptrace would stop the server at each call it measures.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from typing import Any

FULL_EVERY = 50
# Syscalls whose first argument is the file descriptor they block on, by machine (uname -m).
IO_SYSCALLS = {
    "x86_64": {
        0: "read",
        1: "write",
        19: "readv",
        20: "writev",
        44: "sendto",
        45: "recvfrom",
        46: "sendmsg",
        47: "recvmsg",
        299: "recvmmsg",
        307: "sendmmsg",
    },
    "aarch64": {
        63: "read",
        64: "write",
        65: "readv",
        66: "writev",
        206: "sendto",
        207: "recvfrom",
        211: "sendmsg",
        212: "recvmsg",
        243: "recvmmsg",
        269: "sendmmsg",
    },
}


def parse_syscall(text: str, arch: str):
    """(syscall name, fd) of a /proc/.../syscall line when the thread is blocked in an fd I/O call;
    None when it runs ("running"), is in another call (a futex: waiting on a lock, not the network),
    or not in a call at all ("-1 sp pc")."""
    parts = text.split()
    if len(parts) < 2 or not parts[0].isdigit():
        return None
    name = IO_SYSCALLS.get(arch, {}).get(int(parts[0]))
    if name is None:
        return None
    try:
        return name, int(parts[1], 16)
    except ValueError:
        return None


def parse_net_tcp(text: str) -> dict:
    """socket inode → (local port, remote port), from /proc/net/tcp or tcp6 (ports are hex)."""
    out = {}
    for line in text.splitlines()[1:]:
        f = line.split()
        if len(f) < 10:
            continue
        try:
            local, remote, inode = int(f[1].rsplit(":", 1)[1], 16), int(f[2].rsplit(":", 1)[1], 16), int(f[9])
        except (IndexError, ValueError):
            continue
        if inode:
            out[inode] = (local, remote)
    return out


def socket_inode(link: str):
    """The inode of an fd's link text `socket:[12345]`; None for anything else."""
    if link.startswith("socket:[") and link.endswith("]"):
        body = link[8:-1]
        return int(body) if body.isdigit() else None
    return None


class ProcessGone(Exception):
    pass


class Threads:
    """llama-server's threads as /proc shows them."""

    def __init__(self, pid: int, ports, arch: str, proc: str = "/proc"):
        self.base = f"{proc}/{pid}"
        self.ports = set(ports)
        self.arch = arch
        self.inodes: dict = {}  # socket inode -> tunnel port (sockets to a tunnel only)
        self.refreshed = 0.0
        self.candidates: set = set()
        self.found: set = set()  # tunnel ports some thread has been seen blocked on

    def refresh_sockets(self) -> None:
        found = {}
        for name in ("tcp", "tcp6"):
            try:
                with open(f"{self.base}/net/{name}") as f:
                    table = parse_net_tcp(f.read())
            except FileNotFoundError:
                continue
            found.update({ino: remote for ino, (_, remote) in table.items() if remote in self.ports})
        self.inodes = found
        self.refreshed = time.monotonic()

    def port_of(self, fd: int):
        try:
            inode = socket_inode(os.readlink(f"{self.base}/fd/{fd}"))
        except OSError:
            return None
        if inode is None:
            return None
        if inode not in self.inodes and time.monotonic() - self.refreshed > 0.2:
            self.refresh_sockets()  # a socket opened since (a reconnect): at most 5 times a second
        return self.inodes.get(inode)

    def sample(self, full: bool) -> set:
        """The tunnel ports some thread is blocked on now. Every thread is read on a full sample and
        while a tunnel port has no thread known yet; otherwise only the threads known."""
        if full or not self.candidates or self.found != self.ports:
            try:
                tids = os.listdir(f"{self.base}/task")
                with open(f"{self.base}/stat") as f:
                    state = f.read().rsplit(")", 1)[-1].split()[0]
            except (FileNotFoundError, ProcessLookupError, IndexError):
                raise ProcessGone from None
            if state in ("Z", "X"):  # exited, not yet reaped
                raise ProcessGone
        else:
            tids = list(self.candidates)
        waiting = set()
        for tid in tids:
            try:
                with open(f"{self.base}/task/{tid}/syscall") as f:
                    hit = parse_syscall(f.read(), self.arch)
            except (FileNotFoundError, ProcessLookupError):
                self.candidates.discard(tid)
                continue
            if hit is None:
                continue
            port = self.port_of(hit[1])
            if port is not None:
                waiting.add(port)
                self.candidates.add(tid)
                self.found.add(port)
        return waiting


def _wait_eof(stop: threading.Event) -> None:
    # os.read, not sys.stdin: a daemon thread blocked inside the buffered reader holds its lock, and
    # the interpreter aborts at exit when it cannot take it.
    try:
        while os.read(0, 4096):
            pass
    except OSError:
        pass
    finally:
        stop.set()


def run(
    pid: int,
    ports,
    interval: float,
    max_seconds: float,
    max_samples: int,
    stop: threading.Event,
    arch: str | None = None,
    proc: str = "/proc",
) -> dict:
    arch = arch or os.uname().machine
    out: dict[str, Any] = {
        "pid": pid,
        "arch": arch,
        "ports": sorted(ports),
        "samples": 0,
        "waiting": 0,
        "waiting_s": 0.0,
        "by_port": {},
        "elapsed_s": 0.0,
        "io_threads": 0,
        "stopped": None,
        "error": None,
    }
    if arch not in IO_SYSCALLS:
        out["error"] = f"cannot sample on {arch}: its system call numbers are not known to tunnelspec"
        return out
    threads = Threads(pid, ports, arch, proc)
    try:
        tid = sorted(os.listdir(f"{threads.base}/task"))[0]
        with open(f"{threads.base}/task/{tid}/syscall") as f:
            f.read()
    except (OSError, IndexError) as e:
        out["error"] = (
            f"cannot read llama-server's threads (/proc/{pid}/task/*/syscall): {e}; "
            "the sampler needs root (CAP_SYS_PTRACE)"
        )
        return out
    threads.refresh_sockets()
    print("ready", flush=True)
    t0 = prev = time.monotonic()
    n, by_port = 0, dict[str, float]()
    while True:
        if stop.is_set():
            out["stopped"] = "eof"
            break
        if prev - t0 >= max_seconds:
            out["stopped"] = "max_seconds"
            break
        if n >= max_samples:
            out["stopped"] = "max_samples"
            break
        try:
            waiting = threads.sample(full=n % FULL_EVERY == 0)
        except ProcessGone:
            out["stopped"] = "process gone"
            break
        now = time.monotonic()
        dt, prev, n = now - prev, now, n + 1
        if waiting:
            out["waiting"] += 1
            out["waiting_s"] += dt
            for p in waiting:
                by_port[str(p)] = by_port.get(str(p), 0.0) + dt
        time.sleep(interval)
    out.update(
        samples=n,
        elapsed_s=round(prev - t0, 6),
        waiting_s=round(out["waiting_s"], 6),
        by_port={p: round(s, 6) for p, s in by_port.items()},
        io_threads=len(threads.candidates),
    )
    return out


def main(argv) -> int:
    pid, ports = int(argv[0]), {int(p) for p in argv[1].split(",") if p}
    interval, max_seconds, max_samples = float(argv[2]), float(argv[3]), int(argv[4])
    stop = threading.Event()
    threading.Thread(target=_wait_eof, args=(stop,), daemon=True).start()
    print(json.dumps(run(pid, ports, interval, max_seconds, max_samples, stop), sort_keys=True), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
