"""Ansible Vault through the CLI: `--vault-password-file`, `ANSIBLE_VAULT_PASSWORD_FILE`,
`--ask-vault-pass` (no terminal: exit 2 at once); no password, a wrong one, a damaged vault: exit 2
naming file:line and the variable; and a decrypted value appears in no output of any command.

The vaults are made by ansible-vault at test time (skipped without it); the error cases use the
committed fixture (tests/inventory/vault/), so they run everywhere. Hosts are 127.0.0.1 on a port
bound and never listened on: every connection is refused at once."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from support.cli import tunnelspec

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "inventory" / "vault"
ANSIBLE_VAULT = shutil.which("ansible-vault") or str(Path(sys.executable).parent / "ansible-vault")
COMMIT = "0123456789abcdef0123456789abcdef01234567"
# What the vault hides: a model path (it is in the plan), a note of the user's, a bad port (its error).
MODEL = "/srv/models/vaulted-target-4b7e1.gguf"
NOTE = "vaulted-note-9c2d0"
needs_ansible_vault = pytest.mark.skipif(not os.access(ANSIBLE_VAULT, os.X_OK),
                                         reason="ansible-vault is not installed (tests/inventory/test_vault.py "
                                                "covers the decryptor with committed fixtures)")


@pytest.fixture(autouse=True)
def _no_user_password_file(monkeypatch, tmp_path):
    monkeypatch.delenv("ANSIBLE_VAULT_PASSWORD_FILE", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg-cache"))


@pytest.fixture(scope="module")
def dead_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    yield s.getsockname()[1]
    s.close()


def _encrypt(tmp: Path, plaintext: str, vault_id: str | None = None) -> str:
    pw = tmp / "password"
    pw.write_text("cli-test-password\n")
    source = ["--vault-id", f"{vault_id}@{pw}"] if vault_id else ["--vault-password-file", str(pw)]
    p = subprocess.run([ANSIBLE_VAULT, "encrypt_string", *source, "--stdin-name", "v"], input=plaintext,
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    return "\n".join(line.strip() for line in p.stdout.splitlines()[1:])


def _block(vault_text: str, indent: int) -> str:
    return "!vault |\n" + "\n".join(" " * indent + line for line in vault_text.splitlines())


def _inventory(tmp: Path, port: int, model: str, note: str, extra: str = "") -> Path:
    tmp.mkdir(exist_ok=True)
    path = tmp / "inv.yml"
    path.write_text(
        "all:\n  vars:\n    ansible_host: 127.0.0.1\n    ansible_user: root\n"
        f"    ansible_port: {port}\n    tunnelspec_known_hosts: {tmp / 'known_hosts'}\n"
        f"    llama_repo: https://github.com/ggml-org/llama.cpp\n    llama_commit: \"{COMMIT}\"\n"
        f"    llama_model: {model}\n    llama_draft_model: /srv/models/draft.gguf\n"
        f"    my_note: {note}\n{extra}"
        "  children:\n    main: {hosts: {main-host: {}}}\n"
        "    rpc: {hosts: {node-a: {rpc_port: 50052, rpc_role: draft}}}\n"
    )
    return path


@pytest.fixture
def vaulted(tmp_path, dead_port):
    if not os.access(ANSIBLE_VAULT, os.X_OK):
        pytest.skip("ansible-vault is not installed")
    model = _block(_encrypt(tmp_path, MODEL), 6)
    note = _block(_encrypt(tmp_path, NOTE, vault_id="prod"), 6)
    return _inventory(tmp_path, dead_port, model, note), tmp_path / "password"


def _no_plaintext(res, *secrets: str) -> None:
    both = res.stdout + res.stderr
    assert "Traceback" not in both, both
    for s in secrets:
        assert s not in both, f"{s!r} shown:\n{both[-3000:]}"


@needs_ansible_vault
def test_check_decrypts_and_shows_nothing(vaulted):
    inv, pw = vaulted
    res = tunnelspec("check", str(inv), "--vault-password-file", str(pw))
    assert res.rc == 0, res.stdout + res.stderr
    assert "-m ***" in res.stdout  # the plan holds the model: masked
    _no_plaintext(res, MODEL, NOTE)
    res = tunnelspec("check", str(inv), "--format", "json", env={"ANSIBLE_VAULT_PASSWORD_FILE": str(pw)})
    assert res.rc == 0 and json.loads(res.stdout)["ok"], res.stdout + res.stderr
    _no_plaintext(res, MODEL, NOTE)


@needs_ansible_vault
@pytest.mark.parametrize("argv", [["deploy", "--check"], ["deploy", "--check", "-vvv"],
                                  ["deploy", "--check", "--format", "json", "-v"], ["status"],
                                  ["status", "--format", "json"], ["inventory", "list"]])
def test_commands_show_no_plaintext(vaulted, argv):
    inv, pw = vaulted
    res = tunnelspec(*argv, str(inv), "--vault-password-file", str(pw), timeout=120)
    assert res.rc == (0 if argv[0] == "inventory" else 4), res.stdout + res.stderr
    _no_plaintext(res, MODEL, NOTE)


@needs_ansible_vault
def test_play_takes_the_password_too(vaulted):
    inv, pw = vaulted
    book = inv.parent / "book.yml"
    book.write_text("- hosts: all\n  tasks:\n    - directory: {path: /nonexistent-tunnelspec-test}\n")
    res = tunnelspec("play", "-i", str(inv), str(book), "--vault-password-file", str(pw), "-vvv", timeout=120)
    assert res.rc == 4, res.stdout + res.stderr
    _no_plaintext(res, MODEL, NOTE)


@needs_ansible_vault
def test_a_vaulted_value_its_type_refuses_is_not_quoted(tmp_path, dead_port):
    bad_port = _block(_encrypt(tmp_path, "nine-b0a1f"), 6)
    inv = _inventory(tmp_path, dead_port, "/srv/models/t.gguf", "plain", f"    tunnel_port: {bad_port}\n")
    for argv in (["check"], ["check", "--format", "json"], ["deploy", "--check"]):
        res = tunnelspec(*argv, str(inv), "--vault-password-file", str(tmp_path / "password"))
        assert res.rc == 2, res.stdout + res.stderr
        assert "tunnel_port" in res.stdout + res.stderr
        _no_plaintext(res, "nine-b0a1f")


@needs_ansible_vault
def test_extra_vars_files_vaulted_whole_and_by_value(vaulted):
    inv, pw = vaulted
    whole = inv.parent / "whole.yml"
    whole.write_text(f"my_extra: {NOTE}-whole\n")
    p = subprocess.run([ANSIBLE_VAULT, "encrypt", "--vault-password-file", str(pw), str(whole)], capture_output=True,
                       timeout=60)
    assert p.returncode == 0 and whole.read_text().startswith("$ANSIBLE_VAULT;1.1;AES256"), p.stderr
    by_value = inv.parent / "by-value.yml"
    by_value.write_text(f"my_other: {_block(_encrypt(inv.parent, NOTE + '-value'), 2)}\n")
    for extra in (whole, by_value):
        res = tunnelspec("check", str(inv), "-e", f"@{extra}", "--vault-password-file", str(pw))
        assert res.rc == 0, res.stdout + res.stderr
        res = tunnelspec("deploy", str(inv), "--check", "-vvv", "-e", f"@{extra}", "--vault-password-file", str(pw),
                         timeout=120)
        assert res.rc == 4, res.stdout + res.stderr
        _no_plaintext(res, NOTE)
        plain = _inventory(inv.parent / "plain", 1, "/srv/models/t.gguf", "plain")
        res = tunnelspec("status", str(plain), "-e", f"@{extra}")  # no password: exit 2, naming the file
        assert res.rc == 2 and f"{extra}:" in res.stderr and "no vault password" in res.stderr, res.stderr


# ---- what goes wrong: exit 2, file:line and the variable, before any host ------------------------
def _fixture_inventory(tmp_path: Path, port: int, vault_text: str | None = None) -> Path:
    text = vault_text if vault_text is not None else (FIXTURES / "value-1.1.vault").read_text()
    return _inventory(tmp_path, port, "/srv/models/t.gguf", _block(text, 6))


CMDS = [["check"], ["check", "--format", "json"], ["deploy", "--check"], ["status"], ["inventory", "list"]]


@pytest.mark.parametrize("argv", CMDS, ids=["_".join(a) for a in CMDS])
def test_no_password(tmp_path, dead_port, argv):
    inv = _fixture_inventory(tmp_path, dead_port)
    res = tunnelspec(*argv, str(inv))
    assert res.rc == 2, res.stdout + res.stderr
    assert f"{inv}:11: variable 'my_note' is vault-encrypted: no vault password was given" in res.stderr, res.stderr
    if "json" in argv:
        [error] = json.loads(res.stdout)["errors"]
        assert (error["file"], error["line"]) == (str(inv), 11)


@pytest.mark.parametrize("argv", CMDS, ids=["_".join(a) for a in CMDS])
def test_wrong_password(tmp_path, dead_port, argv):
    inv = _fixture_inventory(tmp_path, dead_port)
    wrong = tmp_path / "wrong"
    wrong.write_text("not the password\n")
    res = tunnelspec(*argv, str(inv), "--vault-password-file", str(wrong))
    assert res.rc == 2, res.stdout + res.stderr
    assert f"{inv}:11: variable 'my_note' is vault-encrypted: decryption failed (wrong vault password?)" in res.stderr


def test_right_password_from_the_committed_fixture(tmp_path, dead_port):
    inv = _fixture_inventory(tmp_path, dead_port)
    res = tunnelspec("check", str(inv), "--vault-password-file", str(FIXTURES / "password.txt"))
    assert res.rc == 0, res.stdout + res.stderr
    _no_plaintext(res, "fixture-plaintext-1.1")
    script = tmp_path / "password.sh"
    script.write_text(f"#!/bin/sh\ncat '{FIXTURES / 'password.txt'}'\n")
    script.chmod(0o700)
    res = tunnelspec("check", str(inv), env={"ANSIBLE_VAULT_PASSWORD_FILE": str(script)})
    assert res.rc == 0, res.stdout + res.stderr
    res = tunnelspec("check", str(inv), "--vault-id", f"dev@{tmp_path / 'missing-is-read-first'}")
    assert res.rc == 2 and "does not exist" in res.stderr, res.stderr
    res = tunnelspec("check", str(inv), "--vault-id", f"prod@{FIXTURES / 'password.txt'}")
    assert res.rc == 0, res.stdout + res.stderr


def test_malformed_vault_and_bad_password_file(tmp_path, dead_port):
    inv = _fixture_inventory(tmp_path, dead_port, "$ANSIBLE_VAULT;1.1;AES256\n3132zz")
    res = tunnelspec("check", str(inv), "--vault-password-file", str(FIXTURES / "password.txt"))
    assert res.rc == 2 and f"{inv}:11:" in res.stderr and "not valid hex" in res.stderr, res.stderr
    inv = _fixture_inventory(tmp_path, dead_port)
    res = tunnelspec("status", str(inv), "--vault-password-file", str(tmp_path / "missing"))
    assert res.rc == 2 and "does not exist" in res.stderr, res.stderr


def test_ask_vault_pass_without_a_terminal_is_exit_2_at_once(tmp_path, dead_port):
    """As in CI: no controlling terminal (a new session), stdin a pipe that stays open. Never a hang."""
    inv = _fixture_inventory(tmp_path, dead_port)
    env = {k: v for k, v in os.environ.items() if not k.startswith("TUNNELSPEC_")}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    for argv in (["check", str(inv)], ["deploy", str(inv), "--check"]):
        p = subprocess.run([sys.executable, "-m", "tunnelspec", *argv, "--ask-vault-pass"], capture_output=True,
                           text=True, timeout=60, stdin=subprocess.PIPE, start_new_session=True, env=env)
        assert p.returncode == 2, p.stdout + p.stderr
        assert "--ask-vault-pass needs a terminal" in p.stderr and f"{inv}:11:" in p.stderr, p.stderr
        assert "Traceback" not in p.stderr


def test_every_inventory_command_takes_the_vault_options():
    import click

    from tunnelspec.cli.main import main

    def walk(group, prefix=()):
        for name, cmd in group.commands.items():
            if isinstance(cmd, click.Group):
                yield from walk(cmd, (*prefix, name))
            elif any(p.name in ("inventory_option", "inventory_file") for p in cmd.params):
                yield " ".join((*prefix, name)), cmd

    found = dict(walk(main))
    assert len(found) >= 18
    for name, cmd in found.items():
        opts = {o for p in cmd.params for o in getattr(p, "opts", [])}
        assert {"--vault-password-file", "--ask-vault-pass", "--vault-id"} <= opts, name


def test_ask_vault_pass_on_a_terminal(tmp_path, dead_port):
    """At a terminal the password is asked for once, without echo, and the run goes on with it."""
    import fcntl
    import select
    import termios
    import time

    inv = _fixture_inventory(tmp_path, dead_port)
    env = {k: v for k, v in os.environ.items() if not k.startswith("TUNNELSPEC_")}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    master, slave = os.openpty()
    p = subprocess.Popen([sys.executable, "-m", "tunnelspec", "check", str(inv), "--ask-vault-pass"],
                         stdin=slave, stdout=slave, stderr=slave, env=env, start_new_session=True,
                         preexec_fn=lambda: fcntl.ioctl(0, termios.TIOCSCTTY, 0))
    os.close(slave)
    out, answered, end = b"", False, time.monotonic() + 60
    try:
        while time.monotonic() < end:
            ready, _, _ = select.select([master], [], [], 0.2)
            if ready:
                try:
                    chunk = os.read(master, 65536)
                except OSError:  # the child is gone and the terminal with it
                    break
                if not chunk:
                    break
                out += chunk
            if not answered and b"Vault password:" in out:
                os.write(master, (FIXTURES / "password.txt").read_bytes().splitlines()[0] + b"\n")
                answered = True
            if p.poll() is not None and not ready:
                break
        rc = p.wait(timeout=30)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
        os.close(master)
    text = out.decode(errors="replace")
    assert answered and text.count("Vault password:") == 1, text
    assert rc == 0 and "0 error(s)" in text, text
    assert "correct horse" not in text and "fixture-plaintext" not in text and "Traceback" not in text, text


@needs_ansible_vault
def test_a_run_on_a_host_that_answers_shows_no_plaintext(tmp_path):
    """A host that answers (this machine, ansible_connection=local): a task whose argument is a vaulted
    value, in --check with -v and --diff, in human and JSON output; the directory is not made."""
    secret_dir = tmp_path / "vaulted-dir-5e8a1"
    inv = tmp_path / "local.yml"
    inv.write_text("all:\n  hosts:\n    me:\n      ansible_connection: local\n"
                   f"      my_dir: {_block(_encrypt(tmp_path, str(secret_dir)), 8)}\n")
    book = tmp_path / "book.yml"
    book.write_text("- hosts: all\n  tasks:\n    - name: the vaulted directory\n"
                    "      directory: {path: \"{{ my_dir }}\"}\n")
    pw = str(tmp_path / "password")
    for fmt in ("human", "json"):
        res = tunnelspec("play", str(inv), str(book), "--check", "--diff", "-vvv", "--format", fmt,
                         "--vault-password-file", pw)
        assert res.rc == 3, res.stdout + res.stderr
        assert "***" in res.stdout, res.stdout
        _no_plaintext(res, str(secret_dir), "vaulted-dir-5e8a1")
    assert not secret_dir.exists()
