"""docs/ci.md's exit-code table is true in every cell: the table and the list of commands it speaks for
are read from the Markdown, and for each exit code each class of input that the row names is run
against every command it applies to (the commands read from the CLI itself). A new row without a
class here fails, as does a command the table does not list.

Hosts are 127.0.0.1 only: a port bound and never listened on (refused at once), a listener that never
says a word (a connect waits: Ctrl-C lands there), or `ansible_connection=local` for the rows that need
a host that answers (a task failed, drift, the run lock). Every subprocess has a timeout; every wait a
deadline."""

from __future__ import annotations

import fcntl
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import click
import pytest

from support.cli import tunnelspec

ROOT = Path(__file__).resolve().parents[2]
COMMIT = "0123456789abcdef0123456789abcdef01234567"
# Commands that connect to hosts (the others read the inventory and the controller's files only).
CONNECTING = {"play", "deploy", "rollback", "teardown", "verify", "status", "logs", "bench", "hostkeys scan",
              "tunnel open", "tunnel close", "tunnel status", "keys rotate"}


# ---- the table, read from the docs ---------------------------------------------------------------
def _section() -> str:
    text = (ROOT / "docs" / "ci.md").read_text()
    start = text.index("## Exit codes")
    return text[start : text.index("\n## ", start + 1)]


def table() -> dict[int, str]:
    rows = re.findall(r"^\| (\d+) \| (.+) \|$", _section(), re.M)
    assert rows, "no exit-code table in docs/ci.md"
    return {int(code): meaning for code, meaning in rows}


def _walk(group, prefix=()):
    for name, cmd in group.commands.items():
        if isinstance(cmd, click.Group):
            yield from _walk(cmd, (*prefix, name))
        else:
            yield " ".join((*prefix, name)), cmd


def inventory_commands() -> list[str]:
    from tunnelspec.cli.main import main

    return sorted(n for n, c in _walk(main) if any(p.name in ("inventory_option", "inventory_file") for p in c.params))


def documented_commands() -> set[str]:
    """`One table for every command (`deploy`, …, `tunnel open|close|status`, `certs …`)`, expanded."""
    listed = re.search(r"One table for every command \((.*?)\)\.", _section(), re.S)
    assert listed, "the table's list of commands is gone from docs/ci.md"
    out: set[str] = set()
    for item in re.findall(r"`([^`]+)`", listed.group(1)):
        head, _, tail = item.rpartition(" ")
        if tail == "…":
            out |= {c for c in inventory_commands() if c.startswith(head + " ")}
        elif "|" in tail:
            out |= {f"{head} {t}" for t in tail.split("|")}
        else:
            out.add(item)
    return out


def test_the_table_speaks_for_every_command_that_reads_an_inventory():
    assert documented_commands() == set(inventory_commands())


# ---- hosts and files -----------------------------------------------------------------------------
class Silent:
    """Accepts and never says a word (no SSH banner): a connect waits there until Ctrl-C."""

    def __init__(self):
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.sock.settimeout(0.2)
        self.port = self.sock.getsockname()[1]
        self.conns: list[socket.socket] = []
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._serve, daemon=True)
        self._t.start()

    def _serve(self):
        while not self._stop.is_set():
            try:
                self.conns.append(self.sock.accept()[0])
            except OSError:
                continue

    def close(self):
        self._stop.set()
        self._t.join(5)
        for c in self.conns:
            c.close()
        self.sock.close()


def _unreadable() -> str:
    """A file that even root cannot read (the suite may run as root: a mode would not stop it)."""
    for path in ("/proc/sys/vm/compact_memory", "/proc/self/mem"):
        try:
            with open(path, "rb") as f:
                f.read(1)
        except PermissionError:
            return path
        except OSError:
            if os.path.exists(path):
                return path
    pytest.skip("no file here that root cannot read")


@dataclass
class World:
    d: Path
    dead: int  # bound, never listening

    def inventory(self, name: str = "inv.ini", port: int | None = None, extra: str = "") -> Path:
        p = self.d / name
        p.write_text(
            "[main]\nmain-host\n\n[rpc]\nnode-a rpc_port=50052 rpc_role=draft\n\n[all:vars]\n"
            f"ansible_host=127.0.0.1\nansible_port={port or self.dead}\nansible_user=root\n"
            f"tunnelspec_known_hosts={self.d / 'known_hosts'}\n"
            f'llama_repo=https://github.com/ggml-org/llama.cpp\nllama_commit="{COMMIT}"\n'
            "llama_model=/srv/models/target.gguf\nllama_draft_model=/srv/models/draft.gguf\n" + extra
        )
        return p

    def local(self, tasks: str) -> tuple[Path, Path]:
        """An inventory of this machine (ansible_connection=local) and a playbook of these tasks."""
        (self.d / "lock").mkdir(exist_ok=True)
        inv = self.d / "local.ini"
        inv.write_text(f"[all]\nme ansible_connection=local tunnelspec_lock_dir={self.d / 'lock'}\n")
        book = self.d / "local.yml"
        book.write_text(f"- hosts: all\n  tasks:\n{tasks}")
        return inv, book

    def argv(self, cmd: str, inv, *more: str) -> list[str]:
        args = [*cmd.split(), str(inv)]
        if cmd == "play":
            book = self.d / "noop.yml"
            book.write_text("- hosts: all\n  tasks:\n    - directory: {path: /nonexistent-tunnelspec-test}\n")
            args.append(str(book))
        if cmd == "logs":
            args += ["-o", str(self.d / "bundle.tar.gz")]
        return [*args, *more]


@pytest.fixture
def world(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg-cache"))
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    yield World(tmp_path, s.getsockname()[1])
    s.close()


# ---- running -------------------------------------------------------------------------------------
@dataclass
class Case:
    argv: list[str]
    needle: str | None = None  # a word the output must hold
    run: str = "cli"  # "cli" (support.cli), "closed-stdout", "sigint", "crash"


def _env() -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TUNNELSPEC_")}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    return env


def _popen(argv: list[str], code: str | None = None, **kw) -> subprocess.Popen:
    head = [sys.executable, "-c", code] if code else [sys.executable, "-m", "tunnelspec"]
    return subprocess.Popen(
        [*head, *argv], stdin=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=_env(), **kw
    )


def _finish(p: subprocess.Popen, timeout: float = 60) -> tuple[int, str, str]:
    try:
        out, err = p.communicate(timeout=timeout)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    return p.returncode, out or "", err or ""


_CRASH = (
    "import sys, tunnelspec.inventory as i, tunnelspec.commands.runner as r\n"
    "def boom(*a, **k):\n    raise RuntimeError('boom: an injected bug')\n"
    "i.load_inventory = boom\nr.load_inventory = boom\n"
    "from tunnelspec.cli.main import main\nsys.argv[0] = 'tunnelspec'\nmain()\n"
)


def _one(case: Case, world: World) -> tuple[int, str, str]:
    if case.run == "cli":
        r = tunnelspec(*case.argv, timeout=120)
        return r.rc, r.stdout, r.stderr
    if case.run == "closed-stdout":
        p = _popen(case.argv, stdout=subprocess.PIPE)
        assert p.stdout is not None
        p.stdout.close()  # the reader is gone before the first write (`| head -c0`)
        return _finish(p)
    if case.run == "crash":
        return _finish(_popen(case.argv, _CRASH, stdout=subprocess.PIPE))
    assert case.run == "sigint"
    silent = Silent()
    try:
        argv = [a.replace("{silent}", str(silent.port)) for a in case.argv]
        world.inventory(f"silent-{silent.port}.ini", port=silent.port)
        # SIGINT at its default in the child, as for a terminal's foreground job.
        p = _popen(argv, stdout=subprocess.PIPE, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
        end = time.monotonic() + 60
        while not silent.conns and p.poll() is None and time.monotonic() < end:
            time.sleep(0.05)
        if p.poll() is None:
            p.send_signal(signal.SIGINT)
        return _finish(p)
    finally:
        silent.close()


def _problems(case: Case, want: int, rc: int, out: str, err: str) -> list[str]:
    line = " ".join(case.argv)
    probs = []
    if "Traceback" in out + err:
        probs.append(f"{line}: a traceback:\n{(out + err)[-2000:]}")
    if rc != want:
        probs.append(f"{line} ({case.run}): exit {rc}, the table says {want}\nstdout: {out[-800:]}\nstderr: {err[-800:]}")
    if case.needle and case.needle not in out + err:
        probs.append(f"{line}: {case.needle!r} not in its output:\n{(out + err)[-800:]}")
    return probs


def _check(cases: list[Case], want: int, world: World) -> None:
    assert cases, "no case"
    with ThreadPoolExecutor(max_workers=3) as pool:
        results = list(pool.map(lambda c: _one(c, world), cases))
    problems = [p for c, (rc, out, err) in zip(cases, results, strict=True) for p in _problems(c, want, rc, out, err)]
    assert not problems, "\n\n".join(problems)


# ---- each row's classes of input -----------------------------------------------------------------
def _takes(cmd: str, param: str) -> bool:
    from tunnelspec.cli.main import main

    return any(p.name == param for p in dict(_walk(main))[cmd].params)


def _every(world: World, inv, *more: str, only=None, run: str = "cli", needle=None) -> list[Case]:
    return [Case(world.argv(c, inv, *more), needle, run) for c in inventory_commands() if only is None or only(c)]


def _broken(kind: str) -> Callable[[World], list[Case]]:
    def cases(world: World) -> list[Case]:
        path = world.d / f"{kind}-inventory.ini"
        if kind == "directory":
            path.mkdir()
        elif kind == "binary":
            path.write_bytes(bytes(range(256)) * 4)
        elif kind == "unreadable":
            path = Path(_unreadable())
        return _every(world, path, needle=path.name)

    return cases


def _vaulted(world: World) -> Path:
    """A YAML inventory holding a `!vault` value (the committed ansible-vault fixture)."""
    text = (ROOT / "tests" / "inventory" / "vault" / "value-1.1.vault").read_text()
    path = world.d / "vaulted.yml"
    path.write_text(
        "all:\n  vars:\n    ansible_host: 127.0.0.1\n    my_note: !vault |\n"
        + "".join(f"      {line}\n" for line in text.splitlines())
        + "  children:\n    main: {hosts: {main-host: {}}}\n    rpc: {hosts: {node-a: {rpc_port: 50052}}}\n"
    )
    return path


def _wrong(world: World) -> Path:
    path = world.d / "wrong-password"
    path.write_text("not the password\n")
    return path


def _drift(world: World) -> list[Case]:
    inv, book = world.local(f"    - directory: {{path: {world.d / 'not-yet'}}}\n")
    return [Case(["play", str(inv), str(book), "--check"], "would change")]


def _task_failed(world: World) -> list[Case]:
    inv, book = world.local(f"    - command: {{argv: [\"false\"], creates: {world.d / 'never'}}}\n")
    return [Case(["play", str(inv), str(book)], "failed")]


def _locked(world: World) -> list[Case]:
    inv, book = world.local(f"    - directory: {{path: {world.d / 'made'}}}\n")
    return [Case(["play", str(inv), str(book), "--no-wait"], "locked")]


CLASSES: dict[int, dict[str, Callable[[World], list[Case]]]] = {
    0: {
        "help": lambda w: [Case([*c.split(), "--help"], "Usage") for c in ["", *inventory_commands()]],
        "version": lambda w: [Case(["--version"], "tunnelspec")],
        "offline commands on a valid inventory": lambda w: [
            Case(w.argv(c, w.inventory())) for c in ("check", "inventory list", "client-config")
        ],
    },
    1: {"a task failed": _task_failed},
    2: {
        "missing inventory": _broken("missing"),
        "a directory": _broken("directory"),
        "an unreadable file": _broken("unreadable"),
        "a binary file": _broken("binary"),
        "a value its type refuses (ansible_port=nine)": lambda w: _every(
            w,
            w.inventory("nine.ini", extra="[main:vars]\nansible_port=nine\n"),
            only=lambda c: c != "inventory list",
            needle="ansible_port",
        ),
        "-e @FILE missing": lambda w: _every(
            w, w.inventory(), "-e", f"@{w.d / 'no-such-vars.yml'}", only=lambda c: _takes(c, "extra_vars"),
            needle="no-such-vars.yml",
        ),
        "vault data without its password": lambda w: _every(w, _vaulted(w), needle="no vault password"),
        "vault data with a wrong password": lambda w: _every(
            w, _vaulted(w), "--vault-password-file", str(_wrong(w)), needle="wrong vault password"
        ),
        "an unknown option": lambda w: _every(w, w.inventory(), "--no-such-option", needle="no-such-option"),
    },
    3: {"--check found drift": _drift},
    4: {"an unreachable host": lambda w: _every(w, w.inventory(), only=lambda c: c in CONNECTING)},
    5: {"another run holds the lock": _locked},
    70: {"an internal error": lambda w: _every(w, w.inventory(), run="crash", needle="internal error")},
    130: {
        "Ctrl-C": lambda w: [
            Case(w.argv(c, w.d / "silent-{silent}.ini"), "ERROR: interrupted", "sigint")
            for c in sorted(CONNECTING)
        ]
    },
    141: {
        "a closed stdout": lambda w: [Case([*c.split(), "--help"], run="closed-stdout") for c in inventory_commands()]
        + [Case(w.argv(c, w.inventory()), run="closed-stdout") for c in ("check", "inventory list", "client-config")]
    },
}


def _cells() -> list[tuple[int, str]]:
    return [(code, name) for code in table() for name in CLASSES.get(code, {"(no input class for this row)": None})]


@pytest.mark.parametrize("code,klass", _cells(), ids=[f"{c}-{k}".replace(" ", "_") for c, k in _cells()])
def test_cell(code, klass, world):
    make = CLASSES.get(code, {}).get(klass)
    assert make is not None, f"docs/ci.md's row {code} has no input class in this test: add one"
    cases = make(world)
    if code == 5:  # hold the lock the way a run holds it (engine/runlock.py: flock on run.lock)
        (world.d / "lock").mkdir(exist_ok=True)
        with open(world.d / "lock" / "run.lock", "a") as held:
            fcntl.flock(held, fcntl.LOCK_EX)
            _check(cases, code, world)
        return
    _check(cases, code, world)
    if code == 3:
        assert not (world.d / "not-yet").exists()


def test_every_row_is_tested_and_every_command_takes_e():
    assert set(table()) <= set(CLASSES), f"rows without a class: {set(table()) - set(CLASSES)}"
    # -e applies as for every command (docs/cli.md), but `inventory list`, which shows the file as written.
    assert [c for c in inventory_commands() if not _takes(c, "extra_vars")] == ["inventory list"]
