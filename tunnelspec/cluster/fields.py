"""Reading one cluster variable of one host: its value by its declared type or its declared default
(`HostVars.get`, cluster/declared.py), and errors that point at the line where the value was
written. Used by the model's readers; knows nothing about the cluster's shape."""

from __future__ import annotations

import difflib
from typing import Any

from tunnelspec.cluster.declared import DECLARED
from tunnelspec.cluster.vardecl import parse
from tunnelspec.core.errors import ClusterError
from tunnelspec.core.vartypes import VarValueError
from tunnelspec.inventory.model import Inventory
from tunnelspec.inventory.values import parse_value

# Every variable of tunnelspec's own (Ansible's `ansible_*` aside): the typo check suggests one of these.
KNOWN_VARS = frozenset(name for name in DECLARED if not name.startswith("ansible_"))
# The user's own variables (for their own playbooks, templates or notes): tunnelspec reads none of
# them and `tunnelspec check` does not call them unknown. Ansible's own `ansible_*` are fine too.
USER_VAR_PREFIX = "my_"


def is_unknown_var(name: str) -> bool:
    return not (name in KNOWN_VARS or name.startswith(("ansible_", USER_VAR_PREFIX)))


def nearest_var(name: str, cutoff: float = 0.8) -> str | None:
    close = difflib.get_close_matches(name, KNOWN_VARS, n=1, cutoff=cutoff)
    return close[0] if close else None


_MISSING = object()


def cluster_error(
    inv: Inventory, host: str | None, var: str | None, message: str, line: int | None = None
) -> ClusterError:
    """`file:line: host H: variable V: message`, with whatever parts are known.

    The line is where the variable was written; for a variable that is missing, the line of the
    host (or the `line` given: a group's); for the inventory as a whole, line 1.
    The error keeps .host, .var, .file and .line so callers (and tests) need not parse text."""
    origin = inv.var_origin(host, var) if host in inv.hosts and var else None
    from_cli = bool(var) and var in inv.extra_vars
    if not origin and not from_cli:
        if line is None and host in inv.hosts:
            line = inv.hosts[host].line
        origin = (str(inv.path), line or 1)
    parts = []
    if origin:
        parts.append(f"{origin[0]}:{origin[1]}:")
    else:
        parts.append(f"-e {var}:")  # given on the command line, not written in the inventory
    if host:
        parts.append(f"host {host}:")
    if var:
        parts.append(f"variable {var}:")
    err = ClusterError(" ".join(parts + [message]))
    # ClusterError (core/errors.py) declares none of these four attributes; they are set here only.
    err.host, err.var = host, var
    err.file, err.line = origin if origin else ("-e" if from_cli else str(inv.path), None)
    return err


class HostVars:
    """Typed access to one host's merged variables (inventory layers and -e, Inventory.host_vars).

    A `-e KEY=VALUE` value is text; it is read here the way the INI parser reads a value
    (`-e rpc_threads=3` is the number 3, `-e 'llama_patches=[...]'` a list), so a variable means
    the same whether it was written in the inventory or given with -e."""

    def __init__(self, inv: Inventory, host: str):
        self.inv = inv
        self.host = host
        self.values = inv.host_vars(host)
        for var, value in inv.extra_vars.items():
            if isinstance(value, str):
                self.values[var] = parse_value(value)

    def get(self, var: str) -> Any:
        """A declared variable's value read by its type (cluster/declared.py), or its declared default
        when unset (None where the default is derived from other values: the reader works it out)."""
        if var not in self.values or self.values[var] is None:
            default = DECLARED[var].default
            return list(default) if isinstance(default, list) else default
        try:
            return parse(DECLARED[var], self.values[var], self.inv.path.parent)
        except VarValueError as err:
            raise self.fail(var, str(err)) from None

    def fail(self, var: str | None, message: str) -> ClusterError:
        return cluster_error(self.inv, self.host, var, message)

    def has(self, var: str) -> bool:
        return var in self.values

    def raw(self, var: str, default: Any = _MISSING) -> Any:
        if var in self.values:
            return self.values[var]
        if default is _MISSING:
            raise self.fail(var, "is required; set it in the inventory (see inventory.example.ini or .yml)")
        return default

    def check_typos(self) -> None:
        for name in self.values:
            if not is_unknown_var(name):
                continue
            close = nearest_var(name)
            if close:
                raise self.fail(
                    name,
                    f"unknown variable; did you mean '{close}'? (rename it; a variable of your own "
                    f"starts with {USER_VAR_PREFIX})",
                )
