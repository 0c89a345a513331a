"""facts/safe_read.py: root reads a file in a directory a service user can write without following a
link, blocking on a FIFO, or reading a hard link or a huge file (SECURITY.md, invariant A). The real
script, run by this machine's python3 against real files in a temporary directory."""

from __future__ import annotations

import os
import subprocess

import pytest

from tunnelspec.facts import safe_read


def read(path, cap=safe_read.DEFAULT_CAP):
    return subprocess.run(safe_read.file_text(str(path), cap).argv, capture_output=True, text=True, timeout=20)


@pytest.fixture
def tree(tmp_path):
    secret = tmp_path / "secret"
    secret.write_text("root only\n")
    d = tmp_path / "run"
    d.mkdir()
    (d / "mode.json").write_text('{"mode": "speculative"}\n')
    return tmp_path, secret, d


def test_a_regular_file_is_read(tree):
    _, _, d = tree
    r = read(d / "mode.json")
    assert r.returncode == 0 and r.stdout == '{"mode": "speculative"}\n'


def test_absent_is_its_own_exit(tree):
    _, _, d = tree
    assert read(d / "none.json").returncode == safe_read.ABSENT


@pytest.mark.parametrize("plant", ["symlink", "dir_symlink", "fifo", "hardlink", "big", "directory"])
def test_what_a_hostile_user_can_plant_is_refused_unread(tree, plant):
    tmp, secret, d = tree
    target = d / "mode.json"
    target.unlink()
    path = target
    if plant == "symlink":
        target.symlink_to(secret)
    elif plant == "dir_symlink":
        (tmp / "run2").symlink_to(tmp)           # a link among the directories on the way
        path = tmp / "run2" / "secret"
    elif plant == "fifo":
        os.mkfifo(target)                        # would block a plain open() for ever
    elif plant == "hardlink":
        os.link(secret, target)
    elif plant == "big":
        target.write_bytes(b"x" * 5000)
    elif plant == "directory":
        target.mkdir()
    r = read(path, cap=4096)
    assert r.returncode == safe_read.REFUSED, (r.returncode, r.stderr)
    assert "root only" not in r.stdout and r.stdout == "" and r.stderr.strip()
