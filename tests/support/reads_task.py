"""A test-only task that reads a file through a probe it names (so a batch can read it ahead) and says
what it read; and a spy of every command local connections run or spawn, by host, in order."""

from __future__ import annotations

import collections

from tunnelspec.connection.base import read_argv
from tunnelspec.connection.local import LocalConnection
from tunnelspec.modules import TASKS, Arg, Task, ok, register_task


class ReadsTask(Task):
    """Test-only module: reads a file with a probe it names, and says what it read."""

    module = "test_reads"
    read_only = True
    args = {"path": Arg(str, required=True, help="The file.")}

    def probes(self) -> list[list[str]]:
        return [read_argv(self.p["path"])]

    async def check(self, ctx):
        res = await ctx.conn.probe(read_argv(self.p["path"]))
        return ok(f"read {res.stdout.strip()}")


def reads_spy(monkeypatch):
    """For a fixture (`yield from reads_spy(monkeypatch)`): `test_reads` registered; every command each host's local connection ran (`_exec`) or spawned
    (`spawn`: the run lock), by host, in order: a spy around the real methods."""
    register_task(ReadsTask)
    seen: dict = collections.defaultdict(list)
    real_exec, real_spawn = LocalConnection._exec, LocalConnection.spawn

    async def spy_exec(self, argv, input, timeout):
        seen[self.name].append(list(argv))
        return await real_exec(self, argv, input, timeout)

    async def spy_spawn(self, argv):
        seen[self.name].append(list(argv))
        return await real_spawn(self, argv)

    monkeypatch.setattr(LocalConnection, "_exec", spy_exec)
    monkeypatch.setattr(LocalConnection, "spawn", spy_spawn)
    yield seen
    TASKS.pop(ReadsTask.module, None)
