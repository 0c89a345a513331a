"""What the controller keeps of a host's registered facts for the next run's read-ahead
(engine/recall.py): JSON data without secrets, per host and connection, under the cache root only
where one exists; anything else read back is no record."""

from __future__ import annotations

import json
import stat

from tunnelspec.core.secrets import Secret
from tunnelspec.engine import recall

IDENT = ("ssh", "root", "10.0.0.1", "22")


def test_facts_round_trip_per_host_and_connection(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    facts = {"llama_src": {"tree": "ab" * 20, "patches": []}, "made": {"changed": False, "msg": "ok"}}
    recall.save("main", IDENT, facts, [], before={})
    assert recall.load("main", IDENT) == facts
    assert recall.load("rpc-a", IDENT) == {}  # another host
    assert recall.load("main", ("ssh", "root", "10.0.0.1", "2222")) == {}  # another connection
    (path,) = (tmp_path / "tunnelspec" / "registered").iterdir()
    assert stat.S_IMODE(path.stat().st_mode) == 0o600


def test_secrets_and_what_is_not_json_are_left_out(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    facts = {
        "plain": {"path": "/srv/model.gguf"},
        "masked": {"args": ["--api-key", Secret("hunter2-token")]},
        "inside": {"line": "Authorization: Bearer s3cret-value-9"},
        "code": {"f": object()},
    }
    assert recall.keepable(facts, ["s3cret-value-9"]) == {"plain": {"path": "/srv/model.gguf"}}
    recall.save("main", IDENT, facts, ["s3cret-value-9"], before={})
    text = next((tmp_path / "tunnelspec" / "registered").iterdir()).read_text()
    assert "hunter2" not in text and "s3cret" not in text


def test_no_cache_root_keeps_nothing_and_a_bad_record_is_none(tmp_path, monkeypatch):
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))  # no ~/.cache: nothing is created
    recall.save("main", IDENT, {"a": 1}, [], before={})
    assert not (tmp_path / "home").exists()
    assert recall.load("main", IDENT) == {}

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    recall.save("main", IDENT, {"a": 1}, [], before={})
    path = recall.record_path("main", IDENT)
    assert path is not None and recall.load("main", IDENT) == {"a": 1}
    for bad in ("not json", json.dumps({"version": 99, "host": "main", "facts": {"a": 1}}),
                json.dumps({"version": recall.RECORD_VERSION, "host": "rpc-a", "facts": {"a": 1}}),
                json.dumps({"version": recall.RECORD_VERSION, "host": "main", "facts": ["a"]})):
        path.write_text(bad)
        assert recall.load("main", IDENT) == {}
