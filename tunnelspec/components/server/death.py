"""What a dead (or dying) llama-server left behind: the abort line in its journal and its unit state.

llama-server aborts (SIGABRT, exit 134 from a shell) on a failed GGML_ASSERT, an RPC socket error or
a handshake mismatch, mid-request included: the HTTP client then only sees a cut connection. The
unit (Restart=always) brings it back two seconds later, so by the time anyone looks it may be
"activating" again: the journal of the unit (every invocation) and the restart counter are what
tell the story.
"""

from __future__ import annotations

import re

from tunnelspec.components.server.args import UNIT
from tunnelspec.facts import units

# Most specific first: the line that names the cause beats the generic signal report.
_CAUSES = (
    re.compile(r"GGML_ASSERT\(.*\) failed"),
    # ggml_abort's own format, for GGML_ABORT("…") too: "…/ggml-rpc.cpp:30: Remote RPC server crashed …".
    re.compile(r"\S+\.(?:c|cc|cpp|h|hpp|cu|m):\d+: \S"),
    re.compile(r"terminate called after throwing|what\(\):"),
    re.compile(r"\bfailed to (?:connect|read|send|receive)\b.*RPC|\bRPC\b.*(?:mismatch|failed)", re.I),
    re.compile(r"Main process exited, code=(?:dumped|killed)"),
)
_EXIT = re.compile(r"Main process exited, code=\w+, status=\S+")
PROPS = ("ActiveState", "SubState", "Result", "ExecMainCode", "ExecMainStatus", "NRestarts")
# systemd's CLD_* codes in ExecMainCode.
_CODES = {"1": "exited", "2": "killed", "3": "dumped core"}


def abort_line(journal: str) -> str | None:
    """The last line naming why llama-server died (a GGML_ASSERT, an exception, an RPC failure), else
    systemd's last "Main process exited, code=dumped|killed" line, else None."""
    lines = [ln.strip() for ln in journal.splitlines() if ln.strip()]
    for pattern in _CAUSES:
        for line in reversed(lines):
            if pattern.search(line):
                return line
    return None


# systemd's own lines about the unit (with `-o cat` they are mixed with the process's output).
_SYSTEMD = re.compile(r"^(?:\S+\.service: |(?:Started|Starting|Stopped|Stopping|Consumed) )")
_SIGNAL_EXIT = re.compile(r"Main process exited, code=(?:dumped|killed)")


def last_words(journal: str) -> str | None:
    """The last line the process printed before systemd reported it killed by a signal: an abort()
    after an fprintf(stderr, …), a crash handler's message — what the process said, not systemd."""
    lines = [ln.strip() for ln in journal.splitlines() if ln.strip()]
    for i in range(len(lines) - 1, -1, -1):
        if _SIGNAL_EXIT.search(lines[i]):
            for prev in reversed(lines[:i]):
                if _SYSTEMD.search(prev):
                    continue
                return None if _SIGNAL_EXIT.search(prev) else prev
            return None
    return None


def exit_line(journal: str) -> str | None:
    found = None
    for m in _EXIT.finditer(journal):
        found = m.group(0)
    return found


def unit_state_text(props: dict[str, str], unit: str = UNIT) -> str:
    state = f"{props.get('ActiveState', '?')}/{props.get('SubState', '?')}"
    code = _CODES.get(props.get("ExecMainCode", ""), props.get("ExecMainCode", "?"))
    out = (
        f"unit {unit} {state}, result {props.get('Result', '?')}, last main process {code} "
        f"(status {props.get('ExecMainStatus', '?')})"
    )
    restarts = props.get("NRestarts")
    if restarts and restarts != "0":
        out += f", restarted {restarts} time(s)"
    return out


def describe_from(what: str, props: dict[str, str], journal: str, unit: str = UNIT) -> str:
    """`what` (the symptom), then the abort line if the journal has one, the unit state, and the
    exit report; without an abort line, the journal's last lines."""
    state = unit_state_text(props, unit)
    cause, exited = abort_line(journal), exit_line(journal)
    if cause and _SIGNAL_EXIT.search(cause):
        # Only systemd's signal report matched: what llama-server itself printed last says more.
        said = last_words(journal)
        if said:
            return f"{what}: llama-server died: {said}; {state}; systemd: {cause}"
    if cause:
        extra = f"; systemd: {exited}" if exited and exited not in cause else ""
        return f"{what}: llama-server died: {cause}; {state}{extra}"
    tail = "\n".join(journal.strip().splitlines()[-15:])
    return f"{what}; {state}:\n{tail}"


def crash_loop(start: dict[str, str], now: dict[str, str]) -> bool:
    """The unit restarts in a loop: since `start` (its props when the wait began) systemd restarted it
    twice with the process killed by a signal (an abort while loading is not cured by waiting), or
    three times whatever the exit. The launcher's own exits while it waits for a node are slow (90 s)."""
    try:
        restarts = int(now.get("NRestarts") or 0) - int(start.get("NRestarts") or 0)
    except ValueError:
        return False
    signalled = now.get("ExecMainCode") in ("2", "3")
    return restarts >= 3 or (restarts >= 2 and signalled)


async def unit_props(conn, unit: str = UNIT) -> dict[str, str]:
    return await units.properties(unit, list(PROPS)).gather(conn)


async def describe(conn, what: str, unit: str = UNIT, lines: int = 300) -> str:
    props = await units.properties(unit, list(PROPS)).gather(conn)
    # Every invocation, not only the current one: the one that died may already have been replaced.
    journal = (
        await conn.probe(["journalctl", "--no-pager", "-o", "cat", "-n", str(lines), "-u", unit], timeout=60)
    ).stdout
    return describe_from(what, props, journal, unit)
