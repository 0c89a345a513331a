"""`model_file` with a pinned hf:// model, end to end through the CLI: the real huggingface_hub client
against the Hub stand-in on 127.0.0.1, uploads over a real sshd. Downloaded once, uploaded once,
then `ok` with no download; split GGUFs bring every part; bad inputs fail before any upload."""

from __future__ import annotations

import hashlib
import socket
from pathlib import Path

import pytest

from support.cli import tunnelspec
from support.hub_standin import HubStandIn

REV = "89abcdef0123456789abcdef0123456789abcdef"
REPO = "tiny-org/tiny-GGUF"
DATA = b"GGUF" + hashlib.sha256(b"tiny").digest() * 4096
PART1, PART2 = b"GGUF" + b"1" * 70000, b"2" * 50000
TOKEN = "hf_standin_secret_token_value"
SPLIT = f"hf://{REPO}/split/tiny-00001-of-00002.gguf@{REV}"


@pytest.fixture
def setup(tmp_path):
    from support.sshd_harness import SshdCluster

    c = SshdCluster(tmp_path / "c", 1)
    with HubStandIn(token=TOKEN) as hubs:
        hubs.add(REPO, REV, "tiny.gguf", DATA)
        hubs.add(REPO, REV, "split/tiny-00001-of-00002.gguf", PART1)
        hubs.add(REPO, REV, "split/tiny-00002-of-00002.gguf", PART2)
        env = {"HF_ENDPOINT": hubs.url, "HF_HOME": str(tmp_path / "hf-home"), "HF_TOKEN": TOKEN,
               "HF_HUB_OFFLINE": ""}
        yield c, c.inventory(), hubs, env, c.hosts[0].root / "models"
    c.stop()


def playbook(c, *models: tuple[str, str]) -> str:
    tasks = "".join(f"    - name: {fact}\n      model_file: {{src: \"{src}\", fact: {fact}, "
                    f"dest_dir: \"{{{{ root }}}}/models\"}}\n" for src, fact in models)
    keep = ", ".join(f"\"{{{{ {fact} }}}}\"" for _, fact in models)
    tasks += f"    - name: prune\n      models_prune: {{keep: [{keep}], dir: \"{{{{ root }}}}/models\"}}\n"
    pb = c.base / "models.yml"
    pb.write_text("- hosts: all\n  tasks:\n" + tasks)
    return str(pb)


def files(d: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(d.iterdir())} if d.is_dir() else {}


def test_pinned_models_upload_once_then_nothing(setup):
    c, inv, hubs, env, models = setup
    pb = playbook(c, (f"hf://{REPO}/tiny.gguf@{REV}", "llama_model_path"), (SPLIT, "llama_draft_model_path"))
    first = tunnelspec("play", str(inv), pb, "--format", "json", "--diff", env=env)
    assert first.rc == 0, first.stdout + first.stderr
    assert [e["status"] for e in first.results()] == ["changed", "changed", "ok"]
    assert files(models) == {"tiny.gguf": DATA, "tiny-00001-of-00002.gguf": PART1,
                             "tiny-00002-of-00002.gguf": PART2}
    assert hubs.downloads() == 3, hubs.requests
    progress = [e["msg"] for e in first.events if e.get("event") == "progress"]
    assert any(m.startswith("download tiny-00002-of-00002.gguf") for m in progress), progress
    assert any(m.startswith("tiny.gguf: sha256") and "verified" in m for m in progress), progress
    assert set(hubs.auth_seen) == {f"Bearer {TOKEN}"}  # the token from the environment was used
    second = tunnelspec("play", str(inv), pb, "--format", "json", "--diff", env=env)
    assert second.rc == 0 and [e["status"] for e in second.results()] == ["ok", "ok", "ok"], second.stdout
    assert hubs.downloads() == 3  # checked against the Hub's sha256, nothing downloaded
    for res in (first, second):
        assert TOKEN not in res.stdout + res.stderr


def test_a_changed_host_file_is_uploaded_again_from_the_cache(setup):
    c, inv, hubs, env, models = setup
    pb = playbook(c, (SPLIT, "llama_model_path"))
    assert tunnelspec("play", str(inv), pb, "--format", "json", env=env).rc == 0
    (models / "tiny-00002-of-00002.gguf").write_bytes(b"damaged")
    res = tunnelspec("play", str(inv), pb, "--format", "json", env=env)
    assert res.rc == 0 and [e["status"] for e in res.results()] == ["changed", "ok"], res.stdout
    assert "1 file(s)" in res.results()[0]["msg"]
    assert files(models)["tiny-00002-of-00002.gguf"] == PART2
    assert hubs.downloads() == 2  # the part came from the controller's cache


def test_changed_bytes_at_the_same_revision_fail_and_nothing_is_uploaded(setup):
    c, inv, hubs, env, models = setup
    hubs.tamper(REPO, "split/tiny-00002-of-00002.gguf")
    res = tunnelspec("play", str(inv), playbook(c, (SPLIT, "llama_model_path")), "--format", "json", env=env)
    assert res.rc == 1
    (failed,) = res.results("failed")
    assert "llama_model" in failed["msg"] and "sha256" in failed["msg"] and "refusing" in failed["msg"]
    assert files(models) == {}  # not even the good first part: every part is verified first


@pytest.mark.parametrize("case", ["missing_file", "unreachable", "offline_not_cached"])
def test_bad_hub_inputs_fail_naming_the_variable(setup, case):
    c, inv, hubs, env, models = setup
    src = f"hf://{REPO}/tiny.gguf@{REV}"
    if case == "missing_file":
        src, needle = f"hf://{REPO}/absent.gguf@{REV}", "absent.gguf is not a file"
    elif case == "unreachable":
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        s.close()
        env = {**env, "HF_ENDPOINT": f"http://127.0.0.1:{port}"}
        needle = f"HF_ENDPOINT=http://127.0.0.1:{port}"
    else:
        env = {**env, "HF_HUB_OFFLINE": "1"}
        needle = "HF_HUB_OFFLINE"
    res = tunnelspec("play", str(inv), playbook(c, (src, "llama_draft_model_path")), "--format", "json", env=env)
    assert res.rc == 1, res.stdout + res.stderr
    (failed,) = res.results("failed")
    assert "llama_draft_model" in failed["msg"] and needle in failed["msg"], failed["msg"]
    assert files(models) == {} and TOKEN not in res.stdout + res.stderr


def test_controller_file_still_uploads_once(setup, tmp_path):
    c, inv, hubs, env, models = setup
    local = c.base / "local-model.gguf"
    local.write_bytes(DATA * 12)
    pb = playbook(c, ("local-model.gguf", "llama_model_path"))  # relative: the sshd host shares our disk
    first = tunnelspec("play", str(inv), pb, "--format", "json", env=env)
    assert first.rc == 0 and [e["status"] for e in first.results()] == ["changed", "ok"], first.stdout
    assert files(models) == {"local-model.gguf": DATA * 12}
    second = tunnelspec("play", str(inv), pb, "--format", "json", env=env)
    assert [e["status"] for e in second.results()] == ["ok", "ok"]
    assert hubs.requests == []  # a controller file never asks the Hub


def test_check_mode_asks_the_hub_but_downloads_and_uploads_nothing(setup):
    c, inv, hubs, env, models = setup
    pb = playbook(c, (SPLIT, "llama_model_path"))
    plan = tunnelspec("play", str(inv), pb, "--format", "json", "--check", "--diff", env=env)
    assert plan.rc == 3, plan.stdout + plan.stderr
    (would,) = [e for e in plan.results() if e.get("task") == "llama_model_path"]
    assert "download" in would["msg"] and "2 file(s)" in would["msg"], would
    assert hubs.downloads() == 0 and files(models) == {} and not (Path(env["HF_HOME"]) / "hub").exists()
