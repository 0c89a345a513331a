"""The Vulkan header check against the real trees (b9093, b11434 from the upstream fixture repo) and
this machine's real Debian 12 headers (libvulkan-dev 1.3.239, installed by scripts/setup.sh)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tunnelspec.llama import vulkan


def checkout(tmp_path: Path, tree: str) -> Path:
    from support.upstream_fixtures import ensure_upstream_fixtures

    fx = ensure_upstream_fixtures()
    out = tmp_path / tree
    (out / Path(vulkan.GGML_VULKAN_CPP).parent).mkdir(parents=True)
    blob = subprocess.run(["git", "-C", fx.repo_local, "show", f"{fx.tree(tree).commit}:{vulkan.GGML_VULKAN_CPP}"],
                          capture_output=True, check=True, timeout=60).stdout
    (out / vulkan.GGML_VULKAN_CPP).write_bytes(blob)
    return out


def probe(src: Path) -> str:
    return subprocess.run(vulkan.probe_argv(str(src)), capture_output=True, text=True, timeout=30).stdout


@pytest.mark.skipif(not Path(vulkan.VULKAN_CORE_H).exists(), reason="libvulkan-dev not installed")
@pytest.mark.parametrize("tree", ["b9093", "b11434"])
def test_real_trees_against_this_machines_headers(tmp_path, tree):
    out = probe(checkout(tmp_path, tree))
    assert "tree:LayerSettingEXT" in out  # both trees use VK_EXT_layer_settings
    has = "header:VK_EXT_layer_settings" in out
    why = vulkan.refusal("rpc-a", out)
    assert (why is None) == has, (out, why)
    if not has:  # Debian 12's 1.3.239
        assert "rpc-a:" in why and "VK_EXT_layer_settings" in why and "1.3.261" in why and "version 1.3." in why


def test_refusal_from_probe_lines():
    assert vulkan.refusal("n", "tree:LayerSettingEXT\nversion:239\n").startswith("n: this llama.cpp tree")
    assert vulkan.refusal("n", "tree:LayerSettingEXT\nheader:VK_EXT_layer_settings\nversion:309\n") is None
    assert vulkan.refusal("n", "version:239\n") is None
