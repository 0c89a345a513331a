"""The host facts' version lines kept by the controller (components/host/facts_cache.py): the real
script on this machine through a local connection, with a fake `cmake` first on the PATH that notes
each time it runs. An unchanged host skips its version commands (the kept lines stand in); a tool
whose binary changes, an empty key, a garbled record, or a cached answer the controller has no
record for all gather in full; with no cache root, nothing is written."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import stat
import subprocess
from pathlib import Path

import pytest

from tunnelspec.components.host import facts_cache
from tunnelspec.components.host.host import gather
from tunnelspec.connection.base import Result
from tunnelspec.facts.host import host_facts, versions_of

from support.recording import RecordingConnection

CMAKE = """#!/bin/sh
echo run >> {log}
echo 'cmake version {version}'
echo
echo 'CMake suite maintained and supported by Kitware (kitware.com/cmake).'
"""


@pytest.fixture
def host(tmp_path, monkeypatch):
    """(fake tools dir, cmake's run log): the fake tools come first on the PATH; the cache is in tmp."""
    tools, log = tmp_path / "bin", tmp_path / "cmake-runs"
    tools.mkdir()
    log.write_text("")
    write_cmake(tools, log, "3.31.6")
    monkeypatch.setenv("PATH", f"{tools}:{os.environ['PATH']}")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    return tools, log


def write_cmake(tools: Path, log: Path, version: str) -> None:
    path = tools / "cmake"
    path.write_text(CMAKE.format(log=log, version=version))
    path.chmod(0o755)


def runs(log: Path) -> int:
    return len(log.read_text().splitlines())


def facts(conn, **kw):
    return asyncio.run(gather(conn, "/nonexistent/tunnelspec", **kw))


def same(a, b) -> bool:
    """Equal facts, but for what may change between two reads (free disk)."""
    return dataclasses.replace(a, disk_free_kb=0) == dataclasses.replace(b, disk_free_kb=0)


def keys_sent(conn) -> list[str]:
    return [argv[-1] for argv in conn.ran if argv[:2] == ["sh", "-c"]]


def record_file(conn) -> Path:
    path = facts_cache.record_path(facts_cache.identity(conn))
    assert path is not None
    return path


def test_an_unchanged_host_skips_its_version_commands(host):
    tools, log = host
    conn = RecordingConnection()
    first = facts(conn)
    assert runs(log) == 1 and first.cmake == (3, 31, 6)
    path = record_file(conn)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    doc = json.loads(path.read_text())
    assert doc["key"] and f"{tools}/cmake:" in doc["key"]
    assert "cmake=cmake version 3.31.6" in doc["lines"] and any(line.startswith("ssh_version=") for line in doc["lines"])
    assert [p.name for p in path.parent.iterdir()] == [path.name], "no temporary file left"

    conn2 = RecordingConnection()
    again = facts(conn2)
    assert runs(log) == 1, "cmake did not run: the kept line stands in"
    assert same(first, again)
    assert keys_sent(conn) == [""] and keys_sent(conn2) == [doc["key"]], "one round trip each"


def test_a_changed_tool_runs_the_version_commands_again(host):
    tools, log = host
    first = facts(RecordingConnection())
    st = (tools / "cmake").stat()
    os.utime(tools / "cmake", (st.st_atime, st.st_mtime - 100))  # the same file, another mtime
    assert facts(RecordingConnection()).cmake == (3, 31, 6) and runs(log) == 2
    facts(RecordingConnection())
    assert runs(log) == 2, "the new key is kept"
    write_cmake(tools, log, "4.0.2")  # an upgrade
    assert facts(RecordingConnection()).cmake == (4, 0, 2) and runs(log) == 3
    (tools / "cmake").unlink()  # gone: the next cmake on the PATH (or none) is read, not the kept line
    assert facts(RecordingConnection()).cmake != (4, 0, 2)
    assert first.cmake == (3, 31, 6)


def test_a_tool_not_found_has_a_marker_and_one_that_appears_changes_the_key(host, tmp_path):
    tools, log = host
    for name in ("stat", "readlink", "uname", "id", "df", "nproc", "sh"):  # a PATH of these alone (and the script's sbin dirs)
        (tools / name).symlink_to(subprocess.run(["sh", "-c", f"command -v {name}"], capture_output=True,
                                                 text=True).stdout.strip())
    env = {"PATH": str(tools), "LC_ALL": "C"}

    def key(held: str = "") -> tuple[str, bool]:
        out = subprocess.run(host_facts("/", held).argv, capture_output=True, text=True, timeout=60, env=env)
        got = versions_of(out.stdout)
        return got.key, got.cached

    k, cached = key()
    assert not cached and "gcc:none;" in k and "ssh:none;" in k and f"{tools}/cmake:" in k
    assert key(k) == (k, True) and runs(log) == 1
    write_cmake(tools, log, "3.31.6")
    (tools / "gcc").write_text("#!/bin/sh\necho 14.2.0\n")
    (tools / "gcc").chmod(0o755)
    k2, cached = key(k)
    assert not cached and k2 != k and "gcc:none;" not in k2 and runs(log) == 2


def test_a_garbled_or_foreign_record_is_a_miss(host):
    tools, log = host
    conn = RecordingConnection()
    facts(conn)
    path = record_file(conn)
    good = json.loads(path.read_text())
    bad = [
        "{not json",
        json.dumps({**good, "version": 0}),
        json.dumps({**good, "identity": ["ssh", "ops", "10.0.0.9", "22"]}),
        json.dumps({**good, "key": ""}),
        json.dumps({**good, "lines": ["cmake=cmake version 3.31.6", "uid=0"]}),
        json.dumps([good]),
    ]
    for n, text in enumerate(bad, start=2):
        path.write_text(text)
        assert facts(RecordingConnection()).cmake == (3, 31, 6) and runs(log) == n, text
        assert json.loads(path.read_text()) == good, "the full gather wrote the record again"


def test_the_post_install_gather_runs_everything(host):
    _, log = host
    facts(RecordingConnection())
    conn = RecordingConnection()
    facts(conn, reuse=False)
    assert runs(log) == 2 and keys_sent(conn) == [""]


def test_no_cache_root_no_file(tmp_path, monkeypatch, host):
    _, log = host
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(home))
    facts(RecordingConnection())
    facts(RecordingConnection())
    assert runs(log) == 2 and list(home.iterdir()) == []
    (home / ".cache").mkdir()  # a home that has one: the record goes there
    conn = RecordingConnection()
    facts(conn)
    assert record_file(conn).is_relative_to(home / ".cache" / "tunnelspec" / "facts") and record_file(conn).exists()


def test_without_gnu_stat_the_key_is_empty_and_never_matches(host):
    tools, log = host
    (tools / "stat").write_text("#!/bin/sh\necho 'stat: illegal option -- -' >&2\nexit 1\n")  # macOS's stat
    (tools / "stat").chmod(0o755)
    conn = RecordingConnection()
    facts(conn)
    facts(conn)
    assert runs(log) == 2 and not record_file(conn).exists()
    out = subprocess.run(host_facts("/", "").argv, capture_output=True, text=True, timeout=60).stdout
    got = versions_of(out)
    assert (got.key, got.cached) == ("", False) and runs(log) == 3


def test_an_alternatives_switch_changes_the_key(host):
    tools, log = host
    real = tools.parent / "real"
    real.mkdir()
    for version in ("3.31.6", "3.31.7"):
        write_cmake(real, log, version)
        (real / "cmake").rename(real / f"cmake-{version}")
    (tools / "cmake").unlink()
    (tools / "cmake").symlink_to(real / "cmake-3.31.6")
    assert facts(RecordingConnection()).cmake == (3, 31, 6)
    assert facts(RecordingConnection()).cmake == (3, 31, 6) and runs(log) == 1
    (tools / "cmake").unlink()
    (tools / "cmake").symlink_to(real / "cmake-3.31.7")  # the link's target, nothing else, changes
    assert facts(RecordingConnection()).cmake == (3, 31, 7) and runs(log) == 2


@pytest.mark.parametrize("layout", ["snap", "shims", "relative"])
def test_a_dispatcher_is_never_cached(host, layout, monkeypatch):
    """A tool whose file is a dispatcher (snap's one binary for every snap command, a version manager's
    shim) may run another version with its own file unchanged, and one found through a relative PATH
    entry is another file in another directory: no key, the commands run every time."""
    tools, log = host
    if layout == "relative":
        monkeypatch.chdir(tools.parent)
        monkeypatch.setenv("PATH", f"{tools.name}:{os.environ['PATH']}")
    elif layout == "snap":
        (tools / "cmake").rename(tools / "snap")
        (tools / "cmake").symlink_to(tools / "snap")
    else:
        (tools / "shims").mkdir()
        (tools / "cmake").rename(tools / "shims" / "cmake")
        (tools / "cmake").symlink_to(tools / "shims" / "cmake")
    conn = RecordingConnection()
    assert facts(conn).cmake == (3, 31, 6) and facts(conn).cmake == (3, 31, 6)
    assert runs(log) == 2 and not record_file(conn).exists() and keys_sent(conn) == ["", ""]


class _Answers:
    """A host that answers the facts' probes with given outputs, in order (a race: the record the
    controller read is not the key the host matched)."""

    def __init__(self, outputs: list[str]):
        self.outputs, self.asked = outputs, []

    def cache_identity(self):
        return ("ssh", "ops", "192.0.2.7", "22")

    async def probe(self, argv, **_):
        self.asked.append(list(argv))
        out = self.outputs.pop(0)
        return Result(list(argv), 0, out, "", out.encode())


def test_a_cached_answer_without_the_record_gathers_in_full(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    ident = ("ssh", "ops", "192.0.2.7", "22")
    facts_cache.save(ident, "k-held", ("cmake=cmake version 3.25.1",))
    cached = "system=Linux\nversions_cached=yes\nversions_key=k-other\n"
    full = "system=Linux\ncmake=cmake version 3.31.6\nssh_version=OpenSSH_9.2p1\nversions_key=k-new\n"
    conn = _Answers([cached, full])
    f = asyncio.run(gather(conn, "/opt/tunnelspec"))
    assert f.cmake == (3, 31, 6) and f.openssh == (9, 2)
    assert [a[-1] for a in conn.asked] == ["k-held", ""]
    assert facts_cache.load(ident) == facts_cache.Record("k-new", ("cmake=cmake version 3.31.6", "ssh_version=OpenSSH_9.2p1"))


def test_the_script_cuts_outputs_as_grep_and_head_did(host):
    """The version lines are cut in the shell: an old sshd's usage text, nvcc's fourth line."""
    tools, _ = host
    fakes = {
        "sshd": "printf 'unknown option -- V\\nOpenSSH_X OpenSSH_8.4p1 Debian-5+deb11u3, OpenSSL 1.1.1w\\nusage: sshd\\n' >&2; exit 1",
        "ssh": "echo 'OpenSSH_9.9p1, LibreSSL 3.3.6' >&2",
        "nvcc": "printf 'nvcc: NVIDIA (R) Cuda compiler driver\\nBuilt on x\\nCuda compilation tools, release 12.4, V12.4.131\\nBuild cuda_12.4\\n'",
        "uname": 'case "$*" in "-s -r -m") echo "Weird OS 1.0 x86_64" ;; -s) echo "Weird OS" ;; -r) echo 1.0 ;; *) echo x86_64 ;; esac',
        "id": 'case "$1" in -u) echo 1234 ;; -un) exit 1 ;; *) echo "uid=1234 gid=1234 groups=1234" ;; esac',
    }
    for name, body in fakes.items():
        (tools / name).write_text(f"#!/bin/sh\n{body}\n")
        (tools / name).chmod(0o755)
    out = subprocess.run(["sh", *host_facts("/nonexistent/a/b").argv[1:]], capture_output=True, text=True, timeout=60)
    lines = dict(line.partition("=")[::2] for line in out.stdout.splitlines())
    assert lines["sshd_version"] == "OpenSSH_8.4p1" and lines["ssh_version"] == "OpenSSH_9.9p1"
    assert lines["nvcc"] == "Cuda compilation tools, release 12.4, V12.4.131"
    assert lines["cmake"] == "cmake version 3.31.6"
    assert (lines["system"], lines["kernel"], lines["arch"]) == ("Weird OS", "1.0", "x86_64")
    assert (lines["uid"], lines["user"]) == ("1234", "")
    assert lines["disk_dir"] == "/" and lines["disk_free_kb"].isdigit()


def test_records_not_written_for_a_month_are_pruned_when_another_is_written(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    old, recent = ("ssh", "root", "10.0.0.1", "22"), ("ssh", "root", "10.0.0.2", "22")
    facts_cache.save(old, "k1", ("gcc=12.2.0",))
    facts_cache.save(recent, "k2", ("gcc=12.2.0",))
    old_path, recent_path = facts_cache.record_path(old), facts_cache.record_path(recent)
    assert old_path is not None and recent_path is not None
    month = 31 * 86400
    os.utime(old_path, (old_path.stat().st_atime - month, old_path.stat().st_mtime - month))
    other = old_path.parent / "not-a-record.txt"
    other.write_text("x")
    os.utime(other, (0, 0))
    facts_cache.save(("ssh", "root", "10.0.0.3", "22"), "k3", ("gcc=12.2.0",))
    assert not old_path.exists()
    assert facts_cache.load(recent) == facts_cache.Record("k2", ("gcc=12.2.0",))
    assert other.exists()  # only records are pruned
