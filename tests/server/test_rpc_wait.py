"""The rpc-wait helper (tunnelspec/hostprogs/rpc_wait.py, stdlib only) against a real ggml-rpc-server."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tunnelspec.core.constants import LOOPBACK
from support.localserver import free_port

SCRIPT = Path(__file__).resolve().parents[2] / "tunnelspec" / "hostprogs" / "rpc_wait.py"


def run_wait(*args, timeout=60):
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=timeout)


def test_script_has_no_template_syntax():
    # It is installed with the `template` task: jinja must render it unchanged.
    text = SCRIPT.read_text()
    assert "{{" not in text and "{%" not in text and "{#" not in text


@pytest.mark.llama
def test_ready_endpoint_answers_hello(rpc_server):
    r = run_wait("--timeout", "10", f"{LOOPBACK}:{rpc_server.port}")
    assert r.returncode == 0, r.stderr
    assert "RPC v" in r.stdout and "ready" in r.stdout


@pytest.mark.llama
def test_wrong_version_fails_fast(rpc_server):
    r = run_wait("--timeout", "10", "--expect", "0.0.1", f"{LOOPBACK}:{rpc_server.port}")
    assert r.returncode == 2 and "expected v0.0.1" in r.stderr


@pytest.mark.llama
def test_waits_for_a_late_endpoint(llama_bin, tmp_path):
    from support.localserver import start_rpc_server

    port = free_port()
    # rpc-wait starts first and finds nothing listening; the server comes up while it polls.
    proc = subprocess.Popen([sys.executable, str(SCRIPT), "--timeout", "60", "--interval", "0.2",
                             f"{LOOPBACK}:{port}"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    server = None
    try:
        server = start_rpc_server(llama_bin.rpc_server, port, tmp_path / "rpc.log")
        out, err = proc.communicate(timeout=90)
        assert proc.returncode == 0, err
        assert "ready" in out
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if server is not None:
            server.stop()


def test_nothing_listening_times_out():
    port = free_port()
    r = run_wait("--timeout", "1", "--interval", "0.2", f"{LOOPBACK}:{port}")
    assert r.returncode == 1
    assert f"{LOOPBACK}:{port}: not ready after 1s" in r.stderr
