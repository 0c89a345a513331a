"""Ansible INI inventory parser.

One pass over the lines, as Ansible's own `ini` plugin does, so that group order, host order,
values and precedence come out the same as `ansible-inventory --list`. Where Ansible would fail
we fail too, but always with `file:line` and a hint. Every variable remembers the line it was
written on, so the cluster validation can point at it.
"""

from __future__ import annotations

import pathlib
import re
import shlex
from dataclasses import dataclass

from tunnelspec.core.errors import InventoryError
from tunnelspec.inventory.hostnames import RangeError, expand_range, split_port
from tunnelspec.inventory.builder import InventoryBuilder
from tunnelspec.inventory.model import Inventory
from tunnelspec.inventory.values import parse_value

_SECTION = re.compile(r"^\[([^:\]\s]+)(?::(\w+))?\]\s*(?:#.*)?$")
_GROUP_NAME = re.compile(r"^([^:\]\s]+)\s*(?:#.*)?$")
_COMMENT = ("#", ";")


@dataclass
class _Pending:
    """A group named before its own [group] or [group:children] header."""

    kind: str  # "vars" or "children"
    line: int
    parents: list[str]


class _Parser(InventoryBuilder):
    def __init__(self, path: pathlib.Path, errors: list[InventoryError] | None = None):
        super().__init__(path)
        self.pending: dict[str, _Pending] = {}
        # None: stop at the first error (every command). A list: record each error and go on with
        # the next line, as `tunnelspec check` wants (every mistake of the file in one run).
        self.errors = errors

    def _record(self, err: InventoryError) -> None:
        if self.errors is None:
            raise err
        self.errors.append(err)

    # ---- lines -----------------------------------------------------------------------------
    def parse(self, lines: list[str]) -> Inventory:
        group, state = "ungrouped", "hosts"
        for number, raw in enumerate(lines, start=1):
            self.line = number
            try:
                group, state = self._line(raw.strip(), group, state)
            except InventoryError as err:
                self._record(err)
                if raw.strip().startswith("["):
                    # A header that could not be read: when its intent is plain (`[rpc`, `[ rpc ]`), the
                    # lines under it are read as that section's, so that their own mistakes show in the
                    # same run (`tunnelspec check`); else they belong to no known section.
                    group, state = self._recover_header(raw.strip())
        for name, pending in self.pending.items():
            if pending.kind == "vars":
                self._record(
                    self.error(
                        f"section [{name}:vars] is for group '{name}', which is never declared: "
                        f"add a [{name}] section (or fix the group name)",
                        pending.line,
                    )
                )
                continue
            self._record(
                self.error(
                    f"section [{pending.parents[-1]}:children] includes group '{name}', which is never "
                    f"declared: add a [{name}] section (children must be groups, not hosts)",
                    pending.line,
                )
            )
        self._reconcile()
        return self.inv

    def _line(self, line: str, group: str, state: str) -> tuple[str, str]:
        if not line or line[0] in _COMMENT:
            return group, state
        m = _SECTION.match(line)
        if m:
            return self._section(m)
        if line.startswith("[") and line.endswith("]"):
            raise self.error(
                f"invalid section header '{line}': write [group], [group:vars] or "
                "[group:children], with no spaces inside the brackets"
            )
        if line.startswith("[") and "]" not in line.split("#", 1)[0]:
            # `[rpc` read as a line of the section above would be blamed on that section.
            name = line[1:].split("#", 1)[0].strip() or "group"
            raise self.error(f"section header '{line}' is not closed: write [{name}] (with the ']')")
        if state == "hosts":
            self._host_line(line, group)
        elif state == "vars":
            key, value = self._var_line(line, group)
            self._set_var(self.inv.groups[group], key, value)
        elif state == "children":
            self._child_line(line, group)
        return group, state

    def _recover_header(self, line: str) -> tuple[str, str]:
        """The section a broken header surely means, `[rpc` or `[ rpc ]` read as `[rpc]`; only after
        its error was recorded (`errors` given: a command that stops at the first error never gets here)."""
        text = line[1:].split("#", 1)[0].replace("]", "")
        m = _SECTION.match("[" + "".join(text.split()) + "]") if text.strip() else None
        if m is None or len(text.split()) != 1 and ":" not in text:
            return "ungrouped", "skip"
        try:
            return self._section(m)
        except InventoryError:
            return "ungrouped", "skip"

    def _section(self, m: re.Match) -> tuple[str, str]:
        # Ansible (>= 2.11, default TRANSFORM_INVALID_GROUP_CHARS=never) keeps names as written.
        name = m.group(1)
        state = m.group(2) or "hosts"
        if state not in ("hosts", "children", "vars"):
            raise self.error(
                f"section [{m.group(1)}:{state}] has unknown type '{state}': "
                "use [group], [group:vars] or [group:children]"
            )
        if name not in self.inv.groups:
            if state == "vars" and name not in self.pending:
                self.pending[name] = _Pending("vars", self.line, [])
            self._add_group(name)
        pending = self.pending.get(name)
        if pending is not None and state != "vars":
            if pending.kind == "children":
                self._resolve_children(name)
            else:
                del self.pending[name]
        return name, state

    def _resolve_children(self, name: str) -> None:
        for parent in self.pending[name].parents:
            self._add_child(parent, name)
            if parent in self.pending and self.pending[parent].kind == "children":
                self._resolve_children(parent)
        del self.pending[name]

    def _host_line(self, line: str, group: str) -> None:
        try:
            tokens = shlex.split(line, comments=True)
        except ValueError as err:
            raise self.error(f"cannot split host line ({err}): check the quotes") from None
        if not tokens or not tokens[0]:
            raise self.error("empty host name; remove the line or write a host name")
        entry = tokens[0]
        name, port = split_port(entry)
        if entry.strip().endswith(":") and port is None:
            raise self.error(f"host '{entry}' ends with ':'; after ':' comes a port number (host:2222)")
        try:
            names = expand_range(name)
        except RangeError as err:
            raise self.error(f"{err}") from None
        if not names:
            raise self.error(f"host range '{name}' expands to no host; check begin, end and step")
        if "---" in (n.strip() for n in names):
            raise self.error(
                "'---' is not a host: this looks like a YAML inventory in a file named .ini; "
                "rename it to .yml (tunnelspec reads both formats)"
            )
        variables = []
        for token in tokens[1:]:
            if "=" not in token:
                raise self.error(
                    f"expected key=value after host '{entry}', got '{token}': quote values with spaces (key=\"a b\")"
                )
            key, value = token.split("=", 1)
            if not key:
                raise self.error(f"'{token}' has no variable name before '='")
            variables.append((key, parse_value(value)))
        for host_name in names:
            self._add_host(host_name, group, port)
            host = self.inv.hosts[host_name]
            for key, value in variables:
                self._set_var(host, key, value)

    def _var_line(self, line: str, group: str) -> tuple[str, object]:
        if "=" not in line:
            raise self.error(
                f"expected key=value in [{group}:vars], got '{line}': one variable per line, "
                "hosts go in [" + group + "]"
            )
        key, value = (part.strip() for part in line.split("=", 1))
        if not key:
            raise self.error(f"'{line}' has no variable name before '='")
        return key, parse_value(value)

    def _child_line(self, line: str, group: str) -> None:
        m = _GROUP_NAME.match(line)
        if not m:
            raise self.error(
                f"expected a group name in [{group}:children], got '{line}': one group per line, no host variables here"
            )
        child = m.group(1)
        if child in self.inv.groups:
            self._add_child(group, child)
        elif child in self.pending:
            self.pending[child].parents.append(group)
        else:
            self.pending[child] = _Pending("children", self.line, [group])


def read_bytes(path: pathlib.Path) -> bytes:
    try:
        return path.read_bytes()
    except FileNotFoundError:
        raise InventoryError("inventory file not found; check the path", str(path)) from None
    except IsADirectoryError:
        raise InventoryError("is a directory; give the path of an inventory file (INI or YAML)", str(path)) from None
    except OSError as err:
        raise InventoryError(f"cannot read: {err.strerror}", str(path)) from None


def split_lines(data: bytes) -> list[str]:
    """The file's lines as Ansible's ini plugin splits them: the text (bytes that are not UTF-8
    kept as surrogates) split with str.splitlines, so \\r, \\x1c, \\x85, \\u2028... end a line
    there as here and every line number is the one Ansible reports."""
    return data.decode("utf-8", errors="surrogateescape").splitlines()


def _is_utf8(line: str) -> bool:
    try:
        line.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def read_lines(path: pathlib.Path, data: bytes | None = None) -> list[str]:
    """The INI file's lines. A comment may hold anything, as in Ansible; any other line that is not
    UTF-8 is refused with its line (Ansible would carry the undecodable bytes into names and
    values)."""
    lines = split_lines(read_bytes(path) if data is None else data)
    for number, line in enumerate(lines, start=1):
        if not _is_utf8(line):
            if line.strip()[:1] in _COMMENT:
                lines[number - 1] = ""
                continue
            raise InventoryError("line is not valid UTF-8; save the file as UTF-8", str(path), number)
    return lines


def load_ini(
    path: str | pathlib.Path, lines: list[str] | None = None, errors: list[InventoryError] | None = None
) -> Inventory:
    """Parse an Ansible INI inventory. Raises InventoryError(message, file, line); with `errors`, every
    error is appended there instead and the lines after it are read all the same."""
    path = pathlib.Path(path)
    return _Parser(path, errors).parse(read_lines(path) if lines is None else lines)
