"""A sudoers rule that allows only some commands: the first check (`sudo … true`) may pass, and a
later command is refused by sudo itself. That refusal is a clear error naming the host, the login,
the command and what sudo said — never the command's own non-zero exit read as its answer (a
`test -f` refused by sudo is not "the file is absent")."""

from __future__ import annotations

import asyncio

import pytest

from tunnelspec.connection import become
from tunnelspec.connection.local import LocalConnection
from tunnelspec.core.secrets import Secret

REFUSED = "Sorry, user deploy is not allowed to execute '/usr/bin/install -m 644 a b' as root on main.\n"


@pytest.mark.parametrize(("stderr", "said"), [
    (REFUSED, REFUSED.strip()),
    ("sudo: a password is required\n", "sudo: a password is required"),
    ("install: cannot stat 'a': No such file or directory\n", None),
    ("the program printed: Sorry, user x is not allowed to execute y\n", None),  # not sudo's own line
])
def test_sudos_own_refusal_lines_are_told_from_a_commands_output(stderr, said):
    assert become.refused_by_sudo(stderr) == said


def test_a_command_sudo_refuses_fails_naming_host_login_command_and_sudo(monkeypatch):
    conn = LocalConnection("main")
    conn._becomer = become.Become("main", "deploy", Secret("pw"))
    conn._becomer.mode = "password"  # the first check (`sudo -S true`) passed: `true` is allowed

    async def fake_exec(argv, data, timeout):
        assert argv[:6] == become.PASSWORD_PREFIX and data.startswith(b"pw\n")
        return 1, b"", REFUSED.encode()

    monkeypatch.setattr(conn, "_exec", fake_exec)
    with pytest.raises(become.BecomeError) as e:
        asyncio.run(conn.run(["install", "-m", "644", "a", "b"]))
    msg = str(e.value)
    assert msg.startswith("main: sudo refused to run `install -m 644 a b` as root for the login 'deploy' "
                          f"({REFUSED.strip()}): its sudoers rule allows only some commands"), msg
    assert "pw" not in msg


def test_a_commands_own_failure_under_sudo_is_still_its_result(monkeypatch):
    conn = LocalConnection("main")
    conn._becomer = become.Become("main", "deploy", None)
    conn._becomer.mode = "nopasswd"

    async def fake_exec(argv, data, timeout):
        return 1, b"", b""

    monkeypatch.setattr(conn, "_exec", fake_exec)
    assert asyncio.run(conn.run(["test", "-f", "/nope"])).rc == 1
