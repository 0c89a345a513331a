"""A GGUF read whole for size and tensor bounds (llama/gguf_header.py): real files written with the
gguf package (the lab's tiny llama), cut short as an interrupted copy leaves them; the reader run
both in this process and as the program the hosts run (`python3 -I -c <its source>`)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from tunnelspec.lab import gguf_tiny
from tunnelspec.llama import gguf_header as g
from tunnelspec.components.models.files import parse_proofs, proof_argv


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("gguf") / "tiny.gguf"
    gguf_tiny.write_tiny_llama(path)
    return path


def cut(model: Path, dest: Path, keep: int) -> Path:
    dest.write_bytes(model.read_bytes()[:keep])
    return dest


def test_every_tensor_of_a_whole_file_lies_within_it(model):
    data = model.read_bytes()
    h = g.parse(data)
    assert len(h.infos) == len(h.tensors) == 3 + 9 * gguf_tiny.BLOCKS
    assert h.data_start % g.DEFAULT_ALIGNMENT == 0 and all(t.offset % 32 == 0 for t in h.infos)
    embd = next(t for t in h.infos if t.name == "token_embd.weight")
    assert embd.dims == (gguf_tiny.EMBED, gguf_tiny.N_VOCAB) and g.nbytes(embd) == gguf_tiny.EMBED * gguf_tiny.N_VOCAB * 4
    ext = g.extent(h)
    # gguf-py writes no padding after the last tensor: the file ends where its data does.
    assert ext.need == len(data) and ext.unsized == ()
    assert g.shortfall(len(data), ext) is None


def test_a_copy_cut_short_names_the_bytes_missing(model, tmp_path):
    size = model.stat().st_size
    short = cut(model, tmp_path / "short.gguf", size - 1000)
    proof = g.inspect(str(short), {})
    assert proof["error"] == (f"cut short: {size - 1000} bytes, its tensors need {size} (1000 bytes missing; "
                              "tensor blk.1.ffn_down.weight ends past the end of the file)"), proof
    # One byte short is short too.
    assert "1 bytes missing" in g.inspect(str(cut(model, tmp_path / "one.gguf", size - 1)), {})["error"]


def test_a_copy_cut_inside_its_header_or_no_gguf_at_all_is_refused(model, tmp_path):
    assert g.inspect(str(cut(model, tmp_path / "h.gguf", 900)), {})["error"] == "cut short inside its header: 900 bytes"
    assert "no GGUF magic" in g.inspect(str(cut(model, tmp_path / "h.gguf", 3)), {})["error"]
    (tmp_path / "zip.gguf").write_bytes(b"PK\x03\x04" + b"\0" * 64)
    assert "not a GGUF" in g.inspect(str(tmp_path / "zip.gguf"), {})["error"]
    assert g.inspect(str(tmp_path / "absent.gguf"), {})["error"] == "cannot read it: No such file or directory"


def test_a_misaligned_tensor_offset_is_refused_as_llama_cpp_does(model):
    data = bytearray(model.read_bytes())
    h = g.parse(bytes(data))
    # The last tensor info's u64 offset sits just before the data's padding: move it by 4 bytes.
    last = h.infos[-1]
    at = bytes(data).rindex(last.offset.to_bytes(8, "little"), 0, h.data_start)
    data[at:at + 8] = (last.offset + 4).to_bytes(8, "little")
    with pytest.raises(ValueError, match=f"tensor {last.name}: data offset {last.offset + 4} is not a multiple"):
        g.extent(g.parse(bytes(data)))


def test_the_sha256_is_computed_once_per_change_of_the_file(model, tmp_path):
    copy = tmp_path / "copy.gguf"
    copy.write_bytes(model.read_bytes())
    cache_path = tmp_path / "state" / "proofs.json"

    def run(mode: str, *paths: Path) -> dict[str, dict]:
        # What a host runs: the reader's own source, stdlib only, under the machine's python3.
        res = subprocess.run(proof_argv(mode, [str(p) for p in paths], str(cache_path)), capture_output=True,
                             text=True, timeout=60)
        assert res.returncode == 0, res.stderr
        return parse_proofs(res.stdout)

    first = run("check", copy)[str(copy)]
    assert first["cached"] is False and "sha256" not in first and first["need"] == copy.stat().st_size
    assert not cache_path.exists()          # check is read-only
    rec = run("record", copy)[str(copy)]
    import hashlib
    assert rec["sha256"] == hashlib.sha256(copy.read_bytes()).hexdigest()
    assert oct(cache_path.stat().st_mode & 0o777) == "0o644"
    again = run("check", copy)[str(copy)]
    assert again["cached"] is True and again["sha256"] == rec["sha256"]
    # Another file at the same path (a new copy): read again, its old sum not reported.
    short = cut(model, tmp_path / "short.tmp", model.stat().st_size - 64)
    os.replace(short, copy)
    now = run("check", copy)[str(copy)]
    assert now["cached"] is False and "64 bytes missing" in now["error"] and "sha256" not in now
    assert json.loads(cache_path.read_text())[str(copy)]["sha256"] == rec["sha256"]
