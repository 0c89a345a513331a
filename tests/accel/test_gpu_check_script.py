"""scripts/gpu-check.sh without a GPU: syntax (bash -n, shellcheck when installed), its argument
checks, the plan --dry-run prints (from captured nvidia-smi outputs), and — where a CPU build of
the pinned tree is at hand — the whole check rehearsed on the CPU (--device CPU): RPC server, draft on
RPC0 and on the local device, acceptance and tokens/s printed."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "gpu-check.sh"
DATA = Path(__file__).parent / "data"


def run(*args, timeout=60) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True, timeout=timeout, cwd=ROOT)


def test_syntax_and_shellcheck():
    assert subprocess.run(["bash", "-n", str(SCRIPT)]).returncode == 0
    if shutil.which("shellcheck") is None:
        pytest.skip("shellcheck not installed (apt-get install shellcheck)")
    res = subprocess.run(["shellcheck", str(SCRIPT)], capture_output=True, text=True)
    assert res.returncode == 0, res.stdout


def test_help():
    res = run("--help")
    assert res.returncode == 0 and "--dry-run" in res.stdout and "--nvidia-smi-output" in res.stdout


@pytest.mark.parametrize("args, words", [
    (["--frobnicate"], "unknown argument: --frobnicate"),
    (["--jobs", "0"], "--jobs must be a positive number"),
    (["--model-mb", "10"], "--model-mb must be 50-4000"),
    (["--tunnel", "vpn"], "--tunnel must be ssh, direct or auto"),
    (["--arch", "8.9"], "--arch must be like 89"),
    (["--device", "CPU"], "--device CPU needs --bin"),
    (["--ports", "1,2"], "--ports must be RPC,TUNNEL,SSHD,HTTP"),
    (["--work"], "--work needs a value"),
])
def test_bad_arguments_are_usage_errors(args, words):
    res = run("--dry-run", *args)
    assert res.returncode == 2 and words in res.stderr, res.stderr


def test_dry_run_prints_the_plan_and_does_nothing(tmp_path):
    work = tmp_path / "work"
    res = run("--dry-run", "--nvidia-smi-output", str(DATA / "nvidia-smi-rtx4090.txt"), "--work", str(work),
              "--tunnel", "direct")
    assert res.returncode == 0, res.stderr
    out = res.stdout
    assert "CUDA architectures: 89" in out and "1× NVIDIA GeForce RTX 4090 (8.9)" in res.stdout + res.stderr
    assert "-DGGML_CUDA=ON" in out and "-DCMAKE_CUDA_ARCHITECTURES=89" in out and "-DGGML_RPC_RDMA=OFF" in out
    assert "-DLLAMA_BUILD_NUMBER=11434" in out
    assert "--target llama-server ggml-rpc-server" in out
    assert "ggml-rpc-server -H 127.0.0.1 -p 50152 -d CUDA0" in out
    assert "llama-server --rpc 127.0.0.1:50152 -dev CUDA0 --spec-draft-device RPC0" in out
    assert "llama-server -dev CUDA0 --spec-draft-device CUDA0" in out
    assert "--spec-type draft-simple" in out and "tunnel: none" in out
    assert not work.exists()  # nothing was made


def test_dry_run_with_several_gpus_and_an_ssh_tunnel(tmp_path):
    if shutil.which("sshd") is None and not os.path.exists("/usr/sbin/sshd"):
        pytest.skip("no sshd here: --tunnel ssh refuses")
    res = run("--dry-run", "--nvidia-smi-output", str(DATA / "nvidia-smi-mixed.txt"), "--work", str(tmp_path / "w"),
              "--tunnel", "ssh", "--ports", "50001,15001,2201,8001")
    assert res.returncode == 0, res.stderr
    assert '-DCMAKE_CUDA_ARCHITECTURES=86\\;89' in res.stdout  # one build for both architectures
    assert "-L 127.0.0.1:15001:127.0.0.1:50001" in res.stdout
    assert "llama-server --rpc 127.0.0.1:15001 -dev CUDA0 --spec-draft-device RPC0" in res.stdout


def test_no_driver_stops_the_check():
    res = run("--dry-run", "--nvidia-smi-output", str(DATA / "nvidia-smi-no-driver.txt"))
    assert res.returncode == 1
    assert "couldn't communicate with the NVIDIA driver" in res.stderr and "no usable GPU" in res.stderr


def _cpu_build(request) -> str:
    """The pinned tree's CPU build: TUNNELSPEC_CPU_BIN, else the suite's own dev build (built once
    per session by the `llama_bin` fixture; the tests that run llama-server outside the lab share it)."""
    env = os.environ.get("TUNNELSPEC_CPU_BIN")
    if env:
        return env
    return str(request.getfixturevalue("llama_bin").bin_dir)


@pytest.mark.llama
def test_cpu_rehearsal_of_the_whole_check(tmp_path, request):
    bin_dir = _cpu_build(request)
    assert os.access(os.path.join(bin_dir, "llama-server"), os.X_OK), f"no llama-server in {bin_dir}"
    pytest.importorskip("gguf")
    res = run("--bin", bin_dir, "--device", "CPU", "--model-mb", "50", "--n-predict", "16", "--tunnel", "direct",
              "--ports", "50393,15393,2393,8393", "--work", str(tmp_path / "w"), timeout=300)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-2000:]
    table = res.stdout.rsplit("acceptance\n", 1)[1]  # the results table at the end
    rows = [line.split() for line in table.splitlines() if line.startswith(("RPC0 (", "CPU (direct)"))]
    rows = [r for r in rows if len(r) >= 6 and r[-1].replace(".", "").isdigit()]
    assert [r[0] for r in rows] == ["RPC0", "CPU"], res.stdout
    for r in rows:
        assert float(r[-4]) > 0 and int(r[-3]) > 0 and float(r[-1]) == 1.0  # tokens/s, draft_n, acceptance
    assert "RPC0[127.0.0.1:50393] model buffer size" in res.stdout  # the draft's weights on the RPC device
