"""`model_proof` through the CLI over a real sshd: a model on the host proven (its sha256 kept), then
`ok` without reading it again; a copy cut short refused with the host, the file and the bytes
missing, on the host and on the controller alike — exit 1, no traceback, nothing recorded."""

from __future__ import annotations

import hashlib
import json

import pytest

from support.cli import tunnelspec
from tunnelspec.lab import gguf_tiny


@pytest.fixture
def setup(tmp_path):
    from support.sshd_harness import SshdCluster

    c = SshdCluster(tmp_path / "c", 1)
    model = tmp_path / "tiny.gguf"
    gguf_tiny.write_tiny_llama(model)
    yield c, c.inventory(), model
    c.stop()


def playbook(c, src: str) -> str:
    pb = c.base / "prove.yml"
    pb.write_text("- hosts: all\n  tasks:\n    - name: model whole\n"
                  f"      model_proof: {{src: \"{src}\", cache: \"{{{{ root }}}}/proofs.json\"}}\n")
    return str(pb)


def test_a_model_on_the_host_is_proven_once(setup):
    c, inv, model = setup
    first = tunnelspec("play", str(inv), playbook(c, str(model)), "--format", "json")
    assert first.rc == 0, first.stdout + first.stderr
    [ev] = first.results()
    assert ev["status"] == "changed" and f"{model.stat().st_size} bytes, its tensors need" in ev["msg"], ev
    kept = json.loads((c.hosts[0].root / "proofs.json").read_text())
    assert kept[str(model)]["sha256"] == hashlib.sha256(model.read_bytes()).hexdigest()
    again = tunnelspec("play", str(inv), playbook(c, str(model)), "--format", "json")
    assert [e["status"] for e in again.results()] == ["ok"] and "unchanged since proven" in again.results()[0]["msg"]


@pytest.mark.parametrize("where", ["host", "controller"])
def test_a_copy_cut_short_is_refused_naming_the_shortfall(setup, where):
    c, inv, model = setup
    data = model.read_bytes()
    # On the controller: a path relative to the inventory's directory, which model_file would upload.
    short = (model.parent if where == "host" else inv.parent) / "short.gguf"
    short.write_bytes(data[:-4096])
    src = str(short) if where == "host" else "short.gguf"
    r = tunnelspec("play", str(inv), playbook(c, src), "--format", "json")
    assert r.rc == 1 and "Traceback" not in r.stderr, r.stderr
    [ev] = r.results()
    place = c.hosts[0].name if where == "host" else "the controller"
    assert ev["status"] == "failed", ev
    assert f" on {place} is cut short: {len(data) - 4096} bytes, its tensors need {len(data)} (4096 bytes missing" \
        in ev["msg"], ev["msg"]
    assert not (c.hosts[0].root / "proofs.json").exists()


def test_a_split_model_missing_a_part_is_refused_naming_the_part(setup, tmp_path):
    c, inv, _model = setup
    parts = gguf_tiny.write_tiny_llama_split(tmp_path / "split", "tiny", parts=2)
    parts[1].unlink()
    r = tunnelspec("play", str(inv), playbook(c, str(parts[0])), "--format", "json")
    assert r.rc == 1 and "Traceback" not in r.stderr, r.stderr
    [ev] = r.results()
    assert ev["status"] == "failed" and ev["msg"] == (
        f"model {parts[1]} on {c.hosts[0].name}: cannot read it: No such file or directory"), ev
