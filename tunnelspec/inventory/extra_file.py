"""`-e @FILE`: extra variables from a YAML (or JSON) mapping, as Ansible reads them; a file encrypted
with ansible-vault as a whole, and `!vault` values inside one, are decrypted (inventory/vaulted.py)."""

from __future__ import annotations

import yaml

from tunnelspec.core import vault
from tunnelspec.core.errors import UsageError
from tunnelspec.inventory.vaulted import VaultAt, as_secrets, with_vault

_LOADER: type = with_vault(yaml.SafeLoader)


def _variable_at(text: str, line: int) -> str:
    """How to name the vault value on that line: its key, as `name: !vault |` writes it."""
    lines = text.splitlines()
    key = lines[line - 1].split(":", 1)[0].strip().strip("'\"") if 0 < line <= len(lines) else ""
    return f"variable '{key}' is vault-encrypted" if key and ":" in lines[line - 1] else "a vault-encrypted value"


def read_extra_vars_file(path: str) -> dict:
    try:
        text = open(path, encoding="utf-8").read()
    except OSError as e:
        raise UsageError(f"-e @{path}: cannot read: {e.strerror}") from None
    except UnicodeDecodeError as e:
        raise UsageError(
            f"-e @{path}: not a text file (byte {e.start} is not UTF-8); give a YAML or JSON mapping"
        ) from None
    whole = vault.is_vaulted(text)
    if whole:
        try:
            text = vault.decrypt_text(text)
        except vault.VaultError as err:
            raise UsageError(f"{path}:1: -e @FILE is vault-encrypted: {err}") from None
    try:
        data = yaml.load(text, Loader=_LOADER) if text.strip() else {}  # noqa: S506 - a SafeLoader subclass
    except VaultAt as err:
        raise UsageError(f"{path}:{err.line}: {_variable_at(text, err.line)}: {err}") from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        # The lines of a decrypted file are not the file's: say so rather than point into ciphertext.
        where = f"{path}:{mark.line + 1}" if mark is not None and not whole else path
        problem = getattr(e, "problem", e)
        raise UsageError(f"{where}: not valid YAML{' (once decrypted)' if whole else ''}: {problem}") from None
    if not isinstance(data, dict) or not all(isinstance(k, str) for k in data):
        raise UsageError(f"{path}:1: -e @FILE needs a mapping of variable names to values")
    return as_secrets(data) if whole else data
