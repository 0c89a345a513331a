"""Ansible-like human output. No colour unless a tty and NO_COLOR is unset."""

from __future__ import annotations

import difflib
import os
import sys

_COLORS = {"ok": "32", "changed": "33", "failed": "31", "unreachable": "31", "skipped": "36"}


class HumanReporter:
    def __init__(self, stream=None, verbose: int = 0, color: bool | None = None):
        self.stream = stream or sys.stdout
        self.verbose = verbose
        if color is None:
            color = hasattr(self.stream, "isatty") and self.stream.isatty() and "NO_COLOR" not in os.environ
        self.color = color

    def _c(self, status: str, text: str) -> str:
        return f"\033[{_COLORS[status]}m{text}\033[0m" if self.color and status in _COLORS else text

    def _w(self, line: str) -> None:
        self.stream.write(line + "\n")
        self.stream.flush()

    def __call__(self, ev: dict) -> None:
        kind = ev.get("event")
        if kind == "play_start":
            self._w(f"\nPLAY [{ev['play']}] " + "*" * max(3, 60 - len(ev["play"])))
        elif kind == "task_result":
            st = ev["status"]
            if st == "skipped" and not self.verbose:
                return
            label = "would change" if ev.get("would_change") else st
            msg = ev.get("msg", "")
            self._w(self._c(st, f"{label}: [{ev['host']}] {ev['task']}") + (f" — {msg}" if msg else ""))
            if "diff" in ev:
                d = ev["diff"]
                for line in difflib.unified_diff(
                    d["before"].splitlines(),
                    d["after"].splitlines(),
                    f"before: {d.get('path', '')}",
                    f"after: {d.get('path', '')}",
                    lineterm="",
                ):
                    self._w("    " + line)
        elif kind == "unreachable":
            self._w(self._c("unreachable", f"unreachable: [{ev['host']}]") + f" — {ev.get('msg', '')}")
        elif kind == "progress":
            self._w(f"  .. [{ev['host']}] {ev['task']}: {ev['msg']}")
        elif kind == "run_lock":
            self._w(f"  .. [{ev['host']}] run lock: {ev['msg']}")
        elif kind == "gate":
            color = {"ok": "ok", "planned": "changed"}.get(ev["status"], "failed")
            self._w(self._c(color, f"gate {ev['status']}: {ev['play']}") + f" — {ev['msg']}")
        elif kind == "host_key_pinned":
            self._w(f"NOTE: [{ev['host']}] {ev['msg']}")
        elif kind == "recap":
            self._w("\nPLAY RECAP " + "*" * 50)
            for host, c in ev["hosts"].items():
                parts = "  ".join(f"{k}={v}" for k, v in c.items())
                self._w(f"{host:<24} : {parts}")
        elif kind == "message":
            self._w(ev.get("msg", ""))
