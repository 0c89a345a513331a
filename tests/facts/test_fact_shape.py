"""Facts have one shape: every public fact function of tunnelspec/facts returns a `Fact` — an argv
(a list of str) and a pure parser of what it prints — and the host probes that used to live elsewhere
under their own spellings stay here (the old names are gone from the whole package)."""

from __future__ import annotations

import ast
import importlib
import inspect
import json
import pkgutil
from pathlib import Path

import pytest

import tunnelspec
import tunnelspec.facts
from tests.facts.test_fact_cases import _text, jsonable
from tunnelspec.facts.fact import Fact

CASES = Path(__file__).resolve().parent / "cases"
PACKAGE = Path(tunnelspec.__file__).resolve().parent

# Representative arguments, by parameter name, for calling every fact function.
ARGS = {
    "path": "/etc/tunnelspec/isolation.nft",
    "build_root": "/opt/tunnelspec",
    "users": ["tunnelspec-llama", "tunnelspec-rpc"],
    "names": ["tunnelspec-tunnel-n1.service"],
    "unit": "tunnelspec-llama.service",
    "props": ["ActiveState", "MainPID"],
    "prop": "ActiveState",
    "units": ["a.service", "b.service"],
    "port": 50052,
    "sshd": "/usr/sbin/sshd",
    "user": "tunnelspec-tunnel",
    "address": "127.0.0.1",
}
# Sample outputs for the facts no case under cases/ names (their parse is a one-liner): (text, value).
SAMPLES = {
    ("sockets", "established"): ("0 0 127.0.0.1:50052 127.0.0.1:41234\n\n", 1),
    ("files", "executable_id"): ("/opt/b/bin/llama-server\nabc123  -\n", "/opt/b/bin/llama-server abc123 -"),
    ("safe_read", "file_text"): ('{"mode": "full"}\n', '{"mode": "full"}\n'),
}
# Names the package no longer defines anywhere: the old spellings of a fact's command, and the host
# probes moved into facts/ (death.parse_props is units.properties; server's binary id is files.executable_id).
GONE = {
    "COMMAND",
    "CLOSE_WAIT_COMMAND",
    "facts_argv",
    "observe_argv",
    "stale_argv",
    "show_argv",
    "unit_values_argv",
    "service_state_argv",
    "established_command",
    "parse_props",
    "_binary_id_argv",
}


def _fact_functions():
    out = []
    for info in pkgutil.iter_modules(tunnelspec.facts.__path__):
        mod = importlib.import_module(f"tunnelspec.facts.{info.name}")
        for name, fn in inspect.getmembers(mod, inspect.isfunction):
            if fn.__module__ == mod.__name__ and not name.startswith("_"):
                ret = inspect.signature(fn).return_annotation
                if isinstance(ret, str) and ret.startswith("Fact["):
                    out.append(pytest.param(info.name, name, fn, id=f"{info.name}.{name}"))
    return out


def _cases_of(module: str, name: str) -> list[dict]:
    cases = [json.loads(p.read_text()) for p in sorted((CASES / module).glob("*.json"))]
    return [c for c in cases if (c.get("command_from") or {}).get("call") == name and "expected" in c]


def test_every_fact_module_has_facts():
    modules = {p.values[0] for p in _fact_functions()}
    assert modules == {"files", "host", "nft", "port_owners", "safe_read", "sockets", "sshd", "units"}


@pytest.mark.parametrize("module,name,fn", _fact_functions())
def test_a_fact_function_returns_an_argv_and_a_pure_parser(module, name, fn):
    params = inspect.signature(fn).parameters
    fact = fn(*(ARGS[p] for p, v in params.items() if v.default is inspect.Parameter.empty))
    assert isinstance(fact, Fact)
    assert isinstance(fact.argv, list) and fact.argv and all(isinstance(w, str) for w in fact.argv)
    assert not inspect.iscoroutinefunction(fact.parse), "a parser reads text, it does not run a probe"
    # Fed a host's output (a case's, built with the case's own arguments, or a sample): the case's value,
    # the same value twice.
    samples = [
        (fn(*c["command_from"].get("args", [])), _text(c["output"]), c["expected"]) for c in _cases_of(module, name)
    ]
    samples = samples or [(fact, *SAMPLES[(module, name)])]
    for built, text, expected in samples:
        assert jsonable(built.parse(text)) == expected
        assert jsonable(built.parse(text)) == expected, "the same text parses to the same value"


def test_the_old_spellings_and_the_moved_probes_are_gone():
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name in GONE:
                found.append(f"{path.relative_to(PACKAGE)}: def {node.name}")
            elif isinstance(node, ast.Assign):
                found += [
                    f"{path.relative_to(PACKAGE)}: {t.id} ="
                    for t in node.targets
                    if isinstance(t, ast.Name) and t.id in GONE
                ]
    assert found == []


def test_fact_modules_spell_a_command_one_way():
    """Inside facts/, a command is reached through its fact function: no public `*_argv`, `command`,
    `argv` or `*_COMMAND` beside it."""
    found = []
    for info in pkgutil.iter_modules(tunnelspec.facts.__path__):
        mod = importlib.import_module(f"tunnelspec.facts.{info.name}")
        for name in vars(mod):
            if name.startswith("_"):
                continue
            if name.endswith("_argv") or name in ("argv", "command") or name.endswith("COMMAND"):
                found.append(f"{info.name}.{name}")
    assert found == []
