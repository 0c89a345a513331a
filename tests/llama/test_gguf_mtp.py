"""The tiny MTP target and its separate MTP draft (tests/support/gguf_mtp.py): what the files hold,
and what the fixture build (b11434) does with them — the MTP head on RPC0 drafts tokens the target
accepts, also when the target's layers share that RPC endpoint, and a draft file without an MTP
block makes llama-server exit at start (what tunnelspec refuses at plan time)."""

from __future__ import annotations

import json
import re
import urllib.request

import pytest

from tunnelspec.core.constants import LOOPBACK
from support import gguf_mtp
from tunnelspec.lab import gguf_tiny
from support.localserver import free_port, spawn, wait_health


@pytest.fixture(scope="module")
def mtp_models(tmp_path_factory):
    d = tmp_path_factory.mktemp("mtp")
    return {"target": d / "mtp-target.gguf", "draft": d / "mtp-draft.gguf",
            "target_sha": gguf_mtp.write_mtp_target(d / "mtp-target.gguf"),
            "draft_sha": gguf_mtp.write_mtp_draft(d / "mtp-draft.gguf")}


def _read(path):
    import gguf

    r = gguf.GGUFReader(str(path))
    kv = {f.name: f.contents() for f in r.fields.values() if not f.name.startswith("tokenizer.")}
    return kv, sorted(t.name for t in r.tensors)


def test_the_target_and_the_mtp_file_hold_the_smallest_cohere2moe_tensor_sets(mtp_models):
    kv, names = _read(mtp_models["target"])
    assert kv["general.architecture"] == "cohere2moe"
    assert "cohere2moe.nextn_predict_layers" not in kv  # the head is in the other file (--no-mtp)
    assert names == sorted(["token_embd.weight", "output_norm.weight", "blk.0.attn_norm.weight",
                            "blk.0.attn_qkv.weight", "blk.0.attn_output.weight", "blk.0.ffn_gate.weight",
                            "blk.0.ffn_up.weight", "blk.0.ffn_down.weight"])
    kv, names = _read(mtp_models["draft"])
    assert kv["general.architecture"] == "cohere2moe"
    assert kv["cohere2moe.nextn_predict_layers"] == 1 and kv["cohere2moe.block_count"] == 2
    # MTP-only: no trunk block (llama.cpp tells such a file by the missing blk.0.attn_norm).
    assert not [n for n in names if n.startswith("blk.0.")]
    assert names == sorted(["token_embd.weight", "output_norm.weight", "blk.1.attn_norm.weight",
                            "blk.1.attn_qkv.weight", "blk.1.attn_output.weight", "blk.1.ffn_gate_inp.weight",
                            "blk.1.ffn_gate_up_exps.weight", "blk.1.ffn_down_exps.weight",
                            "blk.1.nextn.eh_proj.weight", "blk.1.nextn.enorm.weight", "blk.1.nextn.hnorm.weight"])
    assert kv["cohere2moe.embedding_length"] == gguf_tiny.EMBED


def test_the_files_are_reproducible(mtp_models, tmp_path):
    assert gguf_mtp.write_mtp_target(tmp_path / "t.gguf") == mtp_models["target_sha"]
    assert gguf_mtp.write_mtp_draft(tmp_path / "d.gguf") == mtp_models["draft_sha"]


def _serve(llama_bin, rpc_server, tmp_path, target, draft, target_dev: str, name: str):
    port = free_port()
    argv = [llama_bin.llama_server, "-m", str(target), "--rpc", f"{LOOPBACK}:{rpc_server.port}",
            "-dev", target_dev, "--spec-type", "draft-mtp", "--spec-draft-model", str(draft),
            "--spec-draft-device", "RPC0", "--spec-draft-ngl", "all", "--spec-draft-n-max", "3",
            "--host", LOOPBACK, "--port", str(port), "-c", "512", "-lv", "4"]
    return spawn(argv, tmp_path / f"{name}.log"), port


def _complete(port: int, prompt: str) -> dict:
    body = json.dumps({"prompt": prompt, "n_predict": 32, "temperature": 0, "top_k": 1,
                       "cache_prompt": False}).encode()
    req = urllib.request.Request(f"http://{LOOPBACK}:{port}/completion", data=body,
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as resp:
        return json.load(resp)


@pytest.mark.llama
@pytest.mark.parametrize("target_dev", ["none", "RPC0"], ids=["target-on-cpu", "target-on-the-draft-endpoint"])
def test_mtp_head_on_rpc0_drafts_what_the_target_accepts(llama_bin, rpc_server, mtp_models, tmp_path, target_dev):
    # target-on-the-draft-endpoint: target and MTP draft contexts compute graphs on one RPC device,
    # which crashed the RPC server in upstream issue 23242 (fixed by PR 23273, before b11434).
    server, port = _serve(llama_bin, rpc_server, tmp_path, mtp_models["target"], mtp_models["draft"],
                          target_dev, "llama-server")
    try:
        wait_health(port, timeout=120, proc=server)
        results = [_complete(port, p) for p in ("Once upon a time", "The quick brown fox jumps over the lazy dog")]
    finally:
        server.stop()
    log = server.log()
    for r in results:
        t = r["timings"]
        assert r["content"] == "a" * 32, r["content"]
        assert t["draft_n"] > 0 and t["draft_n_accepted"] == t["draft_n"], t
    draft_at = log.index(f"loading draft model '{mtp_models['draft']}'")
    where = re.escape(f"RPC0[{LOOPBACK}:{rpc_server.port}]")
    assert re.search(rf"load_tensors: {where} model buffer size", log[draft_at:]), log[draft_at:draft_at + 3000]
    assert re.search(rf"llama_kv_cache: {where} KV buffer size", log[draft_at:])
    target_on_rpc = re.search(rf"load_tensors: {where} model buffer size", log[:draft_at])
    assert bool(target_on_rpc) == (target_dev == "RPC0")


@pytest.mark.llama
def test_a_draft_without_an_mtp_block_makes_llama_server_exit_at_start(llama_bin, llama_fixtures, rpc_server,
                                                                       mtp_models, tmp_path):
    # The lab's tiny llama model as the draft-mtp draft: no nextn_predict_layers. llama-server exits
    # at every start; under systemd that is a restart loop, which is why tunnelspec refuses the
    # combination at plan time (llama/speculative.py mtp_draft_refusal).
    server, port = _serve(llama_bin, rpc_server, tmp_path, mtp_models["target"], llama_fixtures.model_local,
                          "none", "not-mtp")
    try:
        with pytest.raises(Exception, match="exited"):
            wait_health(port, timeout=120, proc=server)
    finally:
        rc = server.stop()
    assert rc not in (None, 0)
    assert "context type MTP requested but model doesn't contain MTP layers" in server.log()
    assert "failed to create MTP context" in server.log()
