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
    # The message goes on after the location: it says what is wrong, not only where.
    message = res.stderr.split(f"{path}:{_expected_line(path)}: ", 1)[1]
    assert len(message.strip()) > 20


def test_missing_file_is_a_usage_error(tmp_path, run_tunnelspec):
    missing = tmp_path / "nope.ini"
    res = run_tunnelspec("inventory", "list", str(missing))
    assert res.returncode == 2
    assert f"{missing}: inventory file not found" in res.stderr
    assert "Traceback" not in res.stderr
