"""Real llama-server from the fixture build: version, help, RPC device discovery, and a remote
draft end to end (tiny model as target and draft, draft on RPC0)."""

from __future__ import annotations

import json
import re
import subprocess
import urllib.request
from pathlib import Path

import pytest

from tunnelspec.core.constants import LOOPBACK
from tunnelspec.llama import flags
from support.localserver import free_port, spawn, wait_health

pytestmark = pytest.mark.llama
DATA = Path(__file__).parent / "data"
# The captured --help of the fixture build: one copy, next to the other builds' help texts.
HELP_FIXTURE = Path(__file__).resolve().parents[1] / "server" / "data" / "llama-server-help-b11434.txt"


def run(argv, timeout=120) -> subprocess.CompletedProcess:
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout)


def test_version_names_the_fixture_commit(llama_bin, llama_fixtures):
    out = run([llama_bin.llama_server, "--version"])
    v = flags.parse_version(out.stdout + out.stderr)
    assert v.commit == llama_fixtures.commit[:9]
    assert v.build_number == llama_fixtures.build_number == 11434  # passed as LLAMA_BUILD_NUMBER
    assert v.version and v.version[0].isdigit()


def test_live_help_matches_captured_help(llama_bin):
    out = run([llama_bin.llama_server, "--help"])
    live = flags.parse_help(out.stdout)
    captured = flags.parse_help((HELP_FIXTURE).read_text())
    assert [o.names for o in live.options] == [o.names for o in captured.options]


def test_list_devices_through_rpc(llama_bin, rpc_server):
    # --rpc must come before --list-devices (arguments are applied in order).
    out = run([llama_bin.llama_server, "--rpc", f"{LOOPBACK}:{rpc_server.port}", "--list-devices"], timeout=60)
    devices = flags.parse_list_devices(out.stdout + out.stderr)
    rpc = [d for d in devices if d.is_rpc]
    assert [d.name for d in rpc] == ["RPC0"], out.stdout + out.stderr
    assert rpc[0].description == f"{LOOPBACK}:{rpc_server.port}"
    assert rpc[0].total_mib > 0
    assert flags.rpc_devices_by_port(devices) == {rpc_server.port: ["RPC0"]}


def test_remote_draft_end_to_end(llama_bin, llama_fixtures, rpc_server, tmp_path):
    help_ = flags.parse_help(run([llama_bin.llama_server, "--help"]).stdout, build=llama_bin.commit[:9])
    model = llama_fixtures.model_local
    port = free_port()
    argv = [
        llama_bin.llama_server, "-m", model,
        # --rpc before -dev/-devd: device names only exist once the endpoint is registered.
        "--rpc", f"{LOOPBACK}:{rpc_server.port}",
        *flags.draft_argv(help_, model, "RPC0", n_max=4),
        "-dev", "none",  # keep the target local (CPU); only the draft goes to RPC0
        "--host", LOOPBACK, "--port", str(port), "-c", "512",
        # The default verbosity (3) hides the load_tensors/llama_kv_cache placement lines.
        "-lv", "4",
    ]
    help_.check_argv(argv)
    server = spawn(argv, tmp_path / "llama-server.log")
    try:
        wait_health(port, timeout=120, proc=server)
        body = json.dumps({"prompt": "Hello", "n_predict": 32, "temperature": 0}).encode()
        req = urllib.request.Request(f"http://{LOOPBACK}:{port}/completion", data=body,
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=120) as resp:
            result = json.load(resp)
    finally:
        rc = server.stop()
    log = server.log()
    timings = result["timings"]
    assert timings["draft_n"] > 0, timings
    assert timings["draft_n_accepted"] == timings["draft_n"]
    # The draft's weights were placed on the RPC device.
    where = re.escape(f"RPC0[{LOOPBACK}:{rpc_server.port}]")
    assert re.search(rf"load_tensors: {where} model buffer size", log), log[-3000:]
    assert re.search(rf"llama_kv_cache: {where} KV buffer size", log), log[-3000:]
    assert re.search(r"draft acceptance = 1\.0+ \(\s*\d+ accepted /\s*\d+ generated\)", log)
    assert rc is not None
