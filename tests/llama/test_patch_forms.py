"""The two PR patch forms over real sshd hosts (real git, the real llama_source task):

- `{"pr": N, "commit": SHA}` cherry-picks that ONE commit of the PR;
- `{"pr": N, "head": SHA}` brings the WHOLE PR: every commit from the merge base with llama_commit
  up to the pinned head, oldest first, fetched from `refs/pull/N/head` as GitHub publishes it (or
  carried in the controller's git bundle with `llama_repo=controller:PATH`);
- a merge inside the PR is refused with the reason, and the checkout is left clean;
- a head that is not on the PR's ref is refused; the same stack gives the same commits and tree on
  every host, and a second run changes nothing.

The upstream repository is built here: the PR branches from the commit BEFORE llama_commit, so
"from the merge base" is really exercised (the base's own commits are not the PR's)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from support.cli import tunnelspec

ENV = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@example.invalid", "GIT_COMMITTER_NAME": "t",
       "GIT_COMMITTER_EMAIL": "t@example.invalid", "GIT_AUTHOR_DATE": "2026-01-01T00:00:00Z",
       "GIT_COMMITTER_DATE": "2026-01-01T00:00:00Z"}
PB = ("- hosts: all\n  gate: {kind: tree_hash, name: same tree}\n  tasks:\n    - llama_source:\n"
      "        repo: \"{{ llama_repo }}\"\n        commit: \"{{ llama_commit }}\"\n"
      "        root: \"{{ root }}\"\n        patches: \"{{ llama_patches | default([]) }}\"\n")


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True,
                          env={**os.environ, **ENV}).stdout.strip()


def commit_file(repo: Path, name: str, text: str, msg: str) -> str:
    path = repo / name
    path.write_text((path.read_text() if path.exists() else "") + text)
    git(repo, "add", name)
    git(repo, "commit", "-qm", msg)
    return git(repo, "rev-parse", "HEAD")


@pytest.fixture
def upstream(tmp_path):
    """base0 ─ base1 (llama_commit) on master; PR 9 = two commits on base0; PR 10 = a commit, a
    merge of master into it, another commit. Only refs/pull/N/head keep the PRs reachable."""
    repo = tmp_path / "upstream"
    repo.mkdir()
    git(repo, "init", "-q", "-b", "master")
    base0 = commit_file(repo, "README.md", "llama\n", "base 0")
    base1 = commit_file(repo, "CMakeLists.txt", "project(x)\n", "base 1")
    git(repo, "checkout", "-q", "-b", "pr9", base0)
    p1 = commit_file(repo, "pr.txt", "one\n", "pr 9: one")
    p2 = commit_file(repo, "pr.txt", "two\n", "pr 9: two")
    git(repo, "checkout", "-q", "-b", "pr10", base0)
    m1 = commit_file(repo, "m.txt", "a\n", "pr 10: a")
    git(repo, "merge", "-q", "--no-ff", "-m", "merge master into pr 10", "master")
    merge = git(repo, "rev-parse", "HEAD")
    m2 = commit_file(repo, "m.txt", "b\n", "pr 10: b")
    git(repo, "checkout", "-q", "master")
    git(repo, "update-ref", "refs/pull/9/head", p2)
    git(repo, "update-ref", "refs/pull/10/head", m2)
    git(repo, "branch", "-qD", "pr9", "pr10")
    return {"repo": repo, "base": base1, "p1": p1, "p2": p2, "m1": m1, "merge": merge, "m2": m2}


def play(cluster, repo: str, commit: str, patches: str):
    inv = cluster.inventory(all_vars={"llama_repo": repo, "llama_commit": f'"{commit}"', "llama_patches": patches})
    pb = cluster.base / "source.yml"
    pb.write_text(PB)
    return tunnelspec("play", str(inv), str(pb), "--format", "json", timeout=300)


def checkout(cluster, i: int = 0) -> Path:
    return cluster.hosts[i].root / "src" / "llama.cpp"


def picked(cluster, base: str, i: int = 0) -> list[str]:
    """Subjects of the commits on top of the base, oldest first."""
    return git(checkout(cluster, i), "log", "--reverse", "--format=%s", f"{base}..HEAD").splitlines()


def test_whole_pr_brings_every_commit_in_order_and_one_commit_form_brings_one(sshd_cluster, upstream):
    c = sshd_cluster(2)
    repo, base = str(upstream["repo"]), upstream["base"]
    whole = f'[{{"pr": 9, "head": "{upstream["p2"]}"}}]'
    first = play(c, repo, base, whole)
    assert first.rc == 0, first.stdout[-3000:] + first.stderr[-2000:]
    for i in range(2):
        assert picked(c, base, i) == ["pr 9: one", "pr 9: two"]
        assert (checkout(c, i) / "pr.txt").read_text() == "one\ntwo\n"
        assert (checkout(c, i) / "CMakeLists.txt").exists()  # the base is llama_commit, not the PR's base
    heads = {git(checkout(c, i), "rev-parse", "HEAD", "HEAD^{tree}") for i in range(2)}
    assert len(heads) == 1, heads  # fixed committer identity and date: same commits and tree on both hosts
    gate = next(e for e in first.events if e.get("event") == "gate")
    assert "equal on 2 host(s)" in gate["msg"], gate
    said = [e["msg"] for e in first.events if e.get("event") == "progress" and "cherry-picked" in e["msg"]]
    assert said and "2 commit(s) cherry-picked in order" in said[0], said
    again = play(c, repo, base, whole)
    assert again.rc == 0 and all(h["changed"] == 0 for h in again.recap.values()), again.recap

    one = play(c, repo, base, f'[{{"pr": 9, "commit": "{upstream["p1"]}"}}]')
    assert one.rc == 0, one.stdout[-3000:]
    for i in range(2):
        assert picked(c, base, i) == ["pr 9: one"]
        assert (checkout(c, i) / "pr.txt").read_text() == "one\n"


def test_whole_pr_from_a_controller_bundle_gives_the_same_tree(sshd_cluster, upstream):
    url, pushed = sshd_cluster(1), sshd_cluster(1)
    base, whole = upstream["base"], f'[{{"pr": 9, "head": "{upstream["p2"]}"}}]'
    assert play(url, str(upstream["repo"]), base, whole).rc == 0
    res = play(pushed, f"controller:{upstream['repo']}", base, whole)
    assert res.rc == 0, res.stdout[-3000:]
    assert "sending a git bundle" in res.results()[0]["msg"]
    assert picked(pushed, base) == ["pr 9: one", "pr 9: two"]
    assert git(checkout(pushed), "rev-parse", "HEAD^{tree}") == git(checkout(url), "rev-parse", "HEAD^{tree}")


def test_a_merge_inside_the_pr_is_refused_and_the_checkout_stays_clean(sshd_cluster, upstream):
    c = sshd_cluster(1)
    res = play(c, str(upstream["repo"]), upstream["base"], f'[{{"pr": 10, "head": "{upstream["m2"]}"}}]')
    assert res.rc == 1
    (failed,) = res.results("failed")
    assert "merge commit" in failed["msg"] and upstream["merge"][:12] in failed["msg"], failed["msg"]
    assert "rebase the pr" in failed["msg"].lower() and "node0" in failed["msg"], failed["msg"]
    src = checkout(c)
    assert git(src, "status", "--porcelain") == ""
    assert git(src, "rev-parse", "HEAD") == upstream["base"]
    assert not (src / "m.txt").exists()
    # The PR's commit before the merge is still reachable as a single-commit entry.
    ok = play(c, str(upstream["repo"]), upstream["base"], f'[{{"pr": 10, "commit": "{upstream["m1"]}"}}]')
    assert ok.rc == 0, ok.stdout[-3000:]
    assert picked(c, upstream["base"]) == ["pr 10: a"]


def test_a_head_that_is_not_on_the_pr_is_refused(sshd_cluster, upstream):
    c = sshd_cluster(1)
    # PR 10's commit exists in the repository (under refs/pull/10/head) but is not PR 9's.
    res = play(c, str(upstream["repo"]), upstream["base"], f'[{{"pr": 9, "head": "{upstream["m2"]}"}}]')
    assert res.rc == 1
    (failed,) = res.results("failed")
    assert "refs/pull/9/head" in failed["msg"] and "pr 9 head" in failed["msg"], failed["msg"]
    assert git(checkout(c), "status", "--porcelain") == ""
