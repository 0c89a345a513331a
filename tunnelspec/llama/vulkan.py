"""What a tree's Vulkan backend needs from the host's Vulkan headers, read from both (no build).

ggml-vulkan follows the Vulkan SDK closely: b9093 and b11434 use VK_EXT_layer_settings
(`vk::LayerSettingEXT`, headers 1.3.261 and later), which Debian 12's libvulkan-dev (1.3.239) lacks —
the compile fails deep in ggml-vulkan.cpp. Checked before configuring, the node is refused with the
reason instead."""

from __future__ import annotations

import re

VULKAN_CORE_H = "/usr/include/vulkan/vulkan_core.h"
GGML_VULKAN_CPP = "ggml/src/ggml-vulkan/ggml-vulkan.cpp"
# (what the tree uses, the header's name for it, the first header version that has it)
NEEDS = (("LayerSettingEXT", "VK_EXT_layer_settings", 261),)

# Prints, one per line: the tree's uses (`tree:<what>`), the header's extensions (`header:<name>`),
# and `version:<VK_HEADER_VERSION>`.
PROBE = r"""src="$1"; h="$2"; shift 2
for what in "$@"; do
  w=${what%%=*}; e=${what#*=}
  grep -q "$w" "$src" 2>/dev/null && echo "tree:$w"
  grep -q "$e" "$h" 2>/dev/null && echo "header:$e"
done
sed -n 's/^#define VK_HEADER_VERSION \([0-9][0-9]*\).*/version:\1/p' "$h" 2>/dev/null
"""


def probe_argv(src_dir: str) -> list[str]:
    return [
        "sh",
        "-c",
        PROBE,
        "sh",
        f"{src_dir.rstrip('/')}/{GGML_VULKAN_CPP}",
        VULKAN_CORE_H,
        *(f"{w}={e}" for w, e, _ in NEEDS),
    ]


def refusal(host: str, probe_output: str) -> str | None:
    """The reason the host's Vulkan headers cannot build this tree, or None."""
    lines = set(probe_output.split())
    m = re.search(r"^version:(\d+)$", probe_output, re.M)
    version = f"1.3.{m.group(1)}" if m else "unknown"
    for what, ext, first in NEEDS:
        if f"tree:{what}" in lines and f"header:{ext}" not in lines:
            return (
                f"{host}: this llama.cpp tree's Vulkan backend uses {ext} (vk::{what}), which the host's "
                f"Vulkan headers ({VULKAN_CORE_H}, version {version}) lack: it needs headers 1.3.{first} "
                "or later (libvulkan-dev of Debian 13, Ubuntu 24.04, or the LunarG SDK). Debian 12's "
                "1.3.239 cannot build it; pin an older llama.cpp or upgrade the node"
            )
    return None
