"""llama-server's RPC connections, seen from main's sockets.

llama-server never reconnects an RPC connection: when an rpc-server restarts (a deploy changed its
unit, it crashed, its node rebooted) or a tunnel's ssh is replaced, the other end closes and
llama-server's socket sits in CLOSE-WAIT until its next request touches it — then it aborts, and that
request (a user's, or the verify completion) fails. A deploy that leaves it so has not converged:
llama-server is restarted here instead, before anyone asks it anything.
"""

from __future__ import annotations

from tunnelspec.core.constants import LOOPBACK
from tunnelspec.facts import sockets, units
from tunnelspec.components.server.args import UNIT
from tunnelspec.modules.base import Arg, Task, change, ok, register_task
from tunnelspec.modules.systemd import STARTED_FACT


def dead_links(closed: list[sockets.PeerClosed], pid: int, ports: list[int]) -> list[int]:
    """The tunnel ports whose connection from llama-server (`pid`) the other end has closed."""
    wanted = set(ports)
    return sorted({c.peer_port for c in closed if pid in c.pids and c.peer == LOOPBACK and c.peer_port in wanted})


_PROPS = ["ActiveState", "MainPID"]  # what the check reads of llama-server's unit


@register_task
class LlamaServerLinks(Task):
    """Restart llama-server when one of its RPC connections was closed by the other end (an rpc-server
    or a tunnel restarted since it connected): it would abort at its next request."""

    module = "llama_server_links"
    args = {
        "ports": Arg(list, required=True, help="main's tunnel ports (llama-server's --rpc endpoints)."),
        "unit": Arg(str, default=UNIT, help="llama-server's unit."),
    }

    def probes(self) -> list[list[str]]:
        return [units.properties(self.p["unit"], _PROPS).argv, sockets.close_wait().argv]

    async def check(self, ctx):
        props = await units.show(ctx.conn, self.p["unit"], _PROPS)
        pid = int(props.get("MainPID") or 0)
        if props.get("ActiveState") != "active" or pid == 0:
            return ok("llama-server not running")
        closed = await sockets.close_wait().gather(ctx.conn)
        dead = dead_links(closed, pid, [int(p) for p in self.p["ports"]])
        if not dead:
            return ok("llama-server's RPC connections are open")
        where = ", ".join(f"{LOOPBACK}:{p}" for p in dead)
        return change(
            f"restart llama-server: the other end closed its RPC connection to {where} "
            "(an rpc-server or tunnel restarted); it would abort at its next request"
        )

    async def apply(self, ctx, ch):
        await ctx.conn.run(["systemctl", "restart", self.p["unit"]], check=True, timeout=300)
        # Restarted from the unit and models now in place: a pending restart handler need not repeat it.
        ctx.register(STARTED_FACT, sorted({*ctx.facts.get(STARTED_FACT, []), self.p["unit"]}))
