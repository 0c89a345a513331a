"""One JSON object per line, each with the schema version."""

from __future__ import annotations

import json
import sys

from tunnelspec.reporting import SCHEMA_VERSION


class JsonReporter:
    def __init__(self, stream=None):
        self.stream = stream or sys.stdout

    def __call__(self, ev: dict) -> None:
        self.stream.write(json.dumps({"schema": SCHEMA_VERSION, **ev}, default=str, sort_keys=True) + "\n")
        self.stream.flush()
