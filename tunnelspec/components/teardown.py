"""Teardown: every unit tunnelspec installed (found on disk by name, so nodes dropped from the
inventory are covered too), and paths removed; both idempotent (a second run is all "ok")."""

from __future__ import annotations

import fnmatch

from tunnelspec.core.errors import TaskFailed
from tunnelspec.facts import sockets
from tunnelspec.modules.base import Arg, Task, change, ok, register_task
from tunnelspec.modules.systemd import UNIT_DIR, daemon_reload

# llama-server first: it depends on the tunnels, which depend on nothing of ours.
_ORDER = ("tunnelspec-llama-server", "tunnelspec-tunnel-", "tunnelspec-rpc")


def _rank(unit: str) -> int:
    return next((i for i, p in enumerate(_ORDER) if unit.startswith(p)), len(_ORDER))


@register_task
class UnitsAbsent(Task):
    """Stop, disable and delete every unit matching `pattern` (file in /etc/systemd/system or loaded)."""

    module = "units_absent"
    args = {
        "pattern": Arg(
            str, default="tunnelspec-*.service", help="Units matching this glob are stopped, disabled and deleted."
        ),
    }

    def _argvs(self) -> tuple[list[str], list[str], list[str]]:
        """What the check reads (read-only): unit files, loaded units, enablement links."""
        pat = self.p["pattern"]
        return (
            ["find", UNIT_DIR, "-maxdepth", "1", "-name", pat, "-printf", "%f\n"],
            ["systemctl", "list-units", "--all", "--plain", "--no-legend", "--no-pager", pat],
            ["find", UNIT_DIR, "-mindepth", "2", "-maxdepth", "2", "-path", "*.wants/*", "-name", pat],
        )

    def probes(self) -> list[list[str]]:
        return list(self._argvs())

    async def _found(self, ctx) -> tuple[list[str], list[str]]:
        """(units, leftover links): unit files and loaded units matching, and enablement symlinks
        (`*.wants/…`) a half-finished earlier removal may have left behind."""
        pat = self.p["pattern"]
        files_argv, loaded_argv, links_argv = self._argvs()
        files = await ctx.conn.probe(files_argv)
        loaded = await ctx.conn.probe(loaded_argv)
        names = set(files.stdout.split())
        for line in loaded.stdout.splitlines():
            parts = [p for p in line.split() if p != "\u25cf"]  # a failed unit is prefixed with a bullet
            # A unit whose file is gone but that is still running or failed also counts.
            if len(parts) > 2 and fnmatch.fnmatch(parts[0], pat) and parts[2] != "inactive":
                names.add(parts[0])
        links = await ctx.conn.probe(links_argv)
        return sorted(names, key=lambda u: (_rank(u), u)), sorted(links.stdout.split())

    async def check(self, ctx):
        units, links = await self._found(ctx)
        if not (units or links):
            return ok("no tunnelspec unit")
        return change("remove " + ", ".join(units + links), units=units, links=links)

    async def apply(self, ctx, ch):
        for unit in ch.data["units"]:
            await ctx.conn.run(["systemctl", "disable", "--now", "--quiet", unit])
            await ctx.conn.run(["rm", "-f", "--", f"{UNIT_DIR}/{unit}"], check=True)
        for link in ch.data["links"]:
            await ctx.conn.run(["rm", "-f", "--", link], check=True)
        await daemon_reload(ctx.conn)
        for unit in ch.data["units"]:
            await ctx.conn.run(["systemctl", "reset-failed", unit])


# $1: how many of the paths after it are removed whole; the rest are pruned only when empty.
_STATE = r"""
n=$1; shift; i=0
for p do
  i=$((i + 1))
  if [ "$i" -le "$n" ]; then
    if [ -e "$p" ] || [ -L "$p" ]; then echo present; else echo absent; fi
  elif [ -d "$p" ] && [ -z "$(ls -A -- "$p")" ]; then echo empty
  else echo kept
  fi
done
"""


@register_task
class PathsAbsent(Task):
    """`paths` removed recursively; `prune` directories removed only when empty (they may hold
    things tunnelspec did not write, e.g. an API key file the user put in /etc/tunnelspec)."""

    module = "paths_absent"
    args = {
        "paths": Arg(list, default=[], help="Paths removed recursively."),
        "prune": Arg(list, default=[], help="Directories removed only when empty."),
    }

    def _state_argv(self) -> list[str]:
        """One read of every path: a word per path, in order (`present`/`absent` for `paths`, then
        `empty`/`kept` for `prune`); shell builtins but for an existing prune directory's `ls`."""
        paths, prune = [str(p) for p in self.p["paths"]], [str(p) for p in self.p["prune"]]
        return ["sh", "-c", _STATE, "sh", str(len(paths)), *paths, *prune]

    def probes(self) -> list[list[str]]:
        return [self._state_argv()]

    async def _present(self, ctx) -> tuple[list[str], list[str]]:
        for p in [*self.p["paths"], *self.p["prune"]]:
            if not str(p).startswith("/") or str(p).rstrip("/") in ("", "/etc", "/var", "/usr", "/opt", "/var/lib"):
                raise TaskFailed(f"refusing to remove {p!r}")
        paths, prune = list(self.p["paths"]), list(self.p["prune"])
        words = (await ctx.conn.probe(self._state_argv(), check=True)).stdout.split("\n")[:-1]
        if len(words) != len(paths) + len(prune) or not set(words) <= {"present", "absent", "empty", "kept"}:
            raise TaskFailed(f"unexpected answer about {', '.join(map(str, paths + prune))}: {words!r}")
        present = [p for p, w in zip(paths, words, strict=False) if w == "present"]
        empty = [p for p, w in zip(prune, words[len(paths) :], strict=True) if w == "empty"]
        return present, empty

    async def check(self, ctx):
        present, empty = await self._present(ctx)
        if not (present or empty):
            return ok("absent")
        return change("remove " + ", ".join(present + empty), present=present, empty=empty)

    async def apply(self, ctx, ch):
        for p in ch.data["present"]:
            await ctx.conn.run(["rm", "-rf", "--", p], check=True)
        # Deepest first, so a parent emptied by its child's removal goes too on the next check.
        for p in sorted(self.p["prune"], key=len, reverse=True):
            await ctx.conn.run(["sh", "-c", '[ -d "$1" ] && [ -z "$(ls -A -- "$1")" ] && rmdir -- "$1" || :', "sh", p])


def _shown(address: str) -> str:
    return f"[{address}]" if ":" in address else address  # IPv6 as ss prints it


def listening_ports(ss_output: str) -> dict[int, str]:
    """`ss -Hltn` lines → {port: local address} (facts/sockets.py parses them)."""
    return {s.port: _shown(s.address) for s in sockets.parse(ss_output)}


@register_task
class PortsClosed(Task):
    """Read-only proof that nothing listens on the given TCP ports any more (`ss -Hltn`)."""

    module = "ports_closed"
    read_only = True
    args = {
        "ports": Arg(list, required=True, help="TCP ports nothing may listen on."),
    }

    async def check(self, ctx):
        res = await ctx.conn.probe(["ss", "-Hltn"], check=True)  # read-only: never from a batch
        listening = listening_ports(res.stdout)
        ports = sorted({int(p) for p in self.p["ports"]})
        still = {p: listening[p] for p in ports if p in listening}
        if still:
            rows = ", ".join(f"{a}:{p}" for p, a in sorted(still.items()))
            raise TaskFailed(f"still listening after teardown: {rows}")
        return ok(f"nothing listens on {', '.join(map(str, ports))}")
