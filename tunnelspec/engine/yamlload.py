"""YAML loading that remembers line numbers, so every playbook error can say file:line."""

from __future__ import annotations

import yaml

from tunnelspec.core.errors import PlaybookError


class LineDict(dict):
    line: int = 0
    key_lines: dict


class LineList(list):
    line: int = 0


# libyaml's parser when PyYAML was built with it (about 10x faster on the shipped playbooks, which every
# run loads); the pure-Python one otherwise. Both give every node its start mark, so lines are the same.
_Base = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class _Loader(_Base):  # type: ignore[valid-type,misc]
    pass


def _mapping(loader, node):
    loader.flatten_mapping(node)
    d = LineDict()
    d.line = node.start_mark.line + 1
    d.key_lines = {}
    for k_node, v_node in node.value:
        key = loader.construct_object(k_node, deep=True)
        if key in d:
            raise PlaybookError(f"duplicate key {key!r}", loader.name, k_node.start_mark.line + 1)
        d[key] = loader.construct_object(v_node, deep=True)
        d.key_lines[key] = k_node.start_mark.line + 1
    return d


def _sequence(loader, node):
    out = LineList(loader.construct_object(n, deep=True) for n in node.value)
    out.line = node.start_mark.line + 1
    return out


_Loader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _mapping)
_Loader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_SEQUENCE_TAG, _sequence)


def load_yaml(text: str, name: str):
    loader = _Loader(text)
    loader.name = name
    try:
        return loader.get_single_data()
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        line = mark.line + 1 if mark else None
        raise PlaybookError(f"invalid YAML: {e.problem or e}", name, line) from None
    except yaml.YAMLError as e:
        raise PlaybookError(f"invalid YAML: {e}", name) from None
    finally:
        loader.dispose()
