"""Model and source delivery in the lab (real hosts, systemd, llama.cpp build, tiny models):

- pinned Hugging Face models: the target is a real split GGUF (two parts) and the draft the lab's tiny
  model, both served by the Hub stand-in on the controller's 127.0.0.1 (tests/support/hub_standin.py) to the
  real huggingface_hub client; deploy uploads them once and the completion with the draft on rpc-a's
  RPC device works; a second deploy changes nothing and downloads nothing;
- sources pushed from the controller: with the hosts' access to the fixture repository taken away
  (a tmpfs over its bind mount on every host), `llama_repo=controller:PATH` reaches the same tree
  hash everywhere and serves; a second deploy sends no bundle.

Each test ends with the lab's own inventory deployed again (another engineer may use the lab next).
"""

from __future__ import annotations

import hashlib
import subprocess
from pathlib import Path

import pytest

from tunnelspec.lab.fixtures import HOST_MOUNT, REPO_NAME
from tunnelspec.lab.gguf_tiny import write_tiny_llama_split

from support.cli import tunnelspec
from support.hub_standin import HubStandIn
from support.labdeploy import MODELS_DIR, UNIT, configured_cmdline, converge, deploy, failures, inventory_copy, sh, task, verify_stats

pytestmark = pytest.mark.lab

HOSTS = ("main", "rpc-a", "rpc-b")
REV = "5eed5eed5eed5eed5eed5eed5eed5eed5eed5eed"
SRC = "/opt/tunnelspec/src/llama.cpp"  # the lab inventory's default tunnelspec_root


def changed_total(result) -> int:
    return sum(h.get("changed", 0) for h in result.recap.values())


def test_pinned_hub_models_upload_once_and_serve(lab, tmp_path, llama_fixtures):
    parts = write_tiny_llama_split(tmp_path / "split", "tiny-split", parts=2)
    target = f"hf://tiny-org/tiny-split-GGUF/q8/{parts[0].name}@{REV}"
    draft = f"hf://tiny-org/tiny-llama-GGUF/tiny-llama.gguf@{REV}"
    inv = inventory_copy(lab, tmp_path, main_vars={"llama_model": target, "llama_draft_model": draft})
    try:
        with HubStandIn(token="hf_lab_secret_token") as hubs:
            hubs.add("tiny-org/tiny-llama-GGUF", REV, "tiny-llama.gguf", Path(llama_fixtures.model_local).read_bytes())
            for p in parts:
                hubs.add("tiny-org/tiny-split-GGUF", REV, f"q8/{p.name}", p.read_bytes())
            env = {"HF_ENDPOINT": hubs.url, "HF_HOME": str(tmp_path / "hf-home"), "HF_TOKEN": hubs.token,
                   "HF_HUB_OFFLINE": ""}
            first = tunnelspec("deploy", str(inv), "--format", "json", env=env, timeout=3600)
            assert first.rc == 0, failures(first)
            assert task(first, "target model")["status"] == "changed"
            assert task(first, "draft model")["status"] == "changed"
            assert hubs.downloads() == 3
            for p in parts:
                out = sh(lab, "main", "sha256sum", f"{MODELS_DIR}/{p.name}").split()
                assert out and out[0] == hashlib.sha256(p.read_bytes()).hexdigest()
            unit = configured_cmdline(lab)
            assert f"{MODELS_DIR}/{parts[0].name}" in unit and f"{MODELS_DIR}/tiny-llama.gguf" in unit, unit
            draft_n, _accepted = verify_stats(first)
            assert draft_n > 0
            journal = sh(lab, "main", "journalctl", "--no-pager", "-o", "cat", "-u", UNIT, "-n", "400")
            assert "RPC0[127.0.0.1:15052] model buffer size" in journal, journal[-3000:]
            assert hubs.token not in first.stdout + first.stderr

            second = tunnelspec("deploy", str(inv), "--format", "json", "--diff", env=env, timeout=3600)
            assert second.rc == 0 and changed_total(second) == 0, failures(second)
            assert task(second, "target model")["status"] == "ok"
            assert hubs.downloads() == 3  # compared with the Hub's sha256; nothing downloaded
            assert hubs.token not in second.stdout + second.stderr
    finally:
        converge(lab.inventory)  # the lab's own models again; the uploads are pruned


def _hide_fixture_repo(lab, hide: bool) -> None:
    path = f"{HOST_MOUNT}/{REPO_NAME}"
    for host in HOSTS:
        if hide:
            res = lab.exec(host, ["mount", "-t", "tmpfs", "-o", "size=1m,mode=0", "tunnelspec-hidden", path], timeout=30)
            assert res.returncode == 0, res.stderr
            probe = lab.exec(host, ["git", "ls-remote", path], timeout=30)
            assert probe.returncode != 0, f"{host} still reaches the fixture repository"
        else:
            lab.exec(host, ["sh", "-c", 'while mountpoint -q "$1"; do umount "$1" || break; done', "sh", path],
                     timeout=30)


def test_pushed_sources_without_access_to_the_fixture_repo(lab, tmp_path, llama_fixtures):
    repo = llama_fixtures.repo_local
    want_tree = subprocess.run(["git", "-C", repo, "rev-parse", f"{llama_fixtures.commit}^{{tree}}"],
                               check=True, capture_output=True, text=True).stdout.strip()
    inv = inventory_copy(lab, tmp_path, drop=("llama_repo=",), extra=(f"llama_repo=controller:{repo}",))
    _hide_fixture_repo(lab, True)
    try:
        for host in HOSTS:  # the hosts must lack the commit: the bundle is then their only source
            sh(lab, host, "rm", "-rf", "--", SRC)
        first = deploy(inv)
        assert first.rc == 0, failures(first)
        for host in HOSTS:
            ev = task(first, "llama.cpp source at the pinned commit with the patch stack", host)
            assert ev["status"] == "changed" and "sending a git bundle" in ev["msg"], ev
            assert sh(lab, host, "git", "-C", SRC, "rev-parse", "HEAD^{tree}").strip() == want_tree
            assert sh(lab, host, "git", "-C", SRC, "config", "remote.origin.url").strip() == f"controller:{repo}"
        gate = next(e for e in first.events if e.get("event") == "gate" and e.get("play") == "llama.cpp source")
        assert gate["status"] == "ok", gate
        draft_n, _ = verify_stats(first)
        assert draft_n > 0

        second = deploy(inv)
        assert second.rc == 0 and changed_total(second) == 0, failures(second)
        for host in HOSTS:
            ev = task(second, "llama.cpp source at the pinned commit with the patch stack", host)
            assert ev["status"] == "ok" and "bundle" not in ev["msg"], ev
    finally:
        _hide_fixture_repo(lab, False)
        converge(lab.inventory)  # back to the fixture repository as origin
