"""jinja2 with StrictUndefined: an unknown variable is an error, never an empty string.

Each distinct source (task argument, `when:` expression, template file) is compiled once per process
and its code kept on disk between runs (core/codecache.py): a no-op deploy renders ≈ 165 of them."""

from __future__ import annotations

import functools
import io
import re
import shlex
from types import CodeType
from typing import Any

import jinja2
from jinja2 import nodes
from jinja2.compiler import CodeGenerator, Frame
from jinja2.environment import TemplateExpression
from jinja2.parser import Parser

from tunnelspec.core.codecache import CodeCache
from tunnelspec.core.secrets import Secret
from tunnelspec.core.booleans import truthy

_ENV = jinja2.Environment(undefined=jinja2.StrictUndefined, keep_trailing_newline=True, autoescape=False)
_ENV.filters["bool"] = truthy
_ENV.filters["shlex_join"] = lambda v: shlex.join(map(str, v))
_SETTINGS = (
    "block_start_string block_end_string variable_start_string variable_end_string comment_start_string "
    "comment_end_string line_statement_prefix line_comment_prefix trim_blocks lstrip_blocks newline_sequence "
    "keep_trailing_newline optimized autoescape is_async"
).split()
_WHOLE = re.compile(r"^\{\{\s*(.+?)\s*\}\}$", re.S)


def _context(e: jinja2.Environment) -> str:
    """What decides the code jinja2 generates for a source, for the disk cache's key: its version, the
    syntax and settings, and the names of the filters, tests and globals (the code looks a filter up
    by name; a global is not a variable the template reads)."""
    settings = [getattr(e, n) for n in _SETTINGS] + [e.finalize is not None, e.undefined.__name__]
    names = (sorted(e.extensions), sorted(e.filters), sorted(e.tests), sorted(e.globals))
    return repr((jinja2.__version__, type(e).__name__, settings, names))


_DISK = CodeCache("templates", _context(_ENV))


class _Codegen(CodeGenerator):
    """jinja2's code generator (what `Environment.compile` runs) that also notes the names the
    template reads from its context, as jinja2.meta.find_undeclared_variables does in a second pass
    of the same generator over the same tree."""

    def __init__(self, environment: jinja2.Environment) -> None:
        self.text = io.StringIO()
        super().__init__(environment, None, None, self.text, False, environment.optimized)
        self.names: set[str] = set()

    def enter_frame(self, frame: Frame) -> None:
        super().enter_frame(frame)
        for _, (action, param) in frame.symbols.loads.items():
            if action == "resolve" and param not in self.environment.globals:
                self.names.add(param)


def _compile(kind: str, source: str) -> tuple[CodeType, frozenset[str]]:
    """The code of a template ("template") or of an expression, and the names it reads: from the disk
    cache, else parsed once, generated once and compiled, with the errors jinja2's `from_string` and
    `compile_expression` raise (the same parse, the same messages); errors are not kept. A change to
    how the code is made here bumps codecache.VERSION (jinja2's version is in the key already)."""
    key = _DISK.key(kind, source)
    found = _DISK.get(key)
    if found is not None:
        return found
    if kind == "template":
        tree = _ENV.parse(source)  # a syntax error is raised as from_string raises it
        hint: str | None = source
    else:
        tree, hint = _expression_tree(source), None
    gen = _Codegen(_ENV)
    try:
        gen.visit(tree)
        code = compile(gen.text.getvalue(), "<template>", "exec", dont_inherit=True)  # not our __future__
    except jinja2.TemplateSyntaxError:
        _ENV.handle_exception(source=hint)
    names = frozenset(gen.names)
    _DISK.put(key, code, names)
    return code, names


def _expression_tree(source: str) -> nodes.Template:
    """`Environment.compile_expression`'s tree: a template assigning the expression to `result`."""
    parser = Parser(_ENV, source, state="variable")
    try:
        expr = parser.parse_expression()
        if not parser.stream.eos:
            raise jinja2.TemplateSyntaxError("chunk after expression", parser.stream.current.lineno, None, None)
        expr.set_environment(_ENV)
    except jinja2.TemplateSyntaxError:
        _ENV.handle_exception(source=source)
    return nodes.Template([nodes.Assign(nodes.Name("result", "store"), expr, lineno=1)], lineno=1)


def _from_code(code: CodeType) -> jinja2.Template:
    return _ENV.template_class.from_code(_ENV, code, _ENV.make_globals(None), None)


@functools.lru_cache(maxsize=1024)
def _template(source: str) -> tuple[jinja2.Template, frozenset[str]]:
    # The same task args are rendered for every host: each distinct source is made a Template once
    # per run. With it: the names it reads (see _pick).
    code, names = _compile("template", source)
    return _from_code(code), names


@functools.lru_cache(maxsize=1024)
def _expression(source: str) -> tuple[TemplateExpression, frozenset[str]]:
    code, names = _compile("expression", source)
    return TemplateExpression(_from_code(code), undefined_to_none=False), names


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
