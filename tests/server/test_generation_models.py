"""A generation's models by identity (docs/generations.md, "Models"): each file llama-server loads is
recorded with its size, mtime and header digest (computed on the host by llama/gguf_header.py, the
tensor data never read for it); `rollback --to` a generation whose model at the same path is another
file now is refused before any host changes, naming the host, the path and what changed; a touch alone
warns; a record from before (sha256 only) returns as it always did."""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import subprocess
from pathlib import Path
from types import SimpleNamespace

import pytest

from tunnelspec.components.generation import model_ids
from tunnelspec.components.generation import tasks as tg
from tunnelspec.components.models.files import parse_proofs
from tunnelspec.connection.local import LocalConnection
from tunnelspec.core.errors import TaskFailed
from tunnelspec.engine.context import HostContext, RunOptions
from tunnelspec.engine.playbook import builtin_playbook, load_playbook
from tunnelspec.lab import gguf_tiny
from tunnelspec.llama import gguf_header

KEY = "0123456789abcdef"
READER = Path(gguf_header.__file__).read_text()
NAME = b"tunnelspec-tiny-llama"


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> bytes:
    path = tmp_path_factory.mktemp("tiny") / "tiny.gguf"
    gguf_tiny.write_tiny_llama(path)
    data = path.read_bytes()
    assert data.count(NAME) >= 1, "the tiny model's general.name changed: pick another header byte to edit"
    return data


def proofs(mode: str, cache: Path, *paths: Path, python: tuple[str, ...] = ("python3",)) -> dict[str, dict]:
    r = subprocess.run([*python, "-I", "-c", READER, mode, str(cache), *map(str, paths)], capture_output=True,
                       text=True, timeout=60, stdin=subprocess.DEVNULL)
    assert r.returncode == 0, r.stderr
    return parse_proofs(r.stdout)


def swapped_header(data: bytes) -> bytes:
    """The same model with one byte of its metadata changed (its name): same size, another header."""
    at = data.index(NAME) + len(NAME) - 1
    return data[:at] + b"X" + data[at + 1:]


# ---- the host program: the header digest, on the oldest host python ------------------------------
def test_the_header_digest_covers_every_byte_before_the_tensor_data(tiny, tmp_path):
    model = tmp_path / "m.gguf"
    model.write_bytes(tiny)
    got = proofs("record", tmp_path / "cache.json", model)[str(model)]
    h = gguf_header.parse(tiny)
    assert got["header_sha256"] == hashlib.sha256(tiny[: h.data_start]).hexdigest()
    assert json.loads((tmp_path / "cache.json").read_text())[str(model)]["header_sha256"] == got["header_sha256"]
    # Another tensor data, the same header: the same digest (the data is not its part).
    model.write_bytes(tiny[:-4] + b"\x01\x02\x03\x04")
    assert proofs("check", tmp_path / "other.json", model)[str(model)]["header_sha256"] == got["header_sha256"]
    model.write_bytes(swapped_header(tiny))
    assert proofs("check", tmp_path / "other.json", model)[str(model)]["header_sha256"] != got["header_sha256"]


def test_a_cache_entry_from_before_the_header_digest_gets_it_without_a_whole_read(tiny, tmp_path):
    model, cache = tmp_path / "m.gguf", tmp_path / "cache.json"
    model.write_bytes(tiny)
    first = proofs("record", cache, model)[str(model)]
    old = json.loads(cache.read_text())
    del old[str(model)]["header_sha256"]
    cache.write_text(json.dumps(old))
    again = proofs("check", cache, model)[str(model)]
    assert again["cached"] is True and again["sha256"] == first["sha256"]
    assert again["header_sha256"] == first["header_sha256"]


def test_the_host_program_runs_on_the_oldest_host_python(tiny, tmp_path):
    python = None
    for argv in (("python3.9",), ("env", "PYENV_VERSION=3.9", "python3.9")):
        try:
            r = subprocess.run([*argv, "-c", "import sys; print(sys.version_info[:2])"], capture_output=True,
                               text=True, timeout=30, stdin=subprocess.DEVNULL)
        except OSError:
            continue
        if r.returncode == 0 and r.stdout.strip() == "(3, 9)":
            python = argv
            break
    if python is None:
        pytest.skip("no python3.9 on this machine")
    model = tmp_path / "m.gguf"
    model.write_bytes(tiny)
    got = proofs("record", tmp_path / "c.json", model, python=python)[str(model)]
    assert got["header_sha256"] == proofs("check", tmp_path / "d.json", model)[str(model)]["header_sha256"]


# ---- the record's entries and the comparison (pure) ----------------------------------------------
def entry(size=100, mtime=5, header="a" * 64, sha="b" * 64, src="/m/t.gguf", placed=""):
    return {"size": size, "mtime_ns": mtime, "header_sha256": header, "sha256": sha, "src": src, "placed": placed}


def proof(size=100, mtime=5, header="a" * 64, sha=None, **more):
    out = {"path": "/m/t.gguf", "size": size, "id": [size, mtime, 7], "header_sha256": header, **more}
    return {**out, **({"sha256": sha} if sha else {})}


def test_entries_say_who_placed_each_file():
    live = {"/m/t.gguf": proof(sha="b" * 64), "/var/lib/tunnelspec/models/d.gguf": proof(),
            "/var/lib/tunnelspec/models/h.gguf": proof(), "/m/broken.gguf": {"path": "/m/broken.gguf", "error": "x"}}
    got = model_ids.entries(live, {"/m/t.gguf": "/m/t.gguf", "/var/lib/tunnelspec/models/d.gguf": "models/d.gguf",
                                   "/var/lib/tunnelspec/models/h.gguf": "hf://o/r/h.gguf@" + "c" * 40})
    assert got["/m/t.gguf"] == entry()
    assert got["/var/lib/tunnelspec/models/d.gguf"]["placed"] == "upload"
    assert got["/var/lib/tunnelspec/models/h.gguf"]["placed"] == "hub"
    assert "/m/broken.gguf" not in got  # no identity: not recorded, not compared


def test_a_record_is_data_an_entry_of_another_shape_is_not_compared():
    record = {"n": 2, "model_files": {"/m/t.gguf": entry(), "rel.gguf": entry(), "/m/x.gguf": {"size": "1"},
                                      "/m/y.gguf": entry(header="../../etc")}}
    assert list(model_ids.recorded(record)) == ["/m/t.gguf"]
    assert model_ids.recorded({"n": 1, "model_sha256": {"/m/t.gguf": "b" * 64}}) == {}


@pytest.mark.parametrize(("live", "said", "touched"), [
    (proof(), [], False),
    (proof(mtime=9), [], True),                                     # a touch: a warning, not a refusal
    (proof(size=200, header="c" * 64), ["size 100 → 200", "header digest differs"], False),
    (proof(header="c" * 64), ["header digest differs"], False),
    (proof(sha="d" * 64), ["sha256 bbbbbbbbbbbb → dddddddddddd"], False),
    ({"path": "/m/t.gguf", "error": "cannot read it: No such file or directory"},
     ["it is gone (cannot read it: No such file or directory)"], False),
    ({"path": "/m/t.gguf", "size": 100, "id": [100, 5, 7], "error": "not a GGUF file (no GGUF magic)"},
     ["its header does not parse (not a GGUF file (no GGUF magic))"], False),
])
def test_what_changed_is_said_in_a_few_words(live, said, touched):
    assert model_ids.changes(entry(), live) == (said, touched)


def test_the_refusal_names_the_host_the_path_the_change_and_how_back():
    record = {"n": 3, "model_files": {"/m/t.gguf": entry(), "/var/lib/tunnelspec/models/h.gguf": entry(
        src="hf://o/r/h.gguf@" + "c" * 40, placed="hub")}}
    live = {"/m/t.gguf": proof(size=200), "/var/lib/tunnelspec/models/h.gguf": proof(header="e" * 64)}
    refusal, warnings = model_ids.verdict(record, live, "main")
    assert refusal is not None and warnings == []
    assert refusal.startswith("refusing to return to generation 3: main: model /m/t.gguf is not the file "
                              "generation 3 served (size 100 → 200); put the file generation 3 served back")
    assert ("main: model /var/lib/tunnelspec/models/h.gguf is not the file generation 3 served (header digest "
            f"differs); tunnelspec downloaded it from hf://o/r/h.gguf@{'c' * 40}: a deploy naming that reference "
            "downloads it again") in refusal
    assert "(nothing was changed;" in refusal
    refusal, warnings = model_ids.verdict(record, {p: proof(mtime=6) for p in live}, "main")
    assert refusal is None and len(warnings) == 2 and "a touch, not a swap" in warnings[0]


# ---- generation_pick on main: the live files read there, before any host changes ----------------------
def pick(tmp_path, record_models: dict | None, cache: Path) -> tuple:
    root = tmp_path / "root"
    build = root / "build" / KEY
    build.mkdir(parents=True, exist_ok=True)
    (build / ".tunnelspec-stamp").write_text(json.dumps({"key": KEY, "build_number": 13000}))
    main = {"role": "main", "root": str(root), "build": str(build), "files": {}}
    record = {"n": 4, "tree": "f" * 40, "patches": [], "hosts": {"main": main}}
    if record_models is not None:
        record["model_files"] = record_models

    async def records(_conn):
        return {4: record}, 5

    cluster = SimpleNamespace(main=SimpleNamespace(name="main", root=str(root), server_host="127.0.0.1",
                                                server_port=8080, tls=None), rpc=[])
    ctx = HostContext(host="main", conn=LocalConnection("main"), vars={}, facts={}, options=RunOptions(),
                      emit=lambda e: None, task_name="generation picked", cluster=cluster)
    task = tg.GenerationPick.build({"to": 4, "cache": str(cache)})
    mp = pytest.MonkeyPatch()
    mp.setattr(tg, "read_records", records)
    try:
        return asyncio.run(task.check(ctx)), ctx
    finally:
        mp.undo()


def recorded_now(model: Path, cache: Path, src: str = "") -> dict:
    return model_ids.entries(proofs("record", cache, model), {str(model): src or str(model)})


def test_pick_refuses_a_model_swapped_at_its_path_before_any_host_changes(tiny, tmp_path):
    model, cache = tmp_path / "draft.gguf", tmp_path / "proofs.json"
    model.write_bytes(tiny)
    ids = recorded_now(model, cache)
    model.write_bytes(swapped_header(tiny) + b"\0" * 32)
    with pytest.raises(TaskFailed) as e:
        pick(tmp_path, ids, cache)
    assert str(e.value).startswith(f"refusing to return to generation 4: main: model {model} is not the file "
                                   f"generation 4 served (size {len(tiny)} → {len(tiny) + 32}, header digest "
                                   "differs)"), str(e.value)


def test_pick_warns_of_a_touched_model_and_returns(tiny, tmp_path):
    model, cache = tmp_path / "draft.gguf", tmp_path / "proofs.json"
    model.write_bytes(tiny)
    ids = recorded_now(model, cache)
    st = model.stat()
    os.utime(model, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    ch, ctx = pick(tmp_path, ids, cache)
    assert f"WARNING main: model {model} has another mtime" in ch.msg and "a touch, not a swap" in ch.msg
    assert ctx.facts["generation"]["n"] == 4
    os.utime(model, ns=(st.st_atime_ns, st.st_mtime_ns))
    ch, _ = pick(tmp_path, ids, cache)
    assert "WARNING" not in ch.msg


def test_pick_of_a_record_from_before_the_identities_reads_no_model(tiny, tmp_path):
    # A generation recorded with the sha256 alone: picked as before (restore.py warns by sha256), even
    # with its model gone; the proof cache is not even read.
    record_models = None
    ch, ctx = pick(tmp_path, record_models, tmp_path / "missing-dir" / "proofs.json")
    assert ch.msg.startswith("generation 4: ") and "WARNING" not in ch.msg
    assert "model_files" not in ctx.facts["generation"]


def test_the_server_play_records_each_models_source():
    tasks = [t for p in load_playbook(builtin_playbook("server.yml")).plays for t in p.tasks
             if t.module == "generation_record"]
    assert len(tasks) == 1 and "sources" in tasks[0].args
