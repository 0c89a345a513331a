"""A model swapped at its path stops a return, in the lab (docs/generations.md, "Models").

The running lab is used as it is (no deploy unless its current generation predates the models'
identity: then one converge adds it). The lab's model — target and draft are the same tiny GGUF, on
the read-only fixtures mount every host sees — is replaced at its path, on the controller, by a copy
with one byte of its metadata changed and 32 bytes more (renamed over it: llama-server keeps the file
it mapped). `rollback --to` the current generation then exits 1 naming main, the model's path and the
change, and nothing serving moved: the same llama-server, front and rpc-server processes, and a
completion still answers. The original file is put back (the same inode, its mtime untouched) in a
finally, and the same rollback then changes nothing. Warm: two rollbacks, about half a minute."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest

from support.cli import tunnelspec
from support.labdeploy import UNIT, completion_on_main, converge, sh

pytestmark = pytest.mark.lab

GEN_DIR = "/var/lib/tunnelspec/generations"
NAME = b"tunnelspec-tiny-llama"  # the tiny model's general.name (tunnelspec/lab/gguf_tiny.py)
EXTRA = 32


def current_record(lab) -> dict:
    n = sh(lab, "main", "cat", f"{GEN_DIR}/current").strip()
    return json.loads(sh(lab, "main", "cat", f"{GEN_DIR}/{n}.json"))


def serving(lab) -> dict[str, str]:
    """The processes that serve: a return that touched nothing leaves every one as it was."""
    def pid(host: str, unit: str) -> str:
        return sh(lab, host, "systemctl", "show", "-p", "MainPID", "--value", unit).strip()

    return {"llama-server": pid("main", UNIT), "front": pid("main", "tunnelspec-front.service"),
            "rpc-a": pid("rpc-a", "tunnelspec-rpc.service")}


def swapped(data: bytes) -> bytes:
    at = data.index(NAME) + len(NAME) - 1
    return data[:at] + b"X" + data[at + 1:] + b"\0" * EXTRA


def test_rollback_to_a_generation_whose_swapped_model_is_refused_untouched(lab, llama_fixtures):
    model, local = llama_fixtures.model, Path(llama_fixtures.model_local)
    assert f"llama_draft_model={model}" in lab.inventory.read_text(), "the lab's draft is not the fixture model"
    record = current_record(lab)
    if model not in record.get("model_files", {}):
        converge(lab.inventory)  # a generation from before identities: the deploy adds them
        record = current_record(lab)
    assert model in record["model_files"], record.get("model_files")
    good, size = record["n"], record["model_files"][model]["size"]
    before = serving(lab)
    assert all(p not in ("", "0") for p in before.values()), before

    data = local.read_bytes()
    orig = local.with_name(local.name + ".tunnelspec-test-orig")
    tmp = local.with_name(local.name + ".tunnelspec-test-tmp")
    os.link(local, orig)  # the original inode kept: put back as it was, mtime and all
    try:
        tmp.write_bytes(swapped(data))
        os.replace(tmp, local)
        r = tunnelspec("rollback", str(lab.inventory), "--to", str(good), "--format", "json", timeout=600)
        assert r.rc == 1 and "Traceback" not in r.stderr, r.stderr[-2000:]
        failed = r.results("failed")
        assert [(e["host"], e["module"]) for e in failed] == [("main", "generation_pick")], failed
        assert (f"refusing to return to generation {good}: main: model {model} is not the file generation {good} "
                f"served (size {size} → {size + EXTRA}, header digest differs)") in failed[0]["msg"], failed[0]
        assert "(nothing was changed" in failed[0]["msg"]
        assert not r.results("changed"), r.results("changed")
        assert serving(lab) == before
        assert completion_on_main(lab) is not None
    finally:
        tmp.unlink(missing_ok=True)
        if orig.exists():
            os.replace(orig, local)

    # As before: the fixture's own bytes at its path, and the same return now changes nothing.
    assert hashlib.sha256(local.read_bytes()).hexdigest() == llama_fixtures.model_sha256
    again = tunnelspec("rollback", str(lab.inventory), "--to", str(good), "--format", "json", timeout=600)
    assert again.rc == 0, [e for e in again.results() if e["status"] == "failed"] + [again.stderr[-2000:]]
    assert [(e["host"], e["task"]) for e in again.results("changed")] == []
    pick = next(e for e in again.results() if e.get("module") == "generation_pick")
    assert "WARNING main: model" not in pick["msg"], pick["msg"]
    assert serving(lab) == before
