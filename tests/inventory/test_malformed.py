"""Every malformed inventory: exit code 2, `file:line` of the bad line, a hint, no traceback."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

MALFORMED = sorted((Path(__file__).parent / "malformed").glob("*.ini"))
MALFORMED_YAML = sorted((Path(__file__).parent / "malformed_yaml").glob("*.yml"))


def _expected_line(path: Path) -> int:
    # Each file states the line that is wrong in its first line: "# error-line: N".
    m = re.match(rb"# error-line: (\d+)", path.read_bytes())
    assert m, f"{path.name} lacks its '# error-line: N' header"
    return int(m.group(1))


# What the message tells the user to do (or names as the fix), per file: the hint the docstring
# promises, not just some text.
HINTS = {
    "all_as_child.ini": "every group is already under 'all'",
    "bad_section_type.ini": "use [group], [group:vars] or [group:children]",
    "child_never_declared.ini": "add a [ghost] section (children must be groups, not hosts)",
    "child_of_itself.ini": "remove that line",
    "children_cycle.ini": "remove one of the two links",
    "children_with_vars.ini": "one group per line, no host variables here",
    "empty_variable_name.ini": "has no variable name before '='",
    "group_priority_not_int.ini": "must be an integer (e.g. ansible_group_priority=10)",
    "host_trailing_colon.ini": "after ':' comes a port number (host:2222)",
    "host_var_without_equals.ini": "quote values with spaces (key=\"a b\")",
    "not_utf8.ini": "save the file as UTF-8",
    "not_utf8_after_a_line_separator.ini": "save the file as UTF-8",
    "range_backwards.ini": "check begin, end and step",
    "range_padding_mismatch.ini": "zero-padded begin and end must have the same length",
    "range_too_many_colons.ini": "must be [begin:end] or [begin:end:step]",
    "range_without_end.ini": "has no end value",
    "section_with_space.ini": "with no spaces inside the brackets",
    "unbalanced_quote.ini": "check the quotes",
    "var_without_equals.ini": "one variable per line, hosts go in [g]",
    "vars_for_undeclared_group.ini": "add a [ghost] section (or fix the group name)",
    "yaml_not_ini.ini": "rename it to .yml",
    "all_as_child.yml": "every group is already under 'all'",
    "binary_value.yml": "write the text itself, or the base64 as a plain string",
    "child_of_itself.yml": "remove that line",
    "children_cycle.yml": "remove one of the two links",
    "control_character.yml": "remove it or write it as an escape",
    "date_mapping_key.yml": "quote the key",
    "duplicate_group.yml": "merge the two entries into one",
    "duplicate_host_var.yml": "merge the two entries into one",
    "empty_document.yml": "start with 'all:' and put groups under 'children:'",
    "group_as_list.yml": "must be a mapping (with hosts:, children: or vars:) or empty",
    "group_priority_not_int.yml": "must be an integer (e.g. ansible_group_priority=10)",
    "group_priority_infinite.yml": "must be an integer (e.g. ansible_group_priority=10)",
    "host_not_string.yml": "quote numbers",
    "host_vars_as_list.yml": "must be a mapping (name: value)",
    "hosts_as_list.yml": "write each entry as 'name:' on its own line under 'hosts:'",
    "lone_surrogate.yml": "write the character itself",
    "mapping_in_plain_value.yml": "quote a value that holds ': '",
    "not_utf8.yml": "save the file as UTF-8",
    "plugin_config.yml": "tunnelspec reads static inventories only",
    "range_backwards.yml": "check begin, end and step",
    "set_value.yml": "write a list ([a, b])",
    "tab_indent.yml": "indent with spaces",
    "top_level_list.yml": "a YAML inventory is a mapping of group names",
    "two_documents.yml": "remove the second '---'",
    "unclosed_flow.yml": "close the [ or {",
    "unclosed_flow_at_end_of_file.yml": "close the [ or {",
    "unclosed_quote.yml": "close the quote",
    "unknown_group_key.yml": "a group holds only 'hosts:', 'children:' and 'vars:'",
    "variable_name_not_string.yml": "quote it",
}


def test_every_malformed_file_has_its_hint():
    assert sorted(HINTS) == sorted(p.name for p in MALFORMED + MALFORMED_YAML)


def test_enough_malformed_files():
    assert len(MALFORMED) >= 15
    assert len(MALFORMED_YAML) >= 15


@pytest.mark.parametrize("path", MALFORMED + MALFORMED_YAML, ids=[p.name for p in MALFORMED + MALFORMED_YAML])
def test_cli_reports_file_and_line(path: Path, run_tunnelspec):
    res = run_tunnelspec("inventory", "list", str(path))
    assert res.returncode == 2, (res.stdout, res.stderr)
    assert res.stdout == ""
    assert "Traceback" not in res.stderr
    assert f"{path}:{_expected_line(path)}: " in res.stderr
    # The message goes on after the location: what is wrong, then what to do about it.
    message = res.stderr.split(f"{path}:{_expected_line(path)}: ", 1)[1]
    assert HINTS[path.name] in message, message


def test_missing_file_is_a_usage_error(tmp_path, run_tunnelspec):
    missing = tmp_path / "nope.ini"
    res = run_tunnelspec("inventory", "list", str(missing))
    assert res.returncode == 2
    assert f"{missing}: inventory file not found" in res.stderr
    assert "Traceback" not in res.stderr
