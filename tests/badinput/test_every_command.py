"""Every command, on broken paths and unreachable hosts: one `ERROR: …` line, the exit code of the
table in docs/ci.md, and never a Python traceback.

The commands are read from the CLI itself (every command that takes an INVENTORY), so a new command
is in the corpus the day it is added. Hosts are 127.0.0.1 on a port this test holds bound without
listening: every connection is refused at once, and nothing else can take the port meanwhile.
Files that cannot be used: missing, empty, a directory, bytes that are not text (we run as root, so
"unreadable" is a directory or binary content, not a mode; a FIFO would block the reader, not fail).
"""

from __future__ import annotations

import json
import os
import socket
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import click
import pytest

from support.cli import CliResult, tunnelspec

UNREACHABLE, USAGE = 4, 2
COMMIT = "0123456789abcdef0123456789abcdef01234567"

# Every command that takes an inventory, as the CLI must offer it (a command losing -i fails here).
KNOWN = {"play", "deploy", "teardown", "verify", "status", "logs", "bench", "check", "inventory list",
         "hostkeys scan", "tunnel open", "tunnel close", "tunnel status", "keys rotate", "certs rotate",
         "certs show", "client-config", "rollback"}
# Commands that connect to hosts (the others read the inventory only).
CONNECTING = {"play", "deploy", "teardown", "verify", "status", "logs", "bench", "hostkeys scan", "tunnel open", "rollback",
              "tunnel close", "tunnel status", "keys rotate"}


def _walk(group, prefix=()):
    for name, cmd in group.commands.items():
        if isinstance(cmd, click.Group):
            yield from _walk(cmd, (*prefix, name))
        else:
            yield " ".join((*prefix, name)), cmd


def inventory_commands() -> dict[str, click.Command]:
    from tunnelspec.cli.main import main

    return {name: cmd for name, cmd in _walk(main)
            if any(p.name in ("inventory_option", "inventory_file") for p in cmd.params)}


def takes(cmd: str, param: str) -> bool:
    return any(p.name == param for p in inventory_commands()[cmd].params)


@pytest.fixture(autouse=True)
def crash_dir(tmp_path, monkeypatch):
    """Crash files (exit 70) land here, not in the caller's ~/.cache."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg-cache"))
    return tmp_path / "xdg-cache"


@pytest.fixture(scope="module")
def dead_port():
    """A port bound on 127.0.0.1 and never listened on: connect() is refused at once."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    yield s.getsockname()[1]
    s.close()


class Files:
    """A valid cluster inventory aimed at the dead port, and broken files of every kind."""

    def __init__(self, d: Path, port: int):
        self.d, self.port = d, port
        self.playbook = d / "noop.yml"
        self.playbook.write_text("- hosts: all\n  tasks:\n    - directory: {path: /nonexistent-tunnelspec-test}\n")

    def broken(self, kind: str, name: str) -> Path:
        p = self.d / f"{kind}-{name}"
        if kind == "missing":
            return p
        if kind == "directory":
            p.mkdir(exist_ok=True)
        elif kind == "empty":
            p.write_text("")
        elif kind == "binary":
            p.write_bytes(bytes(range(256)) * 4)
        else:
            raise ValueError(kind)
        return p

    def inventory(self, extra: str = "", known_hosts: str | None = None, name: str = "inv.ini") -> Path:
        inv = self.d / name
        inv.write_text(
            "[main]\nmain-host\n\n[rpc]\nnode-a rpc_port=50052 rpc_role=draft\n\n[all:vars]\n"
            f"ansible_host=127.0.0.1\nansible_port={self.port}\nansible_user=root\n"
            f"tunnelspec_known_hosts={known_hosts or self.d / 'known_hosts'}\n"
            f"llama_repo=https://github.com/ggml-org/llama.cpp\nllama_commit=\"{COMMIT}\"\n"
            "llama_model=/srv/models/target.gguf\nllama_draft_model=/srv/models/draft.gguf\n" + extra)
        return inv

    def argv(self, cmd: str, inv, *more: str, use_i: bool = False) -> list[str]:
        """The command line of `cmd` on inventory `inv` (what each command needs besides it)."""
        inv_args = ["-i", str(inv)] if use_i else [str(inv)]
        args = [*cmd.split(), *inv_args]
        if cmd == "play":
            args.append(str(self.playbook))
        if cmd == "logs":
            args += ["-o", str(self.d / "bundle.tar.gz")]
        return args + list(more)


@pytest.fixture
def files(tmp_path, dead_port):
    return Files(tmp_path, dead_port)


def _run_all(argvs: list[list[str]], timeout: float = 120) -> list[CliResult]:
    # Two at a time: most of a refused connection's time is the retry's wait, not CPU.
    with ThreadPoolExecutor(max_workers=3) as pool:
        return list(pool.map(lambda a: tunnelspec(*a, timeout=timeout), argvs))


def _problems(argv: list[str], res: CliResult, want: int, needle: str | None = None) -> list[str]:
    out = []
    both = res.stdout + res.stderr
    line = " ".join(argv)
    if "Traceback" in both:
        out.append(f"{line}: a traceback:\n{both[-3000:]}")
    if res.rc != want:
        out.append(f"{line}: exit {res.rc}, want {want}\nstdout: {res.stdout[-1500:]}\nstderr: {res.stderr[-1500:]}")
    # An error before any host is contacted is an `ERROR:` line on stderr (`check` too); what happened
    # to each host (exit 4) is the run's report, on stdout (status, the recap).
    said = both if want == UNREACHABLE else res.stderr
    if want not in (0, 3) and not said.strip():
        out.append(f"{line}: exit {res.rc} and no word of why")
    if needle and needle not in said:
        out.append(f"{line}: {needle!r} not in its output:\n{said[-1500:]}")
    return out


def _check(cases: list[tuple[list[str], int, str | None]]) -> None:
    results = _run_all([c[0] for c in cases])
    problems = [p for (argv, want, needle), res in zip(cases, results, strict=True) for p in _problems(argv, res, want, needle)]
    assert not problems, "\n\n".join(problems)


def test_every_inventory_command_is_known():
    """The corpus covers every command with an inventory; each takes -i too (inventory_argument)."""
    found = inventory_commands()
    assert set(found) >= KNOWN, f"missing: {KNOWN - set(found)}"
    for name, cmd in found.items():
        opts = {o for p in cmd.params for o in getattr(p, "opts", [])}
        assert "-i" in opts and "--inventory" in opts, f"{name} has no -i/--inventory"


# ---- the inventory itself ----------------------------------------------------------------------
@pytest.mark.parametrize("kind", ["missing", "directory", "binary", "empty"])
def test_broken_inventory(kind, files):
    bad = files.broken(kind, "inventory.ini")
    cases = []
    for cmd in sorted(inventory_commands()):
        # An empty inventory is a valid one with no hosts: listed as `{}`, a playbook finds no host.
        want = 0 if kind == "empty" and cmd in ("inventory list", "play") else USAGE
        for use_i in (False, True) if kind == "missing" else (False,):  # -i reaches the same code
            cases.append((files.argv(cmd, bad, use_i=use_i), want, None if want == 0 else str(bad.name)))
    _check(cases)


def test_inventory_given_twice_or_not_at_all(files):
    inv = files.inventory()
    cases = []
    for cmd in sorted(inventory_commands()):
        both = files.argv(cmd, inv)
        both[len(cmd.split()):len(cmd.split())] = ["-i", str(inv)]
        cases.append((both, USAGE, "not both"))
        cases.append(([*cmd.split()] + ([str(files.playbook)] if cmd == "play" else []), USAGE,
                      "PLAYBOOK" if cmd == "play" else "INVENTORY"))
    _check(cases)


# ---- known_hosts ---------------------------------------------------------------------------------
@pytest.mark.parametrize("kind", ["directory", "binary", "garbage"])
def test_known_hosts_unusable_is_exit_2(kind, files):
    if kind == "garbage":
        bad = files.d / "known_hosts-garbage"
        bad.write_text("garbage\n")  # one field: asyncssh refuses it (it skips lines of unknown key types)
    else:
        bad = files.broken(kind, "known_hosts")
    inv = files.inventory(known_hosts=str(bad))
    # Every command that connects checks it; the kinds of content, on one command of each way in.
    cmds = sorted(CONNECTING) if kind == "directory" else ["status", "deploy", "hostkeys scan", "tunnel status"]
    cases = [(files.argv(cmd, inv), USAGE, str(bad)) for cmd in cmds]
    cases.append((files.argv("deploy", inv, "--check", "--format", "json"), USAGE, str(bad)))
    _check(cases)


@pytest.mark.parametrize("kind", ["missing", "empty"])
def test_known_hosts_missing_or_empty_is_an_empty_file(kind, files):
    """A known_hosts the inventory names that does not exist yet is empty: the hosts are then only
    unreachable (here: refused), exit 4; nothing is parsed as known_hosts content."""
    kh = files.broken(kind, "known_hosts")
    inv = files.inventory(known_hosts=str(kh))
    _check([(files.argv(cmd, inv), UNREACHABLE, None) for cmd in ("hostkeys scan", "status", "deploy")])


def test_known_hosts_env_path_that_does_not_exist_is_not_content(files):
    inv = files.inventory()
    res = tunnelspec("status", str(inv), env={"TUNNELSPEC_KNOWN_HOSTS": str(files.d / "no-such-known_hosts")},
                     timeout=60)
    assert not _problems(["status"], res, UNREACHABLE), res.stdout + res.stderr
    res = tunnelspec("status", str(inv), env={"TUNNELSPEC_KNOWN_HOSTS": "known_hosts"}, timeout=60, cwd=files.d)
    assert not _problems(["status"], res, UNREACHABLE), res.stdout + res.stderr


# ---- the SSH key file ----------------------------------------------------------------------------
@pytest.mark.parametrize("kind", ["missing", "binary", "empty"])
def test_key_file_unusable_is_exit_4(kind, files):
    """ansible_ssh_private_key_file that cannot be read: an authentication failure (exit 4, docs/ci.md)
    naming the file."""
    key = files.broken(kind, "id_ed25519")
    inv = files.inventory(extra=f"ansible_ssh_private_key_file={key}\n")
    cmds = ("status", "deploy", "hostkeys scan") if kind != "missing" else sorted(CONNECTING - {"hostkeys scan"})
    # hostkeys scan reads no key: it only asks for host keys (the connection is refused: exit 4 too).
    _check([(files.argv(cmd, inv), UNREACHABLE, None if cmd == "hostkeys scan" else str(key)) for cmd in cmds])


def test_key_file_that_is_a_directory_is_exit_2(files):
    """A directory is not a key file whatever the host says: refused offline, by the variable's declared
    type (cluster/schema.py), with its line (exit 2); hostkeys scan, which reads the host's connection
    variables too (ansible_ssh_timeout), refuses it the same way."""
    key = files.broken("directory", "id_ed25519")
    inv = files.inventory(extra=f"ansible_ssh_private_key_file={key}\n")
    _check([(files.argv(cmd, inv), USAGE, "is a directory") for cmd in ("status", "deploy", "check", "hostkeys scan")])


# ---- -e @FILE ------------------------------------------------------------------------------------
@pytest.mark.parametrize("kind", ["missing", "directory", "binary", "list"])
def test_extra_vars_file_unusable_is_exit_2(kind, files):
    if kind == "list":
        bad = files.d / "list.yml"
        bad.write_text("- a\n- b\n")
    else:
        bad = files.broken(kind, "vars.yml")
    inv = files.inventory()
    cmds = sorted(c for c in inventory_commands() if takes(c, "extra_vars"))
    assert {"deploy", "status", "logs", "bench", "play", "check"} <= set(cmds)
    _check([(files.argv(cmd, inv, "-e", f"@{bad}"), USAGE, bad.name) for cmd in cmds])


def test_extra_vars_file_empty_sets_nothing(files):
    empty = files.broken("empty", "vars.yml")
    inv = files.inventory()
    _check([(files.argv(cmd, inv, "-e", f"@{empty}"), UNREACHABLE, None) for cmd in ("status", "deploy")])


# ---- files the inventory names: patches, models ----------------------------------------------------
@pytest.mark.parametrize("kind", ["missing", "directory", "binary", "empty"])
def test_patch_file_unusable_is_exit_2(kind, files):
    bad = files.broken(kind, "fix.patch")
    inv = files.inventory(extra=f"llama_patches=[{{\"file\": \"{bad}\"}}]\n")
    _check([(files.argv(cmd, inv), USAGE, "llama_patches") for cmd in ("deploy", "check")]
           + [(files.argv("deploy", inv, "--check", "--format", "json"), USAGE, "llama_patches")])


@pytest.mark.parametrize("value", ["", "hf://org/repo/file.gguf"])
def test_model_path_unusable_is_exit_2(value, files):
    inv = files.inventory(extra=f"llama_model={value}\n")
    _check([(files.argv(cmd, inv), USAGE, "llama_model") for cmd in ("deploy", "check")])


# ---- the playbook ----------------------------------------------------------------------------------
@pytest.mark.parametrize("kind", ["missing", "directory", "binary", "empty"])
def test_playbook_unusable_is_exit_2(kind, files):
    bad = files.broken(kind, "playbook.yml")
    inv = files.inventory()
    _check([(["play", str(inv), str(bad)], USAGE, bad.name), (["play", "-i", str(inv), str(bad)], USAGE, bad.name),
            (["play", str(inv), str(bad), "--list-hosts"], USAGE, bad.name)])


# ---- logs -o, lab up --login-password-file -----------------------------------------------------------
def test_logs_output_that_cannot_be_written_is_exit_2_before_collecting(files):
    inv = files.inventory()
    a_file = files.broken("empty", "plain-file")
    a_dir = files.broken("directory", "bundle.tar.gz")
    cases = [(["logs", str(inv), "-o", str(a_file)], USAGE, "--output"),
             (["logs", str(inv), "-o", str(a_dir)], USAGE, "--output"),
             (["logs", str(inv), "-o", str(a_file / "under-a-file")], USAGE, "--output"),
             # Writable by its bits for root, yet no file can be made there.
             (["logs", str(inv), "-o", "/proc/bundle.tar.gz"], USAGE, "--output")]
    _check(cases)


@pytest.mark.parametrize("kind", ["missing", "directory"])
def test_lab_password_file_unusable_is_exit_2(kind, files):
    bad = files.broken(kind, "password")
    _check([(["lab", "up", "--dir", str(files.d / "lab"), "--login-user", "ops", "--login-password-file", str(bad)],
             USAGE, "password")])
    assert not (files.d / "lab").exists()


# ---- unreachable hosts: exit 4 from every command that connects --------------------------------------
UNREACHABLE_CASES = [
    ("status", ()), ("status", ("--format", "json")), ("logs", ()), ("bench", ()), ("bench", ("--format", "json")),
    ("tunnel status", ()), ("tunnel status", ("--format", "json")), ("verify", ()), ("deploy", ("--check",)),
    ("deploy", ("--check", "--format", "json")), ("deploy", ()), ("teardown", ("--check",)), ("teardown", ()),
    ("tunnel open", ()), ("tunnel close", ()), ("keys rotate", ()), ("hostkeys scan", ()),
    ("hostkeys scan", ("--format", "json")), ("play", ()), ("play", ("--format", "json")),
    ("deploy", ("--accept-new-host-keys",)), ("rollback", ()),
]


@pytest.mark.parametrize("cmd,more", UNREACHABLE_CASES, ids=[f"{c}{''.join(m)}".replace(" ", "_")
                                                              for c, m in UNREACHABLE_CASES])
def test_unreachable_host_is_exit_4(cmd, more, files):
    inv = files.inventory()
    argv = files.argv(cmd, inv, *more)
    res = tunnelspec(*argv, timeout=120)
    assert not _problems(argv, res, UNREACHABLE), "\n".join(_problems(argv, res, UNREACHABLE))
    if "json" in more:
        for line in res.stdout.splitlines():
            json.loads(line)  # stdout stays machine-readable
    if cmd == "logs":
        assert "main-host" in res.stderr and (files.d / "bundle.tar.gz").exists()


def test_commands_that_connect_are_all_covered():
    assert CONNECTING <= {c for c, _ in UNREACHABLE_CASES}


def test_commands_that_do_not_connect(files):
    inv = files.inventory()
    _check([(files.argv("inventory list", inv), 0, None), (files.argv("check", inv), 0, None),
            (files.argv("client-config", inv), 0, None),
            # certs need llama_server_public_bind: refused before anything (exit 2).
            (files.argv("certs show", inv), USAGE, "public_bind"), (files.argv("certs rotate", inv), USAGE, "public_bind")])


def test_verify_shows_no_lock_options():
    res = tunnelspec("verify", "--help")
    assert res.rc == 0 and "--lock-timeout" not in res.stdout and "--no-wait" not in res.stdout
    assert "--lock-timeout" in tunnelspec("deploy", "--help").stdout


def test_internal_error_is_one_line_and_a_crash_file(files):
    """An exception no code expected: one line naming it and the file with its traceback, exit 70."""
    import subprocess

    inv = files.inventory()
    code = ("import tunnelspec.inventory as i\n"
            "def boom(*a, **k):\n    raise RuntimeError('boom: a bug\\nsecond line')\n"
            "i.load_inventory = boom\n"
            "from tunnelspec.cli.main import main\nmain()\n")
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("TUNNELSPEC_")},
           "XDG_CACHE_HOME": str(files.d / "cache")}
    for fmt in ("human", "json"):
        p = subprocess.run([sys.executable, "-c", code, "status", str(inv), "--format", fmt,
                            "-e", "become_password=hunter2"],
                           capture_output=True, text=True, env=env, timeout=60, stdin=subprocess.DEVNULL)
        assert p.returncode == 70, p.stdout + p.stderr
        assert "Traceback" not in p.stdout + p.stderr
        if fmt == "json":
            assert json.loads(p.stdout)["exit_code"] == 70
        err = p.stderr.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("ERROR: internal error") and "RuntimeError: boom: a bug" in err[0], err
        crash = Path(err[0].rsplit("the traceback is in ", 1)[1])
        assert crash.parent == files.d / "cache" / "tunnelspec"
        text = crash.read_text()
        assert "Traceback" in text and "RuntimeError: boom" in text and "hunter2" not in text
        assert "become_password=***" in text
        crash.unlink()


# ---- near-misses: values `check` passes are values every command can use --------------------------
# Values at the edge of what each declared type takes (the corpus's mistakes, one step to the good
# side), several per inventory. `check` passes each file; then no connecting command may exit 70 on
# it (an internal error) or say anything but that the hosts are unreachable.
NEAR_MISSES = [
    # ports at their bounds and as text, timeouts as fractions, booleans in Ansible's spellings
    ("ansible_port={port}\nansible_ssh_timeout=0.5\nansible_become=yes\nrpc_local_isolation=True\n"
     "llama_keep_builds=1\ntunnelspec_keep_generations=\" 2 \"\ntunnelspec_install_packages=no\n"),
    # the connection variables honoured: the key-file alias, extra ssh arguments, sudo spelled out
    ("ansible_port={port}\nansible_timeout=2\nansible_private_key_file=id_test\nansible_become_method=sudo\n"
     "ansible_ssh_common_args='-o ServerAliveInterval=5 -o ControlMaster=auto -C'\n"
     "ansible_ssh_extra_args='-o ConnectTimeout=3'\nansible_python_interpreter=/usr/bin/python3\n"),
    # a tunnel port at the top of the range, a node's ssh port for main apart from the controller's
    ("ansible_port={port}\nllama_server_port=65535\nllama_server_internal_port=1024\n"),
]


@pytest.mark.parametrize("i", range(len(NEAR_MISSES)))
def test_no_command_exits_70_on_an_inventory_check_passes(i, files, monkeypatch):
    """In-process (click's runner), each host connected to once (connection/retry.py's waits spared:
    the port refuses at once): an internal error would raise here rather than become exit 70."""
    from click.testing import CliRunner

    from tunnelspec.cli.main import main
    from tunnelspec.connection import retry, ssh

    monkeypatch.setattr(ssh, "connect_retrying", lambda: retry.connect_retrying(attempts=1))
    monkeypatch.setenv("XDG_CACHE_HOME", str(files.d / "cache"))
    (files.d / "id_test").write_text("")  # an existing (if empty) key file: asyncssh skips what it cannot read
    inv = files.d / f"near-{i}.ini"
    inv.write_text(
        "[main]\nmain-host ansible_host=127.0.0.1\n\n[rpc]\nnode-a ansible_host=127.0.0.1 rpc_port=65000 "
        "tunnel_port=65001 tunnel_ssh_port=1\n\n[all:vars]\nansible_user=root\n"
        f"tunnelspec_known_hosts={files.d / 'known_hosts'}\ntunnelspec_lock_dir={files.d / 'lock'}\n"
        f"llama_repo=https://github.com/ggml-org/llama.cpp\nllama_commit=\"{COMMIT}\"\n"
        "llama_model=/srv/models/target.gguf\nllama_draft_model=/srv/models/draft.gguf\n"
        + NEAR_MISSES[i].format(port=files.port))
    runner = CliRunner()
    checked = runner.invoke(main, ["check", str(inv)], catch_exceptions=False)
    assert checked.exit_code == 0, checked.output
    problems = []
    for cmd, more in UNREACHABLE_CASES:
        argv = files.argv(cmd, inv, *more)
        res = runner.invoke(main, argv, catch_exceptions=False)
        if res.exit_code != UNREACHABLE or "Traceback" in res.output:
            problems.append(f"{' '.join(argv)}: exit {res.exit_code}\n{res.output[-1500:]}")
    assert not problems, "\n\n".join(problems)
