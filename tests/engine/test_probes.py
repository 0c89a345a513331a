"""Batched read-only probes (connection/probes.py): same results as running each command, served
only while nothing else ran on the connection; a no-op run of the generic playbook takes one SSH
session per host."""

from __future__ import annotations

import asyncio
import hashlib
import io
import json
import os
import subprocess
from pathlib import Path

import pytest

from support.cli import generic8_inventory, make_repo
from support.side_by_side import waiter_and_maker

from tunnelspec.connection.base import read_argv
from tunnelspec.connection.local import LocalConnection
from tunnelspec.connection.probes import PER_SESSION, parts, plan
from tunnelspec.connection.ssh import SSHConnection
from tunnelspec.facts.files import file_state
from tunnelspec.facts.files import parse
from tunnelspec.facts import units
from tunnelspec.facts.units import parse_service_state, service

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


# Enough probes for two sessions (probes.PER_SESSION each); the first two land in different ones.
FILLER = [["echo", str(i)] for i in range(PER_SESSION - 2)] + ODD_ARGVS


def test_a_large_batch_runs_in_sessions_side_by_side(tmp_path):
    cut = parts(len(FILLER) + 2)
    assert len(cut) == 2 and 0 in cut[0] and 1 in cut[1]

    async def go():
        conn = LocalConnection("local")
        want = [await conn.run(a) for a in FILLER]
        assert await conn.prefetch([*waiter_and_maker(tmp_path / "flag", 200), *FILLER]) == len(FILLER) + 1
        order = [await conn.probe(a) for a in waiter_and_maker(tmp_path / "flag", 200)]
        got = [await conn.probe(a) for a in FILLER]
        for w, g in zip(want, got):
            assert (g.rc, g.stdout_bytes) == (w.rc, w.stdout_bytes)
        return order

    waited, made = asyncio.run(go())
    assert (waited.stdout, made.stdout) == ("saw\n", "made\n")


def test_probe_is_served_until_the_connection_runs_anything_else(tmp_path):
    f = tmp_path / "f"
    f.write_text("one\n")

    async def go():
        conn = LocalConnection("local")
        assert await conn.prefetch([read_argv(str(f)), file_state(str(f)).argv]) == 2
        f.write_text("two\n")                  # behind the connection's back: the batch still answers
        assert await conn.get(str(f)) == b"one\n"
        await conn.run(["true"])               # anything run through the connection may change the host
        assert await conn.get(str(f)) == b"two\n"

    asyncio.run(go())


def test_a_result_is_served_as_often_as_the_checks_named_it_then_read_again(tmp_path):
    f = tmp_path / "f"
    f.write_text("one\n")

    async def go():
        conn = LocalConnection("local")
        # Two checks named the read: it is served twice; a third read (a check that polls) is real.
        assert await conn.prefetch([read_argv(str(f)), read_argv(str(f)), file_state(str(f)).argv]) == 2
        f.write_text("two\n")
        assert await conn.get(str(f)) == b"one\n"
        assert await conn.get(str(f)) == b"one\n"
        assert await conn.get(str(f)) == b"two\n"

    asyncio.run(go())


def test_a_probe_leaves_the_batch_and_a_second_batch_adds_to_it(tmp_path):
    f, g, h = tmp_path / "f", tmp_path / "g", tmp_path / "h"
    f.write_text("f1\n")
    g.write_text("g1\n")

    async def go():
        conn = LocalConnection("local")
        assert await conn.prefetch([read_argv(str(f)), read_argv(str(g))]) == 2
        f.write_text("f2\n")
        g.write_text("g2\n")
        h.write_text("h2\n")
        assert (await conn.probe(["true"])).rc == 0          # a read: the batch's results stay
        assert conn.probes_tried([read_argv(str(f))]) and not conn.probes_tried([read_argv(str(h))])
        # What the first batch ran is not run again; the new probes are added beside its results.
        assert await conn.prefetch([read_argv(str(g)), read_argv(str(h)), file_state(str(h)).argv], more=True) == 4
        assert await conn.get(str(f)) == b"f1\n"
        assert await conn.get(str(g)) == b"g1\n"
        assert await conn.get(str(h)) == b"h2\n"
        await conn.run(["true"])
        assert not conn.probes_tried([read_argv(str(f))])
        assert await conn.get(str(g)) == b"g2\n"

    asyncio.run(go())


def test_batch_overlapping_a_change_is_discarded(tmp_path):
    f = tmp_path / "f"
    f.write_text("one\n")

    async def go():
        conn = LocalConnection("local")
        change = asyncio.create_task(conn.run(["sh", "-c", 'sleep 0.3; echo two > "$1"', "sh", str(f)]))
        await asyncio.sleep(0)                 # the change is running when the batch starts
        assert await conn.prefetch([read_argv(str(f)), file_state(str(f)).argv]) == 0
        await change
        assert await conn.get(str(f)) == b"two\n"

    asyncio.run(go())


def test_noop_run_uses_one_session_per_host(tmp_path, sshd_cluster, monkeypatch):
    from tunnelspec.engine.context import RunOptions
    from tunnelspec.commands.runner import run_playbook_file

    c = sshd_cluster(2)
    inv = generic8_inventory(c, tmp_path, monkeypatch)
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


def test_checks_that_use_a_registered_fact_get_a_second_batch_or_none(tmp_path, sshd_cluster, monkeypatch):
    """A play whose checks use a fact an earlier task registers: without the facts of a last run, one
    more batch per host for those checks (not one session each); with them (engine/recall.py), the
    first batch names those probes too and a no-op run reads each host in one session."""
    from tunnelspec.engine.context import RunOptions
    from tunnelspec.commands.runner import run_playbook_file

    c = sshd_cluster(2)
    inv = generic8_inventory(c, tmp_path, monkeypatch)
    sessions: list[str] = []
    real_exec = SSHConnection._exec

    async def counting_exec(self, argv, input, timeout):
        sessions.append(self.name)
        return await real_exec(self, argv, input, timeout)

    def no_op_run() -> list[str]:
        sessions.clear()
        out = io.StringIO()
        assert run_playbook_file(str(inv), DATA / "registered4.yml", RunOptions(), "json", stream=out) == 0, out.getvalue()
        recap = json.loads(out.getvalue().splitlines()[-1])["hosts"]
        assert all(r["changed"] == 0 and r["ok"] == 4 for r in recap.values()), recap
        return sorted(sessions)

    monkeypatch.setattr(SSHConnection, "_exec", counting_exec)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "converge-cache"))
    assert run_playbook_file(str(inv), DATA / "registered4.yml", RunOptions(), "json", stream=io.StringIO()) == 0
    # No facts kept from a last run: the directory's own probe (alone in its play's first batch:
    # nothing to batch), then one batch for the three checks whose paths use `made`.
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "fresh-cache"))
    assert no_op_run() == ["node0", "node0", "node1", "node1"], sessions
    # That run kept them: the next one names every probe in its first batch.
    assert no_op_run() == ["node0", "node1"], sessions
    # A wrong guess (the kept fact is not what this run registers) names probes no check asks for:
    # the checks still read what they need, in the play's second batch, and answer the same.
    kept = sorted((tmp_path / "fresh-cache" / "tunnelspec" / "registered").glob("*.json"))
    assert len(kept) == 2
    for f in kept:
        doc = json.loads(f.read_text())
        assert "made" in doc["facts"]
        doc["facts"]["made"] = False
        f.write_text(json.dumps(doc))
    assert no_op_run() == ["node0", "node0", "node1", "node1"], sessions


def _odd_tree(tmp_path: Path) -> list[str]:
    """Every kind of path the file-state fact reports, with names that break naive parsing."""
    d = tmp_path / "t"
    d.mkdir()
    (d / "plain").write_text("x\n")
    (d / "empty").write_text("")
    (d / "with space").write_text("s\n")
    (d / "new\nline").write_text("n\n")
    (d / "back\\slash").write_text("b\n")
    (d / "setuid").write_text("#!/bin/sh\n")
    os.chmod(d / "setuid", 0o4755)
    (d / "dir").mkdir()
    os.chmod(d / "dir", 0o700)
    os.symlink("plain", d / "link")
    os.symlink("/nowhere/at all\nreally", d / "dangling")
    os.mkfifo(d / "fifo")
    names = ["plain", "empty", "with space", "new\nline", "back\\slash", "setuid", "dir", "link", "dangling",
             "fifo", "absent", "plain/under-a-file"]
    return [str(d / n) for n in names]


def test_file_states_of_many_paths_are_one_probe_with_the_same_answers(tmp_path):
    paths = _odd_tree(tmp_path)
    argvs = [file_state(p).argv for p in paths]
    batch, _ = plan(argvs)
    assert len(batch) == 1                     # one command answers every path

    async def go():
        conn = LocalConnection("local")
        alone = [await conn.run(a) for a in argvs]
        assert all(r.rc == 0 for r in alone)
        assert await conn.prefetch(argvs) == len(paths)    # every one served from the batch
        for p, a, want in zip(paths, argvs, alone):
            got = await conn.probe(a)
            assert got.stdout_bytes == want.stdout_bytes, p
        assert parse((await conn.probe(argvs[0])).stdout).sha256 == hashlib.sha256(b"x\n").hexdigest()
        assert parse((await conn.probe(argvs[5])).stdout).mode == "4755"
        assert parse((await conn.probe(argvs[8])).stdout).link_target == "/nowhere/at all\nreally"

    asyncio.run(go())


def test_file_states_fall_back_to_one_probe_each_when_find_is_not_gnu(tmp_path, monkeypatch):
    # A stand-in for a host whose `find` has no -printf (busybox): a real executable earlier in PATH
    # that fails the way busybox does. The merged answer must not pass for "everything absent".
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "find").write_text("#!/bin/sh\necho \"find: unrecognized: -printf\" >&2\nexit 1\n")
    os.chmod(bin_dir / "find", 0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    paths = _odd_tree(tmp_path)
    argvs = [file_state(p).argv for p in paths] + [read_argv(paths[0])]

    async def go():
        conn = LocalConnection("local")
        assert await conn.prefetch(argvs) == 1            # only the file read; no file state served
        assert parse((await conn.probe(argvs[0])).stdout).type == "file"   # run alone, for real
        assert parse((await conn.probe(argvs[10])).stdout).type == "absent"

    asyncio.run(go())


def test_relative_paths_are_not_merged():
    batch, _ = plan([file_state("-rf").argv, file_state("/a").argv, file_state("rel").argv])
    assert len(batch) == 3                     # a lone absolute path is not merged either


# systemctl as a Debian 12 host answers over the bus (systemd 252): a.service active and enabled,
# b.service inactive and disabled, m.service failed and masked, any other unit not loaded and without
# a file. is-active prints a line per unit; is-enabled stops at the first unit without a file (rc 1).
# SYSTEMCTL_FAKE=later: is-enabled prints not-found there and goes on (later systemd);
# SYSTEMCTL_FAKE=nobus: PID 1 is not systemd (is-active prints nothing, is-enabled reads the files).
FAKE_SYSTEMCTL = r"""#!/bin/sh
verb=$1; shift
state() { case $1 in a.service) echo active enabled;; b.service) echo inactive disabled;;
  m.service) echo failed masked;; *) echo inactive -;; esac; }
case $verb in
is-active)
  [ "$SYSTEMCTL_FAKE" = nobus ] && { echo "System has not been booted with systemd" >&2; exit 1; }
  for u do set -- $(state "$u"); echo "$1"; done ;;
is-enabled)
  rc=1
  for u do
    set -- $(state "$u")
    if [ "$2" = - ]; then
      [ "$SYSTEMCTL_FAKE" = "" ] && { echo "Failed to get unit file state for $u: No such file or directory" >&2; exit 1; }
      echo not-found; continue
    fi
    echo "$2"; [ "$2" = enabled ] && rc=0
  done
  exit $rc ;;
esac
"""


def _fake_systemctl(tmp_path, monkeypatch, mode=""):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "systemctl").write_text(FAKE_SYSTEMCTL)
    os.chmod(bin_dir / "systemctl", 0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    monkeypatch.setenv("SYSTEMCTL_FAKE", mode)


def test_service_states_are_one_probe_split_back_exactly():
    names = ["a.service", "b.service", "nope.service"]
    argvs = [service(u).argv for u in names] + [read_argv("/etc/hostname"), service("-x.service").argv]
    batch, expand = plan(argvs)
    assert batch[-1] == units._services_command(names)         # the three units: one entry
    assert batch[:-1] == argvs[3:]                            # a file read and an option-like name run alone
    out = b"active\ninactive\ninactive\n=\nenabled\n=\ndisabled\n=\n=\n"
    got = expand([(0, b"host\n"), (0, b""), (0, out)])
    assert got[:4] == [(0, b"active\nenabled\n"), (0, b"inactive\ndisabled\n"), (0, b"inactive\n"), (0, b"host\n")]
    # An answer that cannot be split (is-active stopped short): none of the three is served.
    got = expand([(0, b"host\n"), (0, b""), (0, b"active\n=\n")])
    assert got[:3] == [(-1, b"")] * 3 and got[3] == (0, b"host\n")


@pytest.mark.parametrize("mode", ["", "later"])
def test_service_states_from_the_batch_equal_each_probe_alone(tmp_path, monkeypatch, mode):
    _fake_systemctl(tmp_path, monkeypatch, mode)
    # A missing unit first, in the middle and last; a unit named twice; every state word.
    names = ["x.service", "a.service", "nope.service", "b.service", "m.service", "z.service"]
    argvs = [service(u).argv for u in names]
    assert len(plan(argvs)[0]) == 1

    async def go():
        conn = LocalConnection("local")
        alone = [await conn.run(a) for a in argvs]
        assert await conn.prefetch(argvs + [argvs[1]]) == len(names)       # every one served from the batch
        for u, a, want in zip(names, argvs, alone, strict=True):
            assert (await conn.probe(a)).stdout_bytes == want.stdout_bytes, u
        assert parse_service_state(alone[2].stdout) == ("inactive", "not-found" if mode else "")

    asyncio.run(go())


def test_service_states_without_systemd_run_alone(tmp_path, monkeypatch):
    _fake_systemctl(tmp_path, monkeypatch, "nobus")
    argvs = [service(u).argv for u in ["a.service", "nope.service"]] + [read_argv("/etc/hostname")]

    async def go():
        conn = LocalConnection("local")
        assert await conn.prefetch(argvs) == 1                 # the file read only
        assert parse_service_state((await conn.probe(argvs[0])).stdout) == ("", "enabled")    # run alone

    asyncio.run(go())


def test_git_state_from_one_status(tmp_path):
    from tunnelspec.modules.git import GitCheckout, _parse_state

    def state(dest: Path):
        task = GitCheckout(GitCheckout.validate({"repo": "x", "dest": str(dest), "version": "0" * 40}))
        [argv] = task.probes()
        return _parse_state(asyncio.run(LocalConnection("l").run(argv, check=True)).stdout)

    repo = tmp_path / "repo"
    commit = make_repo(repo)
    assert state(repo) == (commit, "clean")
    (repo / "untracked").write_text("u\n")
    assert state(repo) == (commit, "clean")    # untracked files do not count
    tracked = repo / subprocess.run(["git", "-C", str(repo), "ls-files"], capture_output=True, text=True,
                                    check=True).stdout.split()[0]
    tracked.write_text(tracked.read_text() + "more\n")
    assert state(repo) == (commit, "dirty")
    assert state(tmp_path / "nothing") == ("absent", "clean")
    subprocess.run(["git", "init", "-q", str(tmp_path / "empty")], check=True)
    assert state(tmp_path / "empty") == ("none", "clean")
    subprocess.run(["git", "clone", "-q", "--bare", str(repo), str(tmp_path / "bare")], check=True)
    assert state(tmp_path / "bare") == (commit, "clean")
