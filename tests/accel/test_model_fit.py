"""The fit check's inputs read for real: a GGUF's size and shape from its header over a connection
(the lab's tiny model, and a 30 GiB sparse GGUF that takes no disk), then the decision against
device figures as an RPC server's banner reports them."""

from __future__ import annotations

import asyncio
import os

import pytest

from tunnelspec.connection.local import LocalConnection
from tunnelspec.lab import gguf_tiny
from tunnelspec.llama import devices as dv
from tunnelspec.tasks.fit import gguf_facts

GiB = 2**30


def facts(path):
    return asyncio.run(gguf_facts(LocalConnection("local"), str(path)))


def test_tiny_model_fits_a_lavapipe_device(tmp_path):
    path = tmp_path / "tiny.gguf"
    gguf_tiny.write_tiny_llama(path)
    size, shape, note = facts(path)
    assert size == os.path.getsize(path) and note == ""
    assert (shape.n_layer, shape.n_embd, shape.n_vocab, shape.n_ctx_train) == (2, 64, gguf_tiny.N_VOCAB, 512)
    need = dv.draft_need(size, shape, None)
    fit = dv.check_fit("rpc-a", [("Vulkan0", 18000 * dv.MIB, 18000 * dv.MIB)], need)
    assert fit.level == "ok" and dv.require_fit(fit).startswith("rpc-a: the draft fits: the draft needs")


def test_sparse_30_gib_draft_is_refused_with_both_figures(tmp_path):
    path = tmp_path / "huge.gguf"
    gguf_tiny.write_sparse_llama(path, 30 * GiB)
    assert os.stat(path).st_blocks * 512 < 10 * 2**20  # sparse: no disk taken
    size, shape, _ = facts(path)
    assert size >= 30 * GiB and shape.n_embd == 64
    need = dv.draft_need(size, shape, None)
    with pytest.raises(dv.DeviceError) as e:
        dv.require_fit(dv.check_fit("rpc-a", [("Vulkan0", 17800 * dv.MIB, 17800 * dv.MIB)], need))
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
