"""Templating renders with only the variables a template reads; errors still name what is missing."""

from __future__ import annotations

from collections import ChainMap

import pytest

from tunnelspec.core.templating import TemplateError, evaluate, render_file, render_value


class Guarded(dict):
    """Host variables where reading one key is an error: a render must not touch keys it does not use."""

    def __getitem__(self, key):
        if key == "poison":
            raise AssertionError("read a variable the template does not use")
        return super().__getitem__(key)


def variables():
    return ChainMap({"port": 15052}, Guarded(poison=1, host="10.77.0.11", items=["a", "b"], flag="yes"))


def test_renders_use_only_the_names_they_read():
    v = variables()
    assert render_value("{{ port }}", v) == 15052                     # one whole expression keeps its type
    assert render_value({"a": ["{{ host }}:{{ port }}"]}, v) == {"a": ["10.77.0.11:15052"]}
    assert render_value("{% for i in items %}{{ i }}{% endfor %}", v) == "ab"
    assert render_value("{{ range(2) | list | length }}", v) == 2      # globals are not variables
    assert evaluate("flag | bool and port > 1", v) is True
    assert render_file("listen {{ host }}\n", v) == "listen 10.77.0.11\n"
    assert render_value("{% set x = port %}{{ x + 1 }}", v) == "15053"   # names set inside stay local


@pytest.mark.parametrize("call", [
    lambda v: render_value("{{ nope }}", v),
    lambda v: render_value("a {{ host }} {{ nope }}", v),
    lambda v: evaluate("nope == 1", v),
    lambda v: render_file("{{ nope.x }}", v),
])
def test_a_missing_variable_is_still_named(call):
    with pytest.raises(TemplateError, match="nope"):
        call(variables())


def test_a_broken_template_reports_the_syntax_error():
    with pytest.raises(TemplateError, match="template error"):
        render_value("{{ port + }}", variables())
