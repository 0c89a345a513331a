"""Seed 003 in the lab: examples/seed003-layers-on-two-nodes.ini as written — no draft
model, both nodes rpc_role=target 1:3, main's CPU a share (CPU=2,rpc-a=1,rpc-b=3) — on the lab's
hosts and source, with an 11-block tiny llama as the model (12 layer slots: llama.cpp's rule gives
main's CPU 4, rpc-a 2, rpc-b 6, exactly the asked 2:1:3).

deploy → verify's completion and the layers in the load lines → the running command line has no
draft flag → the journal's own figures (offloaded N/M, the KV cache per device) → status says
split, no draft (human and JSON) → bench: the split against main alone → rpc-a's link cut 70 s with a
client every 2 s: every request answered, split-degraded without rpc-a, the full split again after
(docs/degraded.md, "A target node of a split"; about 2 min) → a second deploy changes nothing.
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import pytest

from tunnelspec.lab import gguf_tiny

from support.cli import failed_report, tunnelspec
from support.labdeploy import (
    UNIT,
    completion_on_main,
    example_in_lab,
    running_argv,
    second_deploy_changes_nothing,
    sh,
    wait_serving,
)

pytestmark = pytest.mark.lab

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "seed003-layers-on-two-nodes.ini"
BLOCKS = 11
PORTS = {"rpc-a": 15052, "rpc-b": 15053}


@pytest.fixture(scope="module")
def inventory(lab, tmp_path_factory):
    model = tmp_path_factory.mktemp("models") / "tiny-llama-11-blocks.gguf"
    gguf_tiny.write_tiny_llama(model, blocks=BLOCKS)
    return example_in_lab(EXAMPLE, lab, model)


@pytest.fixture(scope="module")
def deployed(inventory):
    r = tunnelspec("deploy", str(inventory), "--format", "json", timeout=3600)
    assert r.rc == 0, failed_report(r)
    return r


def test_the_example_is_seed_003(inventory):
    text = EXAMPLE.read_text()
    assert "llama_draft_model" not in text and "rpc_role=draft" not in text
    assert len(re.findall(r"rpc_role=target", text)) == 2
    assert 'llama_tensor_split="CPU=2,rpc-a=1,rpc-b=3"' in text
    assert "llama_draft_model" not in inventory.read_text()


def test_verify_completes_and_proves_the_layers(lab, deployed):
    ev = next(e for e in deployed.results() if e.get("module") == "llama_verify")
    assert ev["status"] == "ok", ev
    assert "split, no draft" in ev["msg"] and "layers CPU 4, RPC0 2, RPC1 6 of 12 as asked" in ev["msg"], ev["msg"]
    plan = next(e for e in deployed.results() if e.get("module") == "llama_server_plan")
    assert "split, no draft" in plan["msg"] and "-ngl 8" in plan["msg"], plan["msg"]
    body = completion_on_main(lab)
    assert body and body["timings"]["predicted_n"] > 0 and not body["timings"].get("draft_n"), body


def test_llama_server_runs_without_any_draft_flag(lab, deployed):
    argv = running_argv(lab)
    assert "llama-server" in argv[0], argv
    assert not [a for a in argv if a.startswith("--spec") or a in ("-md", "-devd", "-ngld", "--model-draft")], argv
    value = {f: argv[argv.index(f) + 1] for f in ("--rpc", "-dev", "-ts", "-ngl", "-sm")}
    assert value == {"--rpc": "127.0.0.1:15052,127.0.0.1:15053", "-dev": "RPC0,RPC1", "-ts": "1,3", "-ngl": "8",
                     "-sm": "layer"}, value


def test_the_journal_shows_the_asked_proportions(lab, deployed):
    # Read here with the journal's own figures, independently of verify's reading: the slots that
    # left main's CPU, and each device's share of the KV cache (one equal slice per block it holds).
    inv = sh(lab, "main", "systemctl", "show", "-p", "InvocationID", "--value", UNIT).strip()
    journal = sh(lab, "main", "journalctl", "--no-pager", "-o", "cat", "-u", UNIT, f"_SYSTEMD_INVOCATION_ID={inv}")
    assert re.search(r"load_tensors: offloaded 8/12 layers", journal), journal[-3000:]
    total = re.search(r"llama_kv_cache: size =\s*([0-9.]+) MiB \(\s*\d+ cells,\s*(\d+) layers", journal)
    assert total and int(total.group(2)) == BLOCKS
    kv = dict(re.findall(r"llama_kv_cache:\s+(\S+?) KV buffer size\s*=\s*([0-9.]+) MiB", journal))
    blocks = {name: round(float(mib) / float(total.group(1)) * BLOCKS) for name, mib in kv.items()}
    # main's CPU: blocks 0-3; rpc-a (its server calls its device RPC0): 4-5; rpc-b: 6-10 and the output.
    assert blocks == {"CPU": 4, f"RPC0[127.0.0.1:{PORTS['rpc-a']}]": 2, f"RPC0[127.0.0.1:{PORTS['rpc-b']}]": 5}, kv
    buffers = dict(re.findall(r"load_tensors: (RPC\d\[127\.0\.0\.1:\d+\]) model buffer size\s*=\s*([0-9.]+) MiB",
                              journal))
    a, b = float(buffers[f"RPC0[127.0.0.1:{PORTS['rpc-a']}]"]), float(buffers[f"RPC0[127.0.0.1:{PORTS['rpc-b']}]"])
    assert 2.5 < b / a < 3.5, buffers  # 5 blocks and the output layer against 2 blocks


def test_status_says_split_with_no_draft(lab, inventory, deployed):
    st = tunnelspec("status", str(inventory), "--format", "json", timeout=120)
    assert st.rc == 0, st.stdout + st.stderr
    server = json.loads(st.stdout)["hosts"]["main"]["llama_server"]
    assert server["health"] == "ok" and server["kind"] == "split", server
    assert server["layers"] == {"slots": 12, "cpu_slots": 4, "buffers_mib": server["layers"]["buffers_mib"]}
    assert set(server["layers"]["buffers_mib"]) == {"RPC0", "RPC1"}, server["layers"]
    human = tunnelspec("status", str(inventory), timeout=120)
    assert human.rc == 0, human.stdout + human.stderr
    line = next(l for l in human.stdout.splitlines() if "llama-server:" in l)
    assert "split, no draft: main's CPU keeps 4 of 12 layers; RPC0" in line, line
    assert "speculative type" not in line


def test_verify_command_proves_the_split_again(inventory, deployed):
    # `tunnelspec verify` plans from the inventory's own model path (a controller file here): the
    # block count is read from the upload on main.
    r = tunnelspec("verify", str(inventory), "--format", "json", timeout=600)
    assert r.rc == 0, failed_report(r)
    ev = next(e for e in r.results() if e.get("module") == "llama_verify")
    assert "split, no draft" in ev["msg"] and "layers CPU 4, RPC0 2, RPC1 6 of 12 as asked" in ev["msg"], ev["msg"]


def test_bench_compares_the_split_with_main_alone(lab, inventory, deployed):
    """Seed 003's baseline: the split as deployed against the same GGUF on main alone (the tiny
    model fits main), every figure on both sides; both nodes hold layers, so the deployed side waits
    on both tunnels and main alone on none. --same-placement has no draft to drop: refused."""
    from support.labdeploy import main_pid

    b = tunnelspec("bench", str(inventory), "--format", "json", "--runs", "2", "--n-predict", "32", timeout=600)
    assert b.rc == 0, b.stdout + b.stderr
    result = json.loads(b.stdout)
    print("bench --format json:", json.dumps(result, sort_keys=True))
    deployed_side, alone = result["deployed"], result["baseline"]
    assert result["schema"] == 2 and deployed_side["kind"] == "split", deployed_side
    assert "-ngl 8" in deployed_side["placement"] and "no draft" in deployed_side["placement"]
    assert alone["kind"] == "main_alone" and alone["ran"] and not alone["rpc"] and alone["devices"] == "none", alone
    assert alone["fit"]["fits"] and alone["fit"]["need_mib"] <= alone["fit"]["free_mib"], alone["fit"]
    for side in (deployed_side, alone):
        assert side["draft_n"] == 0 and side["prompt_per_second"] > 0 and side["predicted_per_second"] > 0, side
        assert side["load"]["seconds"] > 0, side["load"]
    wait = deployed_side["network_wait"]
    assert wait["seconds"] > 0 and set(wait["by_node"]) == {"rpc-a", "rpc-b"}, wait
    assert all(s > 0 for s in wait["by_node"].values()), wait
    assert alone["network_wait"]["seconds"] == 0 and result["speedup"] > 0
    h = tunnelspec("bench", str(inventory), "--runs", "1", "--n-predict", "16", timeout=600)
    assert h.rc == 0, h.stdout + h.stderr
    print("bench:\n" + h.stdout)
    assert "as deployed (split)" in h.stdout and "main alone" in h.stdout
    assert all(row in h.stdout for row in ("load time", "prompt tok/s", "generation tok/s", "network wait")), h.stdout
    pid = main_pid(lab)
    r = tunnelspec("bench", str(inventory), "--same-placement", "--yes", timeout=120)
    assert r.rc == 2 and "has none (split)" in r.stderr and main_pid(lab) == pid, r.stdout + r.stderr
    assert "tunnelspec-llama-bench" not in sh(lab, "main", "systemctl", "list-units", "--all", "--no-legend")


def test_target_node_cut_is_served_from_the_rest_and_the_split_comes_back(lab, inventory, deployed):
    """A target node of a split lost while the rest holds the model: the deploy
    rendered a line without rpc-a (the tiny model fits main's CPU and rpc-b many times over: the
    plan says so); rpc-a's link cut 100 s with a client every 2 s → every request answered,
    status and mode.json say split-degraded naming rpc-a, llama-server runs without rpc-a's
    endpoint, verify proves the split without rpc-a and fails naming it; the link back → the full split again, by the watcher, with no deploy. About 2 min."""
    from support.lab_client import Client, main_time

    plan = next(e for e in deployed.results() if e.get("module") == "llama_server_plan")
    assert "split-degraded without rpc-a, rpc-b" in plan["msg"], plan["msg"]
    modes = json.loads(sh(lab, "main", "cat", "/etc/tunnelspec/llama-server.json"))
    assert set(modes["without"]) == {"rpc-a", "rpc-b"}, modes.get("without")
    cut_s, t_start = 100, time.monotonic()  # long enough for a verify during the cut
    client = Client(lab, "splitcut", cut_s + 45, interval=2)
    time.sleep(4)  # a few answers from the full split first
    t_cut = main_time(lab)
    lab.link("rpc-a", False)
    try:
        sv, took = wait_serving(inventory, "split-degraded", 40)
        print(f"\n  rpc-a cut: split-degraded after {took:.1f}s: {sv}")
        assert sv["node"] == "rpc-a" and sv["reason"] and sv["since"], sv
        state = json.loads(sh(lab, "main", "cat", "/run/tunnelspec-llama/mode.json"))
        assert state["mode"] == "split-degraded" and state["node"] == "rpc-a", state
        human = tunnelspec("status", str(inventory), timeout=180).stdout
        assert "serving: SPLIT-DEGRADED since" in human and "the split without rpc-a" in human, human
        argv = running_argv(lab)
        assert argv[argv.index("--rpc") + 1] == f"127.0.0.1:{PORTS['rpc-b']}" and argv[argv.index("-dev") + 1] == "RPC0", argv
        # verify proves what is served (the split without rpc-a: its completion and layers) and
        # fails the run for the unreachable node, naming the mode.
        v = tunnelspec("verify", str(inventory), "--format", "json", timeout=600)
        out = v.stdout + v.stderr
        assert v.rc != 0 and "SPLIT-DEGRADED since" in out and "the split without rpc-a" in out, out[-3000:]
        ev = next(e for e in v.results() if e.get("module") == "llama_verify" and e.get("host") == "main")
        assert ev["status"] == "ok" and "SPLIT-DEGRADED" in ev["msg"], ev
        time.sleep(max(0.0, t_cut + cut_s - main_time(lab)))
    finally:
        lab.link("rpc-a", True)
    t_back = main_time(lab)
    sv, took = wait_serving(inventory, "plain", 90)
    print(f"  rpc-a back: full split after {took:.1f}s")
    argv = running_argv(lab)
    assert argv[argv.index("--rpc") + 1] == "127.0.0.1:15052,127.0.0.1:15053", argv
    records = client.wait_done()
    failed = [r for r in records if r.get("status") != 200]
    worst = max(records, key=lambda r: r["done"] - r["sent"])
    during = [r for r in records if t_cut + 15 <= r["sent"] and r["done"] < t_back]
    print(f"  {len(records)} requests, {len(failed)} failed, {len(during)} answered split-degraded, worst wait "
          f"{worst['done'] - worst['sent']:.1f}s (sent {worst['sent'] - t_cut:.1f}s after the cut); "
          f"lab time {time.monotonic() - t_start:.0f}s")
    assert not failed, failed[:5]
    assert during, "no request answered while rpc-a was away"
    assert worst["done"] - worst["sent"] <= 30, worst
    # The launcher's and the watcher's own lines (llama-server's verbose log is left out), timed from the cut.
    lines = [l.split(" ", 1) for l in sh(lab, "main", "sh", "-c", f"journalctl -u {UNIT} -u tunnelspec-draftwatch.service "
                                         f"-o short-unix --since @{int(t_cut) - 1} | grep 'tunnelspec: '").splitlines()]
    events = [(float(t) - t_cut, rest.split("tunnelspec: ", 1)[1]) for t, rest in lines if "tunnelspec: " in rest]
    print("".join(f"\n    +{dt:5.1f}s {what[:130]}" for dt, what in events))
    said = [what for _, what in events]
    assert any(w.startswith("mode split-degraded: serving from the other devices, without rpc-a") for w in said), said
    assert any(w.startswith("serving the full split again: rpc-a is back") for w in said), said
    assert events[0][0] <= 10, events[:3]  # the loss noticed within the tunnel's keepalive and a tick


def test_second_deploy_changes_nothing(lab, inventory, deployed):
    second_deploy_changes_nothing(lab, inventory)
