"""A GPU backend's runtime (its driver), looked for in the deploy's preflight before anything is
checked out or built (prereqs.RUNTIME, in the `prerequisites` task): the facts script's lines in,
refusals and warnings out. A missing NVIDIA driver and Metal on Linux are refused; a missing Vulkan
or ROCm driver is a warning naming the host, what was looked for and what brings it, said once per
run (the preflight pass) as a message of the run's output — `deploy --check` included — while the
rpc play's "serves CPU only" stays the refusal (tests/deploy/test_vulkan_lab.py)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from tunnelspec.components.host import prereqs
from tunnelspec.engine.context import HostContext, RunOptions
from tunnelspec.core.errors import TaskFailed
from tunnelspec.facts.host import FIXED, VULKAN_ICD_DIRS, facts_from_dict, parse_facts
from tunnelspec.components.host.host import Prerequisites

DATA = Path(__file__).parent / "data"
# The build tools of each backend, present: what is judged here is the runtime alone.
TOOLS = {"cpu": "", "vulkan": "tool:glslc=/usr/bin/glslc\nfile:/usr/include/vulkan/vulkan.h=yes\n"
                              "file:/usr/include/spirv/unified1/spirv.hpp=yes\n",
         "hip": "tool:hipcc=/usr/bin/hipcc\n", "cuda": "tool:nvcc=/usr/bin/nvcc\n", "metal": ""}
LVP = "icd:/usr/share/vulkan/icd.d/lvp_icd.x86_64.json=yes\n"   # Mesa's lavapipe, as the facts script prints it


def facts(backend: str, extra: str = ""):
    """A Debian 12 host (captured) with its backend's build tools and the lines in `extra`."""
    text = (DATA / "bookworm-root-toolchain.txt").read_text()
    text += "".join(f"file:{p}=yes\n" for p in FIXED) + TOOLS[backend] + extra
    return parse_facts(text)


def check(backend: str, f, plan_only: bool = True):
    events: list[dict] = []
    ctx = HostContext(host="rpc-a", conn=None, vars={}, facts={"host_facts": f.to_dict()},
                      options=RunOptions(check=True), emit=events.append, task_name="prerequisites can be met")
    task = Prerequisites.build({"role": "rpc", "backend": backend, "isolation": False, "plan_only": plan_only})
    return asyncio.run(task.check(ctx)), [e["msg"] for e in events if e["event"] == "message"]


def test_the_facts_script_reports_drivers():
    f = facts("vulkan", LVP + "file:/dev/kfd=yes\nnvcc=Cuda compilation tools, release 12.4, V12.4.131\n")
    assert f.vulkan_icds == ("/usr/share/vulkan/icd.d/lvp_icd.x86_64.json",)
    assert "/dev/kfd" in f.files and f.nvcc == (12, 4)
    assert facts_from_dict(f.to_dict()) == f and f.to_dict()["nvcc"] == "12.4"
    assert "CUDA 12.4" in f.summary()


def test_a_vulkan_node_without_a_driver_is_warned_about_not_refused():
    res, said = check("vulkan", facts("vulkan"))
    assert not res.changed  # the run goes on
    (warning,) = said
    assert warning.startswith("WARNING: rpc-a: llama_backend=vulkan but a Vulkan driver (an ICD manifest in "
                              + ", ".join(VULKAN_ICD_DIRS) + ") was not found"), warning
    assert "mesa-vulkan-drivers" in warning and "never installs a GPU driver" in warning
    assert "serves CPU only" in warning  # what will refuse it, and when
    assert "WARNING llama_backend=vulkan" in res.msg  # the task's own line says it too
    # With the driver's manifest there: nothing to say.
    res, said = check("vulkan", facts("vulkan", LVP))
    assert said == [] and "WARNING" not in res.msg
    # The install pass after the lock does not say it again.
    assert check("vulkan", facts("vulkan"), plan_only=False)[1] == []


def test_a_hip_node_names_the_kernel_driver_and_rocm():
    _, said = check("hip", facts("hip"))
    assert len(said) == 2 and all(w.startswith("WARNING: rpc-a: llama_backend=hip but ") for w in said), said
    assert "/dev/kfd was not found" in said[0] and "amdgpu" in said[0]
    assert "rocminfo was not found" in said[1] and "ROCm" in said[1]
    # AMD's packages put rocminfo in /opt/rocm/bin, off the PATH: found there too.
    assert check("hip", facts("hip", "file:/dev/kfd=yes\nfile:/opt/rocm/bin/rocminfo=yes\n"))[1] == []


def test_a_cuda_node_without_the_nvidia_driver_is_refused_naming_the_host():
    with pytest.raises(TaskFailed) as e:
        check("cuda", facts("cuda"))
    msg = str(e.value)
    assert msg.startswith("rpc-a: llama_backend=cuda but nvidia-smi is not installed"), msg
    assert "nvidia-driver" in msg and "never installs a GPU driver" in msg and msg.endswith("No host was changed")
    res, said = check("cuda", facts("cuda", "tool:nvidia-smi=/usr/bin/nvidia-smi\n"))
    assert said == [] and not res.changed
    # Neither the toolkit nor the driver: one message naming both.
    bare = parse_facts((DATA / "bookworm-root-toolchain.txt").read_text() + "".join(f"file:{p}=yes\n" for p in FIXED))
    with pytest.raises(TaskFailed, match=r"^rpc-a: missing nvcc \(.*\): not installable by tunnelspec, install it "
                                         r"yourself; llama_backend=cuda but nvidia-smi is not installed"):
        check("cuda", bare)


def test_metal_is_refused_on_linux():
    with pytest.raises(TaskFailed, match=r"^rpc-a: llama_backend=metal, but Metal exists on macOS only"):
        check("metal", facts("metal"))


def test_a_cpu_host_needs_no_driver():
    res, said = check("cpu", facts("cpu"))
    assert said == [] and "WARNING" not in res.msg
    assert prereqs.runtime_findings("cpu", facts("cpu")) == ([], [])


def test_the_readme_table_names_the_drivers():
    table = prereqs.markdown_table()
    for r in prereqs.RUNTIME:
        assert f"llama_backend={r.backend}" in table and r.provides in table
    assert "never installed by tunnelspec" in table
