"""Moving a running cluster to another llama.cpp build (upgrade or downgrade in place).

llama-server aborts on an RPC handshake mismatch and on any RPC socket error, and its unit restarts
it forever. When the build changes, the rpc play restarts every node onto the new build (possibly
another RPC protocol, another binary name); a llama-server still running the previous build would
first abort with the node's restart, then be restarted by systemd against nodes that speak another
protocol. So, once the build play has switched main's `current` build, a llama-server that still
runs another build is stopped here, before any node moves; the server play starts it again on the
new build once every tunnel answers HELLO with main's protocol version (its ExecStartPre waits with
`--expect`). Tunnels and keys are not touched.
"""

from __future__ import annotations

from tunnelspec.components.server.args import UNIT
from tunnelspec.modules.base import Arg, Task, change, ok, register_task

# One round trip: the running main PID's executable and the build `binary` resolves to now.
_STATE = r"""
pid=$(systemctl show -p MainPID --value "$1" 2>/dev/null)
echo "pid ${pid:-0}"
[ "${pid:-0}" != 0 ] && echo "running $(readlink -- "/proc/$pid/exe" 2>/dev/null)"
echo "current $(readlink -f -- "$2" 2>/dev/null)"
exit 0
"""
_DELETED = " (deleted)"


def parse_state(text: str) -> tuple[str | None, str | None]:
    """(executable of the running llama-server or None, the current build's binary or None)."""
    running = current = None
    for line in text.splitlines():
        key, _, value = line.partition(" ")
        if key == "running" and value:
            # A rebuilt or pruned binary shows as "<path> (deleted)": it is still that path's build.
            running = value[: -len(_DELETED)] if value.endswith(_DELETED) else value
        elif key == "current" and value:
            current = value
    return running, current


@register_task
class LlamaServerQuiesce(Task):
    """Stop llama-server when it runs another build than main's `current` (the build play just
    switched it): it must not be restarted against nodes moving to another build."""

    module = "llama_server_quiesce"
    args = {
        "binary": Arg(str, required=True, help="main's llama-server under {root}/current (the build now current)."),
        "unit": Arg(str, default=UNIT, help="llama-server's unit."),
    }

    def probes(self) -> list[list[str]]:
        return [["sh", "-c", _STATE, "sh", self.p["unit"], self.p["binary"]]]

    async def check(self, ctx):
        res = await ctx.conn.probe(self.probes()[0])
        running, current = parse_state(res.stdout)
        if running is None:
            return ok("llama-server not running")
        if current is None or running == current:
            return ok(f"llama-server runs the current build ({running})")
        return change(
            f"stop llama-server for the build change: it runs {running}, the current build is "
            f"{current}; the server play starts it on the new build once every node serves it"
        )

    async def apply(self, ctx, ch):
        await ctx.conn.run(["systemctl", "stop", self.p["unit"]], check=True, timeout=120)
