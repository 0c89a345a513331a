"""docs/first-cluster.md's inventories, and the example files it sends readers to, go through the real
`tunnelspec check` (offline: the inventory, the cluster, the plan) as the page gives them.
Each inventory block is the one after its `<!-- doctest: first-cluster … -->` marker; the only change
is the placeholder the page asks the reader to fill (the commit SHA). The seed 000 example's Mac main
is refused, as the page says. Deploying these needs their hardware (CUDA GPUs); the README's
quickstart, the same shape as topology 1, is deployed in the lab by tests/deploy/test_quickstart_doc_lab.py.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from support.docblocks import blocks

REPO = Path(__file__).resolve().parents[1]
FIRST = REPO / "docs" / "first-cluster.md"
SHA = "0c1e57098bba43ac29e6e3b677cdceebdd22334f"


def check(path: Path, home: Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TUNNELSPEC_")}
    env["HOME"] = str(home)
    return subprocess.run([sys.executable, "-m", "tunnelspec", "check", str(path)], capture_output=True, text=True,
                          env=env, timeout=120, stdin=subprocess.DEVNULL)


def fill(text: str) -> str:
    return re.sub(r"<full (40-hex )?SHA[^>]*>", SHA, text)


def first_cluster_inventories() -> dict[str, str]:
    doc = blocks(FIRST)
    one = doc["first-cluster topology 1"].text
    extra = doc["first-cluster extra-args"].text
    return {
        "topology 1": one,
        # The seed's JSON argument, under [main:vars] of topology 1 as the page says.
        "topology 1 with the seed's extra args": one + "\n" + extra,
        "topology 2": doc["first-cluster topology 2"].text,
    }


def test_every_marked_block_of_first_cluster_is_checked():
    assert set(blocks(FIRST)) == {"first-cluster topology 1", "first-cluster topology 2", "first-cluster extra-args"}


@pytest.mark.parametrize("name", sorted(first_cluster_inventories()))
def test_first_cluster_inventory_passes_check(tmp_path, name):
    path = tmp_path / "inventory.ini"
    path.write_text(fill(first_cluster_inventories()[name]))
    r = check(path, tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "0 error(s)" in r.stdout
    if "extra args" in name:
        assert """--chat-template-kwargs '{"preserve_thinking": true}'""" in r.stdout, r.stdout


@pytest.mark.parametrize("name", ["seed000-mtp-laptop-gpu.ini", "seed003-layers-on-two-nodes.ini",
                                  "seed004-tensor-parallel-dflash.ini"])
def test_linux_examples_pass_check(tmp_path, name):
    r = check(REPO / "examples" / name, tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr


def test_the_seeds_mac_main_is_refused_by_check_as_the_example_says(tmp_path):
    """Seed 000's own main (the Mac line the example keeps in its comment) is refused from the
    inventory alone, naming metal and its line."""
    text = (REPO / "examples" / "seed000-mtp-laptop-gpu.ini").read_text()
    (mac,) = re.findall(r"^#.*the seed's line, refused:\s+(mac ansible_host=\S+ llama_backend=metal \S+)$", text, re.M)
    path = tmp_path / "seed000-mac.ini"
    path.write_text(re.sub(r"^srv ansible_host=.*$", mac, text, flags=re.M))
    r = check(path, tmp_path)
    assert r.returncode == 2, r.stdout + r.stderr
    assert re.search(rf"{re.escape(path.name)}:\d+: host mac: variable llama_backend: metal refused on the main host",
                     r.stdout + r.stderr), r.stdout + r.stderr
