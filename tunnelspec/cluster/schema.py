"""One declaration per variable (cluster/declared.py): its type, default, doc line, whether it is
a secret and which hosts read it. From it: `tunnelspec check` and the cluster model read every
value by its type, offline, at the line it was written; the connection layer reads the Ansible
connection variables through `value()`; the engine gives the playbooks every variable's settled
value (`settled()`); the docs' table of variables is generated (`--markdown`).

Ansible's connection variables are either honoured or refused with the reason — never accepted
and ignored: `refused` holds the reason, `ignored` a variable that is Ansible's business only.
"""

from __future__ import annotations

import difflib
import sys
from collections.abc import Mapping
from typing import Any

from tunnelspec.cluster.declared import DECLARED
from tunnelspec.cluster.fields import HostVars, cluster_error
from tunnelspec.cluster.vardecl import TYPES, Var, parse
from tunnelspec.core.vartypes import VarValueError

__all__ = ["DECLARED", "TYPES", "Var", "parse"]

ANSIBLE_NAMES = tuple(n for n in DECLARED if n.startswith("ansible_"))
# Ansible's own variables that tunnelspec does not read and that are not typos of a declared one:
# `tunnelspec check` warns that they have no effect here (an error would refuse harmless ones).
# fmt: off
ANSIBLE_NOT_READ = frozenset({
    "ansible_become_exe", "ansible_become_flags", "ansible_ssh_executable", "ansible_ssh_pipelining",
    "ansible_pipelining", "ansible_shell_type", "ansible_shell_executable", "ansible_sftp_extra_args",
    "ansible_scp_extra_args", "ansible_ssh_transfer_method", "ansible_ssh_retries",
    "ansible_connection_timeout", "ansible_group_priority",
})
# fmt: on


def value(name: str, host_vars: Mapping, base_dir=None, default: Any = None) -> Any:
    """A declared variable of one host, parsed (`default` when unset); VarValueError when bad."""
    if name not in host_vars:
        return default
    return parse(DECLARED[name], host_vars[name], base_dir)


def ansible_typo(name: str) -> str | None:
    """The declared Ansible variable an unknown `ansible_*` name is surely a typo of, else None."""
    if not name.startswith("ansible_") or name in DECLARED or name in ANSIBLE_NOT_READ:
        return None
    close = difflib.get_close_matches(name, ANSIBLE_NAMES, n=1, cutoff=0.85)
    return close[0] if close else None


def problems(host_vars: Mapping, base_dir=None, role: str | None = None) -> list[tuple[str, str]]:
    """(variable, reason) for every declared variable whose value its type refuses, and every
    `ansible_*` name that is a typo of a declared one, in the order the variables are written.
    `role` ("main" or "rpc"): only the variables that host reads (a node's rpc_bind from a group's
    vars is no mistake of the main host's)."""
    out = []
    for name, raw in host_vars.items():
        var = DECLARED.get(name)
        if var is None:
            near = ansible_typo(name)
            if near:
                out.append((name, f"unknown Ansible variable; did you mean '{near}'? (tunnelspec would ignore it)"))
            continue
        if role is not None and var.hosts not in ("all", role):
            continue
        try:
            parse(var, raw, base_dir)
        except VarValueError as err:
            out.append((name, str(err)))
    return out


def check_hosts(inv, hosts) -> list:
    """A ClusterError (file:line, host, variable) per bad value of `hosts`; a value written once for
    several hosts (a group's, -e) is reported once, for the first host that reads it."""

    out, seen = [], set()
    for host in hosts:
        hv = HostVars(inv, host)
        role = "main" if "main" in inv.groups and host in inv.group_hosts("main") else "rpc"
        for var, reason in problems(hv.values, inv.path.parent, role):
            where = inv.var_origin(host, var)  # None for -e
            if (where, var) in seen:
                continue
            seen.add((where, var))
            out.append(cluster_error(inv, host, var, reason))
    return out


def _derived(name: str, host: str, host_vars: Mapping, cluster) -> Any:
    """A default worked out from other values, where the playbooks need it; None otherwise (the
    variable then means "not given": the build's own, the host's cores, ...)."""
    if name == "ansible_host":
        return host
    if name == "tunnel_ssh_host":
        return settle_one("ansible_host", host, host_vars, cluster)
    if name == "tunnel_ssh_port":
        return settle_one("ansible_port", host, host_vars, cluster)
    if cluster is None:
        return None
    if name == "tunnel_port" and host in {n.name for n in cluster.rpc}:
        return cluster.node(host).tunnel_port
    if name == "bench_port" and host == cluster.main.name and cluster.main.front is not None:
        return cluster.main.front.bench_port
    return None


def settle_one(name: str, host: str, host_vars: Mapping, cluster=None, base_dir=None) -> Any:
    var = DECLARED[name]
    raw = host_vars.get(name)
    if raw is None:
        if var.derived:
            return _derived(name, host, host_vars, cluster)
        return list(var.default) if isinstance(var.default, list) else var.default
    if var.secret:
        return raw  # as given (a Secret stays masked)
    try:
        return parse(var, raw, base_dir)
    except VarValueError:
        return raw  # `check` and the cluster model report it, at its line


def settled(host: str, host_vars: Mapping, cluster=None, base_dir=None) -> dict[str, Any]:
    """Every declared variable's settled value on `host`: the value read by its type, else the
    declared default, else (a default derived from other values) the cluster model's. This is the
    one route of a variable to the tasks: the engine's template context (engine/executor.py)."""
    return {
        name: settle_one(name, host, host_vars, cluster, base_dir)
        for name, var in DECLARED.items()
        if var.type not in ("refused", "ignored") and not (name == "ansible_user" and name not in host_vars)
    }


# ---- the docs' table (docs/variables.md) -------------------------------------------------------------
_SECTIONS = (
    ("Every host", lambda v: v.hosts == "all" and not v.by_command and not v.name.startswith("ansible_")),
    ("An rpc node", lambda v: v.hosts == "rpc" and not v.by_command),
    ("The main host", lambda v: v.hosts == "main" and not v.by_command),
    ("Ansible's connection variables", lambda v: v.name.startswith("ansible_")),
    ("Set by tunnelspec's commands (-e)", lambda v: v.by_command),
)


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def markdown() -> str:
    """The variable tables of docs/variables.md, generated from the declarations."""
    out = []
    for title, pick in _SECTIONS:
        out += [f"### {title}", "", "| variable | type | default | meaning |", "|---|---|---|---|"]
        for var in DECLARED.values():
            if not pick(var):
                continue
            kind = var.type
            if var.choices:
                kind = " | ".join(var.choices)
            elif var.minimum is not None or var.maximum is not None:
                low = "" if var.minimum is None else f"{var.minimum:g}"
                high = "" if var.maximum is None else f"{var.maximum:g}"
                kind = f"{kind} {low}..{high}"
            default = var.default_text
            doc = var.doc + (f" {var.reason}" if var.reason else "") + (" (secret)" if var.secret else "")
            row = f"| `{var.name}` | {_cell(kind)} | {_cell(default) if default else ''} | {_cell(doc)} |"
            out.append(row.replace("|  |", "| |"))
        out.append("")
    return "\n".join(out)


BEGIN = "<!-- variables: generated by `python -m tunnelspec.cluster.schema --markdown`; do not edit -->"
END = "<!-- end of variables -->"

if __name__ == "__main__":
    if sys.argv[1:] != ["--markdown"]:
        sys.exit("usage: python -m tunnelspec.cluster.schema --markdown")
    print(f"{BEGIN}\n\n{markdown()}\n{END}")
