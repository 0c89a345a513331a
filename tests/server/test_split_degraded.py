"""Split-degraded (docs/degraded.md, "A target node of a split"): the deploy renders a command line
"without <node>" for each target node whose loss the remaining devices absorb (the memory fit check),
and the launcher (tunnelspec/hostprogs/draftwatch.py) starts llama-server with it when that node does
not answer within its short wait. Pure: the RPC HELLO is replaced by a table, execv by a record."""

from __future__ import annotations

import importlib.machinery
import importlib.util
import json
import sys
import time
from pathlib import Path

import pytest

from tunnelspec.cluster.model import Cluster
from tunnelspec.commands.status import serving_line
from tunnelspec.components.front import model as front
from tunnelspec.components.server.args import build_server_argv
from tunnelspec.inventory import load_inventory
from tunnelspec.llama import memory_fit as devices

from server.test_split_no_draft import SHA, help_of

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "tunnelspec" / "hostprogs" / "draftwatch.py"
MIB = 2**20
BY_PORT = {15052: ["RPC0"], 15053: ["RPC1"]}


def seed003(tmp_path: Path, split: str = '"CPU=2,rpc-a=1,rpc-b=3"') -> Cluster:
    inv = tmp_path / "inventory.ini"
    inv.write_text(f"""[main]
main ansible_host=10.77.0.10

[main:vars]
llama_model=/m/target.gguf
llama_split_mode=layer
llama_tensor_split={split}

[rpc]
rpc-a ansible_host=10.77.0.11 rpc_role=target
rpc-b ansible_host=10.77.0.12 rpc_role=target

[all:vars]
llama_repo=/srv/llama.cpp.git
llama_commit={SHA}
""")
    return Cluster.from_inventory(load_inventory(inv))


def served(free_mib: int) -> list[dict]:
    return [{"name": "CPU", "free_mib": free_mib, "total_mib": free_mib * 2}]


SHAPE = devices.ModelShape(n_layer=11, n_embd=64, n_head=4, n_head_kv=4, n_vocab=256, n_ctx_train=256)


def plan_builder(c: Cluster):
    help_ = help_of()
    return lambda absent: build_server_argv(c, help_, BY_PORT, "/b/llama-server", "/m/target.gguf", None,
                                            absent=absent, n_layer=11)


def fact_for(c: Cluster, fits) -> dict:
    fact = plan_builder(c)(frozenset()).as_fact()
    fact["unit"] = {}
    front.add_serving(fact, c, plan_builder(c), "3.0.0", 90, fits=fits)
    return fact


def test_split_fits_from_the_remaining_devices(tmp_path):
    c = seed003(tmp_path)
    assert [n.name for n in front.split_candidates(c)] == ["rpc-a", "rpc-b"]
    size = 8 * MIB
    roomy = {"rpc-a": served(4096), "rpc-b": served(4096)}
    ok, why = front.split_fits(c, "rpc-a", size, SHAPE, roomy, (4096 * MIB, 8192 * MIB))
    assert ok is True and "rpc-b" in why and "main" in why, why
    # rpc-b could not take its new part (3/5 of the target): not offered, naming it.
    ok, why = front.split_fits(c, "rpc-a", 800 * MIB, SHAPE, {"rpc-b": served(100)}, (4096 * MIB, 8192 * MIB))
    assert ok is False and "rpc-b" in why and "does not fit" in why, why
    # A figure unknown: not decided.
    assert front.split_fits(c, "rpc-a", size, SHAPE, {}, (4096 * MIB, 8192 * MIB))[0] is None
    assert front.split_fits(c, "rpc-a", size, SHAPE, roomy, None)[0] is None
    assert front.split_fits(c, "rpc-a", 0, SHAPE, roomy, (4096 * MIB, 8192 * MIB))[0] is None


def test_no_candidate_without_proportions_or_with_a_draft(tmp_path):
    inv = tmp_path / "i.ini"
    inv.write_text(f"""[main]
main ansible_host=10.77.0.10
[rpc]
rpc-a ansible_host=10.77.0.11 rpc_role=target
rpc-b ansible_host=10.77.0.12 rpc_role=target
[all:vars]
llama_repo=/srv/llama.cpp.git
llama_commit={SHA}
llama_model=/m/target.gguf
""")
    assert front.split_candidates(Cluster.from_inventory(load_inventory(inv))) == []
    # Only one target device left with a share (main's CPU none): a node that is the only other is kept.
    c = seed003(tmp_path, '"rpc-a=1,rpc-b=3"')
    assert [n.name for n in front.split_candidates(c)] == ["rpc-a", "rpc-b"]


def test_modes_document_renders_the_line_without_the_node(tmp_path):
    c = seed003(tmp_path)
    fact = fact_for(c, lambda node: (True, "fits") if node == "rpc-a" else (False, "rpc-a: does not fit"))
    doc = json.loads(fact["modes_json"])
    w = doc["without"]
    assert set(w) == {"rpc-a"} and doc["split_wait"] == front.SPLIT_WAIT
    argv = w["rpc-a"]["argv"]
    # rpc-a's endpoint dropped, rpc-b renumbered RPC0, the split over main's CPU and rpc-b (2:3): -ngl
    # from the 12 slots (CPU keeps round(12*2/5) = 5).
    assert argv[argv.index("--rpc") + 1] == "127.0.0.1:15053" and argv[argv.index("-dev") + 1] == "RPC0"
    assert argv[argv.index("-ts") + 1] == "3" and argv[argv.index("-ngl") + 1] == "7"
    assert w["rpc-a"]["tunnel_unit"] == "tunnelspec-tunnel-rpc-a.service" and w["rpc-a"]["port"] == 15052
    # The full split is unchanged; the watcher runs; rpc-a is no longer PartOf= (the watcher handles it).
    assert doc["modes"]["speculative"] == fact["argv"] and "--rpc" in fact["argv"]
    assert fact["draft_skippable"] is True and fact["without"]["rpc-a"]["argv"] == argv
    # verify proves the split without rpc-a against this plan (its devices, its layers).
    assert fact["without"]["rpc-a"]["nodes"] == {"rpc-b": ["RPC0"]} and fact["without"]["rpc-a"]["absent"] == ["rpc-a"]
    assert fact["unit"]["required_tunnel_units"] == ["tunnelspec-tunnel-rpc-b.service"]
    assert fact["split_fit"]["rpc-b"].startswith("does not fit")
    # The fit's figures never reach the document: a second deploy with other free memory renders the same.
    again = fact_for(c, lambda node: (True, "fits with other figures") if node == "rpc-a" else (False, "x"))
    assert again["modes_json"] == fact["modes_json"]


def test_nothing_offered_when_fit_is_not_decided(tmp_path):
    c = seed003(tmp_path)
    fact = fact_for(c, lambda node: (None, "rpc-b's device memory unknown in this run"))
    doc = json.loads(fact["modes_json"])
    assert "without" not in doc and fact["draft_skippable"] is False
    assert fact["unit"]["required_tunnel_units"] == ["tunnelspec-tunnel-rpc-a.service", "tunnelspec-tunnel-rpc-b.service"]
    # Without a fit callable (an older caller): the document as before.
    assert "without" not in json.loads(fact_for(c, None)["modes_json"])


def test_status_line_names_the_node():
    line = serving_line({"mode": "split-degraded", "since": "2026-12-05T09:00:00Z", "node": "rpc-a",
                         "reason": "tunnel down", "detail": None})
    assert line.startswith("serving: SPLIT-DEGRADED since 2026-12-05T09:00:00Z: the split without rpc-a"), line


# ---- the launcher ------------------------------------------------------------------------------------
def _script():
    loader = importlib.machinery.SourceFileLoader("tunnelspec_draftwatch_split", str(SCRIPT))
    spec = importlib.util.spec_from_loader(loader.name, loader)
    mod = importlib.util.module_from_spec(spec)
    loader.exec_module(mod)
    return mod


class Exec(Exception):
    pass


@pytest.fixture
def dw(monkeypatch):
    mod = _script()
    answers = {}

    def probe(endpoint, timeout):
        v = answers.get(endpoint)
        return (v, "") if v else (None, "Connection refused")

    def execv(path, argv):
        raise Exec(argv)

    monkeypatch.setattr(mod.RPC, "probe", probe)
    monkeypatch.setattr(mod.os, "execv", execv)
    monkeypatch.setattr(mod, "unit_state", lambda unit: ("inactive", "dead"))
    mod.answers = answers
    return mod


def _cfg(tmp_path: Path, without=("rpc-a",), split_wait=0.5, timeout=1.5) -> Path:
    eps = {"rpc-a": "127.0.0.1:15052", "rpc-b": "127.0.0.1:15053"}
    cfg = {
        "schema": 1, "unit": "tunnelspec-llama-server.service", "state": str(tmp_path / "mode.json"),
        "rejoin_flag": str(tmp_path / "rejoin"), "expect": "3.0.0",
        "wait": {"nodes": list(eps), "endpoints": list(eps.values()), "timeout": timeout},
        "draft": None, "modes": {"speculative": ["/b/llama-server", "FULL"], "degraded": None},
        "without": {n: {"argv": ["/b/llama-server", "WITHOUT-" + n], "endpoint": eps[n],
                        "port": int(eps[n].rsplit(":", 1)[1]), "tunnel_unit": f"tunnelspec-tunnel-{n}.service"}
                    for n in without},
        "split_wait": split_wait, "rejoin_after": 20, "grace": 10, "front": {"stats": "", "backend": "llama"},
    }
    path = tmp_path / "llama-server.json"
    path.write_text(json.dumps(cfg))
    return path


def _launch(dw, cfg: Path):
    with pytest.raises(Exec) as e:
        dw.launch(str(cfg))
    return e.value.args[0]


def _state(tmp_path):
    return json.loads((tmp_path / "mode.json").read_text())


def test_launch_serves_without_the_missing_node_then_the_full_split(dw, tmp_path, capsys):
    cfg = _cfg(tmp_path)
    dw.answers["127.0.0.1:15053"] = "3.0.0"
    t0 = time.monotonic()
    assert _launch(dw, cfg) == ["/b/llama-server", "WITHOUT-rpc-a"]
    assert 0.4 < time.monotonic() - t0 < 1.4  # the short split wait, not the 90 s wait
    st = _state(tmp_path)
    assert st["mode"] == "split-degraded" and st["node"] == "rpc-a" and "refused" in st["reason"], st
    assert st["entered"] == {"split-degraded": 1}
    assert "mode split-degraded: serving from the other devices, without rpc-a" in capsys.readouterr().out
    # Started again while rpc-a is still away (an abort): no wait at all, same since.
    t0 = time.monotonic()
    assert _launch(dw, cfg) == ["/b/llama-server", "WITHOUT-rpc-a"]
    assert time.monotonic() - t0 < 0.3 and _state(tmp_path)["since"] == st["since"]
    assert "mode split-degraded" not in capsys.readouterr().out
    # Without the watcher's flag, a node that answers again is taken back at the next start anyway.
    dw.answers["127.0.0.1:15052"] = "3.0.0"
    (tmp_path / "rejoin").write_text("%f\n" % (time.time() + 1))
    assert _launch(dw, cfg) == ["/b/llama-server", "FULL"]
    assert _state(tmp_path)["mode"] == "plain"
    assert "serving the full split again: rpc-a is back" in capsys.readouterr().out


def test_launch_waits_where_the_rest_cannot_hold_the_model(dw, tmp_path, capsys):
    # rpc-b away, and no line without it: waiting, naming rpc-b (as before).
    dw.answers["127.0.0.1:15052"] = "3.0.0"
    assert dw.launch(str(_cfg(tmp_path))) == 1
    st = _state(tmp_path)
    assert st["mode"] == "waiting" and st["node"] == "rpc-b"
    assert "serving waits for rpc-b (it holds target layers)" in capsys.readouterr().out


def test_launch_waits_when_two_nodes_are_away(dw, tmp_path):
    assert dw.launch(str(_cfg(tmp_path, without=("rpc-a", "rpc-b")))) == 1
    assert _state(tmp_path)["mode"] == "waiting"


def test_the_watchers_word_skips_the_wait(dw, tmp_path):
    cfg = _cfg(tmp_path, split_wait=5)
    dw.answers["127.0.0.1:15053"] = "3.0.0"
    (tmp_path / "mode.json").write_text(json.dumps({"mode": "plain", "at": time.time() - 5}))
    (tmp_path / "lost.json").write_text(json.dumps({"at": time.time(), "node": "rpc-a", "grace": 0.0,
                                                    "why": "tunnel down (x failed/failed)"}))
    t0 = time.monotonic()
    assert _launch(dw, cfg) == ["/b/llama-server", "WITHOUT-rpc-a"]
    assert time.monotonic() - t0 < 1.5
    assert _state(tmp_path)["reason"] == "tunnel down (x failed/failed)"
