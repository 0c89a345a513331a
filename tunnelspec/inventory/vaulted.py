"""Ansible Vault in the files tunnelspec reads: `!vault |` values in a YAML inventory or a YAML
`-e @FILE`, and a `-e @FILE` encrypted as a whole. What was decrypted is a `Secret`: shown as `***`
everywhere, whatever the variable's name."""

from __future__ import annotations

from typing import Any

import yaml

from tunnelspec.core import vault
from tunnelspec.core.secrets import Secret


class VaultAt(Exception):
    """A vault value that could not be decrypted, with the line it is written on (1-based)."""

    def __init__(self, err: vault.VaultError, line: int):
        super().__init__(str(err))
        self.line = line


def _construct_vault(loader: yaml.constructor.SafeConstructor, node: yaml.Node) -> Secret:
    line = node.start_mark.line + 1
    if not isinstance(node, yaml.ScalarNode):
        raise VaultAt(vault.VaultFormatError("a !vault value must be the text ansible-vault printed"), line)
    try:
        return Secret(vault.decrypt_text(str(node.value)))
    except vault.VaultError as err:
        raise VaultAt(err, line) from None


def with_vault(loader: type) -> type:
    """A subclass of the YAML loader that reads `!vault` (and the older `!vault-encrypted`) as Ansible does."""
    sub: Any = type(f"Vault{loader.__name__}", (loader,), {})
    sub.add_constructor("!vault", _construct_vault)
    sub.add_constructor("!vault-encrypted", _construct_vault)
    return sub


def as_secrets(value: Any) -> Any:
    """Every text of a decrypted file made a Secret (numbers and yes/no keep their type: they are
    settings, and masking `22` or `true` in every message would hide the rest)."""
    if isinstance(value, str) and not isinstance(value, Secret):
        return Secret(value) if value else value
    if isinstance(value, dict):
        return {k: as_secrets(v) for k, v in value.items()}
    if isinstance(value, list):
        return [as_secrets(v) for v in value]
    return value
