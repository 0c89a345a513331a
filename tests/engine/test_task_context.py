"""A task runs with a HostContext built by hand — no Run, no engine object: the narrow context
(engine/context.py) is all it needs. Real local connection, real files in a temp directory."""

from __future__ import annotations

import asyncio

import pytest

from tunnelspec.connection.local import LocalConnection
from tunnelspec.engine.context import HostContext, RunOptions
from tunnelspec.core.errors import TaskFailed
from tunnelspec.engine.registry import TASKS, load_all

load_all()


def ctx_for(tmp_path, host="h1", memo=None, **kw) -> HostContext:
    return HostContext(host=host, conn=LocalConnection(host), vars={}, facts={}, options=RunOptions(),
                       emit=lambda e: None, inventory_dir=tmp_path, memo={} if memo is None else memo, **kw)


def task(module: str, **args):
    cls = TASKS[module]
    return cls(cls.validate(args))


def test_copy_reads_a_relative_src_from_the_inventory_dir(tmp_path):
    (tmp_path / "payload.txt").write_text("hello\n")
    dest = tmp_path / "out" / "copied.txt"
    dest.parent.mkdir()
    t, ctx = task("copy", dest=str(dest), src="payload.txt"), ctx_for(tmp_path)

    async def go():
        ch = await t.check(ctx)
        assert ch.changed
        await t.apply(ctx, ch)
        return await t.check(ctx)

    assert not asyncio.run(go()).changed
    assert dest.read_text() == "hello\n"


def test_model_file_claims_are_shared_through_the_run_memo(tmp_path):
    # Two controller files with one name bound for one upload path: refused, because the run's memo
    # (one dict for every host and task of a run) remembers the first claim.
    for d in ("a", "b"):
        (tmp_path / d).mkdir()
        (tmp_path / d / "model.gguf").write_bytes(d.encode() * 64)
    memo: dict = {}
    dest_dir = str(tmp_path / "models")
    first = task("model_file", src="a/model.gguf", dest_dir=dest_dir, fact="target")
    second = task("model_file", src="b/model.gguf", dest_dir=dest_dir, fact="draft")
    assert asyncio.run(first.check(ctx_for(tmp_path, memo=memo))).changed
    with pytest.raises(TaskFailed, match="would both be uploaded"):
        asyncio.run(second.check(ctx_for(tmp_path, memo=memo)))
    # Another run (a fresh memo) starts with no claims.
    assert asyncio.run(second.check(ctx_for(tmp_path, memo={}))).changed


def test_cross_host_tasks_say_they_need_a_run(tmp_path):
    ctx = ctx_for(tmp_path, task_name="pin")
    with pytest.raises(TaskFailed, match="needs a cluster inventory"):
        ctx.require_cluster()
    with pytest.raises(TaskFailed, match="needs a connection to other"):
        asyncio.run(ctx.connection_to("other"))
