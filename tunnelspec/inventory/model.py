"""The parsed inventory: hosts, groups, variables and where each variable was written.

Variable precedence follows Ansible: `all` group vars < other groups sorted by
(depth, ansible_group_priority, name) < host vars < extra vars (`-e KEY=VALUE`). Depth is the
longest path from `all`. `host_vars()` is the one place these layers are merged: the templates,
the connections and the typed cluster model (cluster/model.py) all read through it.
"""

from __future__ import annotations

import dataclasses
import datetime
import pathlib
from dataclasses import dataclass, field
from typing import Any
from tunnelspec.inventory.patterns import match_hosts

# Where a value was written: (file, line). Kept so later validation can point at the line.
Origin = tuple[str, int]

# Variables Ansible computes itself; `ansible-inventory --list` drops them from hostvars.
ANSIBLE_INTERNAL_VARS = frozenset(
    {
        "ansible_async_path",
        "ansible_collection_name",
        "ansible_config_file",
        "ansible_dependent_role_names",
        "ansible_diff_mode",
        "ansible_facts",
        "ansible_forks",
        "ansible_inventory_sources",
        "ansible_limit",
        "ansible_play_batch",
        "ansible_play_hosts",
        "ansible_play_hosts_all",
        "ansible_play_role_names",
        "ansible_playbook_python",
        "ansible_role_name",
        "ansible_role_names",
        "ansible_run_tags",
        "ansible_skip_tags",
        "ansible_verbosity",
        "ansible_version",
        "inventory_dir",
        "inventory_file",
        "inventory_hostname",
        "inventory_hostname_short",
        "groups",
        "group_names",
        "hostvars",
        "playbook_dir",
        "play_hosts",
        "role_name",
        "role_names",
        "role_path",
        "role_uuid",
    }
)


def _as_json(value: Any) -> Any:
    """A value as ansible-inventory's JSON shows it: YAML dates and timestamps in ISO form
    (`2020-01-01`, `2001-12-14T21:59:43.100000-05:00`), tuples (YAML !!omap pairs) as lists."""
    if isinstance(value, (datetime.date, datetime.datetime)):
        return value.isoformat()
    if isinstance(value, dict):
        return {k: _as_json(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_as_json(v) for v in value]
    return value


@dataclass
class Host:
    name: str
    groups: list[str] = field(default_factory=list)  # groups the host is listed in directly
    vars: dict[str, Any] = field(default_factory=dict)  # the host's own vars
    origins: dict[str, Origin] = field(default_factory=dict)  # var name -> where it was set
    line: int | None = None  # first line that defined the host


@dataclass
class Group:
    name: str
    hosts: list[str] = field(default_factory=list)
    children: list[str] = field(default_factory=list)
    vars: dict[str, Any] = field(default_factory=dict)
    origins: dict[str, Origin] = field(default_factory=dict)
    priority: int = 1  # ansible_group_priority (kept out of vars, as Ansible does)
    parents: list[str] = field(default_factory=list)
    line: int | None = None  # first line that declared the group


@dataclass
class Inventory:
    path: pathlib.Path
    hosts: dict[str, Host] = field(default_factory=dict)
    groups: dict[str, Group] = field(default_factory=dict)
    # `-e KEY=VALUE` of the run, above every inventory layer (Ansible's highest precedence). Kept
    # apart from the parsed layers so `inventory list` shows the file and errors can say "-e".
    extra_vars: dict[str, Any] = field(default_factory=dict)

    def with_extra_vars(self, extra_vars: dict[str, Any]) -> Inventory:
        """The same inventory seen with a run's extra vars on top (the parsed layers are shared)."""
        if not extra_vars:
            return self
        return dataclasses.replace(self, extra_vars={**self.extra_vars, **extra_vars})

    # ---- structure -------------------------------------------------------------------------
    def ancestors(self, group: str) -> set[str]:
        seen: set[str] = set()
        todo = list(self.groups[group].parents)
        while todo:
            name = todo.pop()
            if name not in seen:
                seen.add(name)
                todo.extend(self.groups[name].parents)
        return seen

    def descendants(self, group: str) -> list[str]:
        """The group and its descendants, breadth first (Ansible's order for host listing)."""
        ordered = [group]
        seen = {group}
        level = list(self.groups[group].children)
        while level:
            nxt: list[str] = []
            for name in level:
                if name not in seen:
                    seen.add(name)
                    ordered.append(name)
                    nxt.extend(self.groups[name].children)
            level = nxt
        return ordered

    def group_hosts(self, group: str) -> list[str]:
        """Hosts of the group and of all its descendants, in Ansible's order, no duplicates."""
        result: list[str] = []
        seen: set[str] = set()
        for name in self.descendants(group):
            for host in self.groups[name].hosts:
                if host not in seen:
                    seen.add(host)
                    result.append(host)
        return result

    def depths(self) -> dict[str, int]:
        """Longest path from `all` to each group (the graph is acyclic: the parser ensures it)."""
        depth: dict[str, int] = {}

        def visit(name: str) -> int:
            if name not in depth:
                parents = self.groups[name].parents
                depth[name] = 1 + max((visit(p) for p in parents), default=-1)
            return depth[name]

        for name in self.groups:
            visit(name)
        return depth

    def host_groups(self, host: str) -> list[str]:
        """Every group the host belongs to, directly or through parents (including `all`)."""
        result: set[str] = set()
        for name in self.hosts[host].groups:
            result.add(name)
            result |= self.ancestors(name)
        return sorted(result)

    def _ordered_groups(self, host: str) -> list[str]:
        depth = self.depths()
        names = [g for g in self.host_groups(host) if g != "all"]
        return sorted(names, key=lambda g: (depth[g], self.groups[g].priority, g))

    # ---- variables -------------------------------------------------------------------------
    def host_vars(self, name: str) -> dict[str, Any]:
        """The host's variables merged with Ansible's precedence (later wins, no deep merge)."""
        merged: dict[str, Any] = dict(self.groups["all"].vars)
        for group in self._ordered_groups(name):
            merged.update(self.groups[group].vars)
        merged.update(self.hosts[name].vars)
        merged.update(self.extra_vars)
        return merged

    def var_origin(self, host: str, var: str) -> Origin | None:
        """Where the value `host_vars(host)[var]` was written, if the parser saw it (None for -e)."""
        if var in self.extra_vars:
            return None
        if var in self.hosts[host].vars:
            return self.hosts[host].origins.get(var)
        for group in reversed(["all", *self._ordered_groups(host)]):
            if var in self.groups[group].vars:
                return self.groups[group].origins.get(var)
        return None

    # ---- patterns --------------------------------------------------------------------------
    def match(self, pattern: str) -> list[str]:
        """Host names matching an Ansible host pattern; [] when nothing matches."""
        return match_hosts(self, pattern)

    # ---- ansible-inventory --list ----------------------------------------------------------
    def to_ansible_list(self) -> dict[str, Any]:
        """Same structure and values as `ansible-inventory --list` (without `_meta.profile`)."""
        result: dict[str, Any] = {}
        seen: set[str] = set()
        available = set(self.hosts)

        def emit(name: str) -> None:
            group = self.groups[name]
            entry: dict[str, Any] = {}
            if name != "all":
                entry["hosts"] = [h for h in group.hosts if h in available]
            entry["children"] = list(group.children)
            result[name] = entry
            for child in group.children:
                if child not in seen:
                    emit(child)
                    seen.add(child)
            for key in ("hosts", "children"):
                if key in entry and not entry[key]:
                    del entry[key]
            if not entry:
                del result[name]

        emit("all")
        hostvars = {}
        parsed = dataclasses.replace(self, extra_vars={})  # what the file says, as ansible-inventory shows it
        for name in self.hosts:
            merged = {k: _as_json(v) for k, v in parsed.host_vars(name).items() if k not in ANSIBLE_INTERNAL_VARS}
            if merged:
                hostvars[name] = merged
        result["_meta"] = {"hostvars": hostvars}
        return result
