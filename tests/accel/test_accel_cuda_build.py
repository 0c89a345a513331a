"""CUDA builds for the node's own GPU: the architecture decision (build_plan.cuda_arch_plan), the
llama_build task's read-only nvidia-smi probe before anything is configured (a fake connection
answering with captured outputs), and llama_cuda_architectures in the inventory. Main's target on
main's accelerator by default. No hosts, no GPU."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from tunnelspec.connection.base import Result
from tunnelspec.engine.context import HostContext, RunOptions
from tunnelspec.core.errors import ClusterError, TaskFailed
from tunnelspec.inventory import load_inventory
from tunnelspec.cluster.model import Cluster
from tunnelspec.llama import build_plan as bp
from tunnelspec.llama import nvidia_smi as nv
from tunnelspec.components.build.build import LlamaBuild

DATA = Path(__file__).parent / "data"
SHA = "0123456789abcdef0123456789abcdef01234567"
TREE = "b" * 40


# ---- the decision --------------------------------------------------------------------------------
def test_arch_plan_detected_inventory_and_cmake_args():
    assert bp.cuda_arch_plan("cpu", [], None, None) == ([], "")
    assert bp.cuda_arch_plan("cuda", [], None, ["89"], "1× NVIDIA GeForce RTX 4090 (8.9)") == (
        ["-DCMAKE_CUDA_ARCHITECTURES=89"], "CUDA architectures 89 (nvidia-smi: 1× NVIDIA GeForce RTX 4090 (8.9))")
    assert bp.cuda_arch_plan("cuda", [], None, ["86", "89"])[0] == ["-DCMAKE_CUDA_ARCHITECTURES=86;89"]
    # The inventory wins over the GPU; llama_cmake_args wins over everything (and adds nothing).
    assert bp.cuda_arch_plan("cuda", [], "90", ["89"]) == (
        ["-DCMAKE_CUDA_ARCHITECTURES=90"], "CUDA architectures 90 (llama_cuda_architectures)")
    assert bp.cuda_arch_plan("cuda", ["-DGGML_NATIVE=OFF", "-DCMAKE_CUDA_ARCHITECTURES:STRING=75"], "90", ["89"]) == (
        [], "CUDA architectures 75 (llama_cmake_args)")
    with pytest.raises(ValueError, match="set llama_cuda_architectures"):
        bp.cuda_arch_plan("cuda", [], None, [])


def test_the_architecture_is_part_of_the_build_key():
    a = bp.keyed_options(SHA, 11434, "cuda", ["-DCMAKE_CUDA_ARCHITECTURES=89"])
    b = bp.keyed_options(SHA, 11434, "cuda", ["-DCMAKE_CUDA_ARCHITECTURES=90"])
    assert bp.build_key(TREE, a) != bp.build_key(TREE, b)
    assert bp.cmake_sets(a, "CMAKE_CUDA_ARCHITECTURES") == "89" and bp.cmake_sets(a, "GGML_HIP") is None


# ---- the task, on a fake host ----------------------------------------------------------------------
class FakeConn:
    """Answers the nvidia-smi probe from a captured file and the build-state script with a finished
    tree; records every command (nothing else may run in a check)."""

    def __init__(self, smi: str, rc: int = 0):
        self.smi, self.smi_rc, self.seen = smi, rc, []

    async def probe(self, argv, check=False, timeout=None):
        if argv != nv.NVIDIA_SMI_PROBE:       # the other reads: answered as below (they change nothing)
            return await self.run(argv, check=check, timeout=timeout)
        self.seen.append(("probe", list(argv)))
        return Result(list(argv), self.smi_rc, self.smi, "")

    async def run(self, argv, check=False, timeout=None):
        # Before configuring, the toolkit check (tests/accel/test_cuda_toolkit.py): a CUDA 12.4 host, the
        # real b11434 ggml-cuda/CMakeLists.txt.
        if "nvcc --version" in " ".join(argv):
            self.seen.append(("nvcc", list(argv)))
            return Result(list(argv), 0, "Cuda compilation tools, release 12.4, V12.4.131\n", "")
        if argv[0] == "cat":
            self.seen.append(("cmakelists", list(argv)))
            return Result(list(argv), 0, (DATA / "ggml-cuda-CMakeLists-b11434.txt").read_text(), "")
        self.seen.append(("run", list(argv)))
        assert argv[:3] == ["sh", "-c", bp.STATE_SCRIPT], argv
        text = (f"tree {TREE}\nnproc 16\nccache yes\ncurrent none\n--- stamp\n--- rpc-cmakelists\n"
                "set(TARGET ggml-rpc-server)\n--- options\noption(GGML_RPC \"rpc\" OFF)\noption(LLAMA_BUILD_WEBUI \"ui\" ON)\n")
        return Result(list(argv), 0, text, "")


def _ctx(conn, host="gpu-a", check=False, cluster=None) -> HostContext:
    return HostContext(host=host, conn=conn, vars={}, facts={}, options=RunOptions(check=check),
                       emit=lambda e: None, task_name="build", cluster=cluster)


def _task(**over) -> LlamaBuild:
    params = {"root": "/opt/tunnelspec", "role": "main", "tree": TREE, "commit": SHA, "build_number": 11434,
              "backend": "cuda"}
    params.update(over)
    return LlamaBuild.build(params)


def _check(task, conn, **kw):
    return asyncio.run(task.check(_ctx(conn, **kw)))


def test_the_build_targets_the_gpu_nvidia_smi_reports():
    conn = FakeConn((DATA / "nvidia-smi-rtx4090.txt").read_text())
    task = _task()
    assert task.probes() == [nv.NVIDIA_SMI_PROBE]  # batched with the play's other read-only checks
    ch = _check(task, conn)
    assert ch.changed and ch.msg.startswith("build llama-server in build/")
    assert "CUDA architectures 89 (nvidia-smi: 1× NVIDIA GeForce RTX 4090 (8.9))" in ch.msg
    assert "-DCMAKE_CUDA_ARCHITECTURES=89" in task._options()
    # The probe ran first, before the build state was even read; then the toolkit against the tree.
    assert [k for k, _ in conn.seen] == ["probe", "run", "nvcc", "cmakelists"]
    # Another GPU, another build directory.
    other = _task()
    _check(other, FakeConn((DATA / "nvidia-smi-h200.txt").read_text()))
    assert other._key != task._key and "-DCMAKE_CUDA_ARCHITECTURES=90" in other._options()


def test_a_mixed_box_builds_both_architectures():
    task = _task()
    ch = _check(task, FakeConn((DATA / "nvidia-smi-mixed.txt").read_text()))
    assert "CUDA architectures 86;89 (nvidia-smi: 1× NVIDIA GeForce RTX 3090 (8.6), 1× NVIDIA GeForce RTX 4060 Ti (8.9))" in ch.msg


def test_a_missing_driver_stops_before_any_build_naming_the_host():
    conn = FakeConn((DATA / "nvidia-smi-no-driver.txt").read_text(), rc=9)
    with pytest.raises(TaskFailed, match=r"^gpu-a: llama_backend=cuda but the NVIDIA driver is not loaded"):
        _check(_task(), conn)
    assert [k for k, _ in conn.seen] == ["probe"]  # nothing else ran
    # --check on a first run (no tree yet) says it too.
    with pytest.raises(TaskFailed, match="gpu-a: llama_backend=cuda but nvidia-smi is not installed"):
        _check(_task(tree=""), FakeConn("tunnelspec: nvidia-smi: command not found\n", rc=127), check=True)


def test_check_mode_before_the_source_shows_the_architecture():
    ch = _check(_task(tree=""), FakeConn((DATA / "nvidia-smi-h100.txt").read_text()), check=True)
    assert ch.msg == ("would build once the source play has applied; CUDA architectures 90 "
                      "(nvidia-smi: 1× NVIDIA H100 80GB HBM3 (9.0))")


def test_inventory_architectures_win_and_cpu_builds_probe_no_gpu():
    task = _task(cuda_architectures="86")
    ch = _check(task, FakeConn((DATA / "nvidia-smi-rtx4090.txt").read_text()))
    assert "CUDA architectures 86 (llama_cuda_architectures)" in ch.msg
    cpu = _task(backend="cpu")
    assert [a[:3] for a in cpu.probes()] == [["sh", "-c", bp.STATE_SCRIPT]]  # its build state, no nvidia-smi
    conn = FakeConn("")
    assert "CUDA" not in _check(cpu, conn).msg and [k for k, _ in conn.seen] == ["run"]


# ---- the inventory -----------------------------------------------------------------------------------
def write(tmp_path: Path, main_vars=(), rpc_vars=(), all_vars=()) -> Path:
    lines = ["[main]", "m1 ansible_host=10.77.0.10 " + " ".join(main_vars), "", "[rpc]",
             "r1 ansible_host=10.77.0.11 " + " ".join(rpc_vars), "", "[all:vars]", "llama_repo=/srv/llama.cpp",
             f'llama_commit="{SHA}"', *all_vars, ""]
    path = tmp_path / "inventory.ini"
    path.write_text("\n".join(lines) + "\n")
    return path


def cluster(path: Path) -> Cluster:
    return Cluster.from_inventory(load_inventory(path))


def test_llama_cuda_architectures_in_the_inventory(tmp_path):
    c = cluster(write(tmp_path, rpc_vars=("llama_backend=cuda", 'llama_cuda_architectures="86, 89"')))
    assert c.rpc[0].build.cuda_architectures == "86;89" and c.main.build.cuda_architectures is None
    c = cluster(write(tmp_path, all_vars=("llama_cuda_architectures=90",)))
    assert c.rpc[0].build.cuda_architectures == "90"


def test_the_build_task_reads_the_hosts_architectures_from_the_cluster(tmp_path):
    c = cluster(write(tmp_path, rpc_vars=("llama_backend=cuda", "llama_cuda_architectures=75")))
    ch = asyncio.run(_task(role="rpc").check(_ctx(FakeConn((DATA / "nvidia-smi-rtx4090.txt").read_text()),
                                                  host="r1", cluster=c)))
    assert "CUDA architectures 75 (llama_cuda_architectures)" in ch.msg


@pytest.mark.parametrize("value, words", [
    ("8.9", "'8.9' is not a CUDA architecture"),
    ("sm_89", "'sm_89' is not a CUDA architecture"),
])
def test_bad_cuda_architectures(tmp_path, value, words):
    with pytest.raises(ClusterError, match=words):
        cluster(write(tmp_path, rpc_vars=(f"llama_cuda_architectures={value}",)))


def test_architectures_given_twice(tmp_path):
    with pytest.raises(ClusterError, match="keep one of the two"):
        cluster(write(tmp_path, rpc_vars=("llama_cuda_architectures=89",
                                          'llama_cmake_args="-DCMAKE_CUDA_ARCHITECTURES=90"')))


@pytest.mark.parametrize("backend, default", [("cpu", "none"), ("cuda", "CUDA0"), ("hip", "ROCm0"),
                                              ("vulkan", "Vulkan0")])
def test_mains_target_defaults_to_its_accelerator(tmp_path, backend, default):
    c = cluster(write(tmp_path, main_vars=(f"llama_backend={backend}",)))
    assert c.main.target_devices == default


def test_a_metal_main_is_refused_from_the_inventory(tmp_path):
    # Metal is a Mac, where tunnelspec does not deploy: refused before any connection, saying what to do.
    with pytest.raises(ClusterError, match="metal refused on the main host.*a Linux host"):
        cluster(write(tmp_path, main_vars=("llama_backend=metal",)))


def test_none_stays_available_explicitly(tmp_path):
    c = cluster(write(tmp_path, main_vars=("llama_backend=cuda", "llama_target_devices=none")))
    assert c.main.target_devices == "none"
    c = cluster(write(tmp_path, main_vars=("llama_backend=cuda", "llama_target_devices=CUDA0,CUDA1")))
    assert c.main.target_devices == "CUDA0,CUDA1"


def test_the_default_reaches_the_command_line(tmp_path):
    from tunnelspec.components.server.args import target_device_list

    c = cluster(write(tmp_path, main_vars=("llama_backend=vulkan",)))
    # The target stays on main's GPU (never spread onto the RPC devices, as without -dev).
    assert target_device_list(c.main.target_devices, []) == "Vulkan0"
    assert target_device_list(c.main.target_devices, ["RPC1"]) == "Vulkan0,RPC1"


def test_nvcc_off_the_path_is_named_to_cmake():
    # NVIDIA's installer puts nvcc in /usr/local/cuda/bin, which no non-interactive PATH has: the facts
    # look there too, and the build names it to CMake (which finds the toolkit from it).
    from tunnelspec.facts.host import CUDA_BIN, SCRIPT

    assert f':{CUDA_BIN}"' in SCRIPT.splitlines()[1]
    assert bp.cuda_compiler_options("/usr/local/cuda/bin/nvcc", []) == ["-DCMAKE_CUDA_COMPILER=/usr/local/cuda/bin/nvcc"]
    assert bp.cuda_compiler_options("/usr/bin/nvcc", []) == []   # Debian's nvidia-cuda-toolkit
    assert bp.cuda_compiler_options(None, []) == []
    assert bp.cuda_compiler_options("/usr/local/cuda/bin/nvcc", ["-DCMAKE_CUDA_COMPILER=/opt/cuda/bin/nvcc"]) == []
