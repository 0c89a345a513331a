"""The registry of listeners (tunnelspec/cluster/ports.py) is where every guard comes from: the rules
local_isolation loads, the live audit of what listens (listeners_guarded, facts/nft.guard_gaps) and the
inventory's port collisions. Pure: an inventory in a temporary file, no host."""

from __future__ import annotations

from pathlib import Path

import pytest

from tunnelspec.cluster import ports
from tunnelspec.cluster.model import Cluster
from tunnelspec.components.isolation import LocalIsolation
from tunnelspec.core.errors import ClusterError
from tunnelspec.facts import nft
from tunnelspec.inventory import load_inventory

INV = """[main]
m1 ansible_host=10.77.0.10 {main}

[rpc]
r1 ansible_host=10.77.0.11 rpc_role=draft
r2 ansible_host=10.77.0.12 rpc_role=target {r2}

[all:vars]
llama_repo=https://github.com/ggml-org/llama.cpp
llama_commit="0123456789abcdef0123456789abcdef01234567"
llama_model=/m/t.gguf
llama_draft_model=/m/d.gguf
"""


def cluster(tmp_path: Path, main: str = "", r2: str = "") -> Cluster:
    path = tmp_path / "inv.ini"
    path.write_text(INV.format(main=main, r2=r2))
    return Cluster.from_inventory(load_inventory(path))


def test_every_listener_of_the_default_cluster_is_registered_with_its_owner(tmp_path):
    c = cluster(tmp_path)
    got = {(x.host, x.port, x.listen, x.connect) for x in ports.listeners(c)}
    assert got == {
        ("m1", 15052, "tunnelspec-tunnel", ("tunnelspec-llama",)),
        ("m1", 15053, "tunnelspec-tunnel", ("tunnelspec-llama",)),
        ("m1", 18080, "tunnelspec-llama", ("tunnelspec-front",)),
        ("m1", 1, None, None),
        ("m1", 18081, "tunnelspec-llama", ()),
        ("m1", 8080, "tunnelspec-front", None),
        ("r1", 50052, "tunnelspec-rpc", ("tunnelspec-tunnel",)),
        ("r2", 50052, "tunnelspec-rpc", ("tunnelspec-tunnel",)),
    }


def test_metrics_and_its_readers_are_a_guarded_port(tmp_path):
    c = cluster(tmp_path, main="metrics=true metrics_readers=prometheus")
    m = next(x for x in ports.listeners(c) if x.var == "metrics_port")
    assert (m.port, m.listen, m.connect) == (9466, "tunnelspec-front", ("tunnelspec-front", "prometheus"))
    g = c.guards("m1")
    assert {"ports": [9466], "users": ["tunnelspec-front", "prometheus"]} in g["more"]
    assert "tunnelspec-metrics.service" in g["guarded"]


def test_the_rules_local_isolation_loads_come_from_the_registry(tmp_path):
    c = cluster(tmp_path)
    task = LocalIsolation(LocalIsolation.validate({"guards": c.guards("m1")}))
    connect = {tuple(sorted(p)): tuple(u) for p, u in task.groups()}
    assert connect == {(15052, 15053): ("tunnelspec-llama",), (18080,): ("tunnelspec-front",), (18081,): ()}
    listen = {tuple(sorted(p)): tuple(u) for p, u in task.listen_groups()}
    assert listen == {(15052, 15053): ("tunnelspec-tunnel",), (18080, 18081): ("tunnelspec-llama",), (1,): (),
                      (8080,): ("tunnelspec-front",)}
    assert task._guarded() == ["tunnelspec-llama-server.service", "tunnelspec-tunnel-r1.service",
                               "tunnelspec-tunnel-r2.service"]
    node = LocalIsolation(LocalIsolation.validate({"guards": c.guards("r2")}))
    assert node.groups() == [([50052], ["tunnelspec-tunnel"])] and node._guarded() == ["tunnelspec-rpc.service"]


def test_a_public_api_is_not_a_loopback_guard_but_still_a_listener(tmp_path):
    c = cluster(tmp_path, main="llama_server_public_bind=true llama_server_host=0.0.0.0 "
                                "llama_server_api_key_file=/etc/tunnelspec/key")
    api = next(x for x in ports.listeners(c) if x.var == "llama_server_port")
    assert not api.loopback and 8080 in c.listener_ports("m1")
    assert all(8080 not in g["ports"] for g in c.guards("m1")["listeners"])


@pytest.mark.parametrize("main, r2, var, words", [
    ("bench_port=15052", "", "tunnel_port", "already used by bench_port of m1"),
    ("metrics=true metrics_port=18085 bench_port=18085", "", "bench_port", "already used by metrics_port of m1"),
    ("bench_port=8080", "", "bench_port", "already used by llama_server_port of m1"),
    ("", "ansible_host=10.77.0.11", "rpc_port", "r1 on the same address 10.77.0.11 already uses rpc_port 50052"),
])
def test_collisions_name_the_later_listener(tmp_path, main, r2, var, words):
    with pytest.raises(ClusterError) as err:
        cluster(tmp_path, main=main, r2=r2)
    assert err.value.var == var and words in str(err.value), str(err.value)


@pytest.mark.parametrize("main, bench", [("", 18081), ("llama_server_internal_port=18081", 18082),
                                         ("metrics=true metrics_port=18081", 18082),
                                         ("llama_server_internal_port=8079", 8081), ("bench_port=9000", 9000)])
def test_bench_port_defaults_to_the_first_free_one_above_llama_servers(tmp_path, main, bench):
    assert cluster(tmp_path, main=main).main.front.bench_port == bench


def test_guard_gaps_reads_the_live_table():
    live = nft.LiveTable(True, nft.ordered(nft.rules_for([50052], [999], "x") + nft.listen_rules_for([50052], [997], "x")),
                         chain_ok=True)
    assert nft.guard_gaps(live, 50052, 997) == []
    assert nft.guard_gaps(live, 50052, 1000) == ["its listen guard lets uids 0,997 answer, not its owner's"]
    assert nft.guard_gaps(live, 50053, 997) == ["no listen guard", "no connect guard"]
    assert nft.guard_gaps(live, 50053, 997, open_port=True) == ["no listen guard"]
