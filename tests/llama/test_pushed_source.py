"""`llama_repo=controller:PATH` over a real sshd: the host gets the pinned commit (and the PR patch's
commit) as a git bundle, checks out the same tree as the controller, and a second run sends nothing.
A commit the host already has is never bundled again (a new file patch on top sends no bundle)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from support.cli import tunnelspec

ENV = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@example.invalid", "GIT_COMMITTER_NAME": "t",
       "GIT_COMMITTER_EMAIL": "t@example.invalid", "GIT_AUTHOR_DATE": "2026-01-01T00:00:00Z",
       "GIT_COMMITTER_DATE": "2026-01-01T00:00:00Z"}


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True,
                          env={**os.environ, **ENV}).stdout.strip()


@pytest.fixture
def setup(tmp_path):
    from support.sshd_harness import SshdCluster

    repo = tmp_path / "controller" / "llama.cpp"
    repo.mkdir(parents=True)
    git(repo, "init", "-q")
    (repo / "README.md").write_text("llama\n")
    git(repo, "add", "README.md")
    git(repo, "commit", "-qm", "base")
    git(repo, "tag", "b100")
    (repo / "CMakeLists.txt").write_text("project(x)\n")
    git(repo, "add", "CMakeLists.txt")
    git(repo, "commit", "-qm", "pinned")
    pinned = git(repo, "rev-parse", "HEAD")
    git(repo, "checkout", "-qb", "pr-7")
    (repo / "pr.txt").write_text("from a PR\n")
    git(repo, "add", "pr.txt")
    git(repo, "commit", "-qm", "pr 7")
    pr = git(repo, "rev-parse", "HEAD")
    git(repo, "checkout", "-q", pinned)
    git(repo, "branch", "-qD", "pr-7")  # the PR commit stays reachable only through a ref below
    git(repo, "update-ref", "refs/pull/7/head", pr)
    c = SshdCluster(tmp_path / "c", 1)
    patch = c.base / "local.patch"
    patch.write_text("diff --git a/local.txt b/local.txt\nnew file mode 100644\n--- /dev/null\n+++ b/local.txt\n"
                     "@@ -0,0 +1 @@\n+local\n")
    yield c, repo, pinned, pr
    c.stop()


def play(c, repo_ref: str, commit: str, patches: str) -> tuple[Path, Path]:
    inv = c.inventory(all_vars={"llama_repo": repo_ref, "llama_commit": f'"{commit}"'})
    pb = c.base / "source.yml"
    pb.write_text("- hosts: all\n  tasks:\n    - llama_source:\n        repo: \"{{ llama_repo }}\"\n"
                  "        commit: \"{{ llama_commit }}\"\n        root: \"{{ root }}\"\n"
                  f"        patches: {patches}\n")
    return inv, pb


def test_bundle_once_same_tree_then_nothing(setup):
    c, repo, pinned, pr = setup
    rel = os.path.relpath(repo, c.base)  # relative to the inventory's directory
    inv, pb = play(c, f"controller:{rel}", pinned, f'[{{"pr": 7, "commit": "{pr}"}}]')
    first = tunnelspec("play", str(inv), str(pb), "--format", "json")
    assert first.rc == 0, first.stdout + first.stderr
    (res,) = first.results()
    assert res["status"] == "changed" and "sending a git bundle" in res["msg"], res
    checkout = c.hosts[0].root / "src" / "llama.cpp"
    # The tree the controller would produce: pinned + the PR commit cherry-picked.
    want_files = {"README.md", "CMakeLists.txt", "pr.txt"}
    assert {p for p in git(checkout, "ls-files").split()} == want_files
    assert git(checkout, "config", "remote.origin.url") == f"controller:{repo}"
    assert git(checkout, "describe", "--tags", "--match", "b[0-9]*", pinned).startswith("b100-1-")
    assert not (checkout / ".git" / "tunnelspec-source.bundle").exists()
    assert not (checkout / ".git" / "objects" / "info" / "alternates").exists()
    second = tunnelspec("play", str(inv), str(pb), "--format", "json")
    assert [r["status"] for r in second.results()] == ["ok"], second.stdout
    # A file patch on top: re-applied from the commits the host holds; no bundle.
    inv, pb = play(c, f"controller:{repo}", pinned, f'[{{"pr": 7, "commit": "{pr}"}}, {{"file": "local.patch"}}]')
    third = tunnelspec("play", str(inv), str(pb), "--format", "json")
    (res,) = third.results()
    assert res["status"] == "changed" and "bundle" not in res["msg"], res
    assert (checkout / "local.txt").read_text() == "local\n"
    assert [r["status"] for r in tunnelspec("play", str(inv), str(pb), "--format", "json").results()] == ["ok"]
    # A newer pinned commit: only what the host lacks travels (the bundle builds on its HEAD).
    git(repo, "checkout", "-q", pinned)
    (repo / "new.txt").write_text("bump\n")
    git(repo, "add", "new.txt")
    git(repo, "commit", "-qm", "bump")
    bumped = git(repo, "rev-parse", "HEAD")
    inv, pb = play(c, f"controller:{repo}", bumped, "[]")
    fourth = tunnelspec("play", str(inv), str(pb), "--format", "json")
    assert fourth.rc == 0, fourth.stdout + fourth.stderr
    assert "sending a git bundle" in fourth.results()[0]["msg"]
    sent = [e["msg"] for e in fourth.events if e.get("event") == "progress" and "bundle sent" in e["msg"]]
    assert len(sent) == 1 and "on top of" in sent[0], sent
    assert git(checkout, "rev-parse", "HEAD") == bumped and (checkout / "new.txt").exists()


def test_commit_missing_from_the_controller_repo_fails_cleanly(setup):
    c, repo, pinned, pr = setup
    inv, pb = play(c, f"controller:{repo}", "c" * 40, "[]")
    res = tunnelspec("play", str(inv), str(pb), "--format", "json")
    assert res.rc == 1
    (failed,) = res.results("failed")
    assert "llama_repo" in failed["msg"] and "does not contain commit " + "c" * 40 in failed["msg"], failed
    assert not (c.hosts[0].root / "src" / "llama.cpp" / ".git" / "tunnelspec-stack").exists()
