"""CI mode against real hosts: no tty, no agent, empty HOME, key and known_hosts from the
environment. Unknown host keys fail (exit 4, fingerprint shown) until accepted explicitly."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

from support.ci_cli import ci_env, cli

SMALL = str(Path(__file__).parent / "small.yml")


def test_play_with_credentials_from_env(target, tmp_path):
    home = tmp_path / "home"
    env = ci_env(home, TUNNELSPEC_SSH_KEY=target.key_text, TUNNELSPEC_KNOWN_HOSTS=target.known_hosts_text)
    first = cli("play", str(target.inventory), SMALL, "--format", "json", env=env)
    assert first.rc == 0, first.stdout + first.stderr
    assert sorted(first.recap) == sorted(target.hosts)
    again = cli("play", str(target.inventory), SMALL, "--format", "json", env=env)
    assert again.rc == 0 and all(c["changed"] == 0 for c in again.recap.values()), again.recap
    # The pull-request gate: converged → --check exits 0 and changes nothing.
    assert cli("play", str(target.inventory), SMALL, "--check", "--format", "json", env=env).rc == 0
    # Nothing secret landed on the controller's disk: HOME untouched, no known_hosts written.
    assert list(home.iterdir()) == []
    assert not target.known_hosts_file.exists()


def test_check_is_a_pull_request_gate(target, tmp_path):
    env = ci_env(tmp_path / "home", TUNNELSPEC_SSH_KEY=target.key_text,
                 TUNNELSPEC_KNOWN_HOSTS=target.known_hosts_text)
    plan = cli("play", str(target.inventory), SMALL, "--check", "--format", "json", env=env)
    assert plan.rc == 3, plan.stdout + plan.stderr          # drift: would change
    would = [e for e in plan.of("task_result") if e.get("would_change")]
    assert {e["host"] for e in would} == set(target.hosts)
    human = cli("play", str(target.inventory), SMALL, "--check", env=env)
    assert human.rc == 3 and "would change:" in human.stdout and "\033[" not in human.stdout
    assert cli("play", str(target.inventory), SMALL, "--format", "json", env=env).rc == 0
    assert cli("play", str(target.inventory), SMALL, "--check", "--format", "json", env=env).rc == 0


def test_unknown_host_key_fails_until_accepted(target, tmp_path):
    env = ci_env(tmp_path / "home", TUNNELSPEC_SSH_KEY=target.key_text)
    res = cli("play", str(target.inventory), SMALL, "--format", "json", env=env)
    assert res.rc == 4, res.stdout + res.stderr
    msgs = {e["host"]: e["msg"] for e in res.of("unreachable")}
    assert sorted(msgs) == sorted(target.hosts)
    for host, msg in msgs.items():
        assert "unknown host key" in msg and target.fingerprints[host] in msg, msg
    assert not target.known_hosts_file.exists()

    res = cli("play", str(target.inventory), SMALL, "--format", "json", "--accept-new-host-keys", env=env)
    assert res.rc == 0, res.stdout + res.stderr
    pinned = res.of("host_key_pinned")
    assert sorted(e["host"] for e in pinned) == sorted(target.hosts)
    text = target.known_hosts_file.read_text()
    assert len(text.splitlines()) == len(target.hosts)
    # what was pinned is the hosts' real keys
    assert {l.split()[2] for l in text.splitlines()} == {l.split()[2] for l in target.known_hosts_text.splitlines()
                                                          if l.strip()}
    res = cli("play", str(target.inventory), SMALL, "--format", "json", env=env)
    assert res.rc == 0 and res.of("host_key_pinned") == []


def test_changed_host_key_names_host_and_both_fingerprints(sshd_target, tmp_path):
    t = sshd_target
    other = tmp_path / "impostor"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(other)], check=True)
    impostor_pub = other.with_suffix(".pub").read_text().split()
    lines = t.known_hosts_text.splitlines()
    victim_line = lines[0].split()
    lines[0] = f"{victim_line[0]} {impostor_pub[0]} {impostor_pub[1]}"
    env = ci_env(tmp_path / "home", TUNNELSPEC_SSH_KEY=t.key_text, TUNNELSPEC_KNOWN_HOSTS="\n".join(lines) + "\n")
    for extra in ([], ["--accept-new-host-keys"]):  # accepting new keys never accepts a changed one
        res = cli("play", str(t.inventory), SMALL, "--format", "json", *extra, env=env)
        assert res.rc == 4
        (ev,) = res.of("unreachable")
        import asyncssh

        pinned_fp = asyncssh.import_public_key(" ".join(impostor_pub[:2])).get_fingerprint("sha256")
        assert ev["host"] == t.hosts[0]
        assert "HOST KEY CHANGED" in ev["msg"] and pinned_fp in ev["msg"] and t.fingerprints[t.hosts[0]] in ev["msg"]
        assert res.recap[t.hosts[1]]["ok"] + res.recap[t.hosts[1]]["changed"] == 2


def _encrypted_key(tmp_path) -> Path:
    key = tmp_path / "id_encrypted"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "correct horse", "-f", str(key)], check=True)
    return key


def test_encrypted_key_file_without_agent_fails_fast(sshd_target, tmp_path):
    t = sshd_target
    key = _encrypted_key(tmp_path)
    inv = tmp_path / "enc.ini"
    inv.write_text(t.inventory.read_text() + f"ansible_ssh_private_key_file={key}\n")
    env = ci_env(tmp_path / "home", TUNNELSPEC_KNOWN_HOSTS=t.known_hosts_text)
    started = time.monotonic()
    res = cli("play", str(inv), SMALL, "--format", "json", env=env, timeout=60)
    assert time.monotonic() - started < 30
    assert res.rc == 4, res.stdout + res.stderr
    for ev in res.of("unreachable"):
        assert str(key) in ev["msg"] and "encrypted" in ev["msg"] and "never prompts" in ev["msg"]


def test_encrypted_key_in_env_fails_fast(sshd_target, tmp_path):
    t = sshd_target
    key = _encrypted_key(tmp_path)
    env = ci_env(tmp_path / "home", TUNNELSPEC_SSH_KEY=key.read_text(), TUNNELSPEC_KNOWN_HOSTS=t.known_hosts_text)
    res = cli("play", str(t.inventory), SMALL, "--format", "json", env=env, timeout=60)
    assert res.rc == 4, res.stdout + res.stderr
    msgs = [e["msg"] for e in res.of("unreachable")]
    assert len(msgs) == 2 and all("TUNNELSPEC_SSH_KEY" in m and "encrypted" in m for m in msgs)
    assert key.read_text() not in res.stdout + res.stderr
