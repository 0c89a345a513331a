"""Client keys without ever prompting: from TUNNELSPEC_SSH_KEY (in memory only), key files, or
ssh-agent. An encrypted key with no agent to hold it fails at once with a message saying what to
do, instead of a bare "permission denied" (or, in other tools, a passphrase prompt that hangs CI)."""

from __future__ import annotations

import os

import asyncssh

from tunnelspec.core.errors import HostUnreachable
from tunnelspec.core.secrets import Secret


def _needs_passphrase(err: Exception) -> bool:
    return "passphrase" in str(err).lower()


def client_keys(host: str, key_files: list[str], env_key: Secret | None) -> tuple[list, list[str]]:
    """(keys for asyncssh, encrypted key files that will be skipped)."""
    keys: list = []
    if env_key:
        try:
            keys.append(asyncssh.import_private_key(env_key.reveal()))
        except (asyncssh.KeyImportError, ValueError) as e:
            if _needs_passphrase(e):
                raise HostUnreachable(
                    f"{host}: TUNNELSPEC_SSH_KEY holds an encrypted private key; tunnelspec never asks for a "
                    "passphrase: store an unencrypted deploy key in your CI secret store, or use ssh-agent"
                ) from None
            raise HostUnreachable(
                f"{host}: TUNNELSPEC_SSH_KEY is not a readable OpenSSH/PEM private key ({type(e).__name__})"
            ) from None
    encrypted = []
    for path in key_files:
        try:
            asyncssh.read_private_key(path)
        except (asyncssh.KeyImportError, ValueError) as e:
            if _needs_passphrase(e):
                encrypted.append(path)
                continue
            raise HostUnreachable(f"{host}: private key {path} cannot be read: {e}") from None
        except OSError as e:
            raise HostUnreachable(f"{host}: private key {path} cannot be read: {e.strerror}") from None
        keys.append(path)  # a path, so asyncssh also picks up a matching -cert.pub
    if encrypted and not keys and not os.environ.get("SSH_AUTH_SOCK"):
        raise HostUnreachable(
            f"{host}: private key {encrypted[0]} is encrypted and no ssh-agent is available (SSH_AUTH_SOCK "
            "is unset); tunnelspec never prompts for a passphrase: `ssh-add` the key to an agent, or pass an "
            "unencrypted deploy key in TUNNELSPEC_SSH_KEY"
        )
    return keys, encrypted
