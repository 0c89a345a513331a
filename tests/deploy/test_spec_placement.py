"""Placement by node name in the lab (CPU): target layers on two rpc nodes in proportion 1:3 *by node name*, a
draft tuning flag passed through, the active type from the server, and a setting the build lacks
refused before any host is touched.

rpc-a is the draft node and, with rpc_target_share=1, also carries target layers; rpc-b carries the
rest (rpc_target_share=3). The target is a tiny llama model with 11 blocks (12 layer slots with the
output layer), so llama.cpp's layer rule puts exactly 3 on RPC0 and 9 on RPC1. The same file is the
draft (every draft token accepted). `--spec-draft-type-k f32` (the draft's K cache type; f16 by
default) passes through `llama_server_extra_args`.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from tunnelspec.lab import gguf_tiny
from tunnelspec.llama.props import spec_types

from support.cli import HOSTS_PLAY_TASKS, failed_report, tasks_run, tunnelspec
from support.labdeploy import completion_on_main, configured_cmdline
from support.placement import BLOCKS, SHARES, check_one_to_three

pytestmark = pytest.mark.lab

UNIT = "tunnelspec-llama-server.service"
PORTS = {"rpc-a": 15052, "rpc-b": 15053}


def sh(lab, host: str, *argv: str) -> str:
    return lab.exec(host, list(argv), timeout=90).stdout or ""


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    path = tmp_path_factory.mktemp("models") / "tiny-llama-11-blocks.gguf"
    saved = gguf_tiny.BLOCKS
    gguf_tiny.BLOCKS = BLOCKS  # a variant of the lab's tiny model with more layers to split
    try:
        gguf_tiny.write_tiny_llama(path)
    finally:
        gguf_tiny.BLOCKS = saved
    return path


def placement_inventory(lab, model: Path, extra_main: str = "") -> Path:
    text = Path(lab.inventory).read_text()
    for node, share in SHARES.items():
        text = re.sub(rf"^({node} ansible_host=\S+.*)$", rf"\1 rpc_target_share={share}", text, flags=re.M)
    text = re.sub(r"^llama_model=.*$", f"llama_model={model}", text, flags=re.M)
    text = re.sub(r"^llama_draft_model=.*$", f"llama_draft_model={model}", text, flags=re.M)
    text = text.replace("[rpc]", f"[main:vars]\nllama_split_mode=layer\n{extra_main}\n[rpc]", 1)
    out = Path(lab.dir) / "inventory-spec-placement.ini"
    out.write_text(text)
    return out


@pytest.fixture(scope="module")
def deployed(lab, model):
    inv = placement_inventory(lab, model, 'llama_server_extra_args="--spec-draft-type-k f32"')
    r = tunnelspec("deploy", str(inv), "--format", "json", timeout=3600)
    assert r.rc == 0, failed_report(r)
    return inv, r


def target_journal(lab) -> str:
    inv_id = sh(lab, "main", "systemctl", "show", "-p", "InvocationID", "--value", UNIT).strip()
    return sh(lab, "main", "journalctl", "--no-pager", "-o", "cat", "-u", UNIT, f"_SYSTEMD_INVOCATION_ID={inv_id}")


def test_target_layers_follow_the_shares_by_node_name(lab, deployed):
    _, r = deployed
    unit = configured_cmdline(lab)
    assert "-dev RPC0,RPC1" in unit and "-ts 1,3" in unit and "-sm layer" in unit, unit
    journal = target_journal(lab)
    got = check_one_to_three(journal, PORTS["rpc-a"], PORTS["rpc-b"])
    print(f"target placement by node: rpc-a {got[PORTS['rpc-a']]}, rpc-b {got[PORTS['rpc-b']]}")
    # Then the draft's whole model on rpc-a, the draft node.
    draft = re.findall(r"load_tensors: RPC\d+\[127\.0\.0\.1:(\d+)\] model buffer size", journal)
    assert len(draft) >= 3 and int(draft[2]) == PORTS["rpc-a"], draft


def test_draft_accepted_on_the_remote_device_and_the_type_from_the_server(lab, deployed):
    _, r = deployed
    ev = next(e for e in r.results() if e.get("module") == "llama_verify")
    assert ev["status"] == "ok", ev
    m = re.search(r"draft_n=(\d+) draft_n_accepted=(\d+)", ev["msg"])
    assert m and int(m.group(1)) > 0 and m.group(1) == m.group(2), ev["msg"]
    assert "speculative type draft-simple" in ev["msg"], ev["msg"]
    assert "draft model buffer on RPC0[127.0.0.1:15052]" in ev["msg"]


def test_tuning_flag_passed_through(lab, deployed):
    unit = configured_cmdline(lab)
    assert "--spec-draft-type-k f32" in unit
    journal = target_journal(lab)
    kv = re.findall(r"llama_kv_cache: size = .*?K \((\w+)\)", journal)
    print(f"KV cache K types (target, then draft): {kv}")
    assert kv[:1] == ["f16"] and "f32" in kv[1:], kv
    # /props and /slots: what llama-server itself reports (see docs/speculative.md). A slot carries
    # the params of its last task: one completion first, as verify does.
    assert completion_on_main(lab), "no completion on main"
    script = ("import json,urllib.request\n"
              "p=json.load(urllib.request.urlopen('http://127.0.0.1:8080/props',timeout=10))\n"
              "s=json.load(urllib.request.urlopen('http://127.0.0.1:8080/slots',timeout=10))\n"
              "print(json.dumps({'props':p['default_generation_settings']['params'],"
              # the slot that served the last completion (llama-server picks any idle one)
              "'slot':next((x['params'] for x in s if x.get('params')), {})}))")
    doc = json.loads(sh(lab, "main", "python3", "-c", script).strip().splitlines()[-1])
    print("props speculative:", {k: v for k, v in doc["props"].items() if "spec" in k or "draft" in k})
    print("slot speculative:", {k: v for k, v in doc["slot"].items() if "spec" in k or "draft" in k})
    # The slot lists the default entry too ("none,draft-simple"): read it as verify does.
    assert spec_types(None, [{"params": doc["slot"]}])["slots"] == "draft-simple", doc["slot"]


def test_a_setting_the_build_lacks_is_refused_before_any_host_is_touched(lab, deployed, model, tmp_path):
    pid = sh(lab, "main", "systemctl", "show", "-p", "MainPID", "--value", UNIT).strip()
    before = {h: sh(lab, h, "sh", "-c", "ls -la --time-style=full-iso /etc/systemd/system/ | sha256sum")
              for h in ("main", "rpc-a", "rpc-b")}
    # A flag this build removed, and (no controller record: a fresh cache) read from main's current
    # build, read-only.
    inv = placement_inventory(lab, model, 'llama_server_extra_args="--spec-draft-ctx-size 64"')
    r = tunnelspec("deploy", str(inv), env={"XDG_CACHE_HOME": str(tmp_path / "cache")}, timeout=300)
    assert r.rc == 2, r.stdout[-3000:] + r.stderr[-2000:]
    assert "--spec-draft-ctx-size" in r.stderr and "no host was changed" in r.stderr
    assert re.search(r"inventory-spec-placement\.ini:\d+:", r.stderr), r.stderr
    # Refused by the preflight play that read main's build: nothing after it ran, nothing changed.
    ran = tasks_run(r.stdout)
    assert ("failed", "main", "llama-server settings against the pinned build") in ran, r.stdout
    assert {task for _, _, task in ran} <= HOSTS_PLAY_TASKS and all(st != "changed" for st, _, _ in ran), r.stdout
    # With the record written by that look, the same check needs no connection at all.
    assert list((tmp_path / "cache" / "tunnelspec" / "builds").glob("*.json"))
    after = {h: sh(lab, h, "sh", "-c", "ls -la --time-style=full-iso /etc/systemd/system/ | sha256sum")
             for h in ("main", "rpc-a", "rpc-b")}
    assert after == before
    assert sh(lab, "main", "systemctl", "show", "-p", "MainPID", "--value", UNIT).strip() == pid
