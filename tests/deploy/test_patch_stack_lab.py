"""The patch stack in the lab: both PR patch forms on real hosts, from the fixture repository's two-commit
pull request (refs/pull/28/head, published as GitHub does: outside refs/heads, so a clone does not
bring it and each host fetches it).

- `{"pr": 28, "head": HEAD}` brings both commits, in order, on every host; same commits and tree
  everywhere (the tree-hash gate says so); a second run changes nothing;
- `{"pr": 28, "commit": FIRST}` brings that one commit only.

Source play only (no build, nothing served), under a root of its own that is removed at the end:
a few seconds of git on three hosts."""

from __future__ import annotations

from pathlib import Path

import pytest

from support.cli import failed_report, tunnelspec

pytestmark = pytest.mark.lab

ROOT = "/opt/tunnelspec-t28"
SOURCE_ONLY = str(Path(__file__).resolve().parents[2] / "playbooks" / "source.yml")
HOSTS = ("main", "rpc-a", "rpc-b")


def sh(lab, host: str, script: str, *args: str) -> str:
    res = lab.exec(host, ["sh", "-c", script, "sh", *args], timeout=120)
    assert res.returncode == 0, f"{host}: {script}: {res.stderr}"
    return res.stdout


def inventory(lab, path: Path, patches: str) -> Path:
    text = Path(lab.inventory).read_text()
    path.write_text(text.replace("[all:vars]\n", f"[all:vars]\ntunnelspec_root={ROOT}\nllama_patches={patches}\n"))
    return path


def run(inv: Path):
    return tunnelspec("play", str(inv), SOURCE_ONLY, "--format", "json", "--forks", "1", timeout=900)


def on_top(lab, host: str, base: str) -> list[str]:
    """Subjects of the commits on top of the base, oldest first."""
    return sh(lab, host, 'git -C "$1/src/llama.cpp" log --reverse --format=%s "$2..HEAD"', ROOT, base).splitlines()


def head_and_tree(lab, host: str) -> str:
    return sh(lab, host, 'git -C "$1/src/llama.cpp" rev-parse HEAD "HEAD^{tree}"', ROOT).strip()


@pytest.fixture(scope="module")
def pr(llama_fixtures):
    from tunnelspec.lab.fixtures import ensure_pr_fixture

    return ensure_pr_fixture(llama_fixtures)


def test_whole_pr_and_single_commit_entries_on_every_host(lab, lab_tools, llama_fixtures, pr, tmp_path):
    base = llama_fixtures.commit
    subjects = ["tunnelspec test PR (1/2): add TUNNELSPEC-PR.md", "tunnelspec test PR (2/2): a second line"]
    try:
        whole = inventory(lab, tmp_path / "whole.ini", f'[{{"pr": {pr.number}, "head": "{pr.head}"}}]')
        first = run(whole)
        assert first.rc == 0, failed_report(first)
        for h in HOSTS:
            assert on_top(lab, h, base) == subjects, h
            assert sh(lab, h, 'cat "$1/src/llama.cpp/$2"', ROOT, pr.file) == \
                "first commit of the PR\nsecond commit of the PR\n", h
        whole_state = {head_and_tree(lab, h) for h in HOSTS}
        assert len(whole_state) == 1, whole_state  # same commits and tree on every host
        gate = next(e for e in first.events if e.get("event") == "gate" and e.get("play") == "llama.cpp source")
        assert f"equal on {len(HOSTS)} host(s)" in gate["msg"], gate
        again = run(whole)
        assert again.rc == 0 and all(again.recap[h]["changed"] == 0 for h in HOSTS), again.recap

        single = inventory(lab, tmp_path / "single.ini", f'[{{"pr": {pr.number}, "commit": "{pr.commits[0]}"}}]')
        one = run(single)
        assert one.rc == 0, failed_report(one)
        for h in HOSTS:
            assert on_top(lab, h, base) == subjects[:1], h
            assert sh(lab, h, 'cat "$1/src/llama.cpp/$2"', ROOT, pr.file) == "first commit of the PR\n", h
        single_state = {head_and_tree(lab, h) for h in HOSTS}
        assert len(single_state) == 1 and single_state != whole_state, (single_state, whole_state)
    finally:
        for h in HOSTS:
            sh(lab, h, 'rm -rf -- "$1"', ROOT)
