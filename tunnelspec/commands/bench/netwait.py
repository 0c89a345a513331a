"""The controller's side of bench's network-wait measurement: start commands/bench/sampler.py on main over
the existing connection for the measured completions only, stop it, and read what it printed."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from tunnelspec.commands.bench import sampler as bench_sampler

SOURCE = Path(bench_sampler.__file__).read_text()
INTERVAL_S = 0.001
MAX_SECONDS = 3600.0  # bound of one sampler run, whatever happens to the controller's runs
READY_TIMEOUT = 30.0


def sampler_argv(pid: int, ports: list[int], max_seconds: float, interval: float = INTERVAL_S) -> list[str]:
    max_seconds = min(max_seconds, MAX_SECONDS)
    return [
        "python3",
        "-I",
        "-c",
        SOURCE,
        str(pid),
        ",".join(str(p) for p in ports),
        f"{interval:g}",
        f"{max_seconds:g}",
        str(int(max_seconds / interval) + 1),
    ]


class Sampling:
    """One sampler process on main: `start`, the measured work, then `stop()` → its output."""

    def __init__(self, proc, first: str):
        self.proc, self.first = proc, first

    @classmethod
    async def start(cls, conn, pid: int, ports: list[int], max_seconds: float) -> Sampling:
        proc = await conn.spawn(sampler_argv(pid, ports, max_seconds))
        try:
            first = await asyncio.wait_for(proc.readline(), READY_TIMEOUT)
        except TimeoutError:
            first = ""
        return cls(proc, first)

    async def stop(self) -> str:
        """EOF on its stdin ends it; what it printed, "ready" line included."""
        await self.proc.close()
        lines = [self.first]
        for _ in range(100):  # bounded: the sampler prints two lines
            line = await self.proc.readline()
            if not line:
                break
            lines.append(line)
        return "\n".join(lines)


def summarize(output: str, port_nodes: dict[int, str], busy_s: float | None) -> dict:
    """What bench reports from the sampler's output: seconds waiting on the tunnels, their share of
    `busy_s` (the completions' own time, prompt + generation, from llama-server's timings), per node,
    and how it was sampled. `seconds` is None, with `why`, when nothing could be measured."""
    doc = None
    for line in reversed((output or "").splitlines()):
        if line.startswith("{"):
            try:
                doc = json.loads(line)
            except ValueError:
                doc = None
            break
    if not isinstance(doc, dict):
        tail = " | ".join((output or "").strip().splitlines()[-3:]) or "nothing"
        return {"seconds": None, "why": f"the sampler on main printed no result (it said: {tail[:300]})"}
    if doc.get("error"):
        return {"seconds": None, "why": doc["error"]}
    samples = int(doc.get("samples") or 0)
    if samples == 0:
        return {
            "seconds": None,
            "why": f"the sampler took no sample (stopped: {doc.get('stopped')})",
            "stopped": doc.get("stopped"),
        }
    secs = float(doc.get("waiting_s") or 0.0)
    by_node = {port_nodes.get(int(p), f"port {p}"): round(float(s), 3) for p, s in (doc.get("by_port") or {}).items()}
    return {
        "seconds": round(secs, 3),
        "share": round(secs / busy_s, 4) if busy_s else None,
        "of_seconds": round(busy_s, 3) if busy_s else None,
        "by_node": by_node,
        "samples": samples,
        "waiting_samples": int(doc.get("waiting") or 0),
        "interval_s": round(float(doc.get("elapsed_s") or 0.0) / samples, 6),
        "stopped": doc.get("stopped"),
    }


def without_rpc() -> dict:
    """A side with no --rpc has no tunnel to wait on: zero by construction, not by sampling."""
    return {"seconds": 0.0, "share": 0.0, "why": "no --rpc: no tunnel to wait on"}
