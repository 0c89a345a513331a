"""jinja2 with StrictUndefined: an unknown variable is an error, never an empty string."""

from __future__ import annotations

import functools
import re
from typing import Any

import jinja2
from jinja2 import meta

from tunnelspec.core.secrets import Secret
from tunnelspec.core.booleans import truthy

_ENV = jinja2.Environment(undefined=jinja2.StrictUndefined, keep_trailing_newline=True, autoescape=False)
_ENV.filters["bool"] = truthy
_ENV.filters["shlex_join"] = lambda v: __import__("shlex").join(map(str, v))
_WHOLE = re.compile(r"^\{\{\s*(.+?)\s*\}\}$", re.S)


@functools.lru_cache(maxsize=1024)
def _template(source: str) -> tuple[jinja2.Template, frozenset[str]]:
    # Compiling is most of the cost of rendering (parse + Python codegen); the same task args are
    # rendered for every host, so each distinct source is compiled once per run. With it: the names
    # it reads (see _pick).
    return _ENV.from_string(source), _names(source)


@functools.lru_cache(maxsize=1024)
def _expression(source: str):
    return _ENV.compile_expression(source, undefined_to_none=False), _names("{{ " + source + " }}")


def _names(source: str) -> frozenset[str]:
    try:
        return frozenset(meta.find_undeclared_variables(_ENV.parse(source)))
    except jinja2.TemplateError:
        return frozenset()  # the compile above raised already, or will, with the real message


def _pick(variables, names: frozenset[str]) -> dict:
    """Only the variables a template reads. A host's variables are layers (a ChainMap of inventory,
    play, -e, registered results): passing all of them made jinja2 copy every key of every layer
    for each of the ~100 renders per host. A name not found stays out, so StrictUndefined still
    reports it by name."""
    return {k: variables[k] for k in names if k in variables}


class TemplateError(Exception):
    pass


def env() -> jinja2.Environment:
    return _ENV


def render_value(value: Any, variables: dict) -> Any:
    """Render strings inside value; a string that is one whole expression keeps its native type."""
    try:
        if isinstance(value, str):
            if "{{" not in value and "{%" not in value:
                return value
            m = _WHOLE.match(value)
            if m and "{{" not in m.group(1):
                expr, names = _expression(m.group(1))
                out = expr(**_pick(variables, names))
                if isinstance(out, jinja2.Undefined):
                    str(out)  # raises UndefinedError with the variable's name
                return out
            tpl, names = _template(value)
            return tpl.render(**_pick(variables, names))
        if isinstance(value, dict):
            return {k: render_value(v, variables) for k, v in value.items()}
        if isinstance(value, list):
            return [render_value(v, variables) for v in value]
        return value
    except jinja2.UndefinedError as e:
        raise TemplateError(str(e)) from None
    except jinja2.TemplateError as e:
        raise TemplateError(f"template error: {e}") from None


def evaluate(expr: str | bool, variables: dict) -> bool:
    if isinstance(expr, bool):
        return expr
    try:
        compiled, names = _expression(str(expr))
        return bool(compiled(**_pick(variables, names)))
    except jinja2.UndefinedError as e:
        raise TemplateError(str(e)) from None
    except jinja2.TemplateError as e:
        raise TemplateError(f"in 'when: {expr}': {e}") from None


def render_file(text: str, variables: dict, name: str = "template") -> str:
    try:
        tpl, names = _template(text)
        return tpl.render(**_pick(variables, names))
    except jinja2.UndefinedError as e:
        raise TemplateError(f"{name}: {e}") from None
    except jinja2.TemplateError as e:
        raise TemplateError(f"{name}:{getattr(e, 'lineno', '?')}: {e}") from None


def collect_secrets(variables: dict) -> list[str]:
    return [v.reveal() for v in variables.values() if isinstance(v, Secret)]
