"""Become with a sudo password, and sudo that cannot give root, against real sshd, real users and
real sudo (connection/become.py).

What is proved: with a password, every path that runs a command (run with and without input,
run_stream, spawn, the open_connection relay) runs as root, sudo reads the password and the command
never sees it on its stdin, and it is on no argv of any process on the host while commands run; a
NOPASSWD login never sends a configured password; a wrong password, a login not in sudoers, a
password sudo asks for but nobody gave, and a host without sudo are each a quick BecomeError naming
the host, the login and what sudo said, decided once (no second attempt, nothing run)."""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from support.guarded import GuardedServer
from tunnelspec.connection.base import ConnectOptions
from tunnelspec.connection.become import BecomeError
from tunnelspec.connection.factory import connect
from tunnelspec.core.constants import LOOPBACK
from tunnelspec.core import http
from tunnelspec.core.secrets import Secret

pytestmark = pytest.mark.skipif(sys.platform != "linux" or os.geteuid() != 0,
                                reason="needs root on Linux (real users, sudo)")

PASSWORD = "Sudo-pw-7f3c91e2"


async def open_conn(cluster, user: str, **extra):
    hv = {"ansible_host": LOOPBACK, "ansible_port": cluster.hosts[0].port, "ansible_user": user,
          "ansible_become": True, "ansible_ssh_private_key_file": str(cluster.key),
          "tunnelspec_known_hosts": str(cluster.known_hosts), **extra}
    return await connect("node0", hv, ConnectOptions(use_ssh_config=False))


def argv_of_every_process() -> str:
    return subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True, check=True).stdout


def files_holding(needle: str, roots) -> list[str]:
    found = []
    for root in roots:
        for dirpath, _dirs, files in os.walk(root):
            for f in files:
                p = os.path.join(dirpath, f)
                try:
                    if os.path.isfile(p) and needle.encode() in Path(p).read_bytes():
                        found.append(p)
                except OSError:
                    continue
    return found


@pytest.mark.parametrize("var", ["ansible_become_password", "ansible_become_pass", "ansible_sudo_pass"])
def test_password_every_path_runs_as_root_and_the_password_shows_nowhere(user_cluster, sudo_user, var):
    cluster = user_cluster()
    user = sudo_user("password", cluster.client_pub, PASSWORD)
    web = GuardedServer("http")
    seen_args: list[str] = []

    async def go():
        conn = await open_conn(cluster, user.name, **{var: PASSWORD})
        try:
            who = await conn.run(["id", "-u"])
            assert (who.rc, who.stdout) == (0, "0\n"), who
            assert conn._becomer.mode == "password"
            # Input reaches the command exactly: sudo took the password line, the command gets the rest.
            cat = await conn.run(["cat"], input="line1\nline2\n")
            assert cat.stdout == "line1\nline2\n", cat
            # No input: the command's stdin is empty (the password was not left for it).
            empty = await conn.run(["sh", "-c", "cat; echo end"])
            assert empty.stdout == "end\n", empty
            lines: list[str] = []
            streamed = await conn.run_stream(["sh", "-c", "id -u; cat; echo end"], lines.append)
            assert streamed.rc == 0 and lines == ["0", "end"], lines
            # A long-lived process (the run lock's): root, and its stdin stays open for it.
            proc = await conn.spawn(["sh", "-c", "id -u; echo ready; cat > /dev/null; echo gone"])
            assert await proc.readline() == "0" and await proc.readline() == "ready"
            # While commands run as root: the host's process list never holds the password.
            long = asyncio.ensure_future(conn.run(["sh", "-c", "sleep 1.5; id -u"]))
            end = time.monotonic() + 1.2
            while time.monotonic() < end:
                seen_args.append(argv_of_every_process())
                await asyncio.sleep(0.05)
            assert (await long).stdout == "0\n"
            await proc.close()
            got = await http.request(http.ssh_opener(conn, web.port), "GET", "/who", timeout=10)
            assert got.json()["uid"] == 0 and web.seen == [0]
        finally:
            await conn.close()

    try:
        asyncio.run(go())
    finally:
        web.close()
    assert len(seen_args) > 5 and any("sleep 1.5" in a for a in seen_args), "ps ran while the command ran"
    assert any("sudo -S -k -p" in a for a in seen_args), "the command ran under sudo -S"
    assert not any(PASSWORD in a for a in seen_args)
    assert not files_holding(PASSWORD, [user.home, "/run/sudo", "/var/lib/sudo", "/var/tmp", cluster.base])


def test_nopasswd_login_never_sends_a_configured_password(user_cluster, sudo_user):
    cluster = user_cluster()
    user = sudo_user("nopasswd", cluster.client_pub)

    async def go():
        conn = await open_conn(cluster, user.name, ansible_become_password=Secret(PASSWORD))
        try:
            # Were the password sent, sudo -n would leave it on cat's stdin.
            cat = await conn.run(["sh", "-c", "id -u; cat"], input="only this\n")
            assert cat.stdout == "0\nonly this\n", cat
            assert conn._becomer.mode == "nopasswd"
        finally:
            await conn.close()

    asyncio.run(go())


def test_wrong_password_fails_once_naming_host_and_login(user_cluster, sudo_user, tmp_path):
    cluster = user_cluster()
    user = sudo_user("password", cluster.client_pub, PASSWORD)
    wrong = "Not-the-pw-123"
    mark = tmp_path / "ran"

    async def go():
        conn = await open_conn(cluster, user.name, ansible_become_password=wrong)
        calls = []
        real_exec = conn._exec

        async def counting(argv, input, timeout):
            calls.append(argv)
            return await real_exec(argv, input, timeout)

        conn._exec = counting
        try:
            t0 = time.monotonic()
            with pytest.raises(BecomeError) as e1:
                await conn.run(["sh", "-c", 'touch "$1"; cat', "sh", str(mark)], input="next line\nmore\n")
            assert time.monotonic() - t0 < 30  # a hang bound: one sudo check, not one per line of input
            n = len(calls)
            with pytest.raises(BecomeError) as e2:
                await conn.run(["true"])
            assert len(calls) == n, "decided once: the second command does not ask sudo again"
            with pytest.raises(BecomeError):
                await conn.open_connection(LOOPBACK, 9)
            return str(e1.value), str(e2.value), calls
        finally:
            await conn.close()

    msg, again, calls = asyncio.run(go())
    assert msg == again
    assert "node0" in msg and repr(user.name) in msg and "rejected the become password" in msg, msg
    assert "incorrect password" in msg, msg
    assert wrong not in msg and PASSWORD not in msg
    assert not mark.exists(), "nothing ran"
    assert [c[:2] for c in calls] == [["sudo", "-k"], ["sudo", "-S"]], calls


def test_login_not_in_sudoers(user_cluster, sudo_user):
    cluster = user_cluster()
    user = sudo_user("none", cluster.client_pub, PASSWORD)

    async def go(**extra):
        conn = await open_conn(cluster, user.name, **extra)
        try:
            with pytest.raises(BecomeError) as e:
                await conn.check_become()
            return str(e.value)
        finally:
            await conn.close()

    with_pw = asyncio.run(go(ansible_become_password=PASSWORD))
    assert "node0" in with_pw and f"{user.name} is not in the sudoers file" in with_pw, with_pw
    without = asyncio.run(go())
    assert "node0" in without and repr(user.name) in without and "a password is required" in without
    assert "no ansible_become_password is set" in without, without


@pytest.fixture
def public_dir():
    """A directory every user can read (pytest's tmp_path is root's only)."""
    import tempfile

    d = Path(tempfile.mkdtemp(prefix="tunnelspec-test-"))
    os.chmod(d, 0o755)
    yield d
    shutil.rmtree(d, ignore_errors=True)


def test_host_without_sudo(user_cluster, sudo_user, public_dir):
    """A host whose PATH has no sudo (sshd's SetEnv PATH): the login cannot become root."""
    bindir = public_dir / "bin"
    bindir.mkdir()
    for tool in ("sh", "bash", "true", "id", "cat"):
        os.symlink(shutil.which(tool), bindir / tool)
    cluster = user_cluster(setenv={"PATH": str(bindir)})
    user = sudo_user("nopasswd", cluster.client_pub)

    async def go():
        conn = await open_conn(cluster, user.name)
        try:
            plain = await conn.run(["id", "-u"], become=False)      # the login itself still works
            assert plain.stdout.strip() == str(user.uid)
            t0 = time.monotonic()
            with pytest.raises(BecomeError) as e:
                await conn.run(["id", "-u"])
            assert time.monotonic() - t0 < 30  # a hang bound: one sudo check, not one per line of input
            return str(e.value)
        finally:
            await conn.close()

    msg = asyncio.run(go())
    assert "node0" in msg and repr(user.name) in msg and "sudo was not found" in msg, msg
    assert "sudo: command not found" in msg, msg


def test_partial_sudoers_rule_is_refused_naming_host_login_command_and_sudo(user_cluster, sudo_user):
    """A real sudoers rule that allows only `true`, with the password: the first check (`sudo -S true`)
    passes; the next command, plain or streamed, is refused by sudo itself, and that is a BecomeError
    naming the host, the login, the command and sudo's line: never the command's own rc (a `test -f`
    that sudo refused is not "the file is absent"), and never the password."""
    cluster = user_cluster()
    user = sudo_user("partial", cluster.client_pub, PASSWORD)

    async def go():
        conn = await open_conn(cluster, user.name, ansible_become_password=PASSWORD)
        try:
            await conn.check_become()
            assert conn._becomer.mode == "password"
            said = []
            with pytest.raises(BecomeError) as e:
                await conn.run(["test", "-f", "/etc/hostname"])
            said.append(str(e.value))
            with pytest.raises(BecomeError) as e:
                await conn.run_stream(["sh", "-c", "echo building"], lambda line: None)
            said.append(str(e.value))
            return said
        finally:
            await conn.close()

    plain, streamed = asyncio.run(go())
    for msg, command in ((plain, "test -f /etc/hostname"), (streamed, "sh -c 'echo building'")):
        assert msg.startswith(f"node0: sudo refused to run `{command}` as root for the login {user.name!r} "
                              f"(Sorry, user {user.name} is not allowed to execute "), msg
        assert "allows only some commands" in msg and PASSWORD not in msg, msg
