"""The fit check's inputs read for real: a GGUF's size and shape from its header over a connection
(the lab's tiny model, and a 30 GiB sparse GGUF that takes no disk), then the decision against
device figures as an RPC server's banner reports them."""

from __future__ import annotations

import asyncio
import os

import pytest

from tunnelspec.connection.local import LocalConnection
from tunnelspec.lab import gguf_tiny
from tunnelspec.llama import devices as dv, gguf_header, memory_fit as mf
from tunnelspec.components.server.fit import gguf_facts

GiB = 2**30


def facts(path):
    return asyncio.run(gguf_facts(LocalConnection("local"), str(path)))


def test_tiny_model_fits_a_lavapipe_device(tmp_path):
    path = tmp_path / "tiny.gguf"
    gguf_tiny.write_tiny_llama(path)
    size, shape, note = facts(path)
    assert size == os.path.getsize(path) and note == ""
    assert (shape.n_layer, shape.n_embd, shape.n_vocab, shape.n_ctx_train) == (2, 64, gguf_tiny.N_VOCAB, 512)
    need = mf.draft_need(size, shape, None)
    fit = mf.check_fit("rpc-a", [("Vulkan0", 18000 * mf.MIB, 18000 * mf.MIB)], need)
    assert fit.level == "ok" and mf.require_fit(fit).startswith("rpc-a: the draft fits: the draft needs")


def test_sparse_30_gib_draft_is_refused_with_both_figures(tmp_path):
    path = tmp_path / "huge.gguf"
    gguf_tiny.write_sparse_llama(path, 30 * GiB)
    assert os.stat(path).st_blocks * 512 < 10 * 2**20  # sparse: no disk taken
    size, shape, _ = facts(path)
    assert size >= 30 * GiB and shape.n_embd == 64
    with open(path, "rb") as f:  # whole: the deploy's model proof would refuse a file cut short
        assert gguf_header.shortfall(size, gguf_header.extent(gguf_header.read_whole_header(f, size))) is None
    need = mf.draft_need(size, shape, None)
    with pytest.raises(dv.DeviceError) as e:
        mf.require_fit(mf.check_fit("rpc-a", [("Vulkan0", 17800 * mf.MIB, 17800 * mf.MIB)], need))
    msg = str(e.value)
    assert msg.startswith("rpc-a: the draft does not fit: the draft needs 307") and \
        "rpc-a reports 17800 MiB free (Vulkan0 17800 MiB free of 17800 MiB)" in msg, msg


def test_unreadable_or_cut_header(tmp_path):
    size, shape, note = facts(tmp_path / "missing.gguf")
    assert size == 0 and shape is None and "cannot read" in note
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(b"GGUF\x03\x00\x00\x00" + b"\x00" * 5)
    size, shape, note = facts(cut)
    assert size == 13 and shape is None and "estimated from the size" in note


def _cluster(tmp_path, shares: str):
    from tunnelspec.cluster.model import Cluster
    from tunnelspec.inventory.loader import load_inventory

    path = tmp_path / "inv.ini"
    path.write_text("[main]\nm ansible_host=10.77.0.10\n\n[rpc]\n"
                    f"rpc-a ansible_host=10.77.0.11 rpc_role=draft {shares.split('|')[0]}\n"
                    f"rpc-b ansible_host=10.77.0.12 rpc_role=target {shares.split('|')[1]}\n\n[all:vars]\n"
                    'llama_repo=/srv/llama.cpp\nllama_commit="' + "a" * 40 + '"\n')
    return Cluster.from_inventory(load_inventory(path))


def _served(free_mib: int) -> list[dict]:
    return [{"name": "CPU", "description": "x", "kind": "cpu", "total_mib": free_mib, "free_mib": free_mib}]


def test_target_shares_on_rpc_nodes_are_checked_too(tmp_path):
    small = (100 * mf.MIB, None, "")
    target = (8 * GiB, None, "")
    c = _cluster(tmp_path, "rpc_target_share=1|rpc_target_share=3")
    from tunnelspec.components.server.fit import fit_verdicts

    v = {f.message.split(":")[0]: f for f in fit_verdicts(c, {"rpc-a": _served(24000), "rpc-b": _served(4000)},
                                                           small, target)}
    # rpc-a holds the draft and 1/4 of the target; rpc-b 3/4 of 8 GiB = 6 GiB > 4000 MiB.
    assert v["rpc-a"].level == "ok" and "the draft and 25% of the target" in v["rpc-a"].message
    assert v["rpc-b"].level == "refuse" and "75% of the target does not fit" in v["rpc-b"].message
    assert "rpc-b reports 4000 MiB free" in v["rpc-b"].message
    # Without given shares llama.cpp sizes the parts by free memory: the draft alone is checked.
    plain = _cluster(tmp_path, "|")
    (only,) = fit_verdicts(plain, {"rpc-a": _served(24000), "rpc-b": _served(4000)}, small, target)
    assert only.message.startswith("rpc-a: the draft fits")
