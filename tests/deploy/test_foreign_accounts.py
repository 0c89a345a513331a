"""Only what tunnelspec created is changed or removed: an inventory naming an existing
login account as a service user (`llama_user=<it>`) is refused on the host before anything is
touched there — the account keeps its shell, nothing else changes — and a teardown (in --check here,
so the lab stays deployed) leaves the account alone instead of deleting it. The lab's own service
users are tunnelspec's (marked at creation, or adopted once when they predate the mark)."""

from __future__ import annotations

import pytest

from support.cli import tunnelspec
from support.labdeploy import converge, deploy, inventory_copy, sh
from tunnelspec.modules.users import MARK

pytestmark = pytest.mark.lab

ACCOUNT = "tsalice"


@pytest.fixture
def login_account(lab):
    sh(lab, "main", "useradd", "--create-home", "--shell", "/bin/bash", "--comment", "Alice", ACCOUNT)
    try:
        yield ACCOUNT
    finally:
        sh(lab, "main", "userdel", "--remove", ACCOUNT)


def test_existing_login_account_is_refused_before_anything_changes(lab, tmp_path, login_account):
    converge(lab.inventory)
    for user in ("tunnelspec-llama", "tunnelspec-tunnel", "tunnelspec-front"):
        assert sh(lab, "main", "getent", "passwd", user).split(":")[4] == MARK, user
    inv = inventory_copy(lab, tmp_path, main_vars={"llama_user": login_account})
    r = deploy(inv)
    assert r.rc != 0
    text = r.stdout + r.stderr
    assert f"main: user {login_account} exists and was not created by tunnelspec" in text, text[-3000:]
    assert r.results("changed") == [], [(e["host"], e["task"]) for e in r.results("changed")]
    assert sh(lab, "main", "getent", "passwd", login_account).strip().endswith(":/bin/bash")

    t = tunnelspec("teardown", str(inv), "--check", "--format", "json", timeout=600)
    left = [e for e in t.results() if e.get("task") == "llama-server user removed"]
    assert left and left[0]["status"] == "ok" and "not created by tunnelspec" in left[0]["msg"], left
    assert sh(lab, "main", "getent", "passwd", login_account).strip().endswith(":/bin/bash")
    converge(lab.inventory)


def test_api_key_file_that_is_a_symlink_is_refused_and_its_target_untouched(lab, tmp_path):
    """The key file's owner is fixed by a root chown: through a symlink (or onto a file with another
    name) that would give llama-server's user whatever the link points to."""
    target, link = "/etc/tunnelspec-test-key-target", "/etc/tunnelspec/test-key-link"
    sh(lab, "main", "sh", "-c", f"printf 'sk-test\\n' > {target} && chmod 644 {target} && ln -sf {target} {link}")
    try:
        inv = inventory_copy(lab, tmp_path, main_vars={"llama_server_api_key_file": link})
        r = deploy(inv)
        assert r.rc != 0 and "is a symbolic link" in r.stdout + r.stderr, (r.stdout[-2000:], r.stderr[-2000:])
        assert sh(lab, "main", "stat", "-c", "%U %a", target).split() == ["root", "644"]
    finally:
        sh(lab, "main", "rm", "-f", link, target)
    converge(lab.inventory)
