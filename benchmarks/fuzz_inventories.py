#!/usr/bin/env python3
"""Differential fuzzer: tunnelspec's inventory readers against Ansible's own.

    python benchmarks/fuzz_inventories.py --cases 3000 --seed 1 --format both

Generates INI and YAML inventories with `hypothesis` (groups, children, nesting, ranges, vars at
every level, values of every type Ansible reads, comments, odd whitespace, unicode names,
duplicate keys, empty groups), some of them mutated (truncated, bytes deleted or inserted, binary,
lines repeated or swapped), and reads each one twice:

- tunnelspec: `load_inventory(FILE).to_ansible_list()` — what `tunnelspec inventory list` prints;
- Ansible: ansible-core's `InventoryCLI.json_inventory` on an `InventoryManager` built in this
  process — the code `ansible-inventory -i FILE --list` runs, with the plugin forced as the
  parity tests force it (`ini` for `.ini`, `yaml` for `.yml`) and unparsed sources fatal. The
  command costs about a second a call; in process it costs a few milliseconds.
  `tests/inventory/test_fuzz_ansible.py` checks that the two give the same JSON.

A case agrees when both give the same JSON, value types included (True is not 1, 1.0 is not 1);
or when both refuse it and tunnelspec's refusal names `file:line`; or when Ansible only warns and
skips and tunnelspec refuses with `file:line`, for the refusals it documents (README
"Inventory", docs/inventory-fuzzing.md): `DOCUMENTED_REFUSALS` below. A refusal without a line, or
any exception other than InventoryError, is a traceback; everything else is a disagreement.

Why hypothesis and not atheris: the inputs are structured (an inventory is a tree of groups, hosts
and typed values, rendered in two syntaxes), hypothesis generates such trees directly and shrinks a
failure to a minimal inventory; a seed makes a run reproducible; it is pure Python (atheris needs
a libFuzzer build of CPython extensions and finds bytes, not inventories).

The last line is always `N cases, D disagreements, T tracebacks`; before it, when D or T is not 0,
the first failing case, minimised, with the seed that finds it. Exit 1 when D or T is not 0.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import math
import os
import pathlib
import re
import sys
import tempfile
import traceback
from dataclasses import dataclass, field

REPO = pathlib.Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from hypothesis import HealthCheck, Phase, given, seed as hyp_seed, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

# ---- the oracle: ansible-core in process ----------------------------------------------------------
os.environ.setdefault("ANSIBLE_NOCOLOR", "1")
os.environ.setdefault("ANSIBLE_INVENTORY_UNPARSED_FAILED", "1")


class Ansible:
    """`ansible-inventory -i FILE --list` in this process (the same InventoryCLI code)."""

    _initialised = False  # ansible's vault context is set up once per process

    def __init__(self):
        from ansible import constants as C
        from ansible.cli.inventory import InventoryCLI
        from ansible.utils.display import Display

        self.C = C
        self.InventoryCLI = InventoryCLI
        self.warnings: list[str] = []
        collected = self.warnings

        def warning(_self, msg, *a, **kw):
            collected.append(str(msg))

        def error_as_warning(_self, msg, exception=None, *a, **kw):
            collected.append(f"{msg}: {exception}")

        def deprecated(_self, msg, *a, **kw):
            collected.append(f"deprecated: {msg}")

        def vvv(_self, msg, *a, **kw):
            collected.append(f"vvv: {msg}")

        # Warnings are data here (they tell "Ansible skipped this" apart from "Ansible read it");
        # the patches hold only while list() runs, so other users of ansible in this process (the
        # pattern tests) see it as it was.
        self._patches = {(Display, "warning"): warning, (Display, "deprecated"): deprecated,
                         (Display, "vvv"): vvv, (Display, "error_as_warning"): error_as_warning,
                         (Display, "display"): lambda *a, **kw: None}

    def list(self, path: pathlib.Path, plugin: str) -> dict:
        """The --list JSON, or raises the AnsibleError that makes the CLI fail."""
        from ansible.inventory.manager import InventoryManager
        from ansible.parsing.dataloader import DataLoader
        from ansible.vars.manager import VariableManager

        settings = {"INVENTORY_ENABLED": [plugin], "INVENTORY_ANY_UNPARSED_IS_FAILED": True,
                    "INVENTORY_UNPARSED_IS_FAILED": True}
        saved = {(self.C, k): getattr(self.C, k) for k in settings}
        saved.update({key: key[0].__dict__[key[1]] for key in self._patches})
        for k, v in settings.items():
            setattr(self.C, k, v)
        for (owner, name), v in self._patches.items():
            setattr(owner, name, v)
        try:
            return self._list(path)
        finally:
            for (owner, name), v in saved.items():
                setattr(owner, name, v)

    def _list(self, path: pathlib.Path) -> dict:
        from ansible.inventory.manager import InventoryManager
        from ansible.parsing.dataloader import DataLoader
        from ansible.vars.manager import VariableManager

        del self.warnings[:]
        cli = self.InventoryCLI(["ansible-inventory", "-i", str(path), "--list"])
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            cli.parse()
            if not Ansible._initialised:
                Ansible._initialised = True
                cli.loader, cli.inventory, cli.vm = cli._play_prereqs()
            else:
                cli.loader = DataLoader()
                cli.inventory = InventoryManager(loader=cli.loader, sources=[str(path)])
                cli.vm = VariableManager(loader=cli.loader, inventory=cli.inventory)
            data = json.loads(cli.dump(cli.json_inventory(cli._get_group("all"))))
        data["_meta"].pop("profile", None)
        return data


def tunnelspec_list(path: pathlib.Path) -> dict:
    """What `tunnelspec inventory list FILE` prints, parsed back (raises InventoryError)."""
    from tunnelspec.inventory import load_inventory

    return json.loads(json.dumps(load_inventory(path).to_ansible_list(), indent=4, sort_keys=True))


# ---- comparing ----------------------------------------------------------------------------------
def same(a, b) -> bool:
    """Equal JSON values with equal types (json's 1, 1.0 and true are three values)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    if isinstance(a, float) and math.isnan(a):
        return math.isnan(b)
    return a == b


def first_difference(a, b, where="") -> str:
    if type(a) is not type(b):
        return f"{where or '/'}: tunnelspec {a!r} ({type(a).__name__}), ansible {b!r} ({type(b).__name__})"
    if isinstance(a, dict):
        for k in sorted(set(a) | set(b), key=str):
            if k not in a or k not in b:
                return f"{where}/{k}: only in {'ansible' if k not in a else 'tunnelspec'}"
            if not same(a[k], b[k]):
                return first_difference(a[k], b[k], f"{where}/{k}")
    if isinstance(a, list) and len(a) == len(b):
        for i, (x, y) in enumerate(zip(a, b)):
            if not same(x, y):
                return first_difference(x, y, f"{where}[{i}]")
    return f"{where or '/'}: tunnelspec {a!r}, ansible {b!r}"


def _warned(pattern):
    regex = re.compile(pattern)
    return lambda warnings, data: any(regex.search(w) for w in warnings)


def _not_utf8(warnings, data):
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return True
    return False


# Where Ansible reads a file with a warning (or carries something no deploy can use), tunnelspec
# stops with file:line, on purpose (README "Inventory", docs/inventory-fuzzing.md):
# (name, when Ansible does that, what tunnelspec then says).
DOCUMENTED_REFUSALS = [
    # an unknown key inside a group (`web: {host: x}`), whatever its value: Ansible warns and skips it
    ("unknown key in a YAML group",
     # (an empty one, `host:`, Ansible skips without a warning: it says so at -vvv only)
     _warned(r"Skipping unexpected key|Skipping key \(.*\) in group \(.*\) as it is not a mapping|"
             r"Skipping empty key \((?!(vars|children|hosts)\))"),
     re.compile(r"unexpected key '.*' in group")),
    # a group that is not a mapping (`web: [a, b]`, `web: 3`): Ansible warns and skips it
    ("YAML group not a mapping", _warned(r"Skipping '.*' as this is not a valid group definition"),
     re.compile(r"group '.*' must be a mapping")),
    # a key written twice in one mapping: Ansible warns and keeps the last one
    ("YAML key written twice", _warned(r"[Dd]uplicate mapping key"),
     re.compile(r"is written twice in the same mapping")),
    # a variable with an empty name, or (YAML) a name that is not a string: Ansible 2.19 accepts it
    # with a deprecation ("invalid name", refused from 2.23)
    ("variable name empty or not a string", _warned(r"inventory variable with invalid name"),
     re.compile(r"has no variable name before '='|variable name .* must be a non-empty string")),
    # bytes that are not UTF-8 outside a comment: Ansible carries them as surrogates into names
    ("INI line not UTF-8", _not_utf8, re.compile(r"line is not valid UTF-8")),
    # a YAML !!set: Ansible lists it in no particular order
    ("YAML !!set", lambda w, data: b"!!set" in data, re.compile(r"is a !!set")),
    # a YAML !!binary value, or a mapping key that is not a string or number (a date): Ansible
    # reads them, and ansible-inventory --list fails as soon as a host carries one
    ("YAML !!binary", lambda w, data: b"!!binary" in data, re.compile(r"is a !!binary value")),
    ("YAML mapping key not JSON", lambda w, data: True, re.compile(r"has a mapping key .* of type")),
]


@dataclass
class Outcome:
    kind: str  # "agree", "disagree" or "traceback"
    detail: str = ""
    ansible: object = None
    tunnelspec: object = None


def judge(path: pathlib.Path, fmt: str, oracle: Ansible) -> Outcome:
    from tunnelspec.core.errors import InventoryError

    try:
        theirs, ansible_error = oracle.list(path, fmt), None
    except Exception as err:  # noqa: BLE001 - any failure of ansible-inventory is "it refuses"
        theirs, ansible_error = None, f"{type(err).__name__}: {err}"
    warnings = list(oracle.warnings)
    try:
        ours, refusal = tunnelspec_list(path), None
    except InventoryError as err:
        ours, refusal = None, err
    except BaseException:  # noqa: BLE001 - this is what the fuzzer looks for
        return Outcome("traceback", traceback.format_exc(limit=-6), ansible_error or theirs)
    if refusal is not None:
        text = path.read_bytes().decode("utf-8", errors="surrogateescape")
        lines = max(len(text.splitlines()), len(re.findall("\r\n|[\r\n\x85\u2028\u2029]", text))) + 1
        if refusal.file != str(path) or refusal.line is None or not 1 <= refusal.line <= lines:
            return Outcome("traceback", f"refusal without a valid file:line: {refusal}", ansible_error or theirs)
        if ansible_error is not None:
            return Outcome("agree", "both refuse")
        for name, ansible_does, says in DOCUMENTED_REFUSALS:
            if says.search(refusal.message) and ansible_does(warnings, path.read_bytes()):
                return Outcome("agree", f"documented refusal: {name}")
        return Outcome("disagree", f"tunnelspec refuses what Ansible reads: {refusal}\n"
                                   f"ansible warnings: {warnings}", theirs, str(refusal))
    if ansible_error is not None:
        return Outcome("disagree", f"tunnelspec reads what Ansible refuses: {ansible_error}", ansible_error, ours)
    if not same(ours, theirs):
        return Outcome("disagree", first_difference(ours, theirs), theirs, ours)
    return Outcome("agree", "same" if len(ours["_meta"]["hostvars"]) or len(ours) > 2 else "same, empty")


# ---- generating -----------------------------------------------------------------------------------
GROUPS = ["web", "db", "g1", "g_2", "Grp", "a-b", "ñandú", "组", "all", "ungrouped", "main", "rpc", "x.y"]
HOSTS = ["h1", "h2", "host-a", "node.example.com", "10.0.0.1", "192.168.1.5", "ñode", "ホスト", "H_3",
         "2001:db8::1", "localhost", "a.b-c", "db01"]
RANGES = ["node[01:03]", "n[a:c]", "x[1:6:2]", "r[0:1]-[a:b]", "s[8:10]", "w[A:C]", "p[001:003:2].lan",
          "q[9:11]x", "h[0:0]", "v[:2]", "k[08:10]", "m[y:Z]", "o[1:3:5]"]
BAD_RANGES = ["z[c:a]", "t[1:3:0]", "u[01:3]", "b[1:2", "c[1:2:3:4]", "d[a:1]", "e[]"]
PORTS = ["", "", "", ":2222", ":22", ":0", ":65536"]
VARS = ["x", "v1", "port_n", "ansible_port", "ansible_host", "ansible_user", "ansible_group_priority",
        "ñ", "with-dash", "CamelCase", "_u", "rpc_port", "inventory_hostname", "groups", "a.b"]

INI_VALUES = [
    "1", "-7", "+3", "0", "007", "0x1F", "0o17", "0b101", "1_000", "1e3", "1.5", ".5", "-0.0", "1.", "inf",
    "True", "False", "true", "false", "yes", "no", "on", "None", "null", "~",
    "'quoted'", '"dq"', '"a b"', "'it''s'", '"esc\\"q"', "''", '""', "'#not a comment'", "a#b",
    "[1, 'a']", "[]", "{'k': 1}", "{}", "{1: 2}", "(1, 2)", "(1,)", "{1, 2}", "b'x'", "1+2j", "...",
    "abc", "a=b", "a:b", "ü", "日本", "/srv/m.gguf", "hf://o/r/f.gguf@main", "{{ x }}", "[1, [2, {'a': None}]]",
    "'a b'", '"x  y"', "'1 2'", "-", "'x'y'", "1_0.5", "0_7", "1e", "--1", "~x", "None_", "True1",
]
SPACED_VALUES = ["'a' 'b'", "1 2", "x y", "a # b", "[1, 2]", "{'a': 1, 'b': 2}"]  # a host line splits these
YAML_SCALARS = [
    "1", "-7", "0", "007", "010", "0o17", "0x1f", "0b101", "1_000", "1:20", "190:20:30", "1.5", ".5", "1e3",
    "1.0e+3", "-.inf", ".Inf", ".nan", "6.8523015e+5", "685_230.15",
    "yes", "No", "on", "OFF", "y", "n", "true", "False", "TRUE", "~", "null", "Null", "",
    "'quoted'", '"dq\\n"', '"uni \\u00e9"', "'it''s'", "2020-01-01", "2001-12-14t21:59:43.10-05:00",
    "2001-12-14 21:59:43.10 -5", "abc", "a b", "ü", "日本", "'123'", '"yes"', "!!str 5", "!!int '7'",
    "!!float 3", "!!bool yes", "!!null ''", "[1, a, yes]", "[]", "{a: 1, b: [x]}", "{}",
    "[1, [2, {a: null}]]", "!!binary aGk=", "!!set {a, b}", "&anc 5", "'#x'", "a #comment", "=",
]


TEXT = st.text(alphabet=st.characters(blacklist_categories=("Cc", "Cs")), max_size=6)


def _pick(pool):
    return st.one_of(st.sampled_from(pool), st.sampled_from(pool), TEXT)


def _names(draw, pool, lo, hi, fresh=None):
    """A few names from the pool, distinct most of the time (a repeated key is its own case)."""
    names = draw(st.lists(st.sampled_from(pool) if fresh is None else fresh, min_size=lo, max_size=hi, unique=True))
    if names and draw(st.integers(0, 12)) == 0:
        names.append(draw(st.sampled_from(names)))
    return names


@st.composite
def ini_inventory(draw) -> str:
    """Mostly coherent inventories (sections for declared groups, children that exist), with every
    kind of line, value and whitespace; a few incoherent lines on purpose."""
    ws = st.sampled_from(["", "", "", "", " ", "  ", "\t", " \t "])
    comment = st.sampled_from(["", "", "", "", "", " # c", " #", "  #x=1", "\t; c"])
    groups = _names(draw, [g for g in GROUPS if g not in ("all", "ungrouped")], 0, 4)
    order = list(groups)
    lines: list[str] = []

    def host_line():
        name = draw(st.one_of(st.sampled_from(HOSTS), st.sampled_from(RANGES))) + draw(st.sampled_from(PORTS))
        if draw(st.integers(0, 15)) == 0:
            name = draw(st.sampled_from(BAD_RANGES))
        parts = [name]
        for var in _names(draw, VARS, 0, 3, _pick(VARS)):
            value = draw(_pick(INI_VALUES))
            if " " in value or draw(st.integers(0, 20)) == 0:
                value = draw(st.sampled_from(["'", '"'])).join(["", draw(st.sampled_from(SPACED_VALUES)), ""])
            parts.append(f"{var}={value}")
        return draw(ws) + (" " * draw(st.integers(1, 2))).join(parts) + draw(comment)

    def var_line():
        eq = draw(st.sampled_from(["=", " = ", "= ", " =", "=", ": "]))
        value = draw(st.one_of(_pick(INI_VALUES), _pick(INI_VALUES), st.sampled_from(SPACED_VALUES)))
        return draw(ws) + f"{draw(_pick(VARS))}{eq}{value}" + draw(comment)

    if draw(st.booleans()):  # hosts before any section: ungrouped
        lines += [host_line() for _ in range(draw(st.integers(1, 2)))]
    declared: list[str] = []
    for _ in range(draw(st.integers(1, 7))):
        kind = draw(st.sampled_from(["hosts", "hosts", "vars", "children", "comment", "blank"]))
        if kind == "comment":
            lines.append(draw(ws) + draw(st.sampled_from(["#", ";"])) + draw(st.text(max_size=10)))
            continue
        if kind == "blank":
            lines.append(draw(ws))
            continue
        if kind == "hosts" or not declared:
            group = order.pop(0) if order else draw(st.sampled_from(GROUPS))
            kind = "hosts" if kind == "hosts" or draw(st.booleans()) else kind
        else:
            group = draw(st.sampled_from(declared + ["all", "ungrouped"]))
        if draw(st.integers(0, 12)) == 0:
            group = draw(st.sampled_from(GROUPS))  # maybe never declared, maybe 'all'
        lines.append(draw(ws) + (f"[{group}]" if kind == "hosts" else f"[{group}:{kind}]") + draw(comment))
        if kind == "hosts":
            declared.append(group)
        for _ in range(draw(st.integers(0, 4))):
            if kind == "hosts":
                lines.append(host_line())
            elif kind == "vars":
                lines.append(var_line())
            else:
                kids = [g for g in declared + ["ungrouped"] if g != group] or GROUPS
                if draw(st.integers(0, 10)) == 0:
                    kids = GROUPS
                lines.append(draw(ws) + draw(st.sampled_from(kids)) + draw(comment))
    return "\n".join(lines) + draw(st.sampled_from(["\n", "", "\n\n", "\r\n"]))


def _yaml_value(draw, depth=0) -> str:
    if depth < 2 and draw(st.integers(0, 9)) == 0:
        items = [draw(st.sampled_from(YAML_SCALARS[:40])) for _ in range(draw(st.integers(0, 3)))]
        return "[" + ", ".join(i or "''" for i in items) + "]"
    return draw(st.one_of(st.sampled_from(YAML_SCALARS), st.sampled_from(YAML_SCALARS), TEXT))


def _yaml_mapping(draw, entries: list[tuple[str, list[str] | str | None]], indent: int) -> list[str]:
    """entries: (key, nested lines | inline value | None for empty)."""
    pad = " " * indent
    out = []
    for key, body in entries:
        if body is None:
            out.append(f"{pad}{key}:" + draw(st.sampled_from(["", "", " ~", " {}", " null", " # c"])))
        elif isinstance(body, str):
            out.append(f"{pad}{key}: {body}")
        else:
            out.append(f"{pad}{key}:" + draw(st.sampled_from(["", "", " # c"])))
            out.extend(body)
    return out


def _yaml_key(draw, pool) -> str:
    name = draw(_pick(pool))
    if not name or name[0] in "!&*%@`'\"[]{}#|>-?,:" or ": " in name or " #" in name or name != name.strip():
        name = f'"{json.dumps(name)[1:-1]}"'
    return name


def _yaml_group(draw, depth: int, indent: int) -> list[str] | str | None:
    if depth and draw(st.integers(0, 7)) == 0:
        return None
    if draw(st.integers(0, 30)) == 0:  # not a mapping: Ansible skips it with a warning
        return draw(st.sampled_from(["[a, b]", "3", "x"]))
    sections = []
    for section in _names(draw, ["hosts", "vars", "children"], 1 if depth < 2 else 0, 3):
        if section == "hosts":
            hosts = []
            for name in _names(draw, HOSTS + RANGES, 1, 3):
                if draw(st.integers(0, 15)) == 0:
                    name = draw(st.sampled_from(BAD_RANGES))
                name += draw(st.sampled_from(PORTS))
                name = draw(st.sampled_from([name, name, name, f"'{name}'", f'"{name}"']))
                hv = [(k, _yaml_value(draw)) for k in _names(draw, VARS, 0, 3, st.builds(_yaml_key, st.just(draw), st.just(VARS)))]
                hosts.append((name, _yaml_mapping(draw, hv, indent + 6) if hv else None))
            body = _yaml_mapping(draw, hosts, indent + 4)
            if draw(st.integers(0, 15)) == 0:
                body = draw(st.sampled_from(HOSTS))  # `hosts: h1` (one name)
        elif section == "vars":
            vs = [(k, _yaml_value(draw)) for k in _names(draw, VARS, 0, 4, st.builds(_yaml_key, st.just(draw), st.just(VARS)))]
            body = _yaml_mapping(draw, vs, indent + 4) if vs else None
        else:
            kids = []
            if depth < 3:
                for kid in _names(draw, GROUPS, 0, 2):
                    kids.append((kid, _yaml_group(draw, depth + 1, indent + 4)))
            body = _yaml_mapping(draw, kids, indent + 4) if kids else None
        sections.append((section, body))
    if draw(st.integers(0, 25)) == 0:  # an unknown key: Ansible warns and skips it
        sections.append((draw(st.sampled_from(["host", "var", "child", "Hosts"])), draw(st.sampled_from([None, "{}", "1"]))))
    return _yaml_mapping(draw, sections, indent + 2) if sections else None


@st.composite
def yaml_inventory(draw) -> str:
    top = []
    if draw(st.integers(0, 4)):
        top.append(("all", _yaml_group(draw, 0, 0)))
    for name in _names(draw, [g for g in GROUPS if g != "all"], 0 if top else 1, 2):
        top.append((name, _yaml_group(draw, 1, 0)))
    lines = _yaml_mapping(draw, top, 0)
    head = draw(st.sampled_from(["", "", "---\n", "# inventory\n", "%YAML 1.1\n---\n"]))
    for _ in range(draw(st.integers(0, 2))):  # comments and blank lines anywhere
        at = draw(st.integers(0, len(lines)))
        lines.insert(at, draw(st.sampled_from(["", "# c", "   # indented comment", "  "])))
    return head + "\n".join(lines) + draw(st.sampled_from(["\n", "", "\n...\n"]))


TOKENS = [b"[", b"]", b":", b"=", b"\x00", b"\xff", b"\xc3", b"\t", b"\r", b"\r\n", b"'", b'"', b"{", b"}",
          b"- ", b"&a ", b"*a", b"<<: ", b"#", b"\n", b"\n  ", b" ", b"\xe2\x80\xa8", b"\x1b", b"!!", b"%", b"|", b">"]


@st.composite
def mutated(draw, base) -> bytes:
    data = draw(base).encode("utf-8")
    for _ in range(draw(st.integers(1, 3))):
        op = draw(st.sampled_from(["truncate", "delete", "insert", "insert", "dupline", "swaplines", "binary"]))
        at = draw(st.integers(0, len(data)))
        if op == "truncate":
            data = data[:at]
        elif op == "delete":
            data = data[:at] + data[at + draw(st.integers(1, 8)):]
        elif op == "insert":
            data = data[:at] + draw(st.sampled_from(TOKENS)) + data[at:]
        elif op == "binary":
            data = data[:at] + draw(st.binary(min_size=1, max_size=8)) + data[at:]
        else:
            lines = data.split(b"\n")
            i, j = draw(st.integers(0, len(lines) - 1)), draw(st.integers(0, len(lines) - 1))
            if op == "dupline":
                lines.insert(j, lines[i])
            else:
                lines[i], lines[j] = lines[j], lines[i]
            data = b"\n".join(lines)
    return data


def cases(fmt: str):
    """(format, file bytes): clean inventories mostly, a quarter of them mutated."""
    strategies = []
    for f, gen in (("ini", ini_inventory()), ("yaml", yaml_inventory())):
        if fmt in (f, "both"):
            strategies.append(st.tuples(st.just(f), st.one_of(gen.map(str.encode), gen.map(str.encode),
                                                              gen.map(str.encode), mutated(gen))))
    return st.one_of(strategies)


# ---- running --------------------------------------------------------------------------------------
@dataclass
class Report:
    cases: int = 0
    disagreements: int = 0
    tracebacks: int = 0
    first: tuple | None = None  # (format, bytes, Outcome)
    minimal: tuple | None = None
    log: list = field(default_factory=list)
    kinds: dict = field(default_factory=dict)  # how the cases agreed: "same", "both refuse"...

    @property
    def last_line(self) -> str:
        return f"{self.cases} cases, {self.disagreements} disagreements, {self.tracebacks} tracebacks"


class _Failure(Exception):
    pass


def run(n: int, seed: int, fmt: str = "both", workdir: pathlib.Path | None = None, minimise: bool = True) -> Report:
    """Run n generated cases against Ansible; when one fails, minimise the first failure."""
    oracle = Ansible()
    report = Report()
    tmp = tempfile.TemporaryDirectory(prefix="fuzzinv-") if workdir is None else None
    where = pathlib.Path(tmp.name) if tmp else workdir
    counter = [0]

    def check(case) -> Outcome:
        f, data = case
        counter[0] += 1
        path = where / f"case{counter[0]}.{'ini' if f == 'ini' else 'yml'}"
        path.write_bytes(data)
        try:
            return judge(path, f, oracle)
        finally:
            path.unlink()

    common = dict(database=None, deadline=None, derandomize=False, suppress_health_check=list(HealthCheck))

    @hyp_seed(seed)
    @settings(max_examples=n, phases=[Phase.generate], **common)
    @given(cases(fmt))
    def explore(case):
        out = check(case)
        report.cases += 1
        label = f"{case[0]} {out.kind}: {out.detail.splitlines()[0][:40] if out.kind == 'agree' else ''}"
        report.kinds[label] = report.kinds.get(label, 0) + 1
        if out.kind == "disagree":
            report.disagreements += 1
        elif out.kind == "traceback":
            report.tracebacks += 1
        if out.kind != "agree":
            report.log.append((case[0], case[1], out))
            if report.first is None:
                report.first = (case[0], case[1], out)

    try:
        explore()
        if report.first is not None and minimise:
            kind = report.first[2].kind

            @hyp_seed(seed)
            @settings(max_examples=n, phases=[Phase.generate, Phase.shrink], **common)
            @given(cases(fmt))
            def shrink(case):
                out = check(case)
                if out.kind == kind:
                    report.minimal = (case[0], case[1], out)
                    raise _Failure(out.kind)

            try:
                shrink()
            except _Failure:
                pass
    finally:
        if tmp:
            tmp.cleanup()
    return report


def describe(case: tuple, seed: int) -> str:
    fmt, data, out = case
    text = data.decode("utf-8", errors="backslashreplace")
    return (f"--- {out.kind} ({fmt}), seed {seed}, minimised:\n{text}\n--- file bytes: {data!r}\n"
            f"--- {out.detail}\n")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cases", type=int, default=300)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--format", choices=["ini", "yaml", "both"], default="both")
    ap.add_argument("--show-all", action="store_true", help="print every failing case (not minimised)")
    args = ap.parse_args(argv)
    report = run(args.cases, args.seed, args.format)
    if args.show_all:
        for fmt, data, out in report.log:
            print(f"=== {out.kind} ({fmt}) {data!r}\n    {out.detail.strip()[-900:]}")
    for label, count in sorted(report.kinds.items()):
        print(f"  {count:6d}  {label}")
    shown = report.minimal or report.first
    if shown is not None:
        print(describe(shown, args.seed))
    print(report.last_line)
    return 1 if report.disagreements or report.tracebacks else 0


if __name__ == "__main__":
    sys.exit(main())
