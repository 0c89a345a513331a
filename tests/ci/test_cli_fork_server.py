"""The unit tier's fork server (tests/support/zygote.py) runs the CLI as a fresh interpreter does: the
same exit status, stdout and stderr, environment and working directory, and a timeout kills the run
and raises as subprocess.run does."""

from __future__ import annotations

import socket
import subprocess

import pytest

from support import cli


def both(*args: str, **kw) -> tuple[cli.CliResult, cli.CliResult]:
    saved = cli.FORK
    try:
        cli.FORK = False
        fresh = cli.tunnelspec(*args, **kw)
        cli.FORK = True
        forked = cli.tunnelspec(*args, **kw)
    finally:
        cli.FORK = saved
    return fresh, forked


@pytest.fixture
def inventory(tmp_path):
    refused = socket.socket()
    refused.bind(("127.0.0.1", 0))  # bound, never listening: connect() is refused at once
    inv = tmp_path / "inv.ini"
    inv.write_text("[main]\nmain-host\n\n[rpc]\nnode-a rpc_role=draft\n\n[all:vars]\nansible_host=127.0.0.1\n"
                   f"ansible_port={refused.getsockname()[1]}\nansible_user=root\n"
                   f"tunnelspec_known_hosts={tmp_path / 'known_hosts'}\n"
                   "llama_repo=https://github.com/ggml-org/llama.cpp\n"
                   'llama_commit="0123456789abcdef0123456789abcdef01234567"\n'
                   "llama_model=/srv/models/target.gguf\nllama_draft_model=/srv/models/draft.gguf\n")
    yield inv
    refused.close()


@pytest.mark.parametrize("argv", [
    ["--help"], ["check", "{inv}"], ["check", "{inv}", "--format", "json"], ["inventory", "list", "{inv}"],
    ["status", "{inv}", "--format", "json"], ["nosuchcommand"], ["check", "{dir}/missing.ini"],
])
def test_same_exit_status_and_output(argv, inventory):
    args = [a.format(inv=inventory, dir=inventory.parent) for a in argv]
    fresh, forked = both(*args, cwd=inventory.parent)
    assert forked.rc == fresh.rc
    assert forked.stdout == fresh.stdout
    assert forked.stderr == fresh.stderr


def test_environment_and_working_directory_are_the_callers(inventory, tmp_path):
    (tmp_path / "known_hosts").write_text("garbage\n")
    # A relative TUNNELSPEC_KNOWN_HOSTS is read from the run's working directory.
    fresh, forked = both("status", str(inventory), env={"TUNNELSPEC_KNOWN_HOSTS": "known_hosts"}, cwd=tmp_path)
    assert fresh.rc == forked.rc == 2
    assert "known_hosts" in forked.stderr and forked.stderr == fresh.stderr


def test_a_run_past_its_timeout_is_killed_and_raises(inventory, tmp_path):
    mute = socket.socket()
    mute.bind(("127.0.0.1", 0))
    mute.listen(4)  # accepts, never says a word of SSH: the run waits
    inv = tmp_path / "mute.ini"
    inv.write_text(inventory.read_text().replace(f"ansible_port={inventory.read_text().split('ansible_port=')[1].split()[0]}",
                                                 f"ansible_port={mute.getsockname()[1]}"))
    saved = cli.FORK
    cli.FORK = True
    try:
        with pytest.raises(subprocess.TimeoutExpired):
            cli.tunnelspec("status", str(inv), timeout=2)
        # The server goes on serving after a killed run.
        assert cli.tunnelspec("--help", timeout=30).rc == 0
    finally:
        cli.FORK = saved
        mute.close()
