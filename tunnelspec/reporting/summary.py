"""Counters and the exit code, in one small object (like black's Report)."""

from __future__ import annotations

from collections import defaultdict

from tunnelspec.core.errors import EXIT_DRIFT, EXIT_FAILED, EXIT_OK, EXIT_UNREACHABLE, EXIT_USAGE

STATUSES = ("ok", "changed", "failed", "skipped", "unreachable")


class Summary:
    def __init__(self, check: bool = False):
        self.check = check
        self.counts: dict[str, dict[str, int]] = defaultdict(lambda: dict.fromkeys(STATUSES, 0))
        self.gate_failed = False
        # A task of a preflight play refused its input (UsageError): the inventory must change, and
        # nothing was changed anywhere. Exit 2, as for every input error, before an unreachable host.
        self.refusals: list[str] = []

    def record(self, event: dict) -> None:
        kind = event.get("event")
        if kind == "task_result":
            self.counts[event["host"]][event["status"]] += 1
        elif kind == "unreachable":
            self.counts[event["host"]]["unreachable"] += 1
        elif kind == "gate" and event.get("status") == "failed":
            self.gate_failed = True

    def mark_failed(self, host: str) -> None:
        self.counts[host]["failed"] += 1

    def per_host(self) -> dict:
        return {h: dict(c) for h, c in sorted(self.counts.items())}

    def total(self, status: str) -> int:
        return sum(c[status] for c in self.counts.values())

    def exit_code(self) -> int:
        if self.refusals:
            return EXIT_USAGE
        if self.total("unreachable"):
            return EXIT_UNREACHABLE
        if self.total("failed") or self.gate_failed:
            return EXIT_FAILED
        if self.check and self.total("changed"):
            return EXIT_DRIFT
        return EXIT_OK

    def wording(self) -> str:
        changed = self.total("changed")
        verb = "would change" if self.check else "changed"
        return f"{changed} task(s) {verb}, {self.total('failed')} failed, {self.total('unreachable')} unreachable"
