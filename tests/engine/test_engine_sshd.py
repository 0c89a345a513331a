"""The engine against real OpenSSH sshd hosts on 127.0.0.1."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from support.cli import make_repo, tunnelspec

DATA = Path(__file__).parent / "data"


@pytest.fixture
def generic(tmp_path, sshd_cluster):
    c = sshd_cluster(3)
    repo = tmp_path / "repo"
    commit = make_repo(repo)
    shutil.copy(DATA / "app.conf.j2", c.base / "app.conf.j2")
    inv = c.inventory(all_vars={"repo": str(repo), "commit": commit})
    return c, inv, DATA / "generic8.yml"


def test_generic_playbook_changes_then_converges(generic):
    c, inv, pb = generic
    first = tunnelspec("play", str(inv), str(pb), "--format", "json")
    assert first.rc == 0, first.stdout + first.stderr
    assert {h: r["changed"] for h, r in first.recap.items()} == {h.name: 8 for h in c.hosts}
    for h in c.hosts:
        conf = (h.root / "app" / "app.conf").read_text()
        assert f"name = {h.name}" in conf and "tuned = yes" in (h.root / "app" / "settings.conf").read_text()
        assert oct((h.root / "app" / "run.sh").stat().st_mode & 0o777) == "0o755"
        assert (h.root / "current").resolve() == (h.root / "app").resolve()
        assert (h.root / "src" / "README").read_text() == "hello\n"
    second = tunnelspec("play", str(inv), str(pb), "--format", "json")
    assert second.rc == 0
    assert all(r["changed"] == 0 and r["ok"] == 8 for r in second.recap.values()), second.recap


def test_check_mode_reports_drift_and_changes_nothing(generic):
    c, inv, pb = generic
    assert tunnelspec("play", str(inv), str(pb), "--format", "json").rc == 0
    (c.hosts[0].root / "app" / "run.sh").write_text("#!/bin/sh\necho tampered\n")
    chk = tunnelspec("play", str(inv), str(pb), "--check", "--diff", "--format", "json")
    assert chk.rc == 3, chk.stdout
    changed = chk.results("changed")
    assert [(e["host"], e["task"]) for e in changed] == [(c.hosts[0].name, "script")]
    assert "tampered" in changed[0]["diff"]["before"] and "echo hi" in changed[0]["diff"]["after"]
    assert "tampered" in (c.hosts[0].root / "app" / "run.sh").read_text()
    # converged again → --check exits 0
    assert tunnelspec("play", str(inv), str(pb), "--format", "json").rc == 0
    assert tunnelspec("play", str(inv), str(pb), "--check", "--format", "json").rc == 0


def test_wrong_host_key_is_refused(generic, tmp_path):
    c, inv, pb = generic
    other = tmp_path / "other_key"
    import subprocess

    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(other)], check=True)
    lines = c.known_hosts.read_text().splitlines()
    bad = f"[127.0.0.1]:{c.hosts[1].port} " + other.with_suffix(".pub").read_text().split(" ", 2)[0] + " " + \
        other.with_suffix(".pub").read_text().split(" ", 2)[1]
    lines[1] = bad
    c.known_hosts.write_text("\n".join(lines) + "\n")
    res = tunnelspec("play", str(inv), str(pb), "--format", "json")
    assert res.rc == 4
    unreach = [e for e in res.events if e["event"] == "unreachable"]
    assert [e["host"] for e in unreach] == [c.hosts[1].name]
    assert "HOST KEY CHANGED" in unreach[0]["msg"] and "SHA256:" in unreach[0]["msg"]
    assert not (c.hosts[1].root / "app").exists()
    # the other hosts finished
    assert (c.hosts[0].root / "app" / "app.conf").exists() and (c.hosts[2].root / "app" / "app.conf").exists()


def test_unknown_host_key_needs_explicit_acceptance(generic):
    c, inv, pb = generic
    c.known_hosts.write_text("")
    res = tunnelspec("play", str(inv), str(pb), "--format", "json")
    assert res.rc == 4
    assert all("unknown host key SHA256:" in e["msg"] for e in res.events if e["event"] == "unreachable")
    res = tunnelspec("play", str(inv), str(pb), "--format", "json", "--accept-new-host-keys")
    assert res.rc == 0, res.stdout
    pinned = [e for e in res.events if e["event"] == "host_key_pinned"]
    assert sorted(e["host"] for e in pinned) == sorted(h.name for h in c.hosts)
    assert len(c.known_hosts.read_text().splitlines()) == 3
    assert tunnelspec("play", str(inv), str(pb), "--format", "json").rc == 0


def test_unreachable_host_does_not_stop_others(generic):
    c, inv, pb = generic
    c.hosts[2].stop()
    res = tunnelspec("play", str(inv), str(pb), "--format", "json")
    assert res.rc == 4
    assert res.recap[c.hosts[2].name]["unreachable"] == 1
    assert res.recap[c.hosts[0].name]["changed"] == 8 and res.recap[c.hosts[1].name]["changed"] == 8


def test_limit_and_tags(generic, tmp_path):
    c, inv, pb = generic
    assert tunnelspec("play", str(inv), str(pb), "--format", "json").rc == 0
    for h in c.hosts[:2]:
        (h.root / "app" / "run.sh").unlink()
        (h.root / "app" / "demo.service").unlink()
    text = pb.read_text().replace("name: script\n", "name: script\n      tags: [scripts]\n")
    pb2 = tmp_path / "tagged.yml"
    pb2.write_text(text)
    res = tunnelspec("play", str(inv), str(pb2), "--format", "json", "--limit", c.hosts[0].name, "--tags", "scripts")
    assert res.rc == 0, res.stdout + res.stderr
    assert [(e["host"], e["task"], e["status"]) for e in res.results()] == [(c.hosts[0].name, "script", "changed")]
    assert (c.hosts[0].root / "app" / "run.sh").exists()
    assert not (c.hosts[0].root / "app" / "demo.service").exists()  # untagged task did not run
    assert not (c.hosts[1].root / "app" / "run.sh").exists()        # host outside --limit untouched
    res = tunnelspec("play", str(inv), str(pb2), "--format", "json", "--skip-tags", "scripts")
    assert res.rc == 0
    assert all(e["task"] != "script" for e in res.results())
    assert not (c.hosts[1].root / "app" / "run.sh").exists() and (c.hosts[1].root / "app" / "demo.service").exists()


def test_human_output_has_recap(generic):
    c, inv, pb = generic
    res = tunnelspec("play", str(inv), str(pb))
    assert res.rc == 0
    assert "PLAY RECAP" in res.stdout and f"{c.hosts[0].name}" in res.stdout and "changed=8" in res.stdout
    assert "\033[" not in res.stdout
