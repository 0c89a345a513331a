"""`-e @FILE`: extra variables from a YAML (or JSON) mapping, as Ansible reads them."""

from __future__ import annotations

from tunnelspec.core.errors import UsageError
import yaml


def read_extra_vars_file(path: str) -> dict:
    try:
        text = open(path, encoding="utf-8").read()
    except OSError as e:
        raise UsageError(f"-e @{path}: cannot read: {e.strerror}") from None
    except UnicodeDecodeError as e:
        raise UsageError(
            f"-e @{path}: not a text file (byte {e.start} is not UTF-8); give a YAML or JSON mapping"
        ) from None
    try:
        data = yaml.safe_load(text) if text.strip() else {}
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"{path}:{mark.line + 1}" if mark is not None else path
        raise UsageError(f"{where}: not valid YAML: {getattr(e, 'problem', e)}") from None
    if not isinstance(data, dict) or not all(isinstance(k, str) for k in data):
        raise UsageError(f"{path}:1: -e @FILE needs a mapping of variable names to values")
    return data
