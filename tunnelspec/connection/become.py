"""Become (sudo) for a login that is not root: decided once per connection, a password only on stdin.

The first command that needs root on a connection asks sudo how it will behave, once:
- `sudo -k -n true` succeeds: the login has NOPASSWD (`-k`: a cached timestamp does not count).
  Every command then runs under `sudo -n`, and a configured password is never sent.
- sudo wants a password and `ansible_become_password` (or Ansible's aliases `ansible_become_pass`,
  `ansible_sudo_pass`) is set: it is checked once with `sudo -S -k -p '' true`, the password on
  stdin. Every command then runs under `sudo -S -k -p ''` with the password as the first line of
  its stdin: `-k` makes sudo read it every time (a cached timestamp would let sudo skip it, and
  the password would flow into the command's own stdin), `-p ''` prints no prompt. The password is
  never on an argv (the hosts' process lists) and never in a file on the host.
- Anything else (sudo missing, the login not in sudoers, a wrong password, sudo asking for a
  password that is not configured): a BecomeError naming the host, the login and what sudo said.
  The verdict is kept: a wrong password is tried once per connection, never once per command (sudo
  would read the command's input lines as further password attempts).

The check runs lazily, at the first command that needs root, so commands run without become (the
host facts) still work on a host whose sudo is broken.
"""

from __future__ import annotations

import asyncio

from tunnelspec.core.errors import TaskFailed
from tunnelspec.core.secrets import Secret, mask_text

# Ansible's names for the sudo password (the sudo become plugin's `become_pass` variables).
PASSWORD_VARS = ("ansible_become_password", "ansible_become_pass", "ansible_sudo_pass")
CHECK_TIMEOUT_S = 30.0

NOPASSWD_ARGV = ["sudo", "-k", "-n", "true"]
PASSWORD_PREFIX = ["sudo", "-S", "-k", "-p", "", "--"]
NOPASSWD_PREFIX = ["sudo", "-n", "--"]


class BecomeError(TaskFailed):
    """Become was asked for and sudo cannot give root on this host to this login."""


def password_from(host_vars: dict) -> Secret | None:
    """The become password of a host (the first of Ansible's names that is set), as a Secret."""
    for name in PASSWORD_VARS:
        value = host_vars.get(name)
        if value is None or isinstance(value, (dict, list)):
            continue
        raw = value.reveal() if isinstance(value, Secret) else str(value)
        if raw:
            return Secret(raw)
    return None


def _said(*streams: bytes, secret: Secret | None = None) -> str:
    """What sudo said, one line: its messages without the noise of a retried prompt."""
    lines = []
    for s in streams:
        for line in s.decode(errors="replace").splitlines():
            line = line.strip()
            if line and line != "Sorry, try again.":
                lines.append(line)
    text = "; ".join(lines[-4:]) or "no message"
    return mask_text(text, [secret] if secret else [])


class Become:
    """How one connection runs a command as root. `ensure(exec)` once, then `wrap` + `stdin_prefix`."""

    def __init__(self, host: str, user: str, password: Secret | None):
        self.host = host
        self.user = user
        self.password = password
        self.mode: str | None = None  # "nopasswd" | "password", once decided
        self._error: BecomeError | None = None
        self._lock: asyncio.Lock | None = None

    def wrap(self, argv: list[str]) -> list[str]:
        return [*(PASSWORD_PREFIX if self.mode == "password" else NOPASSWD_PREFIX), *argv]

    def stdin_prefix(self) -> bytes:
        """What goes to the wrapped command's stdin before anything else (sudo reads it, the command
        never sees it): the password line, or nothing."""
        if self.mode == "password":
            assert self.password is not None  # _decide() chooses "password" only with a password
            return (self.password.reveal() + "\n").encode()
        return b""

    async def ensure(self, exec_) -> None:
        """Decide once how sudo is used here. `exec_(argv, input) -> (rc, stdout, stderr)` runs a
        command as the login (no become)."""
        if self.mode is not None:
            return
        if self._error is not None:
            raise self._error
        if self._lock is None:
            self._lock = asyncio.Lock()
        async with self._lock:
            if self.mode is not None:
                return
            if self._error is not None:
                raise self._error
            try:
                self.mode = await asyncio.wait_for(self._decide(exec_), CHECK_TIMEOUT_S)
            except TimeoutError:
                self._error = BecomeError(
                    f"{self.host}: sudo did not answer within {CHECK_TIMEOUT_S:g}s for the "
                    f"login {self.user!r} (ansible_become=true)"
                )
                raise self._error from None
            except BecomeError as e:
                self._error = e
                raise

    def _fail(self, what: str) -> BecomeError:
        return BecomeError(f"{self.host}: ansible_become=true for the login {self.user!r}, but {what}")

    async def _decide(self, exec_) -> str:
        rc, out, err = await exec_(NOPASSWD_ARGV, None)
        if rc == 0:
            return "nopasswd"
        said = _said(err, out)
        low = said.lower()
        if rc == 127 or "not found" in low:
            raise self._fail(f"sudo was not found on the host ({said}): install sudo, or log in as root")
        if "sudoers" in low or "may not run sudo" in low or "not allowed" in low:
            raise self._fail(f"sudo refuses it ({said}): add {self.user} to sudoers, or log in as root")
        if "password is required" not in low:
            raise self._fail(f"`sudo -n true` failed (rc={rc}): {said}")
        if self.password is None:
            raise self._fail(
                f"sudo asks it for a password ({said}) and no ansible_become_password is set: "
                f"set it (a secret, e.g. -e @secrets.yml), or allow NOPASSWD for {self.user} in sudoers "
                f"(is {self.user} in sudoers at all?)"
            )
        if "\n" in self.password.reveal() or "\r" in self.password.reveal():
            raise self._fail("ansible_become_password holds a line break: sudo reads one line")
        rc, out, err = await exec_([*PASSWORD_PREFIX, "true"], (self.password.reveal() + "\n").encode())
        if rc == 0:
            return "password"
        said = _said(err, out, secret=self.password)
        low = said.lower()
        if "sudoers" in low or "may not run sudo" in low or "not allowed" in low:
            raise self._fail(f"sudo refuses it ({said}): add {self.user} to sudoers, or log in as root")
        if "incorrect password" in low or "no password was provided" in low or "authentication" in low:
            raise self._fail(
                f"sudo rejected the become password (ansible_become_password) ({said}); "
                "it was tried once and is not retried"
            )
        raise self._fail(f"`sudo -S true` with the become password failed (rc={rc}): {said}")


def refused_by_sudo(stderr: str) -> str | None:
    """What sudo said when it refused to run a command at all — a partial sudoers rule (some commands
    only) passes the `true` of the first check and refuses a later command — else None. Only sudo's own
    lines: `Sorry, user X is not allowed to execute …`, or `sudo: a password is required` (sudo -n,
    a rule that allows this command only with a password)."""
    for line in stderr.splitlines():
        line = line.strip()
        if (line.startswith("Sorry, user ") and " is not allowed to execute " in line) or line == (
            "sudo: a password is required"
        ):
            return line
    return None


def refusal_error(host: str, user: str, command: str, said: str) -> BecomeError:
    return BecomeError(
        f"{host}: sudo refused to run `{command}` as root for the login {user!r} ({said}): its sudoers "
        "rule allows only some commands, and tunnelspec runs many as root (units, files, systemctl, "
        f"nft): allow {user} ALL in sudoers, or log in as root"
    )
