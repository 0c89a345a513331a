"""Reads of a no-op play that the batch answers (docs/internals.md, "Probes"): `paths_absent` reads
all its paths in one probe the play's batch runs (the answers and the apply as before, and never a
`run`, which would drop the batch for the rest of the play); the teardown's other checks read with
probes too; a task whose `when` is already false names no probe (an rpc node's turn of a main-only
task costs that node no batch)."""

from __future__ import annotations

import asyncio
from pathlib import Path

from tunnelspec.components.teardown import PathsAbsent, PortsClosed, UnitsAbsent
from tunnelspec.connection.base import Result
from tunnelspec.engine.context import HostContext, RunOptions
from tunnelspec.engine.playbook import builtin_playbook, load_playbook
from tunnelspec.engine.prefetch import Prefetch

from support.recording import RecordingConnection


def ctx_of(conn) -> HostContext:
    return HostContext(host="main", conn=conn, vars={}, facts={}, options=RunOptions(), emit=lambda e: None)


def layout(tmp_path: Path) -> dict:
    (tmp_path / "file").write_text("x")
    (tmp_path / "dir").mkdir()
    (tmp_path / "dir" / "inner").write_text("y")
    (tmp_path / "dangling").symlink_to(tmp_path / "nowhere")
    (tmp_path / "empty").mkdir()
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "kept").write_text("z")
    return {
        "paths": [str(tmp_path / n) for n in ("file", "dir", "dangling", "absent")],
        "prune": [str(tmp_path / n) for n in ("empty", "full", "no-such-dir")],
    }


def test_paths_absent_reads_every_path_in_the_batch_and_applies_as_before(tmp_path):
    args = layout(tmp_path)
    task = PathsAbsent.build(args)
    conn = RecordingConnection()

    async def go():
        await conn.prefetch([*task.probes(), ["true"]])
        ch = await task.check(ctx_of(conn))
        assert [a[0] for a in conn.ran] == ["sh"], conn.ran  # the batch: no `test` per path
        assert conn.changes_started == 0  # a read: the batch stays valid for the play's next checks
        return ch

    ch = asyncio.run(go())
    assert ch.changed
    assert ch.data["present"] == [str(tmp_path / n) for n in ("file", "dir", "dangling")]
    assert ch.data["empty"] == [str(tmp_path / "empty")]

    async def converge():
        await task.apply(ctx_of(conn), ch)
        return await task.check(ctx_of(conn))

    again = asyncio.run(converge())
    assert not again.changed and again.msg == "absent"
    assert (tmp_path / "full" / "kept").exists() and not (tmp_path / "empty").exists()


def test_paths_absent_without_a_batch_is_one_command_not_two_per_path(tmp_path):
    args = layout(tmp_path)
    conn = RecordingConnection()
    ch = asyncio.run(PathsAbsent.build(args).check(ctx_of(conn)))
    assert ch.changed and len(conn.ran) == 1 and conn.changes_started == 0


def test_paths_absent_still_refuses_a_system_directory():
    import pytest

    from tunnelspec.core.errors import TaskFailed

    with pytest.raises(TaskFailed, match="refusing to remove '/var/lib'"):
        asyncio.run(PathsAbsent.build({"paths": ["/var/lib"]}).check(ctx_of(RecordingConnection())))


class Answers:
    """A host that answers reads from a table and refuses any `run`."""

    changes_started = 0

    def __init__(self, table: dict) -> None:
        self.table = table

    async def probe(self, argv, **_):
        return Result(list(argv), 0, self.table.get(argv[0], ""), "")

    async def run(self, argv, **_):
        raise AssertionError(f"a check ran {argv}")


def test_the_teardown_checks_only_read():
    ch = asyncio.run(UnitsAbsent.build({}).check(ctx_of(Answers({}))))
    assert not ch.changed
    assert UnitsAbsent.build({}).probes()  # batched in the teardown play
    got = asyncio.run(PortsClosed.build({"ports": [8080]}).check(ctx_of(Answers({"ss": ""}))))
    assert not got.changed


# ---- the play's batch names no probe of a task whose `when` is false -----------------------------
class Probes(Prefetch):
    options = RunOptions()

    def __init__(self, variables: dict) -> None:
        self.variables = variables

    def template_vars(self, host, play):
        return self.variables

    def _tag_selected(self, spec):
        return True


def test_a_task_whose_when_is_false_names_no_probe():
    [play] = load_playbook(builtin_playbook("prove.yml")).plays
    cluster = {"main": {"model": "/models/t.gguf", "draft_model": "/models/d.gguf"}}
    on_rpc = {"inventory_hostname": "rpc-a", "groups": {"main": ["main"]}, "cluster": cluster}
    on_main = {**on_rpc, "inventory_hostname": "main"}
    rpc = [Probes(on_rpc)._task_probes(play, j, "rpc-a", {}) for j in range(len(play.tasks))]
    main = [Probes(on_main)._task_probes(play, j, "main", {}) for j in range(len(play.tasks))]
    assert rpc == [[], []]
    assert all(m and m[0] == ["test", "-f", p] for m, p in zip(main, ["/models/t.gguf", "/models/d.gguf"], strict=True))


def test_a_when_that_cannot_be_evaluated_yet_keeps_the_probes(tmp_path):
    pb = tmp_path / "p.yml"
    pb.write_text("- hosts: all\n  tasks:\n    - name: gone\n      when: \"not later_fact.on\"\n"
                  "      paths_absent: {paths: [/srv/x]}\n")
    [play] = load_playbook(pb).plays
    assert Probes({})._task_probes(play, 0, "main", {}) == PathsAbsent.build({"paths": ["/srv/x"]}).probes()
