"""The host's nvcc against what the pinned tree's ggml-cuda/CMakeLists.txt says each architecture
needs (llama/cuda_toolkit.py), on the real CMakeLists of b11434 and b9093 and real `nvcc --version`
outputs (tests/accel/data/README.md says where each comes from); and the llama_build task refusing
before cmake configures. No GPU, no toolkit."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from tunnelspec.connection.base import Result
from tunnelspec.engine.context import HostContext, RunOptions
from tunnelspec.core.errors import TaskFailed
from tunnelspec.facts.host import parse_facts
from tunnelspec.llama import build_plan as bp
from tunnelspec.llama import cuda_toolkit as ct
from tunnelspec.llama import nvidia_smi as nv
from tunnelspec.components.build.build import LlamaBuild

DATA = Path(__file__).parent / "data"
HOSTS = Path(__file__).parents[1] / "hosts" / "data"
SHA = "0123456789abcdef0123456789abcdef01234567"
TREE = "b" * 40


def cmakelists(build: int) -> str:
    return (DATA / f"ggml-cuda-CMakeLists-b{build}.txt").read_text()


def nvcc(release: str) -> tuple[str, tuple[int, ...]]:
    text = (DATA / f"nvcc-{release}.txt").read_text()
    return text, ct.parse_nvcc(text)


def test_nvcc_releases_parse():
    assert [nvcc(r)[1] for r in ("11.5", "11.8", "12.4", "13.0")] == [(11, 5), (11, 8), (12, 4), (13, 0)]
    assert ct.parse_nvcc("nvcc: command not found") is None


@pytest.mark.parametrize("build", [11434, 9093])
def test_the_trees_statements_per_architecture(build):
    rules = {(r.arch, r.op, r.version) for r in ct.tree_rules(cmakelists(build))}
    # The comments ("89 == RTX 4000, needs CUDA v11.8") and the guards around the default list.
    assert {(86, ">=", (11, 1)), (89, ">=", (11, 8)), (120, ">=", (12, 8)), (121, ">=", (12, 9))} <= rules
    assert {(50, "<", (13,)), (61, "<", (13,)), (70, "<", (13,))} <= rules
    # 75 and 80 are in the list unguarded: the tree says nothing that limits them.
    assert not [r for r in rules if r[0] in (75, 80)]
    # b11434 added Hopper to the list (and its comment); b9093 says nothing about 90.
    assert ((90, ">=", (11, 8)) in rules) == (build == 11434)


def test_the_tree_line_is_named():
    (r,) = [r for r in ct.tree_rules(cmakelists(11434)) if r.arch == 61]
    assert r.where() == ('ggml/src/ggml-cuda/CMakeLists.txt:43: if (CUDAToolkit_VERSION VERSION_LESS "13") '
                         "around list(APPEND CMAKE_CUDA_ARCHITECTURES 50-virtual 61-virtual 70-virtual)")
    assert cmakelists(11434).splitlines()[42].strip() == 'if (CUDAToolkit_VERSION VERSION_LESS "13")'


def test_architecture_values():
    assert ct.architectures("86;89") == [86, 89]
    assert ct.architectures("120a-real") == [120] and ct.architectures("90a,89-virtual") == [90, 89]
    assert ct.architectures("native") == [] and ct.architectures("all-major") == []


@pytest.mark.parametrize("release, archs, build, verdict", [
    ("11.5", "89", 11434, "CUDA 11.8 or newer"),        # Ubuntu 22.04's toolkit, an RTX 4090
    ("11.5", "89", 9093, "CUDA 11.8 or newer"),
    ("11.8", "89", 11434, None),
    ("11.8", "90", 11434, None),
    ("11.5", "90", 11434, "CUDA 11.8 or newer"),
    ("11.5", "90", 9093, None),                          # b9093 states nothing about 90: not judged here
    ("11.5", "86", 11434, None),
    ("12.4", "120", 11434, "CUDA 12.8 or newer"),        # a Blackwell (RTX 5090) needs 12.8
    ("13.0", "120", 11434, None),
    ("13.0", "61", 11434, "a CUDA toolkit older than 13"),  # a Pascal GPU with CUDA 13
    ("13.0", "86;61", 9093, "a CUDA toolkit older than 13"),
    ("12.4", "61", 11434, None),
    ("13.0", "89", 11434, None),
    ("13.0", "native", 11434, None),
])
def test_nvcc_against_the_tree(release, archs, build, verdict):
    text, version = nvcc(release)
    why = ct.refusal("gpu-a", version, text.splitlines()[3], archs, cmakelists(build), f"b{build}")
    if verdict is None:
        assert why is None
        return
    arch = [a for a in ct.architectures(archs) if why and f"architecture {a}:" in why]
    assert why.startswith(f"gpu-a: nvcc {release} (Cuda compilation tools, release {release}, ") and arch, why
    assert f"the tree builds {arch[0]} with {verdict} only" in why, why
    assert "ggml/src/ggml-cuda/CMakeLists.txt:" in why and "What to do:" in why


def test_no_nvcc_version_judges_nothing():
    assert ct.refusal("gpu-a", None, "", "89", cmakelists(11434), "b11434") is None


# ---- the task: refused before cmake configures ----------------------------------------------------
class FakeConn:
    """A host with a CUDA toolkit: nvidia-smi (captured), the build-state script (a tree that needs a
    build), the tree's CMakeLists (the real b11434 file) and, when asked, `nvcc --version`. Records
    every command; nothing here may configure or build."""

    def __init__(self, smi: str, nvcc_text: str = ""):
        self.smi, self.nvcc_text, self.seen = smi, nvcc_text, []

    async def probe(self, argv, check=False, timeout=None):
        if argv != nv.NVIDIA_SMI_PROBE:       # the other reads: answered as below (they change nothing)
            return await self.run(argv, check=check, timeout=timeout)
        self.seen.append("nvidia-smi")
        return Result(list(argv), 0, self.smi, "")

    async def run(self, argv, check=False, timeout=None):
        if argv[:3] == ["sh", "-c", bp.STATE_SCRIPT]:
            self.seen.append("state")
            text = (f"tree {TREE}\nnproc 16\nccache yes\ncurrent none\n--- stamp\n--- rpc-cmakelists\n"
                    "set(TARGET ggml-rpc-server)\n--- options\noption(GGML_RPC \"rpc\" OFF)\n")
            return Result(list(argv), 0, text, "")
        if argv[0] == "cat":
            assert argv[-1] == "/opt/tunnelspec/src/llama.cpp/ggml/src/ggml-cuda/CMakeLists.txt"
            self.seen.append("cmakelists")
            return Result(list(argv), 0, cmakelists(11434), "")
        if "nvcc --version" in " ".join(argv):
            self.seen.append("nvcc")
            line = next((l for l in self.nvcc_text.splitlines() if "release" in l), "")
            return Result(list(argv), 0 if line else 1, line + "\n" if line else "", "")
        raise AssertionError(f"unexpected command in a check: {argv}")


def host_facts(release: str | None) -> dict:
    """The host's facts (a captured Debian 12 host) with the nvcc line the facts script prints."""
    text = (HOSTS / "bookworm-root-toolchain.txt").read_text() + "tool:nvcc=/usr/local/cuda/bin/nvcc\n"
    if release:
        text += f"nvcc={nvcc(release)[0].splitlines()[3]}\n"
    f = parse_facts(text)
    assert f.nvcc == (nvcc(release)[1] if release else None)
    return f.to_dict()


def check(conn, facts: dict | None, **over):
    params = {"root": "/opt/tunnelspec", "role": "rpc", "tree": TREE, "commit": SHA, "build_number": 11434,
              "backend": "cuda", **over}
    ctx = HostContext(host="gpu-a", conn=conn, vars={}, facts={"host_facts": facts} if facts else {},
                      options=RunOptions(), emit=lambda e: None, task_name="build")
    return asyncio.run(LlamaBuild.build(params).check(ctx))


def test_an_rtx_4090_with_cuda_11_5_is_refused_before_configure():
    conn = FakeConn((DATA / "nvidia-smi-rtx4090.txt").read_text())
    with pytest.raises(TaskFailed) as e:
        check(conn, host_facts("11.5"))
    msg = str(e.value)
    assert msg.startswith("gpu-a: nvcc 11.5 (Cuda compilation tools, release 11.5, V11.5.119) cannot build "
                          "/opt/tunnelspec/src/llama.cpp (commit 0123456789ab) for CUDA architecture 89"), msg
    assert "CUDA 11.8 or newer" in msg and "CMakeLists.txt:30: # 89 == RTX 4000, needs CUDA v11.8" in msg, msg
    # The nvcc version came from the facts: no nvcc run; nothing configured.
    assert conn.seen == ["nvidia-smi", "state", "cmakelists"]


def test_the_same_host_with_cuda_12_4_builds():
    conn = FakeConn((DATA / "nvidia-smi-rtx4090.txt").read_text())
    ch = check(conn, host_facts("12.4"))
    assert ch.changed and ch.msg.startswith("build ggml-rpc-server in build/"), ch.msg


def test_the_inventorys_architecture_is_what_is_judged():
    """A Blackwell box whose inventory builds 89 (PTX runs there) with CUDA 12.4: allowed; the GPU's
    own 120 is not."""
    smi = (DATA / "nvidia-smi-rtx5090.txt").read_text()
    assert check(FakeConn(smi), host_facts("12.4"), cuda_architectures="89").changed
    with pytest.raises(TaskFailed, match=r"architecture 120: the tree builds 120 with CUDA 12\.8 or newer only"):
        check(FakeConn(smi), host_facts("12.4"))


def test_without_facts_nvcc_is_asked():
    conn = FakeConn((DATA / "nvidia-smi-rtx5090.txt").read_text(), nvcc_text=(DATA / "nvcc-12.4.txt").read_text())
    with pytest.raises(TaskFailed, match=r"gpu-a: nvcc 12\.4 \(Cuda compilation tools, release 12\.4, V12\.4\.131\)"):
        check(conn, None)
    assert conn.seen == ["nvidia-smi", "state", "nvcc", "cmakelists"]
