"""Started from a git hook, tunnelspec holds GIT_DIR, GIT_INDEX_FILE, … of the user's repository: the
git it runs on the controller and every command of a local host get an environment without them
(core/gitenv.py), as a host reached over ssh does."""

from __future__ import annotations

import asyncio
import subprocess

from tunnelspec.connection.local import LocalConnection
from tunnelspec.core.gitenv import LOCAL_ENV_VARS, git_env

HOOK = {"GIT_DIR": "/srv/ops/.git", "GIT_INDEX_FILE": "/srv/ops/.git/index", "GIT_WORK_TREE": "/srv/ops",
        "GIT_CONFIG_COUNT": "1", "GIT_CONFIG_KEY_0": "core.hooksPath", "GIT_CONFIG_VALUE_0": "/tmp/x"}


def test_the_list_holds_every_variable_git_clears_for_another_repository():
    local = subprocess.run(["git", "rev-parse", "--local-env-vars"], capture_output=True, text=True, check=True)
    assert set(local.stdout.split()) <= LOCAL_ENV_VARS


def test_git_env_drops_the_hooks_repository_and_keeps_the_rest(monkeypatch):
    for k, v in HOOK.items():
        monkeypatch.setenv(k, v)
    monkeypatch.setenv("GIT_CEILING_DIRECTORIES", "/srv")
    env = git_env(LC_ALL="C")
    assert not set(HOOK) & set(env)
    assert env["GIT_CEILING_DIRECTORIES"] == "/srv" and env["LC_ALL"] == "C" and env["PATH"]


def test_a_local_hosts_commands_do_not_see_the_hooks_repository(monkeypatch):
    for k, v in HOOK.items():
        monkeypatch.setenv(k, v)
    conn = LocalConnection("local")
    script = 'echo "${GIT_DIR-none} ${GIT_INDEX_FILE-none} ${GIT_WORK_TREE-none} ${GIT_CONFIG_COUNT-none}"'
    res = asyncio.run(conn.run(["sh", "-c", script]))
    assert res.stdout.split() == ["none"] * 4
    lines: list[str] = []
    asyncio.run(conn.run_stream(["sh", "-c", script], lines.append))
    assert lines[-1].split() == ["none"] * 4
