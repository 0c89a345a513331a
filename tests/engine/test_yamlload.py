"""The playbook loader gives the same values, line numbers and errors with libyaml's parser as with
PyYAML's pure-Python one (the fallback where PyYAML was built without libyaml)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from tunnelspec.core.errors import PlaybookError
from tunnelspec.engine import yamlload

pytestmark = pytest.mark.unit

PLAYBOOKS = Path(yamlload.__file__).resolve().parents[2] / "playbooks"


class _PyLoader(yaml.SafeLoader):
    pass


_PyLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, yamlload._mapping)
_PyLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_SEQUENCE_TAG, yamlload._sequence)


def _lines(v):
    if isinstance(v, dict):
        return [v.line, sorted(v.key_lines.items(), key=repr), [_lines(x) for x in v.values()]]
    if isinstance(v, list):
        return [v.line, [_lines(x) for x in v]]
    return None


def _py(text: str, name: str):
    loader = _PyLoader(text)
    loader.name = name
    try:
        return loader.get_single_data()
    finally:
        loader.dispose()


def test_libyaml_is_used_where_pyyaml_has_it():
    assert issubclass(yamlload._Loader, yaml.CSafeLoader if yaml.__with_libyaml__ else yaml.SafeLoader)


@pytest.mark.parametrize("path", sorted(PLAYBOOKS.glob("*.yml")), ids=lambda p: p.name)
def test_shipped_playbooks_load_the_same_with_either_parser(path):
    text = path.read_text()
    fast, slow = yamlload.load_yaml(text, str(path)), _py(text, str(path))
    assert fast == slow
    assert _lines(fast) == _lines(slow)


@pytest.mark.parametrize(
    "text, line, what",
    [
        ("a: 1\nb: [1, 2\nc: 3\n", 3, "invalid YAML"),
        ("a: 1\n\tb: 2\n", 2, "invalid YAML"),
        ("a: 1\nb: 2\na: 3\n", 3, "duplicate key 'a'"),
    ],
)
def test_errors_name_the_line(text, line, what):
    with pytest.raises(PlaybookError) as e:
        yamlload.load_yaml(text, "play.yml")
    assert e.value.line == line and what in str(e.value)
