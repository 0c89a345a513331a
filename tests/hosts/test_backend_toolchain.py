"""A backend may need more of the toolchain than llama.cpp itself: ggml-vulkan's CMakeLists.txt asks for
cmake >= 3.19 (Debian 11 has 3.18), and b11434's for the SPIR-V headers."""

from __future__ import annotations

from pathlib import Path

from tunnelspec.components.host import prereqs
from tunnelspec.facts.host import FILES, parse_facts
from tunnelspec.components.host.host import toolchain_refusals

DATA = Path(__file__).parent / "data"


def facts(cmake: str):
    text = (DATA / "bookworm-root-toolchain.txt").read_text().replace("cmake=cmake version 3.25.1",
                                                                       f"cmake=cmake version {cmake}")
    return parse_facts(text)


def test_vulkan_needs_cmake_319():
    old = facts("3.18.4")  # Debian 11's
    assert toolchain_refusals(old) == []  # enough for the CPU build
    (why,) = toolchain_refusals(old, "vulkan")
    assert "cmake 3.18.4" in why and ">= 3.19" in why and "vulkan" in why and "bullseye-backports" in why
    assert toolchain_refusals(facts("3.19.0"), "vulkan") == []
    # Too old for llama.cpp at all: that reason, once.
    assert len(toolchain_refusals(facts("3.10.2"), "vulkan")) == 1


def test_vulkan_prerequisites_include_the_spirv_headers():
    need = prereqs.Need(role="rpc", backend="vulkan", isolation=True, https_repo=False)
    pkgs = {p.apt for p in prereqs.needed(need)}
    assert {"glslc", "libvulkan-dev", "spirv-headers"} <= pkgs
    spirv = next(p for p in prereqs.needed(need) if p.apt == "spirv-headers")
    assert spirv.what in FILES  # the facts script looks for it
    cpu = prereqs.Need(role="rpc", backend="cpu", isolation=True, https_repo=False)
    assert "spirv-headers" not in {p.apt for p in prereqs.needed(cpu)}
