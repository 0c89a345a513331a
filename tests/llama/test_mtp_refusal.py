"""spec_type=draft-mtp with a draft file that is no MTP head of the target: refused at plan time (the
llama_server_plan task, before the unit is written) when llama-server would exit or abort at every
start, a warning when it would serve badly. Real GGUF files (tests/support/gguf_mtp.py, the lab's
tiny llama), their headers read through a real local connection; what llama-server b11434 does with
each file is tests/llama/test_gguf_mtp.py's."""

from __future__ import annotations

import asyncio

import pytest

from tunnelspec.connection.local import LocalConnection
from tunnelspec.core.errors import TaskFailed
from support import gguf_mtp
from tunnelspec.lab import gguf_tiny
from tunnelspec.llama import gguf_header
from tunnelspec.llama.speculative import mtp_draft_refusal, mtp_draft_warnings
from tunnelspec.components.server.mtp_draft import check_mtp_draft, read_header

BUILD = "0.6.0-dev (build 11434, commit d4f3039b1)"


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("mtp-files")
    gguf_mtp.write_mtp_target(d / "target.gguf")
    gguf_mtp.write_mtp_draft(d / "mtp.gguf")
    gguf_mtp.write_mtp_draft(d / "mtp-narrow.gguf", embed=32)
    gguf_mtp.write_mtp_target_with_head(d / "target-with-head.gguf")
    gguf_tiny.write_tiny_llama(d / "llama.gguf")
    return d


def header(path) -> gguf_header.Header:
    return gguf_header.parse(path.read_bytes())


def test_the_header_names_the_architecture_the_mtp_layers_and_every_tensor(files):
    h = header(files / "mtp.gguf")
    assert h.arch == "cohere2moe"
    assert h.arch_int("nextn_predict_layers") == 1 and h.arch_int("block_count") == 2
    assert h.arch_int("embedding_length") == gguf_tiny.EMBED
    assert len(h.tensors) == 11 and "blk.1.nextn.eh_proj.weight" in h.tensors
    assert header(files / "llama.gguf").arch_int("nextn_predict_layers") is None


def test_a_header_cut_short_keeps_what_was_read_and_no_tensor_list(files):
    data = (files / "mtp.gguf").read_bytes()
    assert len(gguf_header.parse(data).tensors) == 11
    cut = gguf_header.parse(data[:600])  # inside the metadata
    assert cut.tensors is None and cut.arch == "cohere2moe"
    with pytest.raises(ValueError, match="not a GGUF"):
        gguf_header.parse(b"PK\x03\x04" + data[4:100])


def test_the_mtp_file_of_this_target_passes(files):
    t, d = header(files / "target.gguf"), header(files / "mtp.gguf")
    assert mtp_draft_refusal(t, d, BUILD, "target.gguf", "mtp.gguf") is None
    assert mtp_draft_warnings(t, d, "mtp.gguf") == []


def test_a_draft_without_an_mtp_block_is_refused_naming_the_build_and_the_restart_loop(files):
    why = mtp_draft_refusal(header(files / "target.gguf"), header(files / "llama.gguf"), BUILD,
                            "/m/target.gguf", "/m/llama.gguf")
    assert why and "/m/llama.gguf has none" in why and "llama.nextn_predict_layers" in why
    assert BUILD in why and "failed to create MTP context" in why and "every start" in why
    assert "convert_hf_to_gguf.py --mtp" in why and "draft-simple" in why


def test_a_head_of_another_width_is_refused(files):
    why = mtp_draft_refusal(header(files / "target.gguf"), header(files / "mtp-narrow.gguf"), BUILD,
                            "/m/target.gguf", "/m/mtp-narrow.gguf")
    assert why and "32 wide" in why and "64 wide" in why and BUILD in why and "GGML_ASSERT" in why


def test_a_head_of_another_architecture_is_a_warning(files):
    # Same width: llama-server serves it, and accepts next to nothing (0 of 39 with these files).
    t, d = header(files / "llama.gguf"), header(files / "mtp.gguf")
    assert mtp_draft_refusal(t, d, BUILD, "llama.gguf", "mtp.gguf") is None
    (w,) = mtp_draft_warnings(t, d, "mtp.gguf")
    assert "cohere2moe head" in w and "target is llama" in w


def test_the_whole_model_with_its_head_as_the_draft_is_a_warning(files):
    t, d = header(files / "target.gguf"), header(files / "target-with-head.gguf")
    assert mtp_draft_refusal(t, d, BUILD, "t", "target-with-head.gguf") is None
    (w,) = mtp_draft_warnings(t, d, "target-with-head.gguf")
    assert "holds the whole model" in w and "--mtp" in w


def test_the_plan_check_reads_both_headers_on_the_host(files):
    conn = LocalConnection("main")
    ok = asyncio.run(check_mtp_draft(conn, str(files / "target.gguf"), str(files / "mtp.gguf"), BUILD))
    assert ok == []
    with pytest.raises(TaskFailed, match="has none"):
        asyncio.run(check_mtp_draft(conn, str(files / "target.gguf"), str(files / "llama.gguf"), BUILD))
    (w,) = asyncio.run(check_mtp_draft(conn, str(files / "target.gguf"), str(files / "target-with-head.gguf"), BUILD))
    assert "whole model" in w
    # An unreadable file is not the check's to judge: llama-server will say more.
    (w,) = asyncio.run(check_mtp_draft(conn, str(files / "target.gguf"), str(files / "absent.gguf"), BUILD))
    assert w.startswith("draft-mtp draft not checked: cannot read") and "absent.gguf" in w
    assert isinstance(asyncio.run(read_header(conn, str(files / "mtp.gguf"))), gguf_header.Header)
