"""Facts as data (pyinfra's fixtures): every `cases/<fact>/<case>.json` holds the command a fact of
tunnelspec/facts/<fact>.py runs, what that command printed on a host, and the value the fact's pure
parser must make of it. How to write one: tests/facts/README.md."""

from __future__ import annotations

import asyncio
import builtins
import dataclasses
import functools
import importlib
import inspect
import json
import pkgutil
from pathlib import Path

import pytest

import tunnelspec.facts
from tunnelspec.connection.base import Result
from tunnelspec.facts.fact import Fact

CASES = Path(__file__).resolve().parent / "cases"
# The keys a case may have, in the order its file gives them (tests/facts/README.md says what each means).
KEYS = set(
    "about source command command_from parser fact args output_param output_bytes rc stderr output "
    "expected raises xfail".split()
)
# Parsers outside the `parse*` names that each need their cases too (module: names).
EXTRA_PARSERS = {"sshd": {"sshd_includes"}, "files": {"_many_split"}, "units": {"_services_split"}}
# Facts whose parser is inline in the fact function (`res.stdout.split()`, ...): driven whole.
INLINE_FACTS = {"units": {"unit_values"}, "sockets": {"clients_of"}, "sshd": {"effective_settings"}}
# PortRule and ListenRule have the same fields: their dicts say which one they are.
KIND = {"PortRule": "connect", "ListenRule": "listen"}


def _case_files() -> list[Path]:
    return sorted(CASES.glob("*/*.json"))


def _load(path: Path) -> dict:
    return json.loads(path.read_text())


def _text(value) -> str:
    """A case's text: a string as is, or a list of lines (each ends with a newline; a line that is a
    JSON object or list stands for the one line `json.dumps` prints, as `nft -j` prints its output)."""
    if isinstance(value, str):
        return value
    return "".join((line if isinstance(line, str) else json.dumps(line)) + "\n" for line in value)


def _argv(command: list) -> list[str]:
    """A case's command: an argv whose elements may be lists of lines (a script), joined by newlines."""
    return [w if isinstance(w, str) else "\n".join(w) for w in command]


def jsonable(value):
    """A parsed value as the case's `expected` writes it: dataclasses as dicts (the class's own
    `to_dict` where it has one), tuples as lists, bytes as text."""
    if hasattr(value, "to_dict") and dataclasses.is_dataclass(value):
        return jsonable(value.to_dict())
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        d = {f.name: jsonable(getattr(value, f.name)) for f in dataclasses.fields(value)}
        kind = KIND.get(type(value).__name__)
        return {"kind": kind, **d} if kind else d
    if isinstance(value, dict):
        return {k: jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    if isinstance(value, bytes):
        return value.decode()
    return value


def _module(fact: str):
    return importlib.import_module(f"tunnelspec.facts.{fact}")


def _built(fact: str, spec: dict):
    """What the module builds for the case: a Fact (the fact functions of tunnelspec/facts), or an argv
    (`read_argv` of connection/base.py, `_many_command` of a merged probe)."""
    mod = importlib.import_module(spec.get("module", f"tunnelspec.facts.{fact}"))
    return getattr(mod, spec["call"])(*spec.get("args", []))


def _parser_of(built: Fact):
    """The module function a Fact parses with (under a `functools.partial` that binds its other arguments)."""
    return built.parse.func if isinstance(built.parse, functools.partial) else built.parse


class _Conn:
    """Answers the one probe a fact runs with the case's output, and keeps the argv it was asked."""

    def __init__(self, case: dict):
        self.case, self.asked = case, []

    async def probe(self, argv, *, check=False, **_):
        self.asked.append(list(argv))
        rc = self.case.get("rc", 0)
        assert not (check and rc), "a checked probe that fails raises in the connection: not a fact case"
        out = _text(self.case["output"])
        return Result(list(argv), rc, out, _text(self.case.get("stderr", "")), out.encode())


def _params():
    out = []
    for path in _case_files():
        case = _load(path)
        marks = [pytest.mark.xfail(reason=case["xfail"], strict=True)] if "xfail" in case else []
        out.append(pytest.param(path, id=f"{path.parent.name}/{path.stem}", marks=marks))
    return out


@pytest.mark.parametrize("path", _params())
def test_fact_case(path: Path):
    case = _load(path)
    fact = path.parent.name
    mod = _module(fact)
    assert set(case) <= KEYS, f"unknown keys {sorted(set(case) - KEYS)}"
    assert ("parser" in case) != ("fact" in case), "a case names a parser or a fact, not both"
    assert ("expected" in case) != ("raises" in case), "a case gives expected or raises"
    if "fact" in case:
        # The whole fact, against a connection that answers its probe with the case's output.
        conn = _Conn(case)
        call = lambda: asyncio.run(getattr(mod, case["fact"])(conn, *case.get("args", [])))  # noqa: E731
    else:
        # A parser: its command is the module's own (constant or builder) wherever it has one.
        assert "command_from" in case, "command_from: the module's constant or builder (null where it has none)"
        parser = getattr(mod, case["parser"])
        if case["command_from"] is not None:
            built = _built(fact, case["command_from"])
            argv = built.argv if isinstance(built, Fact) else built
            assert argv == _argv(case["command"]), (
                "the module builds another command than the case's: update the case (and its output)"
            )
            if isinstance(built, Fact):
                assert _parser_of(built) is parser, "the fact parses with another function than the case's parser"
        text = _text(case["output"])
        output = text.encode() if case.get("output_bytes") else text
        kwargs = dict(case.get("args", {}))
        param = case.get("output_param")
        call = (lambda: parser(**{param: output}, **kwargs)) if param else (lambda: parser(output, **kwargs))
    if "raises" in case:
        with pytest.raises(getattr(builtins, case["raises"]["type"]), match=case["raises"].get("match")):
            call()
    else:
        assert jsonable(call()) == case["expected"]
    if "fact" in case:
        assert conn.asked == [_argv(case["command"])], "the fact ran another command than the case's"


def _parsers() -> dict[str, set[str]]:
    """Every fact module's parsers: its functions named parse*, and those named above."""
    out: dict[str, set[str]] = {}
    for info in pkgutil.iter_modules(tunnelspec.facts.__path__):
        mod = _module(info.name)
        names = {
            n
            for n, f in inspect.getmembers(mod, inspect.isfunction)
            if f.__module__ == mod.__name__ and n.startswith("parse")
        }
        out[info.name] = names | EXTRA_PARSERS.get(info.name, set()) | INLINE_FACTS.get(info.name, set())
    return out


def test_every_fact_parser_has_two_cases():
    counts: dict[tuple[str, str], int] = {}
    for path in _case_files():
        case = _load(path)
        key = (path.parent.name, case.get("parser") or case.get("fact"))
        counts[key] = counts.get(key, 0) + 1
    missing = [
        f"{m}.{p} ({counts.get((m, p), 0)} cases)"
        for m, names in _parsers().items()
        for p in sorted(names)
        if counts.get((m, p), 0) < 2
    ]
    assert missing == [], "fact parsers with fewer than 2 cases under tests/facts/cases/"


def test_case_files_are_written_as_the_readme_says():
    """Indent 2, keys in the file's own order, one trailing newline: a case reads as it diffs."""
    for path in _case_files():
        text = path.read_text()
        assert text == json.dumps(json.loads(text), indent=2, ensure_ascii=False) + "\n", path.name
