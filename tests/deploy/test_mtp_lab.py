"""Seed 000's own topology in the lab, run for real — `--spec-type draft-mtp` with a separate
MTP draft file on the draft node's device (rpc-a, RPC0 through its tunnel), the target on main.

The inventory is examples/seed000-mtp-laptop-gpu.ini itself with only the hosts, the models and
[all:vars] swapped for the lab's (tests/support/seed000.py; the first test prints which lines differ).
The models come from tests/support/gguf_mtp.py: a tiny cohere2moe target and its MTP head, built
to agree on one token, so accepted draft tokens prove that the MTP head on RPC0 read the target's
hidden state and proposed what the target then produced. One deploy serves every test here; the
second deploy must change nothing.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from support import gguf_mtp

from support.cli import failed_report, tunnelspec
from support.labdeploy import UNIT, deploy, main_pid, running_argv, sh
from support.seed000 import changed_lines, lab_variant

pytestmark = pytest.mark.lab

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "seed000-mtp-laptop-gpu.ini"
DRAFT_ENDPOINT = "127.0.0.1:15052"  # rpc-a's tunnel: the first (and only) [rpc] node of seed 000


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    d = tmp_path_factory.mktemp("mtp-models")
    gguf_mtp.write_mtp_target(d / "mtp-target.gguf")
    gguf_mtp.write_mtp_draft(d / "mtp-draft.gguf")
    return d


@pytest.fixture(scope="module")
def seed000(lab, models) -> Path:
    text = lab_variant(EXAMPLE.read_text(), Path(lab.inventory).read_text(),
                       str(models / "mtp-target.gguf"), str(models / "mtp-draft.gguf"))
    path = Path(lab.dir) / "example-seed000-mtp-laptop-gpu.ini"
    path.write_text(text)
    return path


@pytest.fixture(scope="module")
def deployed(seed000):
    r = deploy(seed000)
    assert r.rc == 0, failed_report(r)
    return r


def test_the_lab_runs_seed000_with_only_hosts_models_and_all_vars_swapped(seed000):
    diff = changed_lines(EXAMPLE.read_text(), seed000.read_text())
    for why, old, new in diff:
        print(f"{why:>8}: {old!r} -> {new!r}")
    assert diff and not [d for d in diff if d[0] == "other"], diff
    assert {why for why, _, _ in diff} == {"host", "model", "all:vars"}
    text = seed000.read_text()
    # What seed 000 is about stays as written.
    for line in ("spec_type=draft-mtp", "spec_draft_n_max=3"):
        assert re.search(rf"^{line}$", text, re.M)
    assert re.search(r"^rpc-a .*rpc_role=draft", text, re.M)


def test_mtp_draft_on_rpc0_drafts_tokens_the_target_accepts(lab, deployed):
    # The command line llama-server runs now (whatever launched it).
    argv = running_argv(lab)
    after = {w: argv[i + 1] for i, w in enumerate(argv[:-1]) if w.startswith("--spec")}
    assert after.get("--spec-type") == "draft-mtp" and after.get("--spec-draft-device") == "RPC0", argv
    assert after.get("--spec-draft-n-max") == "3", argv
    draft_path = after.get("--spec-draft-model", "")
    assert draft_path.endswith("mtp-draft.gguf"), argv

    ev = next(e for e in deployed.results() if e.get("module") == "llama_verify")
    print(ev["msg"])
    assert ev["status"] == "ok", ev
    m = re.search(r"draft_n=(\d+) draft_n_accepted=(\d+)", ev["msg"])
    assert m and int(m.group(1)) > 0 and int(m.group(2)) > 0, ev["msg"]
    assert "speculative type draft-mtp" in ev["msg"]
    assert f"draft model buffer on RPC0[{DRAFT_ENDPOINT}]" in ev["msg"]

    # The RPC0 buffer is the MTP file's: the first model buffer llama-server logs after it starts
    # loading the draft (the target is on main's CPU: none of its buffers is on RPC0).
    journal = sh(lab, "main", "journalctl", "-u", UNIT, "-o", "cat", "--no-pager", "-n", "5000")
    start = journal.rfind(f"loading draft model '{draft_path}'")
    assert start >= 0, journal[-3000:]
    rpc_line = re.search(rf"load_tensors: RPC0\[{re.escape(DRAFT_ENDPOINT)}\] model buffer size = +[\d.]+ MiB",
                         journal[start:])
    assert rpc_line, journal[start:start + 4000]
    before_target_reload = journal[start:].find("loading model '")
    assert before_target_reload < 0 or rpc_line.start() < before_target_reload
    print(rpc_line.group(0))


def test_status_names_draft_mtp(lab, seed000, deployed):
    st = tunnelspec("status", str(seed000), "--format", "json", timeout=120)
    assert st.rc == 0, st.stdout + st.stderr
    server = json.loads(st.stdout)["hosts"]["main"]["llama_server"]
    assert server["spec_type"] == "draft-mtp", server
    assert server["health"] == "ok"
    assert server["draft_acceptance"]["accepted"] > 0, server


def test_second_deploy_changes_nothing(seed000, deployed):
    r = deploy(seed000)
    assert r.rc == 0, failed_report(r)
    assert [(e["host"], e["task"]) for e in r.results("changed")] == []
    ev = next(e for e in r.results() if e.get("module") == "llama_verify")
    assert "speculative type draft-mtp" in ev["msg"], ev["msg"]


def test_a_draft_without_an_mtp_block_is_refused_before_llama_server_is_touched(lab, seed000, deployed):
    # The lab's tiny llama model as the draft-mtp draft: llama-server would exit at every start
    # ("failed to create MTP context"), a restart loop. The plan task refuses it, naming the build;
    # the server deployed above keeps serving, its unit unchanged.
    pid, unit = main_pid(lab), sh(lab, "main", "cat", f"/etc/systemd/system/{UNIT}")
    bad = Path(lab.dir) / "seed000-not-mtp.ini"
    not_mtp = "/srv/tunnelspec-fixtures/models/tiny-llama.gguf"  # on every lab host
    bad.write_text(re.sub(r"^llama_draft_model=.*$", f"llama_draft_model={not_mtp}", seed000.read_text(), flags=re.M))
    r = deploy(bad)
    assert r.rc != 0, failed_report(r)
    (failed,) = r.results("failed")
    assert (failed["host"], failed["module"]) == ("main", "llama_server_plan"), failed
    for words in ("tiny-llama.gguf has none", "build 11434", "failed to create MTP context", "--mtp"):
        assert words in failed["msg"], failed["msg"]
    assert main_pid(lab) == pid and sh(lab, "main", "cat", f"/etc/systemd/system/{UNIT}") == unit
    assert sh(lab, "main", "systemctl", "is-active", UNIT).strip() == "active"
