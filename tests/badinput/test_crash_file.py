"""The crash file (cli/crash.py) holds no secret: -e values masked in every spelling click takes, the
secret values the process met and secret-named `KEY=VALUE`s masked in the exception's text (and in
the one line on the terminal), and its file made new, never through a link planted at its name."""

from __future__ import annotations

import os
import stat
import time

import click
import pytest
from click.testing import CliRunner

from tunnelspec.cli import crash
from tunnelspec.core.secrets import Secret

SECRET = "hunter2-Zq9"
# Each: how a user may write -e become_password=SECRET (the options of a playbook command: -v counts,
# -C and -D are flags, -e takes a value).
SPELLINGS = {
    "separate": ["-e", f"become_password={SECRET}"],
    "glued": [f"-ebecome_password={SECRET}"],
    "glued-equals": [f"-e=become_password={SECRET}"],
    "cluster-then-next": ["-ve", f"become_password={SECRET}"],
    "cluster-glued": [f"-CeBecome_password={SECRET}"],
    "long-cluster": ["-vvCDe", f"become_password={SECRET}"],
    "long": ["--extra-vars", f"become_password={SECRET}"],
    "long-equals": [f"--extra-vars=become_password={SECRET}"],
    "no-equals": ["-e", SECRET],
}


@click.command()
@click.option("-v", "--verbose", count=True)
@click.option("--check", "-C", is_flag=True)
@click.option("--diff", "-D", is_flag=True)
@click.option("-e", "--extra-vars", "extra_vars", multiple=True)
def _cmd(verbose, check, diff, extra_vars):
    click.echo("\n".join(extra_vars))


@pytest.mark.parametrize("spelling", sorted(SPELLINGS))
def test_every_spelling_of_e_is_masked(spelling):
    args = SPELLINGS[spelling]
    # click itself reads the secret as -e's value here: the spelling is real.
    assert SECRET in CliRunner().invoke(_cmd, args).output
    shown = crash.masked_argv(["deploy", "inv.ini", *args, "--limit", "main"])
    assert SECRET not in " ".join(shown)
    assert shown[:2] == ["deploy", "inv.ini"] and shown[-2:] == ["--limit", "main"]
    assert "***" in " ".join(shown)


def test_a_file_of_extra_vars_and_other_words_are_kept():
    assert crash.masked_argv(["-e", "@vars.yml", "-e@more.yml", "-i", "inv.ini", "-v"]) == \
        ["-e", "@vars.yml", "-e@more.yml", "-i", "inv.ini", "-v"]
    assert crash.masked_argv(["-e", "llama_user=ops"]) == ["-e", "llama_user=***"]


def _raise(msg: str) -> BaseException:
    try:
        try:
            raise KeyError("inner")
        except KeyError as inner:
            raise RuntimeError(msg) from inner
    except RuntimeError as err:
        return err


def test_secrets_in_the_exception_text_are_masked(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    met = Secret("sk-met-in-the-run-4242")  # e.g. the API key read by verify, a become password
    (tmp_path / "vars.yml").write_text("ansible_become_pass: from-a-file-777\n")
    argv = ["deploy", "inv.ini", "-ve", f"become_password={SECRET}", "-e", f"@{tmp_path / 'vars.yml'}"]
    err = _raise(f"login failed with {SECRET} (key {met.reveal()}, pass from-a-file-777); "
                 "sent {'llama_server_api_key': 'sk-in-a-dict', 'user': 'ops'} and metrics_token=tok-bare-55")
    path = crash.write_report(err, argv)
    text = open(path).read()
    for leak in (SECRET, "sk-met-in-the-run-4242", "from-a-file-777", "sk-in-a-dict", "tok-bare-55"):
        assert leak not in text, leak
    assert "'llama_server_api_key': '***'" in text and "metrics_token=***" in text and "'user': 'ops'" in text
    assert "RuntimeError: login failed with ***" in text and "KeyError: 'inner'" in text
    assert "raise RuntimeError(msg) from inner" in text  # the code of the frames is kept
    line = crash.one_line(err, argv)
    assert line.startswith("RuntimeError: login failed with ***") and SECRET not in line and "tok-bare-55" not in line


def test_the_temporary_directory_fallback_follows_no_planted_link(tmp_path, monkeypatch):
    """~/.cache cannot take it (XDG_CACHE_HOME is a file): the report goes to the temporary directory,
    where anyone may have put a link at the name it would take; the link's target stays untouched."""
    (tmp_path / "not-a-dir").write_text("")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "not-a-dir"))
    shared = tmp_path / "tmp"
    shared.mkdir()
    monkeypatch.setattr("tempfile.tempdir", str(shared))
    target = tmp_path / "victim"
    target.write_text("precious\n")
    now = time.time()
    for dt in range(-1, 5):  # the names of the next few seconds, as a planter would guess them
        stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(now + dt))
        (shared / f"tunnelspec-crash-{stamp}-{os.getpid()}.txt").symlink_to(target)
    path = crash.write_report(_raise("boom"), ["status", "inv.ini"])
    assert target.read_text() == "precious\n"
    assert path is not None and os.path.dirname(path) == str(shared)
    st = os.lstat(path)
    assert stat.S_ISREG(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o600
    assert "RuntimeError: boom" in open(path).read()
