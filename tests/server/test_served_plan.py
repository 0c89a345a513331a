"""The `llama_server` fact as the tasks after the plan read it (llama/served_plan.py): the fact the
plan task builds — ServerPlan.as_fact() completed by add_serving — read into a frozen ServedPlan,
the same after a JSON round trip (a generation record), and a clear error naming the key for
anything that is not such a fact."""

from __future__ import annotations

import dataclasses
import json

import pytest

from tunnelspec.components.front.model import add_serving
from tunnelspec.components.server.args import build_server_argv
from tunnelspec.core.errors import TaskFailed
from tunnelspec.llama.served_plan import ServedPlan

from server.test_split_no_draft import BY_PORT, cluster, help_of


def served_fact(c, draft_model: str | None, n_layer: int | None = None, fits=None) -> dict:
    """The fact as LlamaServerPlan.check builds it, with what the unit template alone reads cut short."""
    build = help_of()
    plan = build_server_argv(c, build, BY_PORT, "/b/llama-server", "/m/t.gguf", draft_model, n_layer=n_layer)
    fact = plan.as_fact()
    fact.update(slot_bytes=[10, 20, 30] if n_layer == 2 else None, build="b11434 (abc)", rpc_proto="3.0.0",
                unit={"exec_start": fact["exec_start"]})
    add_serving(fact, c, lambda absent: build_server_argv(
        c, build, BY_PORT, "/b/llama-server", "/m/t.gguf", None, absent=absent, n_layer=n_layer),
        "3.0.0", 90, fits=fits)
    return fact


def test_a_speculative_fact_reads_as_its_plan_and_its_degraded_plan(tmp_path):
    c = cluster(tmp_path, a="rpc_role=draft")
    fact = served_fact(c, "/m/d.gguf")
    p = ServedPlan.from_fact(fact)
    assert p.argv == tuple(fact["argv"]) and p.argv[0] == "/b/llama-server"
    assert (p.kind, p.draft_node, p.draft_devices, p.draft_port) == ("speculative", "rpc-a", ("RPC0",), 15052)
    assert (p.target_devices, p.endpoints) == (fact["target_devices"], tuple(fact["endpoints"]))
    assert p.spec_type == fact["spec_type"] and p.build == "b11434 (abc)"
    assert dict(p.nodes) == {"rpc-a": ("RPC0",), "rpc-b": ("RPC1",)}
    assert p.draft_skippable and p.has_degraded_mode and not p.without
    d = p.degraded
    assert d is not None and d.draft_node is None and d.build is None and d.argv == tuple(fact["degraded"]["argv"])
    assert "--spec-type" not in d.argv and dict(d.nodes) == {"rpc-b": ("RPC0",)}  # renumbered without rpc-a
    assert not d.has_degraded_mode


def test_a_split_fact_carries_its_proportions_and_the_plans_without_each_node(tmp_path):
    c = cluster(tmp_path, 'llama_tensor_split="CPU=2,rpc-a=1,rpc-b=3"')
    fact = served_fact(c, None, n_layer=2, fits=lambda node: (node == "rpc-a", "test"))
    p = ServedPlan.from_fact(fact)
    assert p.kind == "split" and p.draft_node is None and p.degraded is None
    assert p.tensor_split == (("RPC0", 1.0), ("RPC1", 3.0)) and p.cpu_weight == 2.0
    assert p.slot_bytes == (10, 20, 30)
    assert list(p.without) == ["rpc-a"] and p.has_degraded_mode
    w = p.without["rpc-a"]
    assert w.endpoints == tuple(fact["without"]["rpc-a"]["endpoints"]) and "rpc-a" not in w.nodes


def test_a_generation_record_reads_the_same(tmp_path):
    """The fact kept as JSON (tuples become lists) gives an equal plan."""
    c = cluster(tmp_path, 'llama_tensor_split="CPU=2,rpc-a=1,rpc-b=3"')
    fact = served_fact(c, None, n_layer=2, fits=lambda node: (True, "test"))
    assert ServedPlan.from_fact(json.loads(json.dumps(fact))) == ServedPlan.from_fact(fact)


def test_the_plan_is_read_only(tmp_path):
    p = ServedPlan.from_fact(served_fact(cluster(tmp_path, a="rpc_role=draft"), "/m/d.gguf"))
    with pytest.raises(dataclasses.FrozenInstanceError):
        p.draft_node = "rpc-b"  # type: ignore[misc]
    with pytest.raises(TypeError):
        p.nodes["rpc-c"] = ("RPC9",)  # type: ignore[index]


@pytest.mark.parametrize(("change", "message"), [
    ({"argv": None}, r"^plan: no argv \(not a llama_server fact\?\)$"),
    ({"argv": "llama-server -m x"}, r"^plan\.argv: 'llama-server -m x' is not a list of strings$"),
    ({"draft_port": "15052"}, r"^plan\.draft_port: '15052' is not an integer$"),
    ({"draft_port": True}, r"^plan\.draft_port: True is not an integer$"),
    ({"nodes": {"rpc-a": "RPC0"}}, r"^plan\.nodes\.rpc-a: 'RPC0' is not a list of strings$"),
    ({"tensor_split": [["RPC0", 1, 2]]}, r"^plan\.tensor_split: \['RPC0', 1, 2\] is not a \(device, weight\) pair$"),
    ({"tensor_split": [["RPC0", "1"]]}, r"^plan\.tensor_split: '1' is not a number$"),
    ({"degraded": {"argv": [7]}}, r"^plan\.degraded\.argv: \[7\] is not a list of strings$"),
    ({"without": {"rpc-b": {"kind": "split"}}}, r"^plan\.without\.rpc-b: no argv"),
    ({"without": {"rpc-b": ["llama-server"]}}, r"^plan\.without\.rpc-b: not a llama_server fact \(a mapping\): list$"),
])
def test_a_fact_that_is_not_a_plan_is_named_at_its_key(tmp_path, change, message):
    fact = {**served_fact(cluster(tmp_path, a="rpc_role=draft"), "/m/d.gguf"), **change}
    with pytest.raises(TaskFailed, match=message):
        ServedPlan.from_fact(fact)


def test_something_else_than_a_mapping_is_refused():
    with pytest.raises(TaskFailed, match=r"^plan: not a llama_server fact \(a mapping\): str$"):
        ServedPlan.from_fact("{{ llama_server }}")
