"""The example inventories in examples/: each parses (the real CLI), passes the cluster checks, and
composes the llama-server command line it promises against the fixture build's real --help. The
CPU one (seed 003) also runs `deploy --check` in the lab, its hosts swapped for the lab's."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tunnelspec.core.errors import ClusterError
from tunnelspec.inventory import load_inventory
from tunnelspec.cluster.model import Cluster
from tunnelspec.llama import flags
from tunnelspec.components.server.args import build_server_argv

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
HELP = ROOT / "tests/server/data/llama-server-help.txt"

# What each example must turn into (flag → value), with one RPC device per node in [rpc] order.
EXPECT = {
    "seed000-mtp-laptop-gpu.ini": {"-dev": "CUDA0", "--spec-type": "draft-mtp", "--spec-draft-device": "RPC0",
                                   "--spec-draft-n-max": "3",
                                   "--spec-draft-model": "/srv/models/mtp-Qwen3.6-27B-Q4_0.gguf"},
    "seed004-tensor-parallel-dflash.ini": {"-dev": "CUDA0,CUDA1", "-sm": "tensor", "--spec-type": "draft-dflash",
                                           "--spec-draft-device": "RPC0"},
    # No draft: no --spec-* at all; main's CPU share CPU=2 of 6 over N_LAYER + 1 = 81 slots keeps 27.
    "seed003-layers-on-two-nodes.ini": {"-dev": "RPC0,RPC1", "-ts": "1,3", "-sm": "layer", "-ngl": "54",
                                        "--spec-type": None, "--spec-draft-device": None},
    # Three endpoints: main's CPU=1 of 4 keeps 20 of 81 slots.
    "seed003-layers-on-three-nodes.ini": {"-dev": "RPC0,RPC1,RPC2", "-ts": "1,1,1", "-sm": "layer", "-ngl": "61",
                                          "--spec-type": None, "--spec-draft-device": None},
}
N_LAYER = 80  # the block count the composed argv assumes (a 70B-class model)


def test_every_example_is_tested_and_referenced_from_the_readme():
    assert sorted(p.name for p in EXAMPLES.glob("*.ini")) == sorted(EXPECT)
    readme = (ROOT / "README.md").read_text()
    for name in EXPECT:
        assert f"examples/{name}" in readme


@pytest.mark.parametrize("name", sorted(EXPECT))
def test_example_parses_validates_and_composes(name):
    path = EXAMPLES / name
    assert path.read_text().startswith("# Seed"), "each example opens with a comment saying what it deploys"
    res = subprocess.run([sys.executable, "-m", "tunnelspec", "inventory", "list", str(path)],
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    assert "main" in json.loads(res.stdout)
    inv = load_inventory(path)
    c = Cluster.from_inventory(inv)
    c.require_models()
    by_port = {n.tunnel_port: [f"RPC{i}"] for i, n in enumerate(c.rpc)}
    argv = build_server_argv(c, flags.parse_help(HELP.read_text(), "fixture"), by_port, "llama-server",
                             c.main.model, c.main.draft_model, n_layer=N_LAYER).argv
    got = {flag: argv[argv.index(flag) + 1] if flag in argv else None for flag in EXPECT[name]}
    assert got == EXPECT[name]


def test_seed000_in_the_lab_differs_only_in_hosts_models_and_all_vars(tmp_path):
    """The variant tests/deploy/test_mtp_lab.py deploys, built here against an inventory as `lab up`
    writes it: the main server and the laptop become the lab's CPU hosts, the 27B files the tiny MTP pair;
    the speculative settings compose as in the example, the target on main's CPU."""
    from types import SimpleNamespace

    from support.seed000 import changed_lines
    from support.seed000 import lab_variant as seed000_variant

    from support import gguf_mtp
    from tunnelspec.lab.outputs import inventory_text

    fx = SimpleNamespace(repo="/srv/tunnelspec-fixtures/llama.cpp.git", build_number=11434,
                         commit="d4f3039b1fa47e918560a0e6f29b9dec16fc54b5",
                         model="/srv/tunnelspec-fixtures/models/tiny-llama.gguf")
    (tmp_path / "known_hosts").write_text("")
    lab = inventory_text({"main": "10.77.0.10", "rpc-a": "10.77.0.11", "rpc-b": "10.77.0.12"},
                         tmp_path / "id_ed25519", tmp_path / "known_hosts", fx)
    target, draft = tmp_path / "mtp-target.gguf", tmp_path / "mtp-draft.gguf"
    gguf_mtp.write_mtp_target(target)
    gguf_mtp.write_mtp_draft(draft)
    example = (EXAMPLES / "seed000-mtp-laptop-gpu.ini").read_text()
    text = seed000_variant(example, lab, str(target), str(draft))
    diff = changed_lines(example, text)
    assert {why for why, _, _ in diff} == {"host", "model", "all:vars"}, diff
    assert [(old, new) for why, old, new in diff if why == "host"] == [
        ("srv ansible_host=192.0.2.20 llama_backend=cuda llama_target_devices=CUDA0", "main ansible_host=10.77.0.10"),
        ("laptop ansible_host=192.0.2.30 rpc_role=draft llama_backend=cuda rpc_devices=CUDA0",
         "rpc-a ansible_host=10.77.0.11 rpc_role=draft")]
    assert [new for why, _, new in diff if why == "model"] == [f"llama_model={target}", f"llama_draft_model={draft}"]
    path = tmp_path / "seed000-lab.ini"
    path.write_text(text)
    c = Cluster.from_inventory(load_inventory(path))
    c.require_models()
    argv = build_server_argv(c, flags.parse_help(HELP.read_text(), "fixture"), {c.rpc[0].tunnel_port: ["RPC0"]},
                             "llama-server", c.main.model, c.main.draft_model, n_layer=N_LAYER).argv
    want = {"-dev": "none", "--spec-type": "draft-mtp", "--spec-draft-device": "RPC0", "--spec-draft-n-max": "3",
            "--spec-draft-model": str(draft)}
    assert {flag: argv[argv.index(flag) + 1] if flag in argv else None for flag in want} == want


def lab_variant(example: Path, lab) -> Path:
    """The example with the lab's hosts, keys, source and model: its own placement and speculative
    settings kept as written."""
    lab_text = Path(lab.inventory).read_text()
    lab_all = lab_text[lab_text.index("[all:vars]"):]
    ips = dict(re.findall(r"^(\S+) ansible_host=(\S+)", lab_text, re.M))
    text = example.read_text()
    if "llama_draft_model" not in text:  # a split with no draft stays one
        lab_all = re.sub(r"^llama_draft_model=.*\n", "", lab_all, flags=re.M)
    # The lab's model replaces the example's, wherever the example names it.
    text = re.sub(r"^llama_(draft_)?model=.*\n", "", text[:text.index("[all:vars]")], flags=re.M) + lab_all
    for host, ip in ips.items():
        text = re.sub(rf"^{re.escape(host)} ansible_host=\S+", f"{host} ansible_host={ip}", text, flags=re.M)
    out = Path(lab.dir) / f"example-{example.stem}.ini"
    out.write_text(text)
    return out


@pytest.mark.lab
def test_seed003_example_deploy_check_in_the_lab(lab):
    from support.cli import tunnelspec

    # The lab's own deploy first (a no-op when an earlier test deployed it): the plan check reads the
    # built llama-server's --help, which a fresh lab has not built yet.
    base = tunnelspec("deploy", lab.inventory, "--format", "json", timeout=3600)
    assert base.rc == 0, base.stdout[-4000:] + base.stderr[-2000:]
    inv = lab_variant(EXAMPLES / "seed003-layers-on-two-nodes.ini", lab)
    r = tunnelspec("deploy", str(inv), "--check", "--format", "json", timeout=1800)
    assert r.rc in (0, 3), r.stdout[-4000:] + r.stderr[-2000:]
    assert not r.results("failed"), r.results("failed")
    plan = next(e for e in r.results() if e.get("module") == "llama_server_plan")
    assert plan["status"] == "ok", (plan.get("msg"), plan.get("after"))
