"""A newcomer follows only the README, docs/, the example inventories and SECURITY.md:
what those pages promise is checked here against the code, so a page cannot drift from it.

- README "What each host needs" is exactly the code's prerequisites table (no row more or less);
- README opens with exactly two set-up commands, the real-cluster path is its own section below;
- every inventory the README and docs/first-cluster.md show (one per seed topology), with its
  placeholders filled as the text says, is a valid cluster;
- the commented llama_patches lines (inventory.example.ini/.yml, seed 004's example), once
  uncommented, give the patch forms they describe, with every SHA quoted (an unquoted all-digit SHA
  would read as a number and be refused);
- the shipped patch file is one `git apply` reads;
- the jump-host example's tunnel address is what main's tunnel ssh dials.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from tunnelspec.components.host import prereqs
from tunnelspec.inventory import load_inventory
from tunnelspec.cluster.model import Cluster

REPO = Path(__file__).resolve().parents[1]
README = (REPO / "README.md").read_text()
FIRST = (REPO / "docs" / "first-cluster.md").read_text()
# A SHA of digits only: unquoted in INI it would be a number, in YAML an int.
DIGITS_SHA = "1234567890" * 4


def section(text: str, heading: str) -> str:
    m = re.search(rf"^## {re.escape(heading)}\n(.*?)(?=^## |\Z)", text, re.S | re.M)
    assert m, f"no '## {heading}' section"
    return m.group(1)


def ini_blocks(text: str) -> list[str]:
    return re.findall(r"```ini\n(.*?)```", text, re.S)


def fill(text: str) -> str:
    """The placeholders the pages ask the reader to replace, replaced as the reader would."""
    text = re.sub(r"<full (40-hex )?SHA[^>]*>", DIGITS_SHA, text)
    return text.replace("<40-hex SHA>", DIGITS_SHA)


def cluster_of(tmp_path: Path, text: str, name: str = "inventory.ini") -> Cluster:
    path = tmp_path / name
    path.write_text(text)
    c = Cluster.from_inventory(load_inventory(path))
    return c


# ---- README: the top, and what each host needs -----------------------------------------------------
def test_readme_opens_with_exactly_two_set_up_commands_and_the_real_cluster_path_below():
    setup = section(README, "Set up (fresh Debian/Ubuntu machine, as root)")
    (block,) = re.findall(r"```sh\n(.*?)```", setup, re.S)
    commands = [line.split("#")[0].strip() for line in block.splitlines() if line.strip()]
    assert commands == ["bash scripts/demo.sh", "bash scripts/test.sh"]
    headings = re.findall(r"^## (.+)$", README, re.M)
    assert headings.index("Set up (fresh Debian/Ubuntu machine, as root)") == 0
    assert headings.index("On a real cluster") == 1
    real = section(README, "On a real cluster")
    # Install on the controller: one command, and the Python version pyproject.toml requires.
    import tomllib

    needed = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["requires-python"]
    assert needed.startswith(">=")
    words = " ".join(real.split())
    assert "pipx install ./tunnelspec" in words and f"Python {needed[2:]} or newer" in words


def test_readme_what_each_host_needs_is_the_code_table_row_for_row():
    real = section(README, "On a real cluster")
    after = real[real.index("**What each host needs.**"):]
    rows = []
    for line in after[after.index("\n|"):].splitlines()[1:]:
        if not line.startswith("|"):
            break
        rows.append(line)
    assert "\n".join(rows) == prereqs.markdown_table(), \
        "README.md 'What each host needs': paste the output of `python -m tunnelspec.components.host.prereqs`"


# ---- the inventories the pages show ------------------------------------------------------------------
def test_readme_quickstart_inventory_is_a_valid_cluster(tmp_path):
    (block,) = ini_blocks(section(README, "Quickstart on real hardware: a laptop GPU drafts for a server"))
    c = cluster_of(tmp_path, fill(block))
    c.require_models()
    assert c.main.name == "srv" and [n.name for n in c.rpc] == ["laptop"]
    assert c.source.commit == DIGITS_SHA and c.source.build_number is None  # derived on the hosts


@pytest.mark.parametrize("heading", ["1. A laptop GPU drafts for a server (seed 000)",
                                     "2. One model's layers split over nodes (seed 003)",
                                     "3. Two GPUs plus an AMD box, on a patched tree (seed 004)"])
def test_first_cluster_inventories_are_valid(tmp_path, heading):
    blocks = [b for b in ini_blocks(section(FIRST, heading)) if "[main]" in b or "llama_patches=" in b]
    assert blocks, heading
    full = [b for b in blocks if "[main]" in b]
    if full:
        c = cluster_of(tmp_path, fill(full[0]))
        c.require_models()
    for b in blocks:
        if b.startswith("llama_patches="):  # seed 004's stack, as the reader writes it into the example
            patches = seed004_patches(tmp_path, fill(b).strip())
            assert [p.kind for p in patches] == ["pr", "remote", "file"]
            assert patches[0].commit == DIGITS_SHA and patches[0].head is None  # one commit, not the PR


def seed004_patches(tmp_path: Path, patch_line: str):
    shutil.copytree(REPO / "examples" / "patches", tmp_path / "patches", dirs_exist_ok=True)
    text = (REPO / "examples" / "seed004-tensor-parallel-dflash.ini").read_text()
    return cluster_of(tmp_path, text + patch_line + "\n", "seed004.ini").source.patches


def test_seed004_commented_patch_stack_is_valid_once_filled(tmp_path):
    text = (REPO / "examples" / "seed004-tensor-parallel-dflash.ini").read_text()
    (line,) = re.findall(r"^# (llama_patches=.*)$", text, re.M)
    assert "1a6fee5" in line and "1784fc3" in line  # the write-up's commits, named for the reader
    patches = seed004_patches(tmp_path, fill(line))
    assert [(p.kind, p.pr) for p in patches] == [("pr", 26636), ("remote", None), ("file", None)]
    # As shipped (commented out), the example deploys no patch: nothing short is active.
    assert cluster_of(tmp_path, text, "as-shipped.ini").source.patches == ()


def test_inventory_example_ini_patch_line_gives_both_pr_forms(tmp_path):
    text = (REPO / "inventory.example.ini").read_text()
    (line,) = re.findall(r"^# (llama_patches=\[.*)$", text, re.M)
    (tmp_path / "patches").mkdir()
    (tmp_path / "patches" / "x.patch").write_text("diff --git a/x b/x\n--- a/x\n+++ b/x\n@@ -1 +1 @@\n-a\n+b\n")
    c = cluster_of(tmp_path, text + fill(line) + "\n")
    assert [(p.kind, p.head is not None) for p in c.source.patches] == [("pr", True), ("pr", False), ("file", False)]
    assert c.source.patches[0].head == DIGITS_SHA and c.source.patches[1].commit == DIGITS_SHA


def test_inventory_example_yml_patch_list_is_quoted_and_gives_both_pr_forms(tmp_path):
    text = (REPO / "inventory.example.yml").read_text()
    lines = text.splitlines()
    i = next(n for n, line in enumerate(lines) if line.strip().startswith("# llama_patches:"))
    block = [lines[i]]
    for line in lines[i + 1:]:
        if not re.match(r"^\s*#\s+- ", line):
            break
        block.append(line)
    uncommented = [re.sub(r"^(\s*)# ?", r"\1", line) for line in block]
    uncommented[0] = uncommented[0].split("#")[0].rstrip()  # the trailing comment of the key line
    text = text.replace("\n".join(block), fill("\n".join(uncommented)))
    (tmp_path / "patches").mkdir()
    (tmp_path / "patches" / "x.patch").write_text("diff --git a/x b/x\n--- a/x\n+++ b/x\n@@ -1 +1 @@\n-a\n+b\n")
    c = cluster_of(tmp_path, text, "inventory.yml")
    assert [(p.kind, p.head, p.commit) for p in c.source.patches[:2]] == [("pr", DIGITS_SHA, None),
                                                                         ("pr", None, DIGITS_SHA)]
    assert c.source.patches[2].kind == "file"


def test_shipped_patch_file_is_a_git_apply_patch():
    res = subprocess.run(["git", "apply", "--numstat", str(REPO / "examples" / "patches" / "dflash-coal-rpc.patch")],
                         capture_output=True, text=True, cwd=REPO, timeout=60)
    assert res.returncode == 0, res.stderr
    files = {line.split("\t")[2] for line in res.stdout.splitlines()}
    assert files == {"common/speculative.cpp", "src/models/dflash.cpp"}


def test_jump_host_example_dials_the_tunnel_address(tmp_path):
    from tunnelspec.components.tunnel.units import node_ssh_target

    (line,) = [b for b in ini_blocks(section(FIRST, "Main reaches a node by another address"))]
    rpc_line = next(x for x in line.splitlines() if x.startswith("laptop "))
    inv_text = ("[main]\nsrv ansible_host=192.168.1.20\n\n[rpc]\n" + rpc_line + "\n\n[all:vars]\n"
                f'llama_repo=https://github.com/ggml-org/llama.cpp\nllama_commit="{DIGITS_SHA}"\n')
    (tmp_path / "a.ini").write_text(inv_text)
    inv = load_inventory(tmp_path / "a.ini")
    Cluster.from_inventory(inv)
    assert node_ssh_target(inv, "laptop") == ("192.168.1.30", 22)
    # Without tunnel_ssh_port the port follows ansible_port: the pitfall the page warns about.
    (tmp_path / "b.ini").write_text(inv_text.replace(" tunnel_ssh_port=22", ""))
    assert node_ssh_target(load_inventory(tmp_path / "b.ini"), "laptop") == ("192.168.1.30", 2222)
