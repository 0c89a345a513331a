"""One entry point for every command: read an inventory file, INI or YAML.

The format is chosen as Ansible's plugins choose it: `.yml`, `.yaml` and `.json` are YAML, `.ini`
is INI; any other name is judged by its first meaningful line (`---`, `%YAML`, `{` or a bare
`name:` key mean YAML, anything else INI).
"""

from __future__ import annotations

import pathlib
import re

from tunnelspec.core import vault
from tunnelspec.core.errors import InventoryError
from tunnelspec.inventory.ini import load_ini, read_bytes, read_lines, split_lines
from tunnelspec.inventory.model import Inventory
from tunnelspec.inventory.yaml_inv import load_yaml

YAML_SUFFIXES = (".yml", ".yaml", ".json")
_YAML_BREAKS = re.compile("\r\n|[\r\n\x85\u2028\u2029]")  # the line breaks PyYAML counts
_YAML_START = re.compile(r"^(?:---|%YAML|\{|[^\s\[\]#;=:]+:\s*(?:#.*)?$)")


def inventory_format(path: pathlib.Path, lines: list[str]) -> str:
    suffix = path.suffix.lower()
    if suffix in YAML_SUFFIXES:
        return "yaml"
    if suffix == ".ini":
        return "ini"
    for raw in lines:
        line = raw.strip()
        if line and line[0] not in "#;":
            return "yaml" if _YAML_START.match(line) else "ini"
    return "ini"  # empty or comments only: an empty INI inventory, as Ansible's ini plugin reads it


def load_inventory(path: str | pathlib.Path, errors: list[InventoryError] | None = None) -> Inventory:
    """Parse an Ansible inventory (INI or YAML). Raises InventoryError(message, file, line). With
    `errors` (`tunnelspec check`), an INI file's errors are appended there, each line read all the
    same; a YAML file still stops at its first error (the YAML reader cannot go on past one)."""
    path = pathlib.Path(path)
    data = read_bytes(path)
    if vault.is_vaulted(data[:64]):
        raise InventoryError(
            "the inventory is encrypted with ansible-vault as a whole, which tunnelspec does not read: "
            "decrypt it (ansible-vault decrypt) and encrypt only the secret values "
            "(ansible-vault encrypt_string, a `!vault |` value in a YAML inventory)",
            str(path),
            1,
        )
    if inventory_format(path, split_lines(data)) == "yaml":
        return load_yaml(path, yaml_text(path, data))
    return load_ini(path, read_lines(path, data), errors)


def yaml_text(path: pathlib.Path, data: bytes) -> str:
    """The YAML file's text, as it is (PyYAML counts its lines); bytes that are not UTF-8 are refused
    at their line (Ansible's YAML reader refuses them too)."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        line = len(_YAML_BREAKS.findall(data[: err.start].decode("utf-8"))) + 1
        raise InventoryError("line is not valid UTF-8; save the file as UTF-8", str(path), line) from None


__all__ = ["InventoryError", "inventory_format", "load_inventory"]
