"""The inventory graph as both parsers (INI and YAML) build it, with Ansible's rules.

Adding groups, children and hosts, setting variables (remembering the line each was written on),
and Ansible's `reconcile_inventory` after the last line. A parser sets `self.line` to the line it
is reading before each call, so every origin and error points at that line.
"""

from __future__ import annotations

import pathlib

from tunnelspec.core.errors import InventoryError
from tunnelspec.inventory.model import Group, Host, Inventory


class InventoryBuilder:
    def __init__(self, path: pathlib.Path):
        self.path = path
        self.file = str(path)
        self.inv = Inventory(path=path)
        self.line = 0
        self._add_group("all")
        self._add_group("ungrouped")
        self._add_child("all", "ungrouped")

    def error(self, message: str, line: int | None = None) -> InventoryError:
        return InventoryError(message, self.file, line if line is not None else self.line)

    # ---- graph -----------------------------------------------------------------------------
    def _add_group(self, name: str) -> None:
        if name not in self.inv.groups:
            self.inv.groups[name] = Group(name, line=self.line or None)

    def _add_child(self, parent: str, child: str) -> None:
        if child == "all":
            raise self.error(f"'all' cannot be a child of '{parent}': every group is already under 'all'")
        if parent == child:
            raise self.error(f"group '{child}' is listed as a child of itself; remove that line")
        p, c = self.inv.groups[parent], self.inv.groups[child]
        if child in p.children:
            return
        if child in self.inv.ancestors(parent):
            raise self.error(
                f"adding '{child}' as a child of '{parent}' creates a cycle "
                f"('{parent}' is already a descendant of '{child}'); remove one of the two links"
            )
        p.children.append(child)
        if parent not in c.parents:
            c.parents.append(parent)

    def _add_host(self, name: str, group: str, port: int | None) -> None:
        host = self.inv.hosts.get(name)
        if host is None:
            host = self.inv.hosts[name] = Host(name, line=self.line)
            # Ansible applies `host:port` only when the host is first seen.
            if port:
                self._set_var(host, "ansible_port", port)
        if group not in host.groups:
            host.groups.append(group)
            self.inv.groups[group].hosts.append(name)

    def _set_var(self, target: Host | Group, key: str, value) -> None:
        if isinstance(target, Group) and key == "ansible_group_priority":
            try:
                target.priority = int(value)
            except (TypeError, ValueError, OverflowError):  # OverflowError: .inf
                raise self.error(
                    f"ansible_group_priority must be an integer (e.g. ansible_group_priority=10), got {value!r}"
                ) from None
            return
        target.vars[key] = value
        target.origins[key] = (self.file, self.line)

    # ---- after the last line: Ansible's reconcile_inventory --------------------------------
    def _reconcile(self) -> None:
        for name, group in self.inv.groups.items():
            if name != "all" and not group.parents:
                self._add_child("all", name)
        ungrouped = self.inv.groups["ungrouped"]
        for name, host in list(self.inv.hosts.items()):
            if "ungrouped" in host.groups:
                # Ansible counts the groups above the host's groups too: a host of `ungrouped` made a
                # child of `web` ([web:children] ungrouped) leaves `ungrouped`, and with it the
                # inventory (ansible-inventory --list shows it nowhere).
                if set(self.inv.host_groups(name)) - {"all", "ungrouped"}:
                    host.groups.remove("ungrouped")
                    ungrouped.hosts.remove(name)
                    if not host.groups:
                        del self.inv.hosts[name]
            elif set(host.groups) <= {"all"}:
                host.groups.append("ungrouped")
                ungrouped.hosts.append(name)
