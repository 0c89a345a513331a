"""The front of llama-server on main (tunnelspec/front.py; docs/degraded.md): the checks that are
not plain files and units."""

from __future__ import annotations

from tunnelspec.errors import TaskFailed
from tunnelspec.facts import sockets
from tunnelspec.front import HOLD_PORT
from tunnelspec.tasks.base import Task, ok, register_task


@register_task
class FrontHoldFree(Task):
    """Read-only: nothing listens on the front's `hold` port (a privileged loopback port). The front
    sends requests there while llama-server is not up, counting on the connection to fail; a
    listener there would receive them."""

    module = "front_hold_free"
    read_only = True
    args: dict = {}

    def probes(self) -> list[list[str]]:
        return [list(sockets.COMMAND)]

    async def check(self, ctx):
        found = [s for s in await sockets.listening_sockets(ctx.conn)
                 if s.port == HOLD_PORT and (s.loopback_only or s.wildcard)]
        if found:
            who = ", ".join(f"{n} (pid {p})" for s in found for n, p in s.processes) or "a process"
            raise TaskFailed(f"{ctx.host}: {who} listens on TCP port {HOLD_PORT}, which the front keeps free to "
                             "hold requests while llama-server restarts (docs/degraded.md); stop it")
        return ok(f"nothing listens on port {HOLD_PORT} (the front's hold)")
