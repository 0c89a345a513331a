"""The rpc play's device tasks on the lab's CPU nodes: what each node serves is read and reported,
and `rpc_devices` naming a device a node does not have (CUDA0 on a CPU node) stops the deploy in the
rpc play — listing the node's devices — before the node's RPC unit or llama-server on main change."""

from __future__ import annotations

import pytest

from support.cli import failed_report
from support.labdeploy import UNIT, converge, deploy, inventory_copy, main_pid, sh

pytestmark = pytest.mark.lab
RPC_UNIT = "tunnelspec-rpc.service"


@pytest.fixture(scope="module")
def served(lab):
    """The lab deployed as it is (a no-op when an earlier test left it so)."""
    res = deploy(lab.inventory)
    assert res.rc == 0, failed_report(res)
    return res


def test_each_node_reports_what_it_serves(served):
    evs = {e["host"]: e for e in served.results() if e.get("module") == "rpc_served_devices"}
    assert set(evs) == {"main", "rpc-a", "rpc-b"}, evs
    assert evs.pop("main")["status"] == "skipped"
    for host, e in evs.items():
        assert e["status"] == "ok" and e["msg"].startswith(f"{host} serves CPU ("), e
    # main is in that play (its gate must stop main when a node fails) and does nothing there.
    on_main = [e for e in served.results() if e.get("play") == "rpc devices" and e.get("host") == "main"]
    assert on_main and all(e["status"] == "skipped" for e in on_main), on_main


def test_rpc_devices_naming_a_missing_device_stops_in_the_rpc_play(lab, served, tmp_path):
    unit_before = {n: sh(lab, n, "systemctl", "cat", RPC_UNIT) for n in ("rpc-a", "rpc-b")}
    rpc_pid = sh(lab, "rpc-a", "systemctl", "show", "-p", "MainPID", "--value", RPC_UNIT).strip()
    llama_unit = sh(lab, "main", "systemctl", "cat", UNIT)
    pid = main_pid(lab)
    inv = inventory_copy(lab, tmp_path, host_vars={"rpc-a": "rpc_devices=CUDA0"})
    res = deploy(inv)
    assert res.rc != 0, failed_report(res)
    failed = [e for e in res.results("failed")]
    by_host = {e["host"]: e for e in failed}
    assert by_host["rpc-a"]["module"] == "rpc_requested_devices", failed_report(res)
    msg = by_host["rpc-a"]["msg"]
    assert "rpc_devices=CUDA0 names CUDA0, which this node does not have" in msg and "its devices: CPU (" in msg, msg
    # The gate of the rpc devices play stops main (and rpc-b) before the server play.
    assert "rpc-a failed earlier" in by_host["main"]["msg"], failed_report(res)
    assert not [e for e in res.results() if e.get("play") == "llama-server"], failed_report(res)
    # Nothing changed: rpc-a's unit and process, llama-server's unit and process.
    assert {n: sh(lab, n, "systemctl", "cat", RPC_UNIT) for n in ("rpc-a", "rpc-b")} == unit_before
    assert sh(lab, "rpc-a", "systemctl", "show", "-p", "MainPID", "--value", RPC_UNIT).strip() == rpc_pid
    assert sh(lab, "main", "systemctl", "cat", UNIT) == llama_unit and main_pid(lab) == pid
    # Naming the device the node has (any case: ggml matches names case-insensitively) passes.
    converge(inventory_copy(lab, tmp_path, name="cpu.ini", host_vars={"rpc-a": "rpc_devices=cpu"}))
    converge(lab.inventory)
