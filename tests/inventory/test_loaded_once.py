"""The inventory file is read once per command: check, the cluster model, the run and a rollback
after a failed deploy all use the one object the command loaded (issue: a deploy parsed it twice,
three times with a rollback). Counted at the file read itself, for every command that takes an
inventory, in-process against hosts that refuse connections at once (127.0.0.1, a bound port that
never listens)."""

from __future__ import annotations

import socket

import pytest
from click.testing import CliRunner

from tunnelspec.inventory import loader

COMMIT = "0123456789abcdef0123456789abcdef01234567"


@pytest.fixture(scope="module")
def dead_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    yield s.getsockname()[1]
    s.close()


def _commands():
    import click

    from tunnelspec.cli.main import main

    def walk(group, prefix=()):
        for name, cmd in group.commands.items():
            if isinstance(cmd, click.Group):
                yield from walk(cmd, (*prefix, name))
            elif any(p.name in ("inventory_option", "inventory_file") for p in cmd.params):
                yield " ".join((*prefix, name))

    return sorted(walk(main))


def _one_attempt(monkeypatch):
    """Connect once, not three times with waits between: the hosts refuse at once, and what is
    counted here is the inventory's reads, not the retries (connection/retry.py)."""
    from tunnelspec.connection import retry, ssh

    monkeypatch.setattr(ssh, "connect_retrying", lambda: retry.connect_retrying(attempts=1))


@pytest.mark.parametrize("cmd", [*_commands(), "deploy --check"])
def test_each_command_reads_the_inventory_once(cmd, tmp_path, dead_port, monkeypatch):
    from tunnelspec.cli.main import main

    inv = tmp_path / "inv.ini"
    inv.write_text(
        "[main]\nmain-host\n\n[rpc]\nnode-a rpc_role=draft\n\n[all:vars]\n"
        f"ansible_host=127.0.0.1\nansible_port={dead_port}\nansible_user=root\n"
        f"tunnelspec_known_hosts={tmp_path / 'known_hosts'}\ntunnelspec_lock_dir={tmp_path / 'lock'}\n"
        f'llama_repo=https://github.com/ggml-org/llama.cpp\nllama_commit="{COMMIT}"\n'
        "llama_model=/srv/models/target.gguf\nllama_draft_model=/srv/models/draft.gguf\n")
    playbook = tmp_path / "noop.yml"
    playbook.write_text("- hosts: all\n  tasks:\n    - directory: {path: /nonexistent-tunnelspec-test}\n")
    reads: list[str] = []
    real = loader.read_bytes

    def counted(path):
        reads.append(str(path))
        return real(path)

    monkeypatch.setattr(loader, "read_bytes", counted)
    _one_attempt(monkeypatch)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setenv("HOME", str(tmp_path))
    argv = [*cmd.split(), str(inv)]
    if cmd == "play":
        argv.append(str(playbook))
    if cmd == "logs":
        argv += ["-o", str(tmp_path / "bundle.tar.gz")]
    res = CliRunner().invoke(main, argv, catch_exceptions=False)
    assert res.exit_code in (0, 2, 4), (res.exit_code, res.output[-2000:])
    assert reads.count(str(inv)) == 1, (cmd, reads, res.output[-1500:])
