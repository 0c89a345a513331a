"""bench's figures as pure functions of what main prints: a server run's load time and context from
its journal, the speeds of a side from llama-server's own `timings`, and whether the model fits
main alone (the GGUF's size and shape against the memory main's devices report)."""

from __future__ import annotations

import re

from tunnelspec.llama import devices, memory_fit

MIB = memory_fit.MIB

# One round trip: a unit's current run (its main PID, its InvocationID and when its main process
# started, in CLOCK_MONOTONIC µs), the command line that process runs (its /proc cmdline: the unit's
# ExecStart= may be a launcher that execs llama-server) and that run's journal lines bench reads,
# with their monotonic time.
UNIT_RUN_SCRIPT = r"""u=$1
systemctl show -p MainPID -p InvocationID -p ExecMainStartTimestampMonotonic -- "$u"
pid=$(systemctl show -p MainPID --value -- "$u")
echo "-- cmdline --"
[ "${pid:-0}" -gt 0 ] && tr '\0' '\n' < "/proc/$pid/cmdline"
inv=$(systemctl show -p InvocationID --value -- "$u")
echo "-- journal --"
[ -n "$inv" ] || exit 0
journalctl --no-pager -o short-monotonic -u "$u" "_SYSTEMD_INVOCATION_ID=$inv" \
  | sed -n -e '/llama_context: n_ctx /p' -e '/model loaded/{p;q;}'
"""
# (sed quits at "model loaded": a server that ran for days at -lv 4 has a long journal after it.)

# `[ 8061.878293] main llama-server[3486]: 0.00.334.886 I srv  llama_server: model loaded`: the
# journal's monotonic time, then llama-server's own prefix (common/log.cpp, on by default since
# common_init: minutes.seconds.milliseconds.microseconds since the process started).
_MONO = re.compile(r"^\[\s*(\d+\.\d+)\]")
_OWN = re.compile(r"\]:\s+(\d+)\.(\d{2})\.(\d{3})\.(\d{3}) [A-Z] ")
_N_CTX = re.compile(r"llama_context: n_ctx\s+=\s+(\d+)")


def parse_unit_run(text: str) -> dict:
    """UNIT_RUN_SCRIPT's output → {"pid", "invocation", "start_us", "argv", "journal"}."""
    head, _, journal = (text or "").partition("-- journal --\n")
    head, _, cmdline = head.partition("-- cmdline --\n")
    props = dict(line.split("=", 1) for line in head.splitlines() if "=" in line)
    main_pid = props.get("MainPID", "0")
    start = props.get("ExecMainStartTimestampMonotonic", "0")
    pid = int(main_pid) if main_pid.isdigit() else 0
    return {
        "pid": pid,
        "invocation": props.get("InvocationID") or None,
        "start_us": int(start) if start.isdigit() and int(start) > 0 else None,
        "argv": [a for a in cmdline.split("\n") if a] if pid else [],
        "journal": journal,
    }


def load_time(journal: str, start_us: int | None) -> dict:
    """Seconds from llama-server's start to its "model loaded" line (weights read, sent to every
    device, context made, warm-up run). From the line's own timestamp when the build prints one,
    else from the journal's time of the line less the unit's main-process start; unknown (None,
    with why) when the run's journal has no such line."""
    for line in (journal or "").splitlines():
        if "model loaded" not in line:
            continue
        own = _OWN.search(line)
        if own:
            m, s, ms, us = (int(g) for g in own.groups())
            return {"seconds": round(m * 60 + s + ms / 1e3 + us / 1e6, 3), "source": "llama-server's log timestamp"}
        mono = _MONO.match(line)
        if mono and start_us:
            return {
                "seconds": round(float(mono.group(1)) - start_us / 1e6, 3),
                "source": "journal: main process start to 'model loaded'",
            }
        return {"seconds": None, "why": "the 'model loaded' line has no time to read"}
    return {
        "seconds": None,
        "why": "this run's journal has no 'model loaded' line (rotated, or a build that does not print it)",
    }


def journal_n_ctx(journal: str) -> int | None:
    """The target's context size of that run (its first `llama_context: n_ctx` line; the draft's,
    made after, comes second)."""
    m = _N_CTX.search(journal or "")
    return int(m.group(1)) if m else None


def _median(values: list[float | None]) -> float | None:
    vals = sorted(v for v in values if v is not None)
    if not vals:
        return None
    mid = len(vals) // 2
    return vals[mid] if len(vals) % 2 else (vals[mid - 1] + vals[mid]) / 2


def side_figures(timings: list[dict]) -> dict:
    """A side's speeds from the `timings` of its measured completions: medians of prompt and
    generation tokens/s, draft tokens accepted/generated summed, and the completions' own time
    (prompt + generation, what the network wait is a share of)."""

    def total(key):
        return sum(t.get(key) or 0 for t in timings)

    return {
        "runs": len(timings),
        "prompt_per_second": _round(_median([t.get("prompt_per_second") for t in timings])),
        "predicted_per_second": _round(_median([t.get("predicted_per_second") for t in timings])),
        "prompt_n": timings[-1].get("prompt_n") if timings else None,
        "predicted_n": timings[-1].get("predicted_n") if timings else None,
        "draft_n": total("draft_n"),
        "draft_n_accepted": total("draft_n_accepted"),
        "completion_seconds": round((total("prompt_ms") + total("predicted_ms")) / 1000, 3),
    }


def _round(x: float | None) -> float | None:
    return round(x, 2) if x is not None else None


# ---- does the model fit main alone? --------------------------------------------------------------
def meminfo_figure(text: str) -> tuple[str, int, int] | None:
    """(name, free bytes, total bytes) of a CPU-only main: MemAvailable and MemTotal of /proc/meminfo."""
    got = memory_fit.ram_available(text)
    return None if got is None else ("RAM (MemAvailable)", *got)


def device_figures(list_devices: str, names: str) -> tuple[list[tuple[str, int, int]], list[str]]:
    """(figures of the named devices from `llama-server --list-devices`, the names it did not list)."""
    listed = {d.name.lower(): d for d in devices.parse_list_devices(list_devices)}
    want = [n for n in names.split(",") if n]
    found = [listed[n.lower()] for n in want if n.lower() in listed]
    return (
        [(d.name, d.free_mib * MIB, d.total_mib * MIB) for d in found],
        [n for n in want if n.lower() not in listed],
    )


def fit_on_main(
    model_bytes: int, shape, n_ctx: int | None, figures: list[tuple[str, int, int]], note: str = ""
) -> dict:
    """Whether the target fits main alone: its weights, KV cache for n_ctx and compute buffers
    (llama/memory_fit.py's estimate, the one the deploy uses for a node) against what main's devices
    report free now (with the deployed server running, as the baseline would run beside it)."""
    need = memory_fit.draft_need(model_bytes, shape, n_ctx)
    if note:
        need = memory_fit.Need(need.weights, need.kv, need.compute, need.notes + (note,))
    fit = memory_fit.check_fit("main", figures, need, "the target")
    free = sum(f for _, f, _ in figures)
    return {
        "fits": fit.level != "refuse",
        "level": fit.level,
        "need_mib": round(need.total / MIB),
        "free_mib": round(free / MIB),
        "devices": [n for n, _, _ in figures],
        "message": fit.message,
    }


def fit_unknown(why: str) -> dict:
    return {"fits": None, "level": "unknown", "message": why}
