"""A real HAProxy running tunnelspec's front configuration (templates/tunnelspec-front.cfg.j2) on
127.0.0.1, in front of a llama-server on another loopback port: what main runs, without systemd."""

from __future__ import annotations

import socket
import subprocess
import time
from pathlib import Path

from tunnelspec.components.front import model as front
from tunnelspec.core.constants import LOOPBACK
from tunnelspec.core.templating import render_file
from support.localserver import LocalProcess, free_port, spawn

ROOT = Path(__file__).resolve().parents[2]


def render(tmp_path: Path, internal: int, port: int, hold: int = 60, tls_pem: str = "") -> Path:
    v = {"bind_host": LOOPBACK, "bind_port": port, "internal_port": internal, "loopback": LOOPBACK,
         "hold_port": front.HOLD_PORT, "hold_retries": hold * front.HOLD_TRIES_PER_S,
         "hold_seconds": hold, "stats_socket": str(tmp_path / "stats.sock"),
         "backend": front.FRONT_BACKEND, "front_user": "nobody", "public_bind": bool(tls_pem), "tls_pem": tls_pem}
    cfg = tmp_path / "front.cfg"
    cfg.write_text(render_file((ROOT / "templates" / "tunnelspec-front.cfg.j2").read_text(), v))
    check = subprocess.run([front.HAPROXY, "-c", "-q", "-f", str(cfg)], capture_output=True, text=True)
    assert check.returncode == 0, check.stderr + check.stdout
    return cfg


def start(tmp_path: Path, internal: int, hold: int = 60, tls_pem: str = "") -> tuple[LocalProcess, int]:
    """HAProxy in the foreground (-db), stopped by PID by the caller; returns it and its port."""
    port = free_port()
    cfg = render(tmp_path, internal, port, hold, tls_pem)
    proc = spawn([front.HAPROXY, "-db", "-f", str(cfg)], tmp_path / "haproxy.log")
    proc.port = port
    deadline = time.monotonic() + 20
    for _ in range(400):
        try:
            socket.create_connection((LOOPBACK, port), timeout=1).close()
            return proc, port
        except OSError:
            if proc.proc.poll() is not None or time.monotonic() > deadline:
                proc.stop()
                raise AssertionError(f"haproxy did not listen on {port}:\n{proc.log()[-2000:]}")
            time.sleep(0.05)  # poll interval of the deadline loop
    raise AssertionError("unreachable")
