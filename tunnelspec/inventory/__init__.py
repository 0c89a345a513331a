"""Ansible-compatible inventories (INI and YAML): parse, merge variables, match host patterns."""

from tunnelspec.inventory.loader import load_inventory
from tunnelspec.inventory.model import Group, Host, Inventory

__all__ = ["Group", "Host", "Inventory", "load_inventory"]
