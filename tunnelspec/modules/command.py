"""command: run an argv, guarded by `creates`/`removes` so it is idempotent."""

from __future__ import annotations

import shlex

from tunnelspec.core.errors import TaskFailed
from tunnelspec.facts.files import file_state
from tunnelspec.core.secrets import display_argv
from tunnelspec.modules.base import Arg, Task, change, ok, register_task


@register_task
class Command(Task):
    """Run an argv, made idempotent by `creates` (skip when that path exists) or `removes`."""

    module = "command"
    args = {
        "argv": Arg(list, help="The command as a list (preferred: no shell)."),
        "cmd": Arg(str, help="The command as one string, split like a shell line (no shell runs it)."),
        "creates": Arg(
            str, help="Skip when this path exists (one of creates/removes is required, so the task is idempotent)."
        ),
        "removes": Arg(str, help="Skip when this path does not exist."),
        "chdir": Arg(str, help="Directory to run in."),
        "timeout": Arg((int, float), help="Seconds before the command is killed (none by default)."),
    }

    def _argv(self) -> list[str]:
        if self.p["argv"]:
            return [str(a) for a in self.p["argv"]]
        if self.p["cmd"]:
            return shlex.split(self.p["cmd"])
        raise TaskFailed("command needs `argv` (a list) or `cmd`")

    def probes(self) -> list[list[str]]:
        return [file_state(p).argv for p in (self.p["creates"], self.p["removes"]) if p]

    async def check(self, ctx):
        argv = self._argv()
        if not (self.p["creates"] or self.p["removes"]):
            raise TaskFailed("command needs `creates` or `removes` to be idempotent")
        if self.p["creates"] and (await file_state(self.p["creates"]).gather(ctx.conn, check=True)).exists:
            return ok(f"{self.p['creates']} exists")
        if self.p["removes"] and not (await file_state(self.p["removes"]).gather(ctx.conn, check=True)).exists:
            return ok(f"{self.p['removes']} absent")
        return change(f"run {display_argv(argv)}")

    async def apply(self, ctx, ch):
        argv = self._argv()
        if self.p["chdir"]:
            argv = ["sh", "-c", 'cd -- "$1" && shift && exec "$@"', "sh", self.p["chdir"], *argv]
        await ctx.conn.run(argv, check=True, timeout=self.p["timeout"])
