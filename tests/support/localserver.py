"""Start llama.cpp servers as local child processes (tests, benchmarks): safe signals, line-buffered
logs, readiness by protocol rather than by sleeping, and stop by PID.

Two llama.cpp quirks shape this: ggml-rpc-server dies on SIGPIPE when a client vanishes mid-write
(it does not use MSG_NOSIGNAL; systemd ignores SIGPIPE for its units, a plain launcher does not),
and its banner goes to stdout fully buffered unless `stdbuf -oL` is used.
"""

from __future__ import annotations

import os
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from tunnelspec.core.constants import LOOPBACK
from tunnelspec.core.errors import TaskFailed
from tunnelspec.llama import rpc


def free_port(host: str = LOOPBACK) -> int:
    """A port that was free a moment ago (the kernel's choice)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


@dataclass
class LocalProcess:
    proc: subprocess.Popen
    argv: list[str]
    log_path: Path
    port: int | None = None  # the TCP port it serves, when known

    @property
    def pid(self) -> int:
        return self.proc.pid

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def stop(self, timeout: float = 10.0) -> int:
        """Terminate this process (by PID, never by name); kill if it does not exit in time."""
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout)
        return self.proc.returncode


def spawn(argv: list[str], log_path: str | os.PathLike) -> LocalProcess:
    """Start `argv` line-buffered, output to `log_path`, with SIGPIPE left *ignored*.

    Python ignores SIGPIPE itself, and subprocess's default `restore_signals=True` resets it to
    the default action (terminate) in the child; `restore_signals=False` lets the child inherit
    "ignored" across exec, which is what systemd's IgnoreSIGPIPE=yes gives a unit.
    """
    log_path = Path(log_path)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    full = ["stdbuf", "-oL", "-eL", *argv]
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(full, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                restore_signals=False, start_new_session=True)
    return LocalProcess(proc, full, log_path)


def start_rpc_server(binary: str, port: int, log_path: str | os.PathLike,
                     extra: list[str] | None = None, ready_timeout: float = 30.0) -> LocalProcess:
    """ggml-rpc-server on 127.0.0.1:port, returned once a HELLO probe succeeds."""
    p = spawn([binary, "-H", LOOPBACK, "-p", str(port), *(extra or [])], log_path)
    p.port = port
    deadline = time.monotonic() + ready_timeout
    last = None
    for _ in range(int(ready_timeout / 0.05) + 1):
        if p.proc.poll() is not None:
            # rpc-server exits 0 on bind failure: an exit at all means "not ready", whatever rc.
            raise TaskFailed(f"{binary} exited with {p.proc.returncode} before ready:\n{p.log()[-2000:]}")
        last = rpc.probe_tcp_sync(LOOPBACK, port, timeout=2.0)
        if last.ok or time.monotonic() > deadline:
            break
        time.sleep(0.05)  # bounded poll interval, not a wait for an outcome
    if last is None or not last.ok:
        p.stop()
        raise TaskFailed(f"{binary} on {LOOPBACK}:{port} not ready after {ready_timeout:g}s: {last}")
    return p


def wait_health(port: int, timeout: float = 60.0, proc: LocalProcess | None = None) -> None:
    """Poll llama-server's /health on 127.0.0.1:port until 200 (503 while loading)."""
    import urllib.error
    import urllib.request

    url = f"http://{LOOPBACK}:{port}/health"
    deadline = time.monotonic() + timeout
    last = "no answer"
    for _ in range(int(timeout / 0.1) + 1):
        if proc is not None and proc.proc.poll() is not None:
            raise TaskFailed(f"llama-server exited with {proc.proc.returncode}:\n{proc.log()[-3000:]}")
        try:
            with urllib.request.urlopen(url, timeout=2) as resp:
                if resp.status == 200:
                    return
                last = f"HTTP {resp.status}"
        except urllib.error.HTTPError as err:
            last = f"HTTP {err.code}"
        except (urllib.error.URLError, ConnectionError, TimeoutError) as err:
            last = str(err)
        if time.monotonic() > deadline:
            break
        time.sleep(0.1)  # bounded poll interval
    raise TaskFailed(f"llama-server {url} not healthy after {timeout:g}s: {last}")
