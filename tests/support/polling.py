"""Waiting without sleeps of a guessed length: poll a condition until it holds or a deadline passes."""

from __future__ import annotations

import time


def poll(fn, deadline_s: float = 60.0, step: float = 0.5):
    """fn()'s first truthy result, asked every `step` seconds; its last (falsy) one after the deadline."""
    end = time.monotonic() + deadline_s
    while True:
        value = fn()
        if value or time.monotonic() > end:
            return value
        time.sleep(step)


def poller(deadline_s: float, step: float):
    """`poll` with a module's own defaults (a call may still give its deadline, by position too)."""

    def poll_with(fn, deadline_s: float = deadline_s, step: float = step):
        return poll(fn, deadline_s, step)

    return poll_with
