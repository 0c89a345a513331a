"""Generations (docs/generations.md): the record's pure parts — state parsing, diffing, numbering,
which generations and builds are kept — and the build pruning's pins run by a real shell."""

from __future__ import annotations

import hashlib
import os
import subprocess

from tunnelspec.components.generation import record as gen
from tunnelspec.components.generation import state as gen_state
from tunnelspec.components.generation import store as gstore
from tunnelspec.components.build import build as llama_build

MAIN = "/etc/systemd/system/tunnelspec-llama-server.service"


def _host(build: str, sha: str = "a" * 64) -> dict:
    return {"role": "main", "root": "/opt/t", "build": f"/opt/t/build/{build}",
            "files": {MAIN: {"sha256": sha, "mode": "644"}, "/etc/tunnelspec/front.cfg": None}}


def _record(n: int, build: str = "k1", sha: str = "a" * 64, node_build: str = "r1") -> dict:
    node = {"role": "rpc", "root": "/opt/t", "build": f"/opt/t/build/{node_build}", "files": {}}
    return {"n": n, "tree": "f" * 40, "patches": [], "hosts": {"main": _host(build, sha), "rpc-a": node}}


def test_state_script_output_parses_into_build_and_files():
    text = (f"build /opt/t/build/k1\nfile {'b' * 64} 644 {MAIN}\nfile - - /etc/tunnelspec/front.cfg\n")
    st = gen_state.parse_state(text)
    assert st == {"build": "/opt/t/build/k1",
                  "files": {MAIN: {"sha256": "b" * 64, "mode": "644"}, "/etc/tunnelspec/front.cfg": None}}


def test_the_state_script_reads_a_real_tree(tmp_path):
    root = tmp_path / "root"
    (root / "build" / "k1").mkdir(parents=True)
    os.symlink(str(root / "build" / "k1"), root / "current")
    f = tmp_path / "unit"
    f.write_text("[Unit]\n")
    out = subprocess.run(["sh", "-c", gen_state.STATE_SCRIPT, "sh", str(root), str(f), str(tmp_path / "absent")],
                         capture_output=True, text=True, check=True).stdout
    st = gen_state.parse_state(out)
    assert st["build"] == str(root / "build" / "k1")
    assert st["files"][str(f)] == {"sha256": hashlib.sha256(b"[Unit]\n").hexdigest(), "mode": "644"}
    assert st["files"][str(tmp_path / "absent")] is None


def test_diff_names_the_build_and_the_files_that_differ():
    assert gen.host_diff(_host("k1"), _host("k1")) == []
    d = gen.host_diff(_host("k1"), _host("k2", "c" * 64))
    assert d[0].startswith("build k2") and d[0].endswith("k1") and "tunnelspec-llama-server.service" in d
    assert gen.same_state(_record(1), {"hosts": _record(9)["hosts"]})
    assert not gen.same_state(_record(1), _record(2, build="k2"))


def test_numbering_and_keeping():
    assert gen.next_number([]) == 1 and gen.next_number([3, 1, 2]) == 4
    assert gen.kept([1, 2, 3, 4, 5], 3, 5) == [3, 4, 5]
    # A rollback made an old generation current: it is kept beyond the newest ones.
    assert gen.kept([1, 2, 3, 4, 5], 3, 1) == [1, 3, 4, 5]
    assert gen.kept([1, 2], 0, 2) == [2]


def test_kept_generations_pin_their_builds_and_file_copies():
    records = [_record(1, "k1", "a" * 64), _record(2, "k2", "b" * 64, node_build="r2"), _record(3, "k2", "b" * 64)]
    assert gen.pinned_builds(records, "main") == ["k1", "k2"]
    assert gen.pinned_builds(records, "rpc-a") == ["r1", "r2"]
    assert gen.used_files(records, "main") == {"a" * 64, "b" * 64}
    assert gen.find_same(records, {"hosts": _record(0, "k2", "b" * 64)["hosts"]}) == 3
    assert gen.find_same(records, {"hosts": _record(0, "k9")["hosts"]}) is None
    assert gen.summary(records[0]).startswith("generation 1: tree ffffffffffff + 0 patch(es); main build/k1")


def test_records_on_main_parse_with_the_current_pointer():
    text = ("--- 1\n" + gen.dumps(_record(1)) + "\n--- 2\n" + gen.dumps(_record(2, "k2")) + "\n--- 3\n{broken\n"
            "--- current 2\n")
    records, current = gstore.parse_records(text)
    assert sorted(records) == [1, 2] and current == 2 and records[2]["hosts"]["main"]["build"].endswith("k2")
    assert gstore.parse_records("--- current \n") == ({}, None)
    assert gstore.parse_records("--- 1\n" + gen.dumps(_record(1)) + "--- current 7\n")[1] is None


def test_build_pruning_never_removes_a_pinned_build(tmp_path):
    root = tmp_path / "root"
    build = root / "build"
    for i, key in enumerate(["old1", "old2", "mid", "cur"]):
        d = build / key
        d.mkdir(parents=True)
        (d / llama_build.USED).touch()
        os.utime(d / llama_build.USED, (1000 + i, 1000 + i))
    (build / gen.PINS).write_text("old1\n")
    out = subprocess.run(["sh", "-c", llama_build._PRUNE, "sh", str(root), "2", "cur", llama_build.USED, ".stamp"],
                         capture_output=True, text=True, check=True).stdout.split()
    assert out == ["old2"]
    assert sorted(p.name for p in build.iterdir() if p.is_dir()) == ["cur", "mid", "old1"]


def test_the_pins_and_copies_prune_script(tmp_path):
    root, store = tmp_path / "root", tmp_path / "files"
    (root / "build").mkdir(parents=True)
    store.mkdir()
    for name in ("a" * 64, "b" * 64):
        (store / name).write_text("x")
    subprocess.run(["sh", "-c", gstore.PRUNE_SCRIPT, "sh", str(root / "build" / gen.PINS), str(store), "k1", "k2",
                    f"sha:{'a' * 64}"], check=True)
    assert (root / "build" / gen.PINS).read_text() == "k1\nk2\n"
    assert [p.name for p in store.iterdir()] == ["a" * 64]


MODEL = "/srv/models/target.gguf"


def test_a_model_changed_at_its_path_is_a_new_state_and_the_record_shows_its_sum():
    with_model = {**_record(1), "model_sha256": {MODEL: "d" * 64}}
    assert gen.same_state(with_model, {"hosts": _record(9)["hosts"], "model_sha256": {MODEL: "d" * 64}})
    assert not gen.same_state(with_model, {"hosts": _record(9)["hosts"], "model_sha256": {MODEL: "e" * 64}})
    # A record from before the sums were kept differs from a state that has them: recorded anew once.
    assert not gen.same_state(_record(1), {"hosts": _record(9)["hosts"], "model_sha256": {MODEL: "d" * 64}})
    assert gen.models_diff({MODEL: "d" * 64}, {MODEL: "e" * 64}) == ["model target.gguf"]
    assert gen.models_diff({MODEL: "d" * 64}, {MODEL: "d" * 64}) == []
    assert "; models target.gguf dddddddddddd; state " in gen.summary(with_model)
    assert "models" not in gen.summary(_record(1))


def test_returning_to_a_generation_says_when_a_model_file_is_another():
    record = {**_record(4), "model_sha256": {MODEL: "d" * 64, "/srv/models/draft.gguf": "f" * 64}}
    assert gen.model_drift(record, {MODEL: "d" * 64, "/srv/models/draft.gguf": "f" * 64}) == []
    assert gen.model_drift(record, {MODEL: "e" * 64, "/srv/models/draft.gguf": None}) == [
        f"/srv/models/draft.gguf changed since generation 4 proved it (sha256 then {'f' * 12})",
        f"{MODEL} is not generation 4's (sha256 {'e' * 12}, then {'d' * 12})"]
    assert gen.model_drift(_record(4), {MODEL: "e" * 64}) == []


def test_a_process_already_on_the_generations_build_is_not_restarted():
    assert gen.runs_build("/opt/t/build/k1/bin/llama-server", "/opt/t/build/k1")
    assert gen.runs_build("/opt/t/build/k1/bin/ggml-rpc-server (deleted)", "/opt/t/build/k1/")
    assert not gen.runs_build("/opt/t/build/k10/bin/llama-server", "/opt/t/build/k1")
    assert not gen.runs_build("", "/opt/t/build/k1") and not gen.runs_build("/usr/bin/python3", "")
