"""Draft types in the lab: every draft type a tiny model can exercise, deployed for real with its draft
on the remote device (rpc-a, RPC0 through its tunnel), one completion with draft tokens accepted.

The models come from tests/support/gguf_drafts.py: a target that always predicts one token and
EAGLE-3 / DFlash / DSpark drafts built to predict the same one, so acceptance is the proof that the
type's own path (feature extraction from the target, the head on RPC0) ran. draft-mtp has its own
module, tests/deploy/test_mtp_lab.py: an MTP head reads the target's `h_nextn` hidden state, which
the tiny llama target does not feed it, so it runs with its own pair (tests/support/gguf_mtp.py), in seed
000's topology.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from support import gguf_drafts

from support.cli import failed_report, tunnelspec
from support.labdeploy import running_argv

pytestmark = pytest.mark.lab

WRITERS = {"draft-eagle3": gguf_drafts.write_eagle3_draft, "draft-dflash": gguf_drafts.write_dflash_draft,
           "draft-dspark": gguf_drafts.write_dspark_draft}


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    d = tmp_path_factory.mktemp("draft-models")
    gguf_drafts.write_constant_target(d / "constant-target.gguf")
    for kind, write in WRITERS.items():
        write(d / f"{kind}.gguf")
    return d


@pytest.mark.parametrize("spec_type", sorted(WRITERS))
def test_draft_type_on_the_remote_device_with_tokens_accepted(lab, models, spec_type):
    text = Path(lab.inventory).read_text()
    text = re.sub(r"^llama_model=.*$", f"llama_model={models / 'constant-target.gguf'}", text, flags=re.M)
    text = re.sub(r"^llama_draft_model=.*$", f"llama_draft_model={models / (spec_type + '.gguf')}", text, flags=re.M)
    text = text.replace("[rpc]", f"[main:vars]\nspec_type={spec_type}\n\n[rpc]", 1)
    inv = Path(lab.dir) / f"inventory-{spec_type}.ini"
    inv.write_text(text)
    r = tunnelspec("deploy", str(inv), "--format", "json", timeout=3600)
    assert r.rc == 0, failed_report(r)
    argv = running_argv(lab)  # what llama-server runs now, whatever launched it
    assert argv[argv.index("--spec-type") + 1] == spec_type and argv[argv.index("--spec-draft-device") + 1] == "RPC0"
    ev = next(e for e in r.results() if e.get("module") == "llama_verify")
    assert ev["status"] == "ok", ev
    m = re.search(r"draft_n=(\d+) draft_n_accepted=(\d+)", ev["msg"])
    print(f"{spec_type}: {ev['msg']}")
    assert m and int(m.group(1)) > 0 and int(m.group(2)) > 0, ev["msg"]
    assert f"speculative type {spec_type}" in ev["msg"]
    assert "draft model buffer on RPC0[127.0.0.1:15052]" in ev["msg"]
