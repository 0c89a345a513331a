"""The docs CI users copy: the GitHub Actions workflow in docs/ci.md parses and uses only options
tunnelspec has; shell completion is produced; SECURITY.md's advisories table matches the code."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import click
import yaml

from support.ci_cli import ci_env, cli
from tunnelspec.cli.main import main
from tunnelspec.llama import advisories

ROOT = Path(__file__).resolve().parents[2]


def _workflow() -> dict:
    text = (ROOT / "docs" / "ci.md").read_text()
    blocks = re.findall(r"```yaml\n(.*?)```", text, re.S)
    assert blocks, "docs/ci.md has no ```yaml block"
    wf = yaml.safe_load(blocks[0])
    return wf


def _commands(wf: dict) -> list[list[str]]:
    out = []
    for job in wf["jobs"].values():
        for step in job["steps"]:
            script = step.get("run", "")
            for line in script.replace("\\\n", " ").splitlines():
                words = shlex.split(line, comments=True)
                if words and words[0] == "tunnelspec":
                    out.append(words)
    return out


def _command_for(words: list[str]) -> tuple[click.Command, list[str]]:
    cmd: click.Command = main
    rest = words[1:]
    while isinstance(cmd, click.Group) and rest and rest[0] in cmd.commands:
        cmd, rest = cmd.commands[rest[0]], rest[1:]
    return cmd, rest


def test_workflow_is_valid_github_actions():
    wf = _workflow()
    assert wf["name"] and wf["jobs"]
    triggers = wf.get("on") or wf.get(True)  # YAML 1.1 reads a bare `on` as true
    assert "pull_request" in triggers and "push" in triggers
    for job in wf["jobs"].values():
        assert job["runs-on"] and isinstance(job["steps"], list)
        for step in job["steps"]:
            assert "uses" in step or "run" in step
    text = yaml.safe_dump(wf)
    assert "secrets.TUNNELSPEC_SSH_KEY" in text and "secrets.TUNNELSPEC_KNOWN_HOSTS" in text


def test_workflow_uses_only_real_options():
    cmds = _commands(_workflow())
    assert any("--check" in c for c in cmds) and any(c[:2] == ["tunnelspec", "deploy"] and "--check" not in c
                                                       for c in cmds)
    for words in cmds:
        cmd, rest = _command_for(words)
        assert not isinstance(cmd, click.Group), f"{words}: not a command"
        known = {o for p in cmd.params for o in getattr(p, "opts", []) + getattr(p, "secondary_opts", [])}
        for w in rest:
            if w.startswith("-"):
                assert w.split("=", 1)[0] in known, f"{' '.join(words)}: {w} is not an option of {cmd.name}"


def test_bash_completion_script_is_produced(tmp_path):
    env = ci_env(tmp_path / "home", _TUNNELSPEC_COMPLETE="bash_source")
    res = cli(env=env)
    assert res.rc == 0 and "_tunnelspec_completion()" in res.stdout and "complete -o nosort" in res.stdout
    env = ci_env(tmp_path / "home", _TUNNELSPEC_COMPLETE="bash_complete", COMP_WORDS="tunnelspec hostk",
                 COMP_CWORD="1")
    res = cli(env=env)
    assert "hostkeys" in res.stdout


def test_security_md_advisories_in_sync():
    text = (ROOT / "SECURITY.md").read_text()
    table = text.split("<!-- advisories:start -->")[1].split("<!-- advisories:end -->")[0]
    rows = [r for r in table.splitlines() if r.startswith("| ") and not r.startswith("| ID") and "---" not in r]
    assert len(rows) == len(advisories.ADVISORIES)
    for row, adv in zip(rows, advisories.ADVISORIES):
        cells = [c.strip() for c in row.strip("|").split("|")]
        assert cells[:4] == [adv.id, adv.cve, adv.range_text, adv.fix], row


def test_docs_exist_and_mention_env_credentials():
    ci = (ROOT / "docs" / "ci.md").read_text()
    for word in ("TUNNELSPEC_SSH_KEY", "TUNNELSPEC_KNOWN_HOSTS", "--check", "exit", "hostkeys scan"):
        assert word in ci
    readme = (ROOT / "README.md").read_text()
    assert "bash scripts/demo.sh" in readme and "bash scripts/test.sh" in readme
    assert "_TUNNELSPEC_COMPLETE=bash_source tunnelspec" in (ROOT / "docs" / "cli.md").read_text()
