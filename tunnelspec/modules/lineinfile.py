"""lineinfile: one line present (replacing a regexp match) or absent."""

from __future__ import annotations

import re

from tunnelspec.connection.base import read_argv
from tunnelspec.core.errors import TaskFailed
from tunnelspec.modules.base import Arg, Diff, Task, change, ok, register_task


def edit(text: str, line: str, regexp: str | None, present: bool) -> str:
    lines = text.splitlines()
    rx = re.compile(regexp) if regexp else None
    if present:
        idx = [i for i, old in enumerate(lines) if (rx.search(old) if rx else old == line)]
        if idx:
            lines[idx[-1]] = line
        else:
            lines.append(line)
    else:
        lines = [old for old in lines if not (rx.search(old) if rx else old == line)]
    return "\n".join(lines) + ("\n" if lines else "")


@register_task
class LineInFile(Task):
    """One line present (replacing a `regexp` match) or absent."""

    module = "lineinfile"
    args = {
        "path": Arg(str, required=True, help="The file."),
        "line": Arg(str, help="The line that must be present (state=present)."),
        "regexp": Arg(str, help="A line matching this is replaced (present) or removed (absent)."),
        "state": Arg(str, default="present", choices=("present", "absent"), help="`present` or `absent`."),
        "create": Arg(bool, default=False, help="Create the file when missing."),
        "mode": Arg((str, int), help="Mode of a created file."),
    }

    def probes(self) -> list[list[str]]:
        return [read_argv(self.p["path"])]

    async def _current(self, ctx) -> str | None:
        data = await ctx.conn.get(self.p["path"])
        return None if data is None else data.decode()

    async def check(self, ctx):
        present = self.p["state"] == "present"
        if present and self.p["line"] is None:
            raise TaskFailed("lineinfile with state=present needs `line`")
        cur = await self._current(ctx)
        if cur is None:
            if not present:
                return ok("file absent")
            if not self.p["create"]:
                raise TaskFailed(f"{self.p['path']} does not exist (set create: true)")
            cur = ""
        new = edit(cur, self.p["line"] or "", self.p["regexp"], present)
        if new == cur:
            return ok("line " + ("present" if present else "absent"))
        return change("line " + ("added/replaced" if present else "removed"), Diff(cur, new, self.p["path"]), new=new)

    async def apply(self, ctx, ch):
        mode = int(str(self.p["mode"] or "644"), 8)
        await ctx.conn.put(ch.data["new"], self.p["path"], mode)
