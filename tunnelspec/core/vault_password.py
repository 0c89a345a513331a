"""Where the vault password comes from, as Ansible takes it: a file (`--vault-password-file`, or the
environment's `ANSIBLE_VAULT_PASSWORD_FILE`), an executable file run for its output, or the terminal
(`--ask-vault-pass`). Each source is a callable core/vault.py calls at the first vault data it meets;
every failure is a VaultPasswordError saying what to do (exit 2 through the loaders)."""

from __future__ import annotations

import getpass
import os
import subprocess
from collections.abc import Callable

from tunnelspec.core.vault import VaultPasswordError

ENV_FILE = "ANSIBLE_VAULT_PASSWORD_FILE"


def _stripped(data: bytes, what: str) -> bytes:
    password = data.strip()  # Ansible's reading: the content without surrounding blanks and line breaks
    if not password:
        raise VaultPasswordError(f"{what} gives an empty vault password")
    return password


def from_file(path: str, named_by: str) -> Callable[[], bytes]:
    """The file's content as the password; an executable file is run (no arguments, stdin and stderr
    the terminal's, as Ansible runs it) and its output is the password."""

    def read() -> bytes:
        what = f"the vault password file {path} ({named_by})"
        if os.path.isdir(path):
            raise VaultPasswordError(f"{what} is a directory; name the file that holds the password")
        if not os.path.exists(path):
            raise VaultPasswordError(f"{what} does not exist")
        if os.access(path, os.X_OK):
            return _run_script(path, what)
        try:
            with open(path, "rb") as f:
                data = f.read(1 << 20)
        except OSError as err:
            raise VaultPasswordError(f"{what} cannot be read: {err.strerror}") from None
        return _stripped(data, what)

    return read


def _run_script(path: str, what: str) -> bytes:
    try:
        done = subprocess.run([os.path.abspath(path)], stdout=subprocess.PIPE, check=False)
    except OSError as err:
        raise VaultPasswordError(
            f"{what} is executable and could not be run ({err.strerror}); if it is not a script, "
            "remove its executable bit (chmod -x)"
        ) from None
    if done.returncode != 0:
        raise VaultPasswordError(f"{what} is a script and it exited with {done.returncode}")
    return _stripped(done.stdout, what)


def from_terminal() -> bytes:
    """Asks on the controlling terminal; without one (a CI job) it fails at once, never waits on stdin."""
    try:
        fd = os.open("/dev/tty", os.O_RDWR | os.O_NOCTTY)
    except OSError:
        raise VaultPasswordError(
            "--ask-vault-pass needs a terminal to ask on, and there is none (a CI job?): give the "
            "password in a file instead, --vault-password-file FILE or ANSIBLE_VAULT_PASSWORD_FILE"
        ) from None
    os.close(fd)
    # getpass reads /dev/tty (which opened above), with echo off.
    password = getpass.getpass("Vault password: ")
    if not password:
        raise VaultPasswordError("--ask-vault-pass: an empty vault password was entered")
    return password.encode("utf-8")


def sources(
    files: tuple[str, ...] | list[str], ask: bool, environ: dict | None = None, vault_ids: tuple[str, ...] = ()
) -> list[Callable[[], bytes]]:
    """The run's sources, in the order they are tried: each --vault-id (`[label@]FILE` or
    `[label@]prompt`), each --vault-password-file, the terminal, and ANSIBLE_VAULT_PASSWORD_FILE when
    no option names a password. A label names nothing to check: a 1.2 vault's label is not
    authenticated, so every password is tried on every vault (as Ansible does by default)."""
    env = os.environ if environ is None else environ
    out: list[Callable[[], bytes]] = []
    for vault_id in vault_ids:
        source = vault_id.split("@", 1)[1] if "@" in vault_id else vault_id
        out.append(from_terminal if source == "prompt" else from_file(source, f"--vault-id {vault_id}"))
    out += [from_file(f, "--vault-password-file") for f in files]
    if ask and from_terminal not in out:
        out.append(from_terminal)
    if not out and env.get(ENV_FILE):
        out.append(from_file(env[ENV_FILE], ENV_FILE))
    return out
