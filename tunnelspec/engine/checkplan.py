"""--check on a cluster that is not there yet: the plan goes on past steps whose input is missing.

A check is read-only, so under --check nothing an earlier task would create exists when a later
task looks for it: no source before the build, no binary before the rpc unit, no rpc-server before
the tunnels' HELLO, no tunnels before llama-server's device list. A real run meets none of those
failures, because it applies each step before checking the next.

So the run keeps a memo of what would change (host, task). When a check fails under --check and
something earlier would change — on the same host, or, for the steps that cross hosts (tunnels,
gates), on any host of the run — the failure is the absence of what those changes create: the
task is reported as a planned change that depends on them (`after`), the host goes on, and the
plan stays whole. With nothing earlier to change, a failing check is what a real run would meet
too, and it stays a failure. One rule in the executor, no special case in any task.
"""

from __future__ import annotations


class CheckPlan:
    def __init__(self) -> None:
        self._would: list[tuple[str, str]] = []  # (host, task) in run order

    def record(self, host: str, task: str) -> None:
        if (host, task) not in self._would:
            self._would.append((host, task))

    def earlier(self, host: str) -> list[str]:
        """What would change before this point: this host's steps, else every host's (a step that
        crosses hosts, like the tunnels on main, waits for the nodes' services)."""
        own = [t for h, t in self._would if h == host]
        if own:
            return own
        return [f"{t} on {h}" for h, t in self._would]

    def any(self) -> bool:
        return bool(self._would)

    @staticmethod
    def message(after: list[str], reason: str) -> str:
        shown = ", ".join(after[-3:]) + (f" (and {len(after) - 3} earlier)" if len(after) > 3 else "")
        first = reason.strip().splitlines()[0] if reason.strip() else ""
        return f"would run after what earlier steps would create ({shown}); its check cannot see that yet: {first}"
