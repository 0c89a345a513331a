"""The models' proofs without python3 when nothing changed (components/models/proof_cache.py): a
`stat` of each model and the proof cache, answered by the play's batch, give exactly what the python3
reader prints for an unchanged file; a touched, replaced or missing model, and a cache that is
missing, garbled, a link, writable by others, owned by someone else or of another shape, run the
python3 reader as before, which sees the change."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
from pathlib import Path

import pytest

from tunnelspec.components.generation import live
from tunnelspec.components.models import proof_cache
from tunnelspec.components.models.files import ModelProof, parse_proofs, proof_argv, read_proofs
from tunnelspec.engine.context import HostContext, RunOptions
from tunnelspec.lab import gguf_tiny

from support.recording import RecordingConnection

NAME = b"tunnelspec-tiny-llama"


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> bytes:
    path = tmp_path_factory.mktemp("tiny") / "tiny.gguf"
    gguf_tiny.write_tiny_llama(path)
    return path.read_bytes()


@pytest.fixture
def proven(tiny, tmp_path) -> tuple[Path, Path]:
    """A model proven by the python3 reader (`record`, as model_proof's apply), and its cache."""
    d = tmp_path / "state"
    d.mkdir(mode=0o755)
    model, cache = tmp_path / "m.gguf", d / "proofs.json"
    model.write_bytes(tiny)
    python3(["record", str(cache), str(model)])
    return model, cache


def python3(args: list[str]) -> dict[str, dict]:
    mode, cache, *paths = args
    r = subprocess.run(proof_argv(mode, paths, cache), capture_output=True, text=True, timeout=60,
                       stdin=subprocess.DEVNULL)
    assert r.returncode == 0, r.stderr
    return parse_proofs(r.stdout)


def check(conn, model: Path, cache: Path, *, batched: bool = True):
    """model_proof's check, its probes first batched as the executor does for a play."""
    task = ModelProof.build({"src": str(model), "cache": str(cache)})
    ctx = HostContext(host="main", conn=conn, vars={}, facts={}, options=RunOptions(), emit=lambda e: None)

    async def go():
        if batched:
            assert await conn.prefetch(task.probes()) == 2
        return await task.check(ctx)

    return asyncio.run(go())


# ---- unchanged: no python3 -----------------------------------------------------------------------
def test_an_unchanged_model_is_proven_from_the_batch_without_python3(proven):
    model, cache = proven
    conn = RecordingConnection()
    ch = check(conn, model, cache)
    assert not ch.changed and "unchanged since proven" in ch.msg, ch.msg
    assert conn.programs() == ["sh"], conn.ran  # the batch alone: no test -f, no python3
    assert conn.changes_started == 0


def test_the_cache_answers_exactly_what_python3_prints_for_an_unchanged_file(proven):
    model, cache = proven
    want = python3(["check", str(cache), str(model)])
    assert want[str(model)]["cached"] is True
    conn = RecordingConnection()
    assert asyncio.run(read_proofs(conn, "main", [str(model)], str(cache))) == want
    assert "python3" not in conn.programs()


def test_the_generation_record_names_the_same_read_and_skips_python3(proven):
    model, cache = proven
    conn = RecordingConnection()

    async def go():
        probes = live.model_proofs_probe([str(model), ""], str(cache))
        assert probes == [proof_cache.stat_argv([str(model)], str(cache))]
        await conn.prefetch([*probes, ["true"]])
        return await live.model_proofs(conn, [str(model), ""], str(cache))

    got = asyncio.run(go())
    assert got == python3(["check", str(cache), str(model)])
    assert conn.programs() == ["sh"], conn.ran


# ---- changed: python3 reads again and says so ----------------------------------------------------
def test_a_touched_model_is_read_again(proven):
    model, cache = proven
    st = model.stat()
    os.utime(model, ns=(st.st_atime_ns, st.st_mtime_ns + 1))
    conn = RecordingConnection()
    ch = check(conn, model, cache)
    assert "python3" in conn.programs()
    assert ch.changed and "its sha256 to record" in ch.msg, ch.msg


def test_once_recorded_again_the_next_check_needs_no_python3(proven):
    model, cache = proven
    st = model.stat()
    os.utime(model, ns=(st.st_atime_ns, st.st_mtime_ns + 1))
    conn = RecordingConnection()
    task = ModelProof.build({"src": str(model), "cache": str(cache)})
    ctx = HostContext(host="main", conn=conn, vars={}, facts={}, options=RunOptions(), emit=lambda e: None)

    async def go():
        ch = await task.check(ctx)
        assert ch.changed
        await task.apply(ctx, ch)  # python3 `record`, as the executor's apply
        conn.ran.clear()
        return await task.check(ctx)  # the executor's check after the apply: converged

    again = asyncio.run(go())
    assert not again.changed and "python3" not in [a[0] for a in conn.ran], conn.ran


def test_a_replaced_model_is_read_again_and_its_new_header_seen(proven, tiny):
    model, cache = proven
    old = python3(["check", str(cache), str(model)])[str(model)]
    at = tiny.index(NAME) + len(NAME) - 1
    new = model.with_name("new.gguf")
    new.write_bytes(tiny[:at] + b"X" + tiny[at + 1 :])  # same size, another header
    os.utime(new, ns=(model.stat().st_atime_ns, model.stat().st_mtime_ns))  # even the same mtime
    new.replace(model)
    conn = RecordingConnection()
    got = asyncio.run(read_proofs(conn, "main", [str(model)], str(cache)))[str(model)]
    assert "python3" in conn.programs()
    assert got["cached"] is False and got["header_sha256"] != old["header_sha256"]
    assert got["size"] == old["size"]


def test_a_missing_part_is_read_by_python3_which_names_it(proven):
    model, cache = proven
    gone = str(model.with_name("gone.gguf"))
    conn = RecordingConnection()
    got = asyncio.run(live.model_proofs(conn, [str(model), gone], str(cache)))
    assert "python3" in conn.programs()
    assert got[gone]["error"].startswith("cannot read it")


# ---- a cache that is not trusted: python3 as before --------------------------------------------
def _untrusted(kind: str, model: Path, cache: Path) -> None:
    if kind == "absent":
        cache.unlink()
    elif kind == "garbled":
        cache.write_text(cache.read_text()[:-5])
    elif kind == "group writable":
        cache.chmod(0o664)
    elif kind == "directory writable":
        cache.parent.chmod(0o777)
    elif kind == "a link":
        real = cache.with_name("real.json")
        cache.rename(real)
        cache.symlink_to(real)
    elif kind == "two names":
        os.link(cache, cache.with_name("other.json"))
    else:
        doc = json.loads(cache.read_text())
        entry = doc[str(model)]
        if kind == "sha256 of another shape":
            entry["sha256"] = entry["sha256"].upper()
        elif kind == "no header digest":
            del entry["header_sha256"]
        elif kind == "needs more than its size":
            entry["need"] = entry["size"] + 1
        elif kind == "identity of another shape":
            entry["id"] = [*entry["id"], 0]
        elif kind == "a list":
            doc = [doc]
        cache.write_text(json.dumps(doc))


@pytest.mark.parametrize("kind", [
    "absent", "garbled", "group writable", "directory writable", "a link", "two names",
    "sha256 of another shape", "no header digest", "needs more than its size", "identity of another shape",
    "a list",
])
def test_a_cache_that_is_not_trusted_leaves_it_to_python3(proven, kind):
    model, cache = proven
    _untrusted(kind, model, cache)
    conn = RecordingConnection()
    got = asyncio.run(read_proofs(conn, "main", [str(model)], str(cache)))
    assert "python3" in conn.programs(), kind
    assert got[str(model)]["path"] == str(model)


def test_a_cache_owned_by_someone_else_is_not_trusted():
    entry = {"header_sha256": "a" * 64, "id": [10, 5_000000001, 7], "need": 10, "sha256": "b" * 64, "size": 10}

    def out(me: str, owner: str, dir_owner: str) -> str:
        return f"{me}\n{owner} 81a4 1\n{dir_owner} 41ed\n10 5.000000001 7 81a4 /m\n@\n" + json.dumps({"/m": entry})

    assert proof_cache.parse(out("0", "0", "0"), ["/m"]) == {"/m": {**entry, "path": "/m", "cached": True}}
    assert proof_cache.parse(out("0", "1000", "0"), ["/m"]) is None
    assert proof_cache.parse(out("0", "0", "1000"), ["/m"]) is None
    # A login that is not root: its own cache (it wrote the proofs without sudo), or root's.
    assert proof_cache.parse(out("1000", "1000", "1000"), ["/m"]) is not None
    assert proof_cache.parse(out("1000", "0", "0"), ["/m"]) is not None
    assert proof_cache.parse(out("1000", "1001", "1000"), ["/m"]) is None


def test_a_stat_without_nanoseconds_or_of_another_kind_of_file_is_no_match():
    entry = {"header_sha256": "a" * 64, "id": [10, 5_000000000, 7], "need": 10, "sha256": "b" * 64, "size": 10}

    def out(model_line: str) -> str:
        return f"0\n0 81a4 1\n0 41ed\n{model_line}\n@\n" + json.dumps({"/m": entry})

    assert proof_cache.parse(out("10 5.000000000 7 81a4 /m"), ["/m"]) is not None
    assert proof_cache.parse(out("10 5 7 81a4 /m"), ["/m"]) is None  # %.9Y not understood
    assert proof_cache.parse(out("10 5.000000000 7 41ed /m"), ["/m"]) is None  # a directory
    assert proof_cache.parse(out("10 5.000000000 8 81a4 /m"), ["/m"]) is None  # another inode
    assert proof_cache.parse(out("10 5.000000000 7 81a4 /other"), ["/m"]) is None
