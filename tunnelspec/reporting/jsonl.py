"""One JSON object per line. Each event already carries the schema version (reporting/events.py
stamps it when the event is built)."""

from __future__ import annotations

import json
import sys


class JsonReporter:
    def __init__(self, stream=None):
        self.stream = stream or sys.stdout

    def __call__(self, ev: dict) -> None:
        self.stream.write(json.dumps(ev, default=str, sort_keys=True) + "\n")
        self.stream.flush()
