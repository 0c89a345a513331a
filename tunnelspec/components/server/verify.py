"""Proof that llama-server serves with the remote draft: /health, one completion that used draft
tokens, the journal line placing the draft model's buffer on the draft node's RPC device, and the
speculative type it runs. Shared by the `llama_verify` task, `tunnelspec status` and `tunnelspec bench`."""

from __future__ import annotations

import asyncio
from itertools import pairwise

from tunnelspec.connection.base import read_argv
from tunnelspec.core.constants import LOOPBACK
from tunnelspec.core.errors import TaskFailed
from tunnelspec.core import http
from tunnelspec.facts import units
from tunnelspec.llama import known_issues, props, split_proof
from tunnelspec.llama.served_plan import ServedPlan
from tunnelspec.components.server import death as server_death
from tunnelspec.components.server.args import UNIT, draft_placement
from tunnelspec.core.secrets import Secret
from tunnelspec.components.tls.reach import ApiTls, Seen, api_opener
from tunnelspec.components.tls.reach import summary as tls_summary


async def read_api_key(conn, path: str | None) -> Secret | None:
    if not path:
        return None
    data = await conn.get(path)
    if data is None:
        raise TaskFailed(f"API key file {path} does not exist on the main host")
    return Secret(data.decode().strip())


def invocation_argv(unit: str = UNIT) -> list[str]:
    return ["systemctl", "show", "-p", "InvocationID", "--value", unit]


def sizes_argv(paths: list[str]) -> list[str]:
    """What `model_sizes(conn, paths)` reads."""
    return ["stat", "-L", "-c", "%s", "--", *paths]


# The journal of the unit's current run only (its InvocationID, read on the host in the same command),
# so old runs prove nothing; the whole unit's journal where systemd names no run.
_JOURNAL = (
    'inv=$(systemctl show -p InvocationID --value "$1" 2>/dev/null) || inv=\n'
    'if [ -n "$inv" ]; then exec journalctl --no-pager -o cat -u "$1" "_SYSTEMD_INVOCATION_ID=$inv"; fi\n'
    'exec journalctl --no-pager -o cat -u "$1"\n'
)


def journal_argv(unit: str = UNIT) -> list[str]:
    """What `invocation_journal(conn, unit)` reads: one command, so a play's batch can read it."""
    return ["sh", "-c", _JOURNAL, "sh", unit]


def verify_probes(api_key_file: str | None) -> list[list[str]]:
    """What `verify_server` reads: the unit's state (the crash watch's baseline), the API key, and
    the current run's journal (the draft's placement)."""
    key = [read_argv(api_key_file)] if api_key_file else []
    return [units.properties(UNIT, list(server_death.PROPS)).argv, *key, journal_argv()]


async def invocation_journal(conn, unit: str = UNIT) -> str:
    """The journal of the unit's current run only (its InvocationID), so old runs prove nothing."""
    return (await conn.probe(journal_argv(unit), timeout=60)).stdout


def output_parser_failure(plan: ServedPlan, e) -> str:
    """One clear message for a build that generated text and refused it (core/http.py)."""
    build = plan.build or "this llama-server build"
    return (
        f"llama-server ({build}) generated the test completion and then refused its own output "
        f"(HTTP 500 from its output parser: {e.server_message!r}). This build checks generated text "
        "and fails on text that is not valid UTF-8 or not in the form it expects — a model whose "
        "tokens are single bytes (random or tiny test models), or a real one cut mid-character by "
        "n_predict. Serving and the remote draft are not at fault. What to do: use a model whose "
        "vocabulary decodes to whole UTF-8 characters (the lab's tiny model is printable ASCII), or "
        "a build without this check (b11434 has none); clients asking for more tokens may not meet it."
    )


# verify's wait for /health when the inventory gives no llama_server_start_timeout: the old fixed
# 180 s, plus 15 s for every GiB of model that llama-server reads and sends to its devices (about
# 70 MB/s: a 1 Gbit/s link to RPC nodes, with room) — 780 s for a 40 GiB target.
BASE_START_TIMEOUT = 180
START_SECONDS_PER_GIB = 15


def start_timeout(configured: int | None, model_bytes: list[int]) -> int:
    """Seconds to wait for /health: the inventory's llama_server_start_timeout, else from the sizes."""
    if configured:
        return int(configured)
    gib = sum(model_bytes) / (1 << 30)
    return BASE_START_TIMEOUT + int(round(gib * START_SECONDS_PER_GIB))


async def journal_last_line(conn, unit: str = UNIT, lines: int = 40) -> str:
    """The newest line of the unit's current run (its InvocationID), for a progress report; '' when
    there is none or the journal cannot be read (a report must not fail the wait)."""
    try:
        inv = (await conn.probe(invocation_argv(unit))).stdout.strip()
        argv = ["journalctl", "--no-pager", "-o", "cat", "-n", str(lines), "-u", unit]
        if inv:
            argv.append(f"_SYSTEMD_INVOCATION_ID={inv}")
        out = (await conn.probe(argv, timeout=30)).stdout or ""
    except Exception:  # noqa: BLE001 — a report is best effort; the wait itself says what failed
        return ""
    text = [row.strip() for row in out.splitlines() if row.strip()]
    return text[-1] if text else ""


def health_progress_line(elapsed: float, budget: float, last: str, journal: str) -> str:
    """`llama-server not healthy yet: 12 s of 195 s (HTTP 503 …); journal: llama_model_load: …`"""
    answer = " ".join(last.split())
    answer = answer if len(answer) <= 70 else answer[:69] + "…"
    line = f"llama-server not healthy yet: {elapsed:.0f} s of {budget:g} s ({answer})"
    if journal:
        journal = journal if len(journal) <= 160 else journal[:159] + "…"
        line += f"; journal: {journal}"
    return line


def health_reporter(conn, progress, budget: float):
    """The /health wait's report (http.wait_health): elapsed time, the budget, the last answer and
    llama-server's newest journal line (its model-load lines as they come), as a progress event."""
    if progress is None:
        return None

    async def report(elapsed: float, last: str) -> None:
        journal = await journal_last_line(conn)
        progress(
            health_progress_line(elapsed, budget, last, journal),
            waiting_for="/health",
            elapsed_s=round(elapsed, 1),
            budget_s=budget,
            journal=journal,
        )

    return report


def crash_watch(conn, report, host: str, port: int):
    """The /health wait's report, plus a look at the unit each time: a llama-server that dies again
    and again before /health answers (an abort while loading the model) fails the wait at once,
    with its own last words, instead of after the whole budget. Call it to start a wait: returns
    the report for that wait, its restart count taken now."""

    async def start():
        baseline = await server_death.unit_props(conn)

        async def watched(elapsed: float, last: str) -> None:
            if report is not None:
                await report(elapsed, last)
            now = await server_death.unit_props(conn)
            if server_death.crash_loop(baseline, now):
                n = int(now.get("NRestarts") or 0) - int(baseline.get("NRestarts") or 0)
                raise TaskFailed(
                    await server_death.describe(
                        conn,
                        f"llama-server on {host}:{port} restarts in a loop ({n} restarts in {elapsed:.0f} s, "
                        "never healthy)",
                    )
                )

        return watched

    return start


def model_paths(argv: list[str]) -> list[str]:
    """The model files (-m and the draft's) of a llama-server argv."""
    out = []
    for flag, value in pairwise(argv):
        if flag in ("-m", "--model", "-md", "--model-draft", "--spec-draft-model"):
            out.append(value)
    return out


async def model_sizes(conn, paths: list[str]) -> list[int]:
    """Sizes in bytes of the files that exist (a missing one counts 0: /health's wait then says why)."""
    if not paths:
        return []
    res = await conn.probe(sizes_argv(paths))
    return [int(x) for x in (res.stdout or "").split() if x.isdigit()]


def no_progress(e: http.HttpError, endpoints: int, what: str) -> str:
    """A completion that got no answer in its time (`what` says which), on 3 or more RPC endpoints:
    the message naming llama.cpp issue 28487 (llama/known_issues.py); '' for any other failure or
    topology. Shared by verify and bench."""
    if not isinstance(e, http.NoAnswer):
        return ""
    return known_issues.no_progress(endpoints, f"{what} within {e.timeout:g} s", UNIT)


async def verify_server(
    conn,
    port: int,
    plan: ServedPlan,
    *,
    host: str = LOOPBACK,
    api_key_file=None,
    health_timeout=180,
    n_predict=32,
    prompt="Once upon a time",
    journal_timeout=30,
    add_secret=None,
    tls: ApiTls | None = None,
    progress=None,
    completion_timeout: float = 120.0,
) -> dict:
    """Shared by the verify task and `tunnelspec verify`: returns the facts, raises TaskFailed.
    `host` is the address llama-server listens on, as seen from the main host; `tls` (public bind):
    TLS with the CA pinned, the certificate checked for the name clients use. `progress(msg, **data)`
    (a task's): where a long /health wait stands, every few seconds. `completion_timeout`: the bound
    on the test completion's answer."""
    seen = Seen()
    opener = api_opener(conn, port, host, tls, seen)
    report = crash_watch(conn, health_reporter(conn, progress, health_timeout), host, port)
    try:
        await http.wait_health(opener, health_timeout, report=await report())
    except http.HttpError as e:
        raise TaskFailed(
            await server_death.describe(conn, f"llama-server on {host}:{port} not healthy ({e})")
        ) from None
    key = await read_api_key(conn, api_key_file)
    if key and add_secret:
        add_secret(key.reveal())
    restarted = ""
    try:
        body = await http.completion(
            opener, prompt, n_predict, api_key=key.reveal() if key else None, timeout=completion_timeout
        )
    except http.OutputParserError as e:
        raise TaskFailed(output_parser_failure(plan, e)) from None
    except http.HttpError as e:
        what = f"llama-server on {host}:{port} gave no answer to a {n_predict}-token test completion"
        if stuck := no_progress(e, len(plan.endpoints), what):
            raise TaskFailed(stuck) from None  # asking again would wait behind the stuck slot
        # llama-server never reconnects a lost RPC connection: it notices one (an rpc-server restarted by
        # this deploy, or by another run just before) at its next request, aborts, and systemd starts it
        # again (Restart=always). That next request is this one. Once healthy again, one more try;
        # what the play's batch read of llama-server (its InvocationID) is from before that restart.
        conn.drop_probes()
        try:
            await http.wait_health(opener, health_timeout, report=await report())
            body = await http.completion(
                opener, prompt, n_predict, api_key=key.reveal() if key else None, timeout=completion_timeout
            )
        except http.OutputParserError as e2:
            raise TaskFailed(output_parser_failure(plan, e2)) from None
        except http.HttpError as e2:
            if stuck := no_progress(e2, len(plan.endpoints), what):
                raise TaskFailed(f"{stuck} (first completion failed: {e})") from None
            # Dying again is more than a lost connection: say why from its journal and unit state.
            raise TaskFailed(
                await server_death.describe(conn, f"completion failed: {e}; again after /health: {e2}")
            ) from None
        restarted = f" (first completion failed: {e}; llama-server restarted, ok after)"
    timings = body.get("timings") or {}
    draft_n, accepted = timings.get("draft_n"), timings.get("draft_n_accepted")
    if plan.draft_node is None:
        return await _verify_split(conn, opener, plan, body, key, journal_timeout, tls, seen, restarted)
    if not draft_n:
        raise TaskFailed(
            f"the completion used no draft tokens (timings: draft_n={draft_n}): speculative "
            "decoding is off or the draft proposed nothing. Was --spec-type given, and did the "
            "draft load? A build drafts only tokens the draft model is at least "
            "--spec-draft-p-min sure of (b9093's default is 0.75): a draft never that sure "
            "proposes nothing — set spec_draft_p_min lower to see it draft."
        )
    # The load lines reach the journal shortly after they are printed: poll with a deadline.
    loop = asyncio.get_running_loop()
    end = loop.time() + journal_timeout
    placed = None
    for _ in range(journal_timeout * 2 + 2):
        journal = await invocation_journal(conn)
        try:
            placed = draft_placement(journal, plan)
            break
        except TaskFailed:
            if loop.time() >= end:
                raise
            await asyncio.sleep(0.5)
    if placed is None:  # the tries ran out before the deadline did
        raise TaskFailed(f"the draft model's placement did not reach the journal within {journal_timeout} s")
    tps = timings.get("predicted_per_second")
    # The type llama-server runs, in its own words (after the completion a slot carries it).
    types = await props.read_spec_types(opener, key.reveal() if key else None)
    want, running = plan.spec_type, types["slots"]
    # Only a slot's value is evidence (/props' is the sampling defaults'); builds where the draft
    # model alone speculates report "none" there although they draft.
    if want and running and not plan.implicit_spec_type and want not in running.split(","):
        raise TaskFailed(
            f"llama-server runs speculative type {running!r} (from /slots), not the {want} the inventory asks for"
        )
    summary = (
        f"health ok; speculative type {types['active'] or '?'}; draft model buffer on "
        f"{placed.device}[{placed.host}:{placed.port}] ({placed.size}); "
        f"completion {timings.get('predicted_n')} tokens at {tps or 0:.1f} tok/s, "
        f"draft_n={draft_n} draft_n_accepted={accepted}; {tls_summary(tls, seen)}{restarted}"
    )
    return {
        "draft_n": draft_n,
        "draft_n_accepted": accepted,
        "predicted_n": timings.get("predicted_n"),
        "predicted_per_second": tps,
        "placement": placed.line,
        "content": body.get("content", ""),
        "spec_type": types["active"],
        "spec_type_props": types["props"],
        "summary": summary,
        "tls": seen.describe() if tls is not None else None,
    }


async def _verify_split(
    conn, opener, plan: ServedPlan, body: dict, key, journal_timeout: int, tls, seen, restarted: str
) -> dict:
    """No draft (a target split, or the draft node left out): the completion answered (no draft
    tokens expected), and the target's load lines put its layers where the proportions say."""
    timings = body.get("timings") or {}
    loop = asyncio.get_running_loop()
    end = loop.time() + journal_timeout
    check = None
    for _ in range(journal_timeout * 2 + 2):  # the load lines reach the journal shortly after
        check = split_proof.check_split(await invocation_journal(conn), plan)
        if check is not None or loop.time() >= end:
            break
        await asyncio.sleep(0.5)
    if check is None:
        raise TaskFailed(
            "llama-server's journal (this run) has no 'load_tensors: offloaded N/M layers' line: "
            "the target's placement cannot be proven; is its log verbosity lowered in "
            "llama_server_extra_args?"
        )
    if not check.ok:
        raise TaskFailed(check.message)
    types = await props.read_spec_types(opener, key.reveal() if key else None)
    tps = timings.get("predicted_per_second")
    summary = (
        f"health ok; split, no draft; {check.message}; completion {timings.get('predicted_n')} tokens at "
        f"{tps or 0:.1f} tok/s; {tls_summary(tls, seen)}{restarted}"
    )
    return {
        "kind": plan.kind,
        "draft_n": timings.get("draft_n") or 0,
        "draft_n_accepted": timings.get("draft_n_accepted") or 0,
        "predicted_n": timings.get("predicted_n"),
        "predicted_per_second": tps,
        "placement": "; ".join(f"{d} {n}" for d, n in check.seen),
        "layers": {"asked": [[d, round(x, 2)] for d, x in check.asked], "seen": [list(p) for p in check.seen]},
        "content": body.get("content", ""),
        "spec_type": types["active"],
        "spec_type_props": types["props"],
        "summary": summary,
        "tls": seen.describe() if tls is not None else None,
    }
