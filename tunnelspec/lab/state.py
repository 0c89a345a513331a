"""The lab's state file: what `lab up` created, so `down`/`status` work after a crash.

One lab per bridge: `/var/lib/tunnelspec-lab/<bridge>/state.json`. Written atomically after each
step that creates something, so a crash never leaves an unrecorded namespace, mount or process.
"""

from __future__ import annotations

import fcntl
import json
import os
import time
from contextlib import contextmanager
from pathlib import Path

from tunnelspec.core.errors import LabError

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


@contextmanager
def locked(wait_s: float = 900.0):
    """One `lab up`/`lab down` at a time on this machine: test sessions of several engineers and
    CI may start labs concurrently, and two image builds or two boots of one host would clash.
    The wait covers a cold image build."""
    STATE_ROOT.mkdir(parents=True, exist_ok=True)
    with open(STATE_ROOT / ".lock", "w") as f:
        end = time.monotonic() + wait_s
        while True:
            try:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > end:
                    raise LabError(f"another lab up/down held {STATE_ROOT / '.lock'} for {wait_s:.0f} s") from None
                time.sleep(0.5)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)
