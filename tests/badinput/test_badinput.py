"""Bad input: every broken inventory, playbook and option combination gets one clear error naming
file:line (or host and option), exit 2, and no host is contacted.

"No host is contacted" is proved, not assumed: every host of every case points at a listening
socket this test owns on 127.0.0.1 (a honeypot), and the test asserts that nothing connected to
it. A positive control runs a valid inventory against the same honeypot and sees the connection,
so a broken honeypot cannot make the corpus pass.

Each corpus file ends with `# expect: TEXT` lines; `@` in TEXT stands for the file's path as the
CLI was given it (so `@:5:` means "names line 5 of this file").
"""

from __future__ import annotations

import re
import selectors
import shutil
import socket
import threading
import time
from pathlib import Path

import pytest

from support.cli import tunnelspec

HERE = Path(__file__).parent
INVENTORIES = sorted((HERE / "inventories").glob("*.ini"))
PLAYBOOKS = sorted((HERE / "playbooks").glob("*.yml"))

# (id, argv template, expected texts). {inv} is the valid inventory, {pb} a valid playbook.
OPTION_CASES = [
    ("forks_zero", ["deploy", "{inv}", "--forks", "0"], ["--forks", "0"]),
    ("forks_not_a_number", ["play", "{inv}", "{pb}", "-f", "many"], ["--forks", "many"]),
    ("format_unknown", ["deploy", "{inv}", "--format", "xml"], ["--format", "xml"]),
    ("extra_var_without_value", ["deploy", "{inv}", "-e", "llama_model"], ["-e", "KEY=VALUE"]),
    ("limit_matches_nothing", ["deploy", "{inv}", "--limit", "no-such-host"], ["--limit", "no-such-host"]),
    ("limit_excludes_everything", ["play", "{inv}", "{pb}", "--limit", "!all"], ["--limit", "!all"]),
    ("unknown_option", ["deploy", "{inv}", "--frobnicate"], ["--frobnicate"]),
    ("playbook_argument_missing", ["play", "{inv}"], ["PLAYBOOK"]),
    ("playbook_file_missing", ["play", "{inv}", "{dir}/no-such-playbook.yml"], ["no-such-playbook.yml"]),
    ("inventory_file_missing", ["deploy", "{dir}/no-such-inventory.ini"], ["no-such-inventory.ini"]),
    ("check_takes_no_value", ["deploy", "{inv}", "--check=yes"], ["--check"]),
    ("scan_bad_inventory", ["hostkeys", "scan", "{dir}/bad.ini"], ["bad.ini:1:"]),
]


class Honeypot:
    """A TCP listener on 127.0.0.1 that records every connection attempt (and closes it)."""

    def __init__(self):
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.sock.setblocking(False)
        self.port = self.sock.getsockname()[1]
        self.accepted = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self):
        sel = selectors.DefaultSelector()
        sel.register(self.sock, selectors.EVENT_READ)
        while not self._stop.is_set():
            for _key, _ in sel.select(timeout=0.1):
                try:
                    conn, _addr = self.sock.accept()
                except BlockingIOError:
                    continue
                self.accepted += 1
                conn.close()
        sel.close()

    def drain(self) -> int:
        """Connections seen so far, after giving the accept thread a bounded moment to catch up."""
        deadline = time.monotonic() + 1.0
        while time.monotonic() < deadline:
            try:
                conn, _ = self.sock.accept()  # one the thread has not picked up yet
                self.accepted += 1
                conn.close()
            except BlockingIOError:
                break
        return self.accepted

    def close(self):
        self._stop.set()
        self._thread.join(5)
        self.sock.close()


@pytest.fixture
def honeypot():
    h = Honeypot()
    yield h
    h.close()


def _expects(path: Path) -> list[str]:
    return [l.split("# expect:", 1)[1].strip() for l in path.read_text(errors="replace").splitlines()
            if l.startswith("# expect:")]


def _pointed_at(src: Path, dst: Path, port: int) -> Path:
    """The case file with every host sent to the honeypot (appended, so line numbers stay)."""
    shutil.copy(src, dst)
    with open(dst, "a") as f:
        f.write(f"\n[all:vars]\nansible_host=127.0.0.1\nansible_port={port}\n"
                f"tunnelspec_known_hosts={dst.parent}/known_hosts\n")
    return dst


def _assert_only_the_error_event(res):
    """--format json: stdout holds one `error` event (schema-valid, same text as stderr), no run."""
    import json

    import jsonschema

    from tunnelspec.reporting.schema import EVENT_SCHEMA

    lines = res.stdout.strip().splitlines()
    assert len(lines) == 1, f"want only the error event, got: {res.stdout}"
    ev = json.loads(lines[0])
    jsonschema.validate(ev, EVENT_SCHEMA)
    assert ev["event"] == "error" and ev["exit_code"] == 2 and f"ERROR: {ev['msg']}" == res.stderr.strip(), ev


def _assert_clean_usage_error(res, expects: list[str], where: str, honeypot: Honeypot):
    assert res.rc == 2, f"exit {res.rc}, want 2\nstdout: {res.stdout}\nstderr: {res.stderr}"
    err = res.stderr.strip()
    assert err, "no error message"
    assert "Traceback" not in err, err
    for text in expects:
        assert text.replace("@", where) in err, f"{text.replace('@', where)!r} not in:\n{err}"
    assert honeypot.drain() == 0, "a host was contacted"


def test_corpus_is_big_enough():
    assert len(INVENTORIES) + len(PLAYBOOKS) + len(OPTION_CASES) >= 30
    for f in INVENTORIES + PLAYBOOKS:
        assert _expects(f), f"{f.name} has no '# expect:' line"
    for f in INVENTORIES:  # each names its exact line: `@:` alone would pass with any line
        assert any(re.fullmatch(r"@:\d+:", e) for e in _expects(f)), f"{f.name} expects no exact @:LINE:"


def test_honeypot_sees_a_real_run(tmp_path, honeypot):
    """Positive control: a valid inventory and playbook do reach the honeypot."""
    inv = _pointed_at(HERE / "good.ini", tmp_path / "good.ini", honeypot.port)
    pb = tmp_path / "noop.yml"
    pb.write_text("- hosts: all\n  tasks:\n    - directory: {path: /nonexistent-tunnelspec-test}\n")
    res = tunnelspec("play", str(inv), str(pb), "--format", "json", "--limit", "node-a", timeout=120)
    assert res.rc == 4, res.stdout + res.stderr
    assert honeypot.drain() >= 1


@pytest.mark.parametrize("case", INVENTORIES, ids=[p.stem for p in INVENTORIES])
def test_bad_inventory(case, tmp_path, honeypot):
    inv = _pointed_at(case, tmp_path / case.name, honeypot.port)
    res = tunnelspec("deploy", str(inv), "--format", "json", timeout=60)
    _assert_clean_usage_error(res, _expects(case), str(inv), honeypot)
    _assert_only_the_error_event(res)


@pytest.mark.parametrize("case", PLAYBOOKS, ids=[p.stem for p in PLAYBOOKS])
def test_bad_playbook(case, tmp_path, honeypot):
    inv = _pointed_at(HERE / "good.ini", tmp_path / "good.ini", honeypot.port)
    pb = tmp_path / case.name
    shutil.copy(case, pb)
    res = tunnelspec("play", str(inv), str(pb), "--format", "json", timeout=60)
    _assert_clean_usage_error(res, _expects(case), str(pb), honeypot)
    _assert_only_the_error_event(res)


@pytest.mark.parametrize("argv,expects", [c[1:] for c in OPTION_CASES], ids=[c[0] for c in OPTION_CASES])
def test_bad_options(argv, expects, tmp_path, honeypot):
    inv = _pointed_at(HERE / "good.ini", tmp_path / "good.ini", honeypot.port)
    pb = tmp_path / "noop.yml"
    pb.write_text("- hosts: all\n  tasks:\n    - directory: {path: /nonexistent-tunnelspec-test}\n")
    (tmp_path / "bad.ini").write_text("[main\nhost\n")
    args = [a.format(inv=inv, pb=pb, dir=tmp_path) for a in argv]
    res = tunnelspec(*args, timeout=60)
    _assert_clean_usage_error(res, expects, str(inv), honeypot)
