"""What the rpc play's device tasks read, from the real RPC server of this machine's b11434 build:
its device listing (`-d` with an unknown name) and its start banner, and the served-device rule used
when a journal no longer has the banner."""

from __future__ import annotations

import subprocess

import pytest

from tunnelspec.llama import devices as dv


def test_served_by_rule():
    cpu = dv.Device("CPU", "AMD EPYC", 64000, 60000)
    gpu0, gpu1 = dv.Device("CUDA0", "RTX 4090", 24000, 23000), dv.Device("CUDA1", "RTX 3090", 24000, 23000)
    assert dv.served_by_rule([cpu], []) == [cpu]
    assert dv.served_by_rule([cpu, gpu0, gpu1], []) == [gpu0, gpu1]  # every non-CPU device
    assert dv.served_by_rule([cpu, gpu0, gpu1], ["cuda1"]) == [gpu1]  # -d, matched case-insensitively
    assert dv.served_by_rule([cpu, gpu0], ["CPU"]) == [cpu]


@pytest.fixture(scope="module")
def build():
    from support.devbuild import ensure_dev_build

    return ensure_dev_build()


def test_real_listing_and_banner(build, tmp_path):
    from support.localserver import free_port, start_rpc_server

    # As the task runs it: stdout line-buffered, stderr merged (the lines come from both).
    out = subprocess.run(dv.merged_output_argv(dv.list_devices_argv(build.rpc_server)), capture_output=True,
                         text=True, timeout=60)
    assert out.returncode != 0  # it refuses the probe name and exits before binding
    listed = dv.node_devices(out.stdout)
    assert [d.name for d in listed] == ["CPU"] and listed[0].total_mib > 0, out.stdout
    assert dv.check_requested("rpc-a", ["CPU"], listed).startswith("rpc-a has CPU")
    with pytest.raises(dv.DeviceError, match=r"rpc-a: rpc_devices=CUDA0 names CUDA0, which this node does not "
                                               r"have; its devices: CPU \("):
        dv.check_requested("rpc-a", ["CUDA0"], listed)

    rpc = start_rpc_server(build.rpc_server, free_port(), tmp_path / "rpc.log")
    try:
        log = dv.parse_node_log(rpc.log())
    finally:
        rpc.stop()
    assert log.banner is not None and log.banner.version == (7, 0, 0), rpc.log()
    assert [d.name for d in log.banner.devices] == ["CPU"]
    assert dv.served_by_rule(listed, []) == [d for d in listed if d.name == "CPU"]
    assert dv.check_served("rpc-a", "cpu", [], log).startswith("rpc-a serves CPU")
    # The same real CPU server standing for a node built for a GPU whose driver is missing: refused.
    with pytest.raises(dv.DeviceError, match="built for vulkan .* serves CPU only") as e:
        dv.check_served("rpc-a", "vulkan", [], log, user="tunnelspec-rpc")
    assert "vulkaninfo" in str(e.value) and "tunnelspec-rpc" in str(e.value)
