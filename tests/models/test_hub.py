"""Pinned Hub references and the controller-side download against a real HTTP stand-in of the Hub
(tests/support/hub_standin.py) driven by the real huggingface_hub client."""

from __future__ import annotations

import asyncio
import hashlib
import socket
from pathlib import Path

import pytest

from tunnelspec.components.models import hub

from support.hub_standin import HubStandIn

REV = "0123456789abcdef0123456789abcdef01234567"
OTHER_REV = "fedcba9876543210fedcba9876543210fedcba98"
REPO = "tiny-org/tiny-GGUF"
DATA = b"GGUF" + bytes(range(256)) * 64
PART1, PART2 = b"GGUF-part-one" * 1000, b"part-two" * 1500


@pytest.fixture
def endpoint(tmp_path, monkeypatch):
    with HubStandIn() as s:
        s.add(REPO, REV, "tiny.gguf", DATA)
        s.add(REPO, REV, "split/tiny-00001-of-00002.gguf", PART1)
        s.add(REPO, REV, "split/tiny-00002-of-00002.gguf", PART2)
        s.add(REPO, REV, "broken/x-00001-of-00002.gguf", PART1)  # its part 2 is missing
        monkeypatch.setenv("HF_ENDPOINT", s.url)
        monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))
        monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
        monkeypatch.delenv("HF_HUB_CACHE", raising=False)
        monkeypatch.delenv("HF_TOKEN", raising=False)
        yield s


def fetch(text: str, var: str = "llama_model") -> list[Path]:
    ref = hub.parse_ref(text)
    files = hub.resolve(ref, var)
    return asyncio.run(hub.download(ref, files, var))


# ---- parsing --------------------------------------------------------------------------------------
@pytest.mark.parametrize("text, needle", [
    ("hf://org/repo/model.gguf", "no pinned revision"),
    ("hf://org/repo/model.gguf@main", "'main' of"),
    ("hf://org/repo/model.gguf@v1.0", "not a full 40-hex"),
    ("hf://org/repo/model.gguf@0123456", "not a full 40-hex"),
    ("hf://org/model.gguf@" + REV, "organisation, a repository and a file"),
    ("hf://org/repo/model.bin@" + REV, ".gguf"),
    ("hf://org/repo/../x.gguf@" + REV, "'..'"),
    ("hf://org/repo/m-00002-of-00003.gguf@" + REV, "name the first part"),
    ("hf:org/repo/m.gguf@" + REV, "hf://ORG/REPO"),
])
def test_bad_references_are_refused_with_the_pinned_form(text, needle):
    with pytest.raises(hub.HubRefError) as e:
        hub.parse_ref(text)
    assert needle in str(e.value)


def test_split_reference_names_every_part_in_its_folder():
    ref = hub.parse_ref(f"hf://o/r/q/m-00001-of-00003.gguf@{REV.upper()}")
    assert ref.revision == REV
    assert ref.parts == [f"q/m-0000{i}-of-00003.gguf" for i in (1, 2, 3)]
    assert str(ref) == f"hf://o/r/q/m-00001-of-00003.gguf@{REV}"


# ---- against the stand-in -------------------------------------------------------------------------
def test_download_verifies_and_second_fetch_uses_the_cache(endpoint):
    (path,) = fetch(f"hf://{REPO}/tiny.gguf@{REV}")
    assert path.read_bytes() == DATA
    assert endpoint.downloads("tiny.gguf") == 1
    (again,) = fetch(f"hf://{REPO}/tiny.gguf@{REV}")
    assert again == path and endpoint.downloads("tiny.gguf") == 1


def test_split_gguf_brings_every_part(endpoint):
    paths = fetch(f"hf://{REPO}/split/tiny-00001-of-00002.gguf@{REV}")
    assert [p.read_bytes() for p in paths] == [PART1, PART2]
    assert [p.name for p in paths] == ["tiny-00001-of-00002.gguf", "tiny-00002-of-00002.gguf"]


def test_missing_split_part_is_named(endpoint):
    with pytest.raises(hub.HubError) as e:
        fetch(f"hf://{REPO}/broken/x-00001-of-00002.gguf@{REV}", "llama_draft_model")
    assert "llama_draft_model" in str(e.value) and "x-00002-of-00002.gguf" in str(e.value)


def test_missing_file_revision_and_repo(endpoint):
    for text, needle in ((f"hf://{REPO}/nope.gguf@{REV}", "nope.gguf is not a file"),
                         (f"hf://{REPO}/tiny.gguf@{OTHER_REV}", f"revision {OTHER_REV} is not in"),
                         (f"hf://nobody/none/tiny.gguf@{REV}", "repository nobody/none not found")):
        with pytest.raises(hub.HubError) as e:
            fetch(text)
        assert needle in str(e.value) and "llama_model" in str(e.value)


def test_changed_bytes_for_the_same_revision_are_caught_and_not_kept(endpoint, tmp_path):
    endpoint.tamper(REPO, "tiny.gguf")
    with pytest.raises(hub.HubError) as e:
        fetch(f"hf://{REPO}/tiny.gguf@{REV}")
    assert f"reports {hashlib.sha256(DATA).hexdigest()}" in str(e.value)
    # Nothing with the wrong bytes stays in the cache for a later run to pick up.
    cached = [p for p in (tmp_path / "hf-home").rglob("*") if p.is_file() and p.stat().st_size == len(DATA)]
    assert cached == []
    endpoint.tampered.clear()
    (path,) = fetch(f"hf://{REPO}/tiny.gguf@{REV}")
    assert path.read_bytes() == DATA


def test_unreachable_endpoint_names_the_variable(monkeypatch, tmp_path):
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()  # a port nothing listens on: connection refused at once
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{port}")
    monkeypatch.setenv("HF_HOME", str(tmp_path))
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    with pytest.raises(hub.HubError) as e:
        hub.resolve(hub.parse_ref(f"hf://{REPO}/tiny.gguf@{REV}"), "llama_model")
    assert f"HF_ENDPOINT=http://127.0.0.1:{port}" in str(e.value) and "llama_model" in str(e.value)


def test_offline_uses_the_verified_cache_only(endpoint, monkeypatch):
    fetch(f"hf://{REPO}/tiny.gguf@{REV}")
    before = len(endpoint.requests)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    (path,) = fetch(f"hf://{REPO}/tiny.gguf@{REV}")
    assert path.read_bytes() == DATA and len(endpoint.requests) == before
    with pytest.raises(hub.HubError) as e:
        fetch(f"hf://{REPO}/split/tiny-00001-of-00002.gguf@{REV}")
    assert "HF_HUB_OFFLINE" in str(e.value) and len(endpoint.requests) == before


def test_token_is_sent_and_never_shown(endpoint, monkeypatch):
    endpoint.token = "hf_standin_secret_value"
    monkeypatch.setenv("HF_TOKEN", endpoint.token)
    (path,) = fetch(f"hf://{REPO}/tiny.gguf@{REV}")
    assert path.read_bytes() == DATA
    assert set(endpoint.auth_seen) == {f"Bearer {endpoint.token}"}
    endpoint.tamper(REPO, "tiny.gguf")
    monkeypatch.setenv("HF_TOKEN", "hf_wrong_secret")
    with pytest.raises(hub.HubError) as e:
        fetch(f"hf://{REPO}/split/tiny-00001-of-00002.gguf@{REV}")
    assert "hf_wrong_secret" not in str(e.value)
