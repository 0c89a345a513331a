"""A real HAProxy running tunnelspec's front configuration (templates/tunnelspec-front.cfg.j2) on
127.0.0.1, in front of a llama-server on another loopback port: what main runs, without systemd. The
configuration is rendered as the deploy renders it (components/front/model.py `front_vars`), with its
sockets in the test's directory instead of the front's runtime directory."""

from __future__ import annotations

import socket
import subprocess
import time
from pathlib import Path
from types import SimpleNamespace

from tunnelspec.cluster.front_vars import FrontSettings, MetricsSettings
from tunnelspec.components.front import model as front
from tunnelspec.core.constants import LOOPBACK
from tunnelspec.core.templating import render_file
from support.localserver import LocalProcess, free_port, spawn

ROOT = Path(__file__).resolve().parents[2]


def render(tmp_path: Path, internal: int, port: int, hold: int = 60, tls_pem: str = "",
           metrics: MetricsSettings | None = None) -> Path:
    """The configuration in tmp_path/front.cfg (its sockets next to it), checked with `haproxy -c`."""
    # What front_vars reads of main's host section (cluster/host_sections.py MainHost).
    main = SimpleNamespace(server_host=LOOPBACK, server_port=port, public_bind=bool(tls_pem),
                           tls=SimpleNamespace(cert_path=tls_pem) if tls_pem else None,
                           front=FrontSettings(internal_port=internal, hold_timeout=hold, rejoin_after=20,
                                               user="nobody", metrics=metrics))
    tmp_path.mkdir(parents=True, exist_ok=True)
    v = front.front_vars(main, run_dir=str(tmp_path))
    cfg = tmp_path / "front.cfg"
    cfg.write_text(render_file((ROOT / "templates" / "tunnelspec-front.cfg.j2").read_text(), v))
    check = subprocess.run([front.HAPROXY, "-c", "-q", "-f", str(cfg)], capture_output=True, text=True)
    assert check.returncode == 0, check.stderr + check.stdout
    return cfg


def start(tmp_path: Path, internal: int, hold: int = 60, tls_pem: str = "",
          metrics: MetricsSettings | None = None) -> tuple[LocalProcess, int]:
    """HAProxy in the foreground (-db), stopped by PID by the caller; returns it and its port."""
    port = free_port()
    cfg = render(tmp_path, internal, port, hold, tls_pem, metrics)
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
