"""Ansible YAML inventory parser (`all:` / `hosts:` / `children:` / `vars:`).

It walks the YAML node tree (not the loaded dict) so every group, host and variable keeps the
line it was written on: the cluster checks then cite `file:line` exactly as for INI. Groups,
hosts and values come out in the order and with the types of Ansible's `yaml` plugin, into the
same Inventory model, so precedence is the INI one.

The YAML is read by libyaml (`yaml.CSafeLoader`), as Ansible's loader reads it whenever PyYAML has
libyaml (`ansible.module_utils.common.yaml.HAS_LIBYAML`); the pure-Python scanner differs on a few
inputs (a tab inside a plain scalar, `w\teb:`, is a name for libyaml and a syntax error for it).
Without libyaml both fall back to the pure-Python reader alike. Its nodes carry marks (line,
column) all the same.

Where Ansible only warns and skips (an unknown key in a group, a group that is not a mapping),
we stop with `file:line`: a silently skipped key in a deployment inventory is a node or a
setting that would quietly not be deployed.
"""

from __future__ import annotations

import pathlib
import re
from collections.abc import Hashable
from typing import Any

import yaml

from tunnelspec.core.errors import InventoryError
from tunnelspec.inventory.builder import InventoryBuilder
from tunnelspec.inventory.hostnames import RangeError, expand_range, split_port
from tunnelspec.inventory.model import Inventory
from tunnelspec.inventory.vaulted import VaultAt, with_vault

_SECTIONS = ("vars", "children", "hosts")
# The reader Ansible's AnsibleLoader uses: libyaml's CParser when PyYAML was built with it.
_LOADER: type = yaml.CSafeLoader if getattr(yaml, "__with_libyaml__", False) else yaml.SafeLoader
_BREAKS = re.compile("\r\n|[\r\n\x85\u2028\u2029]")
# The same reader with Ansible's `!vault` tag: an encrypted value is read as its plaintext, a Secret.
_VAULT_LOADER: type = with_vault(_LOADER)


def _yaml_hint(err: yaml.MarkedYAMLError, text: str) -> str:
    """What to do about a YAML syntax error, after what libyaml (or PyYAML's scanner) says is wrong."""
    problem, context = err.problem or "", err.context or ""
    mark = err.problem_mark
    at = text[mark.index] if mark is not None and 0 <= mark.index < len(text) else ""
    if "'\\t'" in problem or "tab character" in problem or (at == "\t" and "cannot start any token" in problem):
        return "; indent with spaces, YAML does not allow tabs there"
    if "invalid Unicode character escape" in problem:
        # libyaml refuses "\ud800" (a surrogate half) and escapes past U+10FFFF; so does Ansible.
        return (
            "; a \\u or \\U escape must name a character (not a surrogate half, nothing past "
            "U+10FFFF): write the character itself"
        )
    if "mapping values are not allowed" in problem:
        return "; quote a value that holds ': ' (\"a: b\"), or check the indentation of this line"
    if "quoted scalar" in context:
        return "; close the quote (a quote inside the value is doubled in '...' or escaped in \"...\")"
    if "single document" in context or "single document" in problem:
        return "; an inventory is one YAML document: remove the second '---' and what follows, or merge it"
    if "flow" in context:
        return "; close the [ or { (and separate its items with ', ')"
    if "end of stream" in problem or "<stream end>" in problem or (mark is not None and mark.index >= len(text)):
        return "; the file ends in the middle of an entry: complete it or remove it"
    if "duplicate anchor" in problem + context or "found undefined alias" in problem:
        return "; give each anchor (&name) one definition before its aliases (*name)"
    return "; check the indentation and the quoting at that line"


def _is_text(value: Any) -> bool:
    """No string anywhere in the value holds a surrogate code point."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return False
        return True
    if isinstance(value, dict):
        return all(_is_text(k) and _is_text(v) for k, v in value.items())
    if isinstance(value, (list, tuple, set, frozenset)):
        return all(_is_text(v) for v in value)
    return True


def _line(node: yaml.Node) -> int:
    return node.start_mark.line + 1


class _YamlParser(InventoryBuilder):
    def __init__(self, path: pathlib.Path, text: str):
        super().__init__(path)
        self.text = text
        self._seen: dict[int, dict] = {}
        # The safe constructor: the same YAML 1.1 types as Ansible's loader (yes/no are booleans,
        # 010 octal) and no Python object tags. libyaml's reader meets control characters while
        # parsing; the pure-Python one checks the whole text here.
        try:
            self.loader = _VAULT_LOADER(text)
        except yaml.reader.ReaderError as err:
            raise self._reader_error(err) from None

    def close(self) -> None:
        self.loader.dispose()

    def _reader_error(self, err: yaml.reader.ReaderError) -> InventoryError:
        # YAML's line breaks: \r\n, \r, \n, \x85, \u2028, \u2029. libyaml gives the offset in the
        # UTF-8 bytes it reads, the pure-Python reader in characters.
        position = err.position if isinstance(err.position, int) else None
        if position is not None and _LOADER is not yaml.SafeLoader:
            position = len(self.text.encode("utf-8")[:position].decode("utf-8", "ignore"))
        line = len(_BREAKS.findall(self.text, 0, position)) + 1 if position is not None else 1
        char = err.character if isinstance(err.character, str) else chr(err.character)
        return InventoryError(
            f"invalid YAML: character {char!r} (U+{ord(char):04X}) is not allowed in YAML; "
            "remove it or write it as an escape in a double-quoted string",
            self.file,
            line,
        )

    # ---- nodes -----------------------------------------------------------------------------
    def _value(self, node: yaml.Node, var: str | None = None) -> Any:
        try:
            value = self.loader.construct_object(node, deep=True)
        except yaml.MarkedYAMLError as err:
            raise self._yaml_error(err) from None
        except VaultAt as err:
            what = f"variable '{var}' is vault-encrypted: " if var is not None else "a vault-encrypted value: "
            raise InventoryError(f"{what}{err}", self.file, err.line) from None
        if not _is_text(value):
            # "\ud800" escapes make strings that are not Unicode text; Ansible fails on them.
            raise InventoryError(
                'a string holds a lone surrogate (an escape like "\\ud800"), which is not '
                "Unicode text; write the character itself",
                self.file,
                _line(node),
            )
        return value

    def _pairs(self, node: yaml.MappingNode) -> dict[Any, tuple[yaml.Node, yaml.Node]]:
        """key -> (key node, value node), merge keys (`<<: *x`) applied.

        A key written twice in one mapping is an error here (Ansible warns and keeps the last one,
        dropping e.g. every host of the first `web:`). Keys that come from a merge (`<<`) may be
        overridden: that is what a merge is for."""
        if id(node) in self._seen:  # an alias of a mapping already read (flattened once only)
            return self._seen[id(node)]
        own = {id(k) for k, _ in node.value if k.tag != "tag:yaml.org,2002:merge"}
        self.loader.flatten_mapping(node)
        pairs: dict[Any, tuple[yaml.Node, yaml.Node]] = {}
        for key_node, value_node in node.value:
            key = self._value(key_node)
            self.line = _line(key_node)
            if not isinstance(key, Hashable):
                raise self.error("a mapping key must be a plain value (a name), not a list or mapping")
            if key in pairs and id(key_node) in own and id(pairs[key][0]) in own:
                raise self.error(
                    f"'{key}' is written twice in the same mapping (first on line "
                    f"{_line(pairs[key][0])}); merge the two entries into one"
                )
            pairs[key] = (key_node, value_node)
        self._seen[id(node)] = pairs
        return pairs

    def _variable(self, name: Any, node: yaml.Node) -> Any:
        """A variable's value, refused (at its line) when Ansible could not show it either."""
        if not isinstance(name, str) or not name:
            # Ansible 2.19 accepts it with a deprecation ("invalid name"; refused from 2.23).
            raise self.error(f"variable name {name!r} must be a non-empty string; quote it (\"'{name}':\")")
        if node is None:  # `vars: name` (one name, no value), as Ansible reads it
            return None
        value = self._value(node, name)
        self._check_value(name, value)
        return value

    def _check_value(self, name: Any, value: Any) -> None:
        if isinstance(value, bytes):
            # ansible-inventory --list fails on it ("not JSON serializable"), no deploy can use it.
            raise self.error(
                f"variable '{name}' is a !!binary value, which Ansible cannot show or template; "
                "write the text itself, or the base64 as a plain string"
            )
        if isinstance(value, (set, frozenset)):
            # Ansible keeps a set in no particular order: the same file would give different lists.
            raise self.error(f"variable '{name}' is a !!set, which has no order; write a list ([a, b])")
        if isinstance(value, dict):
            for key, item in value.items():
                if not isinstance(key, (str, int, float, bool, type(None))):
                    raise self.error(
                        f"variable '{name}' has a mapping key {key!r} of type {type(key).__name__}; "
                        "Ansible cannot show it (ansible-inventory fails): quote the key"
                    )
                self._check_value(name, item)
        elif isinstance(value, (list, tuple)):
            for item in value:
                self._check_value(name, item)

    @staticmethod
    def _is_null(node: yaml.Node) -> bool:
        return isinstance(node, yaml.ScalarNode) and node.tag == "tag:yaml.org,2002:null"

    def _yaml_error(self, err: yaml.MarkedYAMLError) -> InventoryError:
        mark = err.problem_mark or err.context_mark
        what = " ".join(p for p in (err.context, err.problem) if p)
        at_end = err.problem_mark is not None and err.problem_mark.index >= len(self.text)
        if err.context_mark is not None and err.problem and ("end of stream" in err.problem or at_end):
            # The end of the file is no place to fix: point at what was left open.
            mark = err.context_mark
        elif (
            err.context_mark is not None
            and err.problem_mark is not None
            and err.context_mark.line != err.problem_mark.line
        ):
            what += (
                f" (the {err.context.split()[-1] if err.context else 'construct'} opened on line "
                f"{err.context_mark.line + 1})"
            )
        what += _yaml_hint(err, self.text)
        # The end of a file without a final newline is still its last line.
        last = len(_BREAKS.findall(self.text)) + 1
        line = min(mark.line + 1, last) if mark else 1
        return InventoryError(f"invalid YAML: {what}", self.file, line)

    # ---- document --------------------------------------------------------------------------
    def parse(self) -> Inventory:
        try:
            root = self.loader.get_single_node()
        except yaml.MarkedYAMLError as err:
            raise self._yaml_error(err) from None
        except yaml.reader.ReaderError as err:  # a control character met while scanning
            raise self._reader_error(err) from None
        except yaml.YAMLError as err:
            raise InventoryError(f"invalid YAML: {err}", self.file, 1) from None
        if root is None or self._is_null(root):
            # Ansible refuses it too ("Parsed empty YAML file"); line 1 is where the inventory goes.
            raise InventoryError(
                "the YAML inventory is empty; start with 'all:' and put groups under 'children:'",
                self.file,
                _line(root) if root is not None else 1,
            )
        self.line = _line(root)
        if not isinstance(root, yaml.MappingNode):
            raise self.error(
                "a YAML inventory is a mapping of group names ('all:', then 'hosts:', "
                "'children:', 'vars:'), not a list or a single value"
            )
        pairs = self._pairs(root)
        if "plugin" in pairs:
            self.line = _line(pairs["plugin"][0])
            raise self.error(
                "this is an inventory plugin configuration ('plugin:'), not a YAML inventory; "
                "tunnelspec reads static inventories only"
            )
        for name, (key_node, value_node) in pairs.items():
            self._group(name, key_node, value_node)
        self._reconcile()
        return self.inv

    def _group(self, name: Any, key_node: yaml.Node, node: yaml.Node) -> str:
        self.line = _line(key_node)
        if not isinstance(name, str) or not name:
            raise self.error(f"group name {name!r} must be a non-empty string; quote it if it is a number")
        if not (isinstance(node, yaml.MappingNode) or self._is_null(node)):
            raise self.error(
                f"group '{name}' must be a mapping (with hosts:, children: or vars:) or empty, not {self._kind(node)}"
            )
        self._add_group(name)
        if self._is_null(node):
            return name
        assert isinstance(node, yaml.MappingNode)  # a mapping or null, checked above
        sections = self._pairs(node)
        for key, (skey, snode) in sections.items():
            self.line = _line(skey)
            if key not in _SECTIONS:
                raise self.error(
                    f"unexpected key '{key}' in group '{name}': a group holds only 'hosts:', "
                    "'children:' and 'vars:' (a host's variables go under its name in 'hosts:')"
                )
            if isinstance(snode, yaml.ScalarNode) and not self._is_null(snode):
                # Ansible accepts `hosts: web1` (one name) for `hosts: {web1: }`.
                self._section(name, key, {self._value(snode): (snode, None)})
                continue
            if self._is_null(snode):
                continue
            if not isinstance(snode, yaml.MappingNode):
                raise self.error(
                    f"'{key}' of group '{name}' must be a mapping of names, not {self._kind(snode)}; "
                    f"write each entry as 'name:' on its own line under '{key}:'"
                )
            self._section(name, key, self._pairs(snode))
        return name

    def _section(self, group: str, key: str, pairs: dict) -> None:
        if key == "vars":
            for var, (vkey, vnode) in pairs.items():
                self.line = _line(vkey)
                value = self._variable(var, vnode)
                self._set_var(self.inv.groups[group], var, value)
        elif key == "children":
            for child, (ckey, cnode) in pairs.items():
                child = self._group(
                    child,
                    ckey,
                    cnode
                    if cnode is not None
                    else yaml.ScalarNode("tag:yaml.org,2002:null", "", ckey.start_mark, ckey.end_mark),
                )
                self.line = _line(ckey)
                self._add_child(group, child)
        else:
            for pattern, (hkey, hnode) in pairs.items():
                self._hosts(group, pattern, hkey, hnode)

    def _hosts(self, group: str, pattern: Any, key_node: yaml.Node, node: yaml.Node | None) -> None:
        self.line = _line(key_node)
        if not isinstance(pattern, str):
            raise self.error(f"host {pattern!r} must be a string: quote numbers (\"'{pattern}':\")")
        name, port = split_port(pattern)
        try:
            names = expand_range(name)
        except RangeError as err:
            raise self.error(str(err)) from None
        if not names:
            raise self.error(f"host range '{name}' expands to no host; check begin, end and step")
        variables: dict[Any, tuple[yaml.Node, yaml.Node]] = {}
        if node is not None and not self._is_null(node):
            if not isinstance(node, yaml.MappingNode):
                raise self.error(
                    f"the variables of host '{pattern}' must be a mapping (name: value), not {self._kind(node)}"
                )
            variables = self._pairs(node)
        values = []
        for var, (vkey, vnode) in variables.items():
            self.line = _line(vkey)
            values.append((var, vkey, self._variable(var, vnode)))
        for host_name in names:
            self.line = _line(key_node)
            self._add_host(host_name, group, port)
            host = self.inv.hosts[host_name]
            for var, vkey, value in values:
                self.line = _line(vkey)
                self._set_var(host, var, value)

    @staticmethod
    def _kind(node: yaml.Node) -> str:
        if isinstance(node, yaml.SequenceNode):
            return "a list"
        if isinstance(node, yaml.MappingNode):
            return "a mapping"
        return f"the value {node.value!r}"


def load_yaml(path: pathlib.Path, text: str) -> Inventory:
    """Parse an Ansible YAML inventory. Raises InventoryError(message, file, line)."""
    parser = _YamlParser(path, text)
    try:
        return parser.parse()
    finally:
        parser.close()
