from click.testing import CliRunner

from tunnelspec.cli.main import main


def test_table():
    res = CliRunner().invoke(main, ["advisories"])
    assert res.exit_code == 0
    assert "CVE-2026-34159" in res.output and "b11450 to < b12658" in res.output


def test_one_build_affected_exits_1():
    res = CliRunner().invoke(main, ["advisories", "--build", "12657"])
    assert res.exit_code == 1
    assert res.output.startswith("affected:") and "CVE-2026-137567" in res.output


def test_one_build_clean():
    res = CliRunner().invoke(main, ["advisories", "--build", "12658"])
    assert res.exit_code == 0 and res.output.startswith("clean:")
