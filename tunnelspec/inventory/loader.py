"""One entry point for every command: read an inventory file, INI or YAML.

The format is chosen as Ansible's plugins choose it: `.yml`, `.yaml` and `.json` are YAML, `.ini`
is INI; any other name is judged by its first meaningful line (`---`, `%YAML`, `{` or a bare
`name:` key mean YAML, anything else INI).
"""

from __future__ import annotations

import pathlib
import re

from tunnelspec.errors import InventoryError
from tunnelspec.inventory.ini import load_ini, read_lines
from tunnelspec.inventory.model import Inventory
from tunnelspec.inventory.yaml_inv import load_yaml

YAML_SUFFIXES = (".yml", ".yaml", ".json")
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


def load_inventory(path: str | pathlib.Path) -> Inventory:
    """Parse an Ansible inventory (INI or YAML). Raises InventoryError(message, file, line)."""
    path = pathlib.Path(path)
    lines = read_lines(path)
    if inventory_format(path, lines) == "yaml":
        return load_yaml(path, "\n".join(lines) + "\n")
    return load_ini(path, lines)


__all__ = ["InventoryError", "inventory_format", "load_inventory"]
