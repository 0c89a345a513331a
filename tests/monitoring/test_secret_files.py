"""The scrape token's file and the API key's file on main (components/secret_file.py): root gives
them to one user, owner and mode 0600, only as a regular file with one name — never through a
symlink or onto a second name — and a token that is the API key, give or take blanks and line ends,
is refused. A real local connection on files in a temporary directory (root: the owner changes)."""

from __future__ import annotations

import asyncio
import os
import sys

import pytest

from tunnelspec.components import secret_file
from tunnelspec.connection.local import LocalConnection
from tunnelspec.core.errors import TaskFailed
from tunnelspec.engine.context import HostContext, RunOptions
from tunnelspec.engine.registry import TASKS, load_all

load_all()
pytestmark = pytest.mark.skipif(sys.platform != "linux" or os.geteuid() != 0,
                                reason="root on Linux: the fix gives the file to another user")
KEY = "sk-0123456789abcdef"


def ctx_for(tmp_path) -> HostContext:
    return HostContext(host="main", conn=LocalConnection("main"), vars={}, facts={}, options=RunOptions(),
                       emit=lambda e: None, inventory_dir=tmp_path, memo={})


def token_task(tmp_path, path, **more):
    cls = TASKS["metrics_token_file"]
    return cls(cls.validate({"path": str(path), "owner": "nobody", **more}))


def converge(task, ctx):
    async def go():
        ch = await task.check(ctx)
        if ch.changed:
            await task.apply(ctx, ch)
        return await task.check(ctx)
    return asyncio.run(go())


def test_a_plain_token_file_is_given_to_the_front_user(tmp_path):
    token = tmp_path / "token"
    token.write_text("scrape-token\n")
    token.chmod(0o644)
    (tmp_path / "key").write_text(KEY + "\n")
    assert not converge(token_task(tmp_path, token, api_key_file=str(tmp_path / "key")), ctx_for(tmp_path)).changed
    st = token.stat()
    assert (st.st_uid, st.st_mode & 0o777) == (65534, 0o600)


def test_a_token_file_that_is_a_symlink_is_refused_and_its_target_untouched(tmp_path):
    target, link = tmp_path / "target", tmp_path / "token"
    target.write_text("scrape-token\n")
    target.chmod(0o644)
    link.symlink_to(target)
    t, ctx = token_task(tmp_path, link), ctx_for(tmp_path)
    with pytest.raises(TaskFailed, match=r"main: metrics_token_file .*token is a symbolic link with 1 name"):
        asyncio.run(t.check(ctx))
    with pytest.raises(TaskFailed, match="symbolic link"):
        asyncio.run(t.apply(ctx, None))
    st = target.stat()
    assert (st.st_uid, st.st_mode & 0o777) == (0, 0o644)


def test_a_token_file_with_a_second_name_is_refused(tmp_path):
    other, token = tmp_path / "elsewhere", tmp_path / "token"
    other.write_text("scrape-token\n")
    other.chmod(0o644)
    os.link(other, token)
    with pytest.raises(TaskFailed, match="regular file with 2 name"):
        asyncio.run(token_task(tmp_path, token).check(ctx_for(tmp_path)))
    assert (other.stat().st_uid, other.stat().st_mode & 0o777) == (0, 0o644)


@pytest.mark.parametrize("token_text", [KEY, KEY + "\n", f"  {KEY}\t\r\n", f"other-token\n{KEY}\n"],
                         ids=["same-bytes", "trailing-newline", "blanks-and-crlf", "second-line"])
@pytest.mark.parametrize("key_text", [KEY, KEY + "\n", f"\n{KEY} \n"], ids=["key", "key-newline", "key-blanks"])
def test_a_token_that_is_the_api_key_is_refused(tmp_path, token_text, key_text):
    (tmp_path / "key").write_text(key_text)
    (tmp_path / "token").write_text(token_text)
    t = token_task(tmp_path, tmp_path / "token", api_key_file=str(tmp_path / "key"))
    with pytest.raises(TaskFailed, match="holds the API key"):
        asyncio.run(t.check(ctx_for(tmp_path)))


def test_a_token_that_only_contains_the_api_key_is_another_token(tmp_path):
    (tmp_path / "key").write_text(KEY + "\n")
    (tmp_path / "token").write_text(KEY + "-scrape\n")
    t = token_task(tmp_path, tmp_path / "token", api_key_file=str(tmp_path / "key"))
    assert asyncio.run(t.check(ctx_for(tmp_path))).changed


def test_the_fix_follows_no_link_put_there_after_the_check(tmp_path):
    """The check saw a plain file; a link swapped in before the fix (a race) is not followed: the fix
    works on the file it opened without following a link, for the API key's file as for the token's."""
    target, path = tmp_path / "target", tmp_path / "key"
    target.write_text("not yours\n")
    target.chmod(0o644)
    path.symlink_to(target)
    conn = LocalConnection("main")
    with pytest.raises(TaskFailed, match=r"main: API key file .*key: owner and mode not changed"):
        asyncio.run(secret_file.make_private(conn, "main", str(path), "nobody", "API key file"))
    os.unlink(path)
    os.link(target, path)
    with pytest.raises(TaskFailed, match="no longer a regular file with one name"):
        asyncio.run(secret_file.make_private(conn, "main", str(path), "nobody", "API key file"))
    assert (target.stat().st_uid, target.stat().st_mode & 0o777) == (0, 0o644)
