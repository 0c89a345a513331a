"""Progress on a long wait: a line when it starts, then one every few seconds with the time it has
taken, until it ends. A command that takes minutes with no output looks hung; a line
every 10 s with the elapsed time says it is not. The lines are `progress` events (reporting/events.py),
so the human output shows them as `.. [host] task: …` and `--format json` as events. Tasks reach
it as `ctx.heartbeat(what)` (engine/context.py). A polling loop with news of its own (the /health
wait, core/http.py) reports on its own schedule instead."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

# Seconds between two heartbeat lines of a command that says nothing while it runs.
HEARTBEAT_EVERY = 10.0


class Heartbeat:
    """`async with Heartbeat(ctx.progress, "git clone …"):` — "git clone …" at once, then
    "git clone …: 10 s so far" every `every` seconds while the body runs. `progress` is a task
    context's progress(msg, **data)."""

    def __init__(self, progress: Callable[..., None], what: str, every: float = HEARTBEAT_EVERY):
        self.progress, self.what, self.every = progress, what, every
        self._task: asyncio.Task | None = None
        self._start = 0.0

    async def _beat(self) -> None:
        n = 0
        while True:
            n += 1
            # Sleep until the n-th mark, not `every` after the last line: the marks stay on 10 s, 20 s…
            await asyncio.sleep(max(0.0, self._start + n * self.every - time.monotonic()))
            elapsed = time.monotonic() - self._start
            self.progress(f"{self.what}: {elapsed:.0f} s so far", elapsed_s=round(elapsed, 1))

    async def __aenter__(self) -> Heartbeat:
        self._start = time.monotonic()
        self.progress(self.what, elapsed_s=0.0)
        self._task = asyncio.create_task(self._beat())
        return self

    async def __aexit__(self, *exc) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
