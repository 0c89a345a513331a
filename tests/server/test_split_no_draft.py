"""Pure: a target split with no draft (seed 003) — the inventory's rules, the command line against
every captured real `--help`, main's CPU share as -ngl, nodes left out (`absent`), and the proof read
from llama-server's load lines (llama/split_proof.py) on the lab's real tiny GGUF."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tunnelspec.core.errors import ClusterError, TaskFailed
from tunnelspec.inventory import load_inventory
from tunnelspec.cluster.model import Cluster
from tunnelspec.lab import gguf_tiny
from tunnelspec.llama import flags, split_proof
from tunnelspec.llama.served_plan import ServedPlan
from tunnelspec.components.server.args import build_server_argv, cpu_layers, layer_counts

from support.placement import expected_layers

SHA = "8c22f3ff082f60e8b97ed51afbf8e51e63208260"
DATA = Path(__file__).resolve().parent / "data"
HELPS = {p.stem.removeprefix("llama-server-help-"): p for p in DATA.glob("llama-server-help*.txt")}
BY_PORT = {15052: ["RPC0"], 15053: ["RPC1"]}
DRAFT_FLAGS = ("--spec-type", "--spec-draft-model", "-md", "--model-draft", "--spec-draft-device", "-devd",
               "--device-draft", "--spec-draft-ngl", "-ngld", "--gpu-layers-draft", "--spec-draft-n-max",
               "--spec-draft-p-min", "--draft-max", "--draft-p-min")


def help_of(name: str = "b11434") -> flags.ServerHelp:
    return flags.parse_help(HELPS[name].read_text(), build=name)


def inventory(tmp_path: Path, main_vars: str = "", a: str = "rpc_role=target", b: str = "rpc_role=target",
              draft_model: str = "", extra_rpc: str = "") -> Path:
    path = tmp_path / "inventory.ini"
    path.write_text(f"""[main]
main ansible_host=10.77.0.10 {main_vars}

[rpc]
rpc-a ansible_host=10.77.0.11 {a}
rpc-b ansible_host=10.77.0.12 {b}
{extra_rpc}
[all:vars]
llama_repo=/srv/llama.cpp.git
llama_commit={SHA}
llama_model=/m/target.gguf
{draft_model}
""")
    return path


def cluster(tmp_path: Path, *args, **kw) -> Cluster:
    return Cluster.from_inventory(load_inventory(inventory(tmp_path, *args, **kw)))


def value(argv: list[str], flag: str) -> str:
    return argv[argv.index(flag) + 1]


# ---- the inventory --------------------------------------------------------------------------------
def test_every_node_a_target_and_no_draft_model_is_a_split(tmp_path):
    c = cluster(tmp_path)
    c.require_models()
    assert not c.speculative and c.draft_node is None
    assert [n.name for n in c.target_nodes] == ["rpc-a", "rpc-b"]


def test_a_draft_model_without_a_draft_node_is_refused_at_its_line(tmp_path):
    c = cluster(tmp_path, draft_model="llama_draft_model=/m/d.gguf")
    with pytest.raises(ClusterError) as e:
        c.require_models()
    assert e.value.var == "llama_draft_model" and "no rpc node has rpc_role=draft" in str(e.value)
    assert str(e.value).startswith(f"{tmp_path / 'inventory.ini'}:12:"), str(e.value)


def test_a_draft_node_without_a_draft_model_is_refused_at_the_node(tmp_path):
    # rpc_role defaults to draft: a node without it is the draft node.
    c = cluster(tmp_path, a="")
    with pytest.raises(ClusterError) as e:
        c.require_models()
    assert (e.value.host, e.value.var) == ("rpc-a", "rpc_role") and "llama_draft_model is not set" in str(e.value)
    assert str(e.value).startswith(f"{tmp_path / 'inventory.ini'}:5:"), str(e.value)


@pytest.mark.parametrize("var", ["spec_type=draft-simple", "spec_draft_n_max=4", "spec_draft_p_min=0.5"])
def test_draft_settings_without_a_draft_are_refused(tmp_path, var):
    c = cluster(tmp_path, main_vars=var)
    with pytest.raises(ClusterError, match="this cluster has none") as e:
        c.require_models()
    assert e.value.var == var.split("=")[0]


def test_speculation_stays_the_default_with_a_draft(tmp_path):
    c = cluster(tmp_path, a="rpc_role=draft", draft_model="llama_draft_model=/m/d.gguf")
    c.require_models()
    assert c.speculative
    plan = build_server_argv(c, help_of(), BY_PORT, "/b/llama-server", "/m/t.gguf", "/m/d.gguf")
    assert plan.kind == "speculative" and value(plan.argv, "--spec-type") == "draft-simple"
    assert value(plan.argv, "--spec-draft-device") == "RPC0" and value(plan.argv, "-dev") == "RPC1"


def test_a_cpu_share_and_an_ngl_in_extra_args_are_refused(tmp_path):
    with pytest.raises(ClusterError, match="keep one of the two") as e:
        cluster(tmp_path, main_vars='llama_tensor_split="CPU=2,rpc-a=1,rpc-b=3" llama_server_extra_args="-ngl 5"')
    assert e.value.var == "llama_tensor_split"


# ---- the command line ------------------------------------------------------------------------------
@pytest.mark.parametrize("build", sorted(HELPS))
def test_no_draft_argument_at_all_on_every_build(tmp_path, build):
    c = cluster(tmp_path)
    plan = build_server_argv(c, help_of(build), BY_PORT, "/b/llama-server", "/m/t.gguf", None)
    assert not set(DRAFT_FLAGS) & set(plan.argv), plan.argv
    assert value(plan.argv, "--rpc") == "127.0.0.1:15052,127.0.0.1:15053"
    assert value(plan.argv, "-dev") == "RPC0,RPC1" and value(plan.argv, "-m") == "/m/t.gguf"
    fact = plan.as_fact()
    assert (fact["kind"], fact["draft_node"], fact["draft_devices"], fact["draft_port"], fact["spec_type"]) == (
        "split", None, [], None, None)
    assert fact["nodes"] == {"rpc-a": ["RPC0"], "rpc-b": ["RPC1"]}


def test_seed_003_shares_main_cpu_2_nodes_1_3(tmp_path):
    # 11 blocks + the output layer = 12 slots: CPU 12 * 2/6 = 4 stay, -ngl 8 leave; of those RPC0
    # takes 8 * 1/4 = 2 and RPC1 6 — exactly 2:1:3.
    c = cluster(tmp_path, main_vars='llama_split_mode=layer llama_tensor_split="CPU=2,rpc-a=1,rpc-b=3"')
    plan = build_server_argv(c, help_of(), BY_PORT, "/b/llama-server", "/m/t.gguf", None, n_layer=11)
    a = plan.argv
    assert (value(a, "-dev"), value(a, "-ts"), value(a, "-ngl"), value(a, "-sm")) == ("RPC0,RPC1", "1,3", "8", "layer")
    assert a.index("--rpc") < a.index("-dev")
    assert plan.layers == [("CPU", 4), ("RPC0", 2), ("RPC1", 6)] and plan.gpu_layers == 8
    assert plan.as_fact()["cpu_weight"] == 2.0


def test_cpu_share_needs_the_block_count(tmp_path):
    c = cluster(tmp_path, main_vars='llama_tensor_split="CPU=1,rpc-a=1,rpc-b=3"')
    with pytest.raises(TaskFailed, match="block count is unknown"):
        build_server_argv(c, help_of(), BY_PORT, "/b/llama-server", "/m/t.gguf", None)


def test_cpu_share_with_a_local_gpu_and_the_old_spelling(tmp_path):
    c = cluster(tmp_path, main_vars='llama_target_devices=CUDA0 llama_tensor_split="CUDA0=2,CPU=1,rpc-a=1,rpc-b=0"')
    plan = build_server_argv(c, help_of("b9093"), BY_PORT, "/b/llama-server", "/m/t.gguf", None, n_layer=31)
    # 32 slots: CPU round(32 / 4) = 8; the other 24 over CUDA0 2, RPC0 1 (rpc-b 0): 16 and 8.
    assert value(plan.argv, "-dev") == "CUDA0,RPC0,RPC1" and value(plan.argv, "-ts") == "2,1,0"
    ngl = next(f for f in ("-ngl", "--gpu-layers", "--n-gpu-layers") if f in plan.argv)
    assert value(plan.argv, ngl) == "24" and plan.layers == [("CPU", 8), ("CUDA0", 16), ("RPC0", 8), ("RPC1", 0)]


@pytest.mark.parametrize("weights,slots", [([1, 3], 12), ([1, 1, 3], 12), ([2, 1, 3], 12), ([1, 2], 81),
                                           ([0, 1], 5), ([3, 3, 1, 1], 65)])
def test_layer_counts_is_llama_cpp_rule(weights, slots):
    assert layer_counts(weights, slots) == expected_layers(weights, slots)
    assert sum(layer_counts(weights, slots)) == slots


def test_cpu_layers_round_to_the_nearest_slot():
    assert (cpu_layers(2, 6, 12), cpu_layers(1, 5, 12), cpu_layers(0, 5, 12), cpu_layers(5, 5, 12)) == (4, 2, 0, 12)


# ---- nodes left out --------------------------------------------------------------------------------
def test_absent_draft_node_means_no_draft_arguments_and_renumbered_devices(tmp_path):
    c = cluster(tmp_path, a="rpc_role=draft", draft_model="llama_draft_model=/m/d.gguf")
    plan = build_server_argv(c, help_of(), BY_PORT, "/b/llama-server", "/m/t.gguf", "/m/d.gguf",
                             absent=frozenset({"rpc-a"}))
    assert not set(DRAFT_FLAGS) & set(plan.argv), plan.argv
    assert value(plan.argv, "--rpc") == "127.0.0.1:15053" and value(plan.argv, "-dev") == "RPC0"
    assert plan.draft_node is None and plan.absent == ("rpc-a",) and plan.nodes == {"rpc-b": ["RPC0"]}


def test_absent_middle_node_renumbers_a_two_device_node(tmp_path):
    c = cluster(tmp_path, extra_rpc="rpc-c ansible_host=10.77.0.13 rpc_role=target")
    by_port = {15052: ["RPC0"], 15053: ["RPC1"], 15054: ["RPC2", "RPC3"]}
    plan = build_server_argv(c, help_of(), by_port, "/b/llama-server", "/m/t.gguf", None, absent=frozenset({"rpc-b"}))
    assert value(plan.argv, "--rpc") == "127.0.0.1:15052,127.0.0.1:15054"
    assert value(plan.argv, "-dev") == "RPC0,RPC1,RPC2"
    # A node left out needs no device map entry either (its tunnel may be down).
    plan = build_server_argv(c, help_of(), {15052: ["RPC0"], 15054: ["RPC2", "RPC3"]}, "/b/llama-server",
                             "/m/t.gguf", None, absent=frozenset({"rpc-b"}))
    assert value(plan.argv, "-dev") == "RPC0,RPC1,RPC2"


def test_absent_keeps_the_old_endpoint_names(tmp_path):
    c = cluster(tmp_path)
    by_port = {15052: ["RPC[127.0.0.1:15052]"], 15053: ["RPC[127.0.0.1:15053]"]}
    plan = build_server_argv(c, help_of("b9093"), by_port, "/b/llama-server", "/m/t.gguf", None,
                             absent=frozenset({"rpc-a"}))
    assert value(plan.argv, "-dev") == "RPC[127.0.0.1:15053]"


def test_absent_shares_over_what_remains_and_unknown_names_refused(tmp_path):
    c = cluster(tmp_path, main_vars='llama_tensor_split="CPU=2,rpc-a=1,rpc-b=3"')
    plan = build_server_argv(c, help_of(), BY_PORT, "/b/llama-server", "/m/t.gguf", None, n_layer=11,
                             absent=frozenset({"rpc-a"}))
    # CPU 2 of 5 of 12 slots = 4.8 → 5 stay; the other 7 on RPC0 (rpc-b).
    assert value(plan.argv, "-dev") == "RPC0" and value(plan.argv, "-ts") == "3" and value(plan.argv, "-ngl") == "7"
    with pytest.raises(TaskFailed, match="rpc-z"):
        build_server_argv(c, help_of(), BY_PORT, "/b", "/m/t.gguf", None, n_layer=11, absent=frozenset({"rpc-z"}))


def test_every_node_absent_serves_main_alone(tmp_path):
    c = cluster(tmp_path, main_vars='llama_tensor_split="CPU=2,rpc-a=1,rpc-b=3"')
    plan = build_server_argv(c, help_of(), BY_PORT, "/b/llama-server", "/m/t.gguf", None, n_layer=11,
                             absent=frozenset({"rpc-a", "rpc-b"}))
    assert "--rpc" not in plan.argv and value(plan.argv, "-dev") == "none" and plan.kind == "local"
    assert plan.layers == [("CPU", 12)] and "-ts" not in plan.argv


# ---- the proof from the load lines ---------------------------------------------------------------
@pytest.fixture(scope="module")
def tiny11(tmp_path_factory):
    path = tmp_path_factory.mktemp("gguf") / "tiny-11.gguf"
    gguf_tiny.write_tiny_llama(path, blocks=11)
    return path


def test_slot_bytes_of_a_real_gguf(tiny11):
    data = tiny11.read_bytes()
    slots = split_proof.slot_bytes(data, len(data))
    assert slots is not None and len(slots) == 12
    from support.placement import BLOCK_BYTES, OUTPUT_BYTES
    # Each block's tensors (the file's 32-byte alignment included); the output layer last.
    assert all(BLOCK_BYTES <= s < BLOCK_BYTES + 32 * 9 for s in slots[:-1]), slots
    assert OUTPUT_BYTES <= slots[-1] < OUTPUT_BYTES + 64
    assert split_proof.slot_bytes(data[:300], len(data)) is None  # the table cut: unknown, not wrong


def journal(cpu: int, rpc: list[tuple[int, int, float]], slots: int = 12, draft: str = "") -> str:
    lines = ["0.00.010 I load_tensors: loading model tensors, this can take a while... (load_mode = mmap)",
             f"0.00.050 I load_tensors: offloaded {slots - cpu}/{slots} layers to GPU",
             "0.00.050 I load_tensors:   CPU_Mapped model buffer size =     0.77 MiB"]
    lines += [f"0.00.050 I load_tensors: RPC{i}[127.0.0.1:{port}] model buffer size = {mib:8.2f} MiB"
              for i, port, mib in rpc]
    lines += ["0.00.051 I llama_context: n_ctx = 512", draft]
    return "\n".join(lines)


def plan_fact(tmp_path, tiny11, split='llama_tensor_split="CPU=2,rpc-a=1,rpc-b=3"') -> dict:
    c = cluster(tmp_path, main_vars=split)
    fact = build_server_argv(c, help_of(), BY_PORT, "/b/llama-server", "/m/t.gguf", None, n_layer=11).as_fact()
    data = tiny11.read_bytes()
    fact["slot_bytes"] = split_proof.slot_bytes(data, len(data))
    return fact


def test_check_split_reads_cpu_from_offloaded_and_nodes_from_buffer_sizes(tmp_path, tiny11):
    fact = plan_fact(tmp_path, tiny11)
    s = fact["slot_bytes"]
    rpc0, rpc1 = sum(s[4:6]) / 2**20, sum(s[6:12]) / 2**20
    # Each server names its first device RPC0: the port says which node.
    ok = split_proof.check_split(journal(4, [(0, 15052, rpc0), (0, 15053, rpc1)]), ServedPlan.from_fact(fact))
    assert ok.ok and ok.seen == [("CPU", 4), ("RPC0", 2), ("RPC1", 6)], ok.message
    assert [round(x, 2) for _, x in ok.asked] == [4.0, 2.0, 6.0]


def test_check_split_refuses_layers_elsewhere(tmp_path, tiny11):
    fact = plan_fact(tmp_path, tiny11)
    s = fact["slot_bytes"]
    # Everything offloaded, 3:9 over the nodes: what the inventory did not ask for.
    plan = ServedPlan.from_fact(fact)
    bad = split_proof.check_split(journal(0, [(0, 15052, sum(s[:3]) / 2**20), (0, 15053, sum(s[3:]) / 2**20)]), plan)
    assert not bad.ok and "not where the proportions say" in bad.message
    assert bad.seen == [("CPU", 0), ("RPC0", 3), ("RPC1", 9)]
    # Within one slot of the asked share is rounding (llama.cpp places whole layers).
    near = split_proof.check_split(journal(3, [(0, 15052, sum(s[3:6]) / 2**20), (0, 15053, sum(s[6:]) / 2**20)]),
                                   plan)
    assert near.ok and near.seen == [("CPU", 3), ("RPC0", 3), ("RPC1", 6)], near.message


def test_check_split_reads_the_target_not_the_draft_and_waits_for_the_lines(tmp_path, tiny11):
    fact = plan_fact(tmp_path, tiny11)
    s = fact["slot_bytes"]
    text = journal(4, [(0, 15052, sum(s[4:6]) / 2**20), (0, 15053, sum(s[6:]) / 2**20)],
                   draft="0.00.090 I load_tensors: offloaded 3/3 layers to GPU\n"
                         "0.00.090 I load_tensors: RPC0[127.0.0.1:15052] model buffer size = 0.34 MiB")
    assert split_proof.check_split(text, ServedPlan.from_fact(fact)).ok
    assert split_proof.check_split("0.00.01 I main: loading model", ServedPlan.from_fact(fact)) is None


def test_check_split_without_slot_bytes_still_proves_main_cpu(tmp_path, tiny11):
    fact = plan_fact(tmp_path, tiny11)
    fact["slot_bytes"] = None
    r = split_proof.check_split(journal(4, [(0, 15052, 0.63), (0, 15053, 1.98)]), ServedPlan.from_fact(fact))
    assert r.ok and r.seen == [("CPU", 4), ("RPC0", None), ("RPC1", None)] and "slot bytes unknown" in r.message
    assert not split_proof.check_split(journal(0, [(0, 15052, 0.63), (0, 15053, 1.98)]), ServedPlan.from_fact(fact)).ok


def test_status_summary_from_the_load_lines_alone():
    text = journal(4, [(0, 15052, 0.31), (0, 15053, 0.96)])
    load = split_proof.target_load(text, {"rpc-a": ["RPC0"], "rpc-b": ["RPC1"]}, {"rpc-a": 15052, "rpc-b": 15053})
    s = split_proof.load_summary(load)
    assert s == {"slots": 12, "cpu_slots": 4, "buffers_mib": {"RPC0": 0.31, "RPC1": 0.96}}
    assert split_proof.describe_summary(s) == "main's CPU keeps 4 of 12 layers; RPC0 0.31 MiB, RPC1 0.96 MiB"
    assert split_proof.describe_summary(None) == "load lines not in this run's journal"
