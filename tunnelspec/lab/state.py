"""The lab's state file: what `lab up` created, so `down`/`status` work after a crash.

One lab per bridge: `/var/lib/tunnelspec-lab/<bridge>/state.json`. Written atomically after each
step that creates something, so a crash never leaves an unrecorded namespace, mount or process.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

STATE_ROOT = Path("/var/lib/tunnelspec-lab")


def state_dir(bridge: str) -> Path:
    return STATE_ROOT / bridge


def load(bridge: str) -> dict | None:
    path = state_dir(bridge) / "state.json"
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        return None


def save(bridge: str, state: dict) -> None:
    d = state_dir(bridge)
    d.mkdir(parents=True, exist_ok=True)
    tmp = d / "state.json.tmp"
    tmp.write_text(json.dumps(state, indent=2, sort_keys=True) + "\n")
    os.replace(tmp, d / "state.json")


def all_labs() -> list[dict]:
    labs = []
    if STATE_ROOT.is_dir():
        for path in sorted(STATE_ROOT.glob("*/state.json")):
            try:
                labs.append(json.loads(path.read_text()))
            except (OSError, ValueError):
                continue
    return labs


def find_by_dir(lab_dir: Path) -> dict | None:
    for st in all_labs():
        if st.get("dir") == str(lab_dir):
            return st
    return None
