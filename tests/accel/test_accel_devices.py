"""llama/devices.py: the rpc-server's banner and device listings, the served-device and rpc_devices
checks, nvidia-smi parsing, main's default target devices, the fit check and the GGUF shape. Pure:
captured outputs (tests/accel/data, see its README for which are hand-written), no hosts."""

from __future__ import annotations

from pathlib import Path

import pytest

from tunnelspec.core.errors import TaskFailed
from tunnelspec.llama import devices as dv, devices_cli, memory_fit as mf, nvidia_smi as nv

DATA = Path(__file__).parent / "data"
MIB = mf.MIB


def data(name: str) -> str:
    return (DATA / name).read_text()


# ---- nvidia-smi -------------------------------------------------------------------------------------
@pytest.mark.parametrize("name, archs, summary", [
    ("nvidia-smi-rtx4090.txt", ["89"], "1× NVIDIA GeForce RTX 4090 (8.9)"),
    ("nvidia-smi-h100.txt", ["90"], "1× NVIDIA H100 80GB HBM3 (9.0)"),
    ("nvidia-smi-h200.txt", ["90"], "1× NVIDIA H200 (9.0)"),
    ("nvidia-smi-8x-h100.txt", ["90"], "8× NVIDIA H100 80GB HBM3 (9.0)"),
    ("nvidia-smi-mixed.txt", ["86", "89"], "1× NVIDIA GeForce RTX 3090 (8.6), 1× NVIDIA GeForce RTX 4060 Ti (8.9)"),
    ("nvidia-smi-rtx5090.txt", ["120"], "1× NVIDIA GeForce RTX 5090 (12.0)"),
])
def test_nvidia_smi_architectures(name, archs, summary):
    gpus = nv.parse_nvidia_smi(data(name))
    assert nv.cuda_architectures(gpus) == archs
    assert nv.describe_gpus(gpus) == summary
    assert all(g.memory_mib and g.driver.count(".") >= 1 for g in gpus)


def test_nvidia_smi_fields_and_argv():
    (gpu,) = nv.parse_nvidia_smi(data("nvidia-smi-h200.txt"))
    assert (gpu.compute_cap, gpu.name, gpu.driver, gpu.memory_mib) == ("9.0", "NVIDIA H200", "570.124.06", 143771)
    assert nv.NVIDIA_SMI_ARGV == ["nvidia-smi", "--query-gpu=compute_cap,name,driver_version,memory.total",
                                  "--format=csv,noheader"]
    # A memory field nvidia-smi cannot read ([N/A]) does not lose the GPU.
    (odd,) = nv.parse_nvidia_smi("9.0, NVIDIA GH200 480GB, 560.35.03, [N/A]\n")
    assert odd.memory_mib is None and odd.arch == "90"


@pytest.mark.parametrize("name, rc, words", [
    ("nvidia-smi-no-driver.txt", 9, ["not loaded", "couldn't communicate with the NVIDIA driver"]),
    ("nvidia-smi-version-mismatch.txt", 18, ["reboot after an upgrade", "Driver/library version mismatch"]),
    ("nvidia-smi-no-devices.txt", 6, ["sees no GPU", "No devices were found"]),
    ("nvidia-smi-old-driver.txt", 2, ["llama_cuda_architectures", "compute_cap"]),
])
def test_nvidia_smi_failures_name_the_host_and_the_cause(name, rc, words):
    with pytest.raises(TaskFailed) as info:
        nv.parse_nvidia_smi(data(name), rc, "gpu-a")
    msg = str(info.value)
    assert msg.startswith("gpu-a: llama_backend=cuda but "), msg
    for w in words:
        assert w in msg, msg


def test_nvidia_smi_missing_is_the_driver_missing():
    with pytest.raises(dv.DeviceError, match=r"gpu-a: .*nvidia-smi is not installed: the NVIDIA driver is missing"):
        nv.parse_nvidia_smi("tunnelspec: nvidia-smi: command not found\n", 127, "gpu-a")
    with pytest.raises(dv.DeviceError, match="exit status 1, no output"):
        nv.parse_nvidia_smi("", 1, "gpu-a")


def test_cuda_arch_cli(capsys, monkeypatch):
    import io

    monkeypatch.setattr("sys.stdin", io.StringIO(data("nvidia-smi-mixed.txt")))
    assert devices_cli.main(["cuda-arch"]) == 0
    out = capsys.readouterr()
    assert out.out.strip() == "86;89" and "RTX 3090" in out.err
    monkeypatch.setattr("sys.stdin", io.StringIO(data("nvidia-smi-no-driver.txt")))
    assert devices_cli.main(["cuda-arch"]) == 1
    assert devices_cli.main([]) == 2


# ---- what a node serves ------------------------------------------------------------------------------
def test_banner_parsing():
    log = dv.parse_node_log(data("rpc-banner-vulkan-llvmpipe.txt"))
    assert log.banner.version == (7, 0, 0) and log.unknown is None and log.hints == ()
    (dev,) = log.banner.devices
    assert (dev.name, dev.description, dev.total_mib, dev.free_mib) == (
        "Vulkan0", "llvmpipe (LLVM 15.0.6, 256 bits)", 32098, 32098)
    assert (dev.kind, dev.backend) == ("gpu", "vulkan")
    cpu = dv.parse_node_log(data("rpc-banner-cpu.txt")).banner.devices[0]
    assert (cpu.name, cpu.kind, cpu.backend, cpu.description) == ("CPU", "cpu", "cpu", "AMD EPYC 7763 64-Core Processor")
    assert dv.Device("RPC0", "127.0.0.1:15052", 1, 1).kind == "rpc"
    assert dv.Device("ROCm1", "AMD Radeon", 1, 1).backend == "hip"
    assert dv.Device("MTL0", "Apple M2", 1, 1).backend == "metal"
    assert dv.Device("BLAS", "OpenBLAS", 0, 0).kind == "other"
    assert dv.Device("CUDA0", "x", 3, 2).as_fact() == {"name": "CUDA0", "description": "x", "kind": "gpu",
                                                       "total_mib": 3, "free_mib": 2}


def test_the_latest_run_wins():
    # A node that served CPU, then was fixed: the later banner is what it serves now.
    text = data("rpc-banner-cuda-no-driver.txt") + "Accepted client connection\n" + data("rpc-banner-cuda-4090.txt")
    log = dv.parse_node_log(text)
    assert [d.name for d in log.banner.devices] == ["CUDA0"] and log.hints == ()
    # A crash loop after a good run: the refusal is the current state.
    log = dv.parse_node_log(data("rpc-banner-cpu.txt") + data("rpc-unknown-device.txt"))
    assert log.banner is None and log.unknown.requested == "CUDA0"
    assert [d.name for d in log.unknown.available] == ["CPU"]
    assert dv.parse_node_log("") == dv.NodeLog(None, None, ())


def test_a_gpu_node_serving_the_gpu_passes():
    assert dv.check_served("rpc-a", "cuda", (), dv.parse_node_log(data("rpc-banner-cuda-4090.txt"))) == (
        "rpc-a serves CUDA0 (NVIDIA GeForce RTX 4090, 23600/24080 MiB free)")
    assert dv.check_served("rpc-a", "vulkan", ["Vulkan0"], dv.parse_node_log(data("rpc-banner-vulkan-llvmpipe.txt")))
    assert dv.check_served("rpc-a", "cpu", (), dv.parse_node_log(data("rpc-banner-cpu.txt"))).startswith("rpc-a serves CPU")


@pytest.mark.parametrize("name, backend, words", [
    ("rpc-banner-cuda-no-driver.txt", "cuda",
     ["nvidia-smi", "/dev/nvidia*", "CUDA driver version is insufficient"]),
    ("rpc-banner-vulkan-no-icd.txt", "vulkan",
     ["vulkaninfo --summary", "render", "ggml_vulkan: No devices found."]),
    ("rpc-banner-cpu.txt", "hip", ["rocminfo", "/dev/kfd", "`render` and `video`"]),
])
def test_a_gpu_build_serving_cpu_only_is_an_error_naming_node_and_causes(name, backend, words):
    with pytest.raises(dv.DeviceError) as info:
        dv.check_served("rpc-a", backend, (), dv.parse_node_log(data(name)), user="tunnelspec-rpc")
    msg = str(info.value)
    assert msg.startswith(f"rpc-a: built for {backend} (llama_backend={backend}) but its RPC server serves CPU only: CPU ("), msg
    assert "rpc_devices: unset" in msg and "rpc_devices=CPU" in msg and "tunnelspec-rpc" in msg
    for w in words:
        assert w in msg, msg


def test_cpu_asked_for_explicitly_is_fine():
    log = dv.parse_node_log(data("rpc-banner-cuda-no-driver.txt"))
    assert "rpc_devices asks for the CPU" in dv.check_served("rpc-a", "cuda", ["cpu"], log)


def test_rpc_devices_naming_a_missing_device_lists_the_nodes_devices():
    log = dv.parse_node_log(data("rpc-unknown-device.txt"))
    with pytest.raises(dv.DeviceError) as info:
        dv.check_served("rpc-a", "cpu", ["CUDA0"], log)
    assert str(info.value) == (
        "rpc-a: rpc_devices=CUDA0 names CUDA0, which this node does not have; its devices: CPU (AMD EPYC 7763 "
        "64-Core Processor, 24105/24105 MiB free). Set rpc_devices to some of CPU (or remove it: every non-CPU "
        "device, else the CPU)")


def test_listing_a_nodes_devices_before_start():
    assert dv.list_devices_argv("/opt/tunnelspec/current/bin/ggml-rpc-server") == [
        "/opt/tunnelspec/current/bin/ggml-rpc-server", "-d", dv.LIST_PROBE_NAME]
    listing = data("rpc-unknown-device.txt").replace("CUDA0", dv.LIST_PROBE_NAME).split("No devices found")[0]
    have = dv.node_devices(listing)
    assert [d.name for d in have] == ["CPU"]
    assert dv.check_requested("rpc-a", ["cpu"], have).startswith("rpc-a has cpu")  # ggml matches names case-insensitively
    assert dv.check_requested("rpc-a", [], have).startswith("rpc-a has CPU (")
    with pytest.raises(dv.DeviceError, match=r"rpc_devices=CPU,Vulkan0 names Vulkan0, which this node does not have; its devices: CPU \("):
        dv.check_requested("rpc-a", ["CPU", "Vulkan0"], have)
    with pytest.raises(dv.DeviceError, match="did not list its devices"):
        dv.node_devices("error while loading shared libraries: libcudart.so.12")


def test_no_banner_says_so():
    with pytest.raises(dv.DeviceError, match="rpc-a: the RPC server printed no banner"):
        dv.check_served("rpc-a", "cuda", (), dv.parse_node_log("ggml-rpc-server: error while loading shared "
                                                               "libraries: libcudart.so.12\n"))


# ---- main's target ----------------------------------------------------------------------------------
def test_default_target_devices_from_the_listing():
    listed = dv.parse_list_devices(data("llama-server-list-devices-cuda-rpc.txt"))
    assert [d.name for d in listed] == ["CUDA0", "CUDA1", "RPC0"]
    assert dv.default_target_devices("cuda", listed) == "CUDA0,CUDA1"  # every local GPU, never the RPC device
    assert dv.default_target_devices("cpu", listed) == "none"
    with pytest.raises(dv.DeviceError, match="main is built for vulkan but llama-server --list-devices shows no "
                       r"Vulkan device \(it lists: CUDA0, CUDA1, RPC0\).*llama_target_devices=none"):
        dv.default_target_devices("vulkan", listed)
    assert [dv.static_target_default(b) for b in ("cpu", "cuda", "hip", "vulkan", "metal")] == [
        "none", "CUDA0", "ROCm0", "Vulkan0", "MTL0"]


# ---- does it fit ------------------------------------------------------------------------------------
SHAPE = mf.ModelShape(n_layer=24, n_embd=896, n_head=14, n_head_kv=2, n_vocab=151936, n_ctx_train=32768)


def test_estimates():
    # KV: 2 × 4096 × 24 × 896 × 2/14 × 2 bytes = 48 MiB (a Qwen2.5-0.5B-like draft at 4096 tokens).
    assert mf.kv_bytes(SHAPE, 4096) == 2 * 4096 * 24 * 896 * 2 // 14 * 2 == 48 * MIB
    assert mf.kv_bytes(mf.ModelShape(), 4096) is None
    need = mf.draft_need(400 * MIB, SHAPE, 4096)
    assert need.weights == 400 * MIB and need.kv == 48 * MIB
    assert need.compute == 512 * (151936 + 4 * 896) * 4  # ≈ 304 MiB of logits and activations
    assert "KV for 4096 tokens" in need.describe()
    blind = mf.draft_need(400 * MIB, None, None)
    assert blind.kv == 0 and blind.compute == 20 * MIB + 16 * MIB
    assert "KV cache not estimated" in blind.describe() and "guessed from the size" in blind.describe()
    share = mf.target_share_need(8000 * MIB, 1, 4, SHAPE, 4096)
    assert share.weights == 2000 * MIB and share.kv == 12 * MIB and "25% of the target" in share.describe()
    assert mf.target_share_need(8000 * MIB, 0, 4, SHAPE, 4096).total == 0
    both = mf.combine(need, share)
    assert both.total == need.total + share.total


def test_fit_refuses_with_both_figures_and_warns_when_tight():
    need = mf.Need(900 * MIB, 50 * MIB, 50 * MIB)  # 1000 MiB
    fit = mf.check_fit("rpc-a", [("Vulkan0", 800 * MIB, 1024 * MIB)], need)
    assert fit.level == "refuse"
    assert "rpc-a: the draft does not fit: the draft needs 1000 MiB" in fit.message
    assert "rpc-a reports 800 MiB free (Vulkan0 800 MiB free of 1024 MiB)" in fit.message
    with pytest.raises(dv.DeviceError, match="does not fit"):
        mf.require_fit(fit)
    # 1100 MiB free: 100 MiB would be left, under max(10 % = 110 MiB, 256 MiB): tight.
    tight = mf.check_fit("rpc-a", [("CUDA0", 1100 * MIB, 2048 * MIB)], need)
    assert tight.level == "tight" and "100 MiB would be left" in tight.message
    assert mf.require_fit(tight).startswith("WARNING rpc-a: the draft fits tightly")
    # 24 GiB free: 10 % = 2.4 GiB headroom needed, 23 GiB left: ok.
    assert mf.check_fit("rpc-a", [("CUDA0", 24 * 1024 * MIB, 24 * 1024 * MIB)], need).level == "ok"
    # Two devices: llama.cpp spreads the model over both, so their free memory adds up.
    two = mf.check_fit("rpc-a", [("CUDA0", 700 * MIB, 1024 * MIB), ("CUDA1", 700 * MIB, 1024 * MIB)], need)
    assert two.level == "ok" and "CUDA0 700 MiB free of 1024 MiB, CUDA1 700 MiB free" in two.message


def test_fit_takes_the_rpc_probes_figures():
    from tunnelspec.llama.rpc import DeviceMemory

    probed = [DeviceMemory(free=300 * MIB, total=512 * MIB)]
    fit = mf.check_fit("rpc-a", [(f"RPC0.{i}", d.free, d.total) for i, d in enumerate(probed)],
                       mf.Need(1 * MIB, 0, 17 * MIB))
    assert fit.level == "ok"


# ---- a GGUF's shape ---------------------------------------------------------------------------------
def test_gguf_shape_of_the_tiny_model(tmp_path):
    pytest.importorskip("gguf")
    from tunnelspec.lab import gguf_tiny

    path = tmp_path / "tiny.gguf"
    gguf_tiny.write_tiny_llama(path)
    raw = path.read_bytes()
    shape = mf.gguf_shape(raw[:1 << 20])
    assert shape == mf.ModelShape(n_layer=gguf_tiny.BLOCKS, n_embd=gguf_tiny.EMBED, n_head=gguf_tiny.HEADS,
                                  n_head_kv=gguf_tiny.HEADS_KV, n_vocab=gguf_tiny.N_VOCAB,
                                  n_ctx_train=gguf_tiny.CONTEXT)
    # Cut inside the token list: the keys read before the cut are kept.
    cut = mf.gguf_shape(raw[:600])
    assert cut.n_layer == gguf_tiny.BLOCKS and cut.n_vocab is None
    with pytest.raises(ValueError, match="not a GGUF"):
        mf.gguf_shape(b"PK\x03\x04" + bytes(40))
