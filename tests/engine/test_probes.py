"""Batched read-only probes (connection/probes.py): same results as running each command, served
only while nothing else ran on the connection; a no-op run of the generic playbook takes one SSH
session per host."""

from __future__ import annotations

import asyncio
import io
import json
import os
import shutil
from pathlib import Path

from helpers import make_repo

from tunnelspec.connection.base import read_argv
from tunnelspec.connection.local import LocalConnection
from tunnelspec.connection.ssh import SSHConnection
from tunnelspec.facts.files import command as file_state_argv

DATA = Path(__file__).parent / "data"

ODD_ARGVS = [
    ["printf", "a b\n\nc"],                   # no trailing newline, blank line inside
    ["printf", ""],                            # empty output
    ["echo", "x y", "-n"],                     # arguments with spaces, option-looking last
    ["sh", "-c", 'printf "%s|" "$@"', "sh", "1 2", "", "3"],   # empty argument kept
    ["sh", "-c", "echo out; echo err >&2; exit 3"],            # failing: not served from the batch
]


def test_batch_matches_each_command_and_failures_run_again(tmp_path):
    async def go():
        conn = LocalConnection("local")
        want = [await conn.run(a) for a in ODD_ARGVS]
        assert await conn.prefetch(ODD_ARGVS) == len(ODD_ARGVS) - 1
        got = [await conn.probe(a) for a in ODD_ARGVS]
        for w, g in zip(want, got):
            assert (g.rc, g.stdout_bytes) == (w.rc, w.stdout_bytes)
        assert got[-1].stderr == "err\n"      # the failing probe ran for real, with its stderr

    asyncio.run(go())


def test_probe_is_served_until_the_connection_runs_anything_else(tmp_path):
    f = tmp_path / "f"
    f.write_text("one\n")

    async def go():
        conn = LocalConnection("local")
        assert await conn.prefetch([read_argv(str(f)), file_state_argv(str(f))]) == 2
        f.write_text("two\n")                  # behind the connection's back: the batch still answers
        assert await conn.get(str(f)) == b"one\n"
        await conn.run(["true"])               # anything run through the connection may change the host
        assert await conn.get(str(f)) == b"two\n"

    asyncio.run(go())


def test_batch_overlapping_a_change_is_discarded(tmp_path):
    f = tmp_path / "f"
    f.write_text("one\n")

    async def go():
        conn = LocalConnection("local")
        change = asyncio.create_task(conn.run(["sh", "-c", 'sleep 0.3; echo two > "$1"', "sh", str(f)]))
        await asyncio.sleep(0)                 # the change is running when the batch starts
        assert await conn.prefetch([read_argv(str(f)), file_state_argv(str(f))]) == 0
        await change
        assert await conn.get(str(f)) == b"two\n"

    asyncio.run(go())


def test_noop_run_uses_one_session_per_host(tmp_path, sshd_cluster, monkeypatch):
    from tunnelspec.engine.context import RunOptions
    from tunnelspec.runner import run_playbook_file

    c = sshd_cluster(2)
    repo = tmp_path / "repo"
    commit = make_repo(repo)
    shutil.copy(DATA / "app.conf.j2", c.base / "app.conf.j2")
    inv = c.inventory(all_vars={"repo": str(repo), "commit": commit})
    for name in [k for k in os.environ if k.startswith("TUNNELSPEC_")]:
        monkeypatch.delenv(name)
    sessions: list[str] = []
    real_exec = SSHConnection._exec

    async def counting_exec(self, argv, input, timeout):  # counts real sessions; the command still runs
        sessions.append(self.name)
        return await real_exec(self, argv, input, timeout)

    monkeypatch.setattr(SSHConnection, "_exec", counting_exec)
    out = io.StringIO()
    assert run_playbook_file(str(inv), DATA / "generic8.yml", RunOptions(), "json", stream=out) == 0
    first = len(sessions)
    sessions.clear()
    out = io.StringIO()
    assert run_playbook_file(str(inv), DATA / "generic8.yml", RunOptions(), "json", stream=out) == 0, out.getvalue()
    recap = json.loads(out.getvalue().splitlines()[-1])["hosts"]
    assert all(r["changed"] == 0 and r["ok"] == 8 for r in recap.values()), recap
    assert sorted(sessions) == ["node0", "node1"], sessions
    assert first > 8 * 2                       # the converging run really ran its changes
