"""`tunnelspec bench`: the cluster as deployed against the same GGUF on main alone, on one prompt,
side by side: load time, prompt and generation speed, draft acceptance, time waiting on the network.

The deployed side is the running llama-server (speculative with a remote draft, or a target split
over RPC nodes with no draft: commands/bench/argv.py reads which from its ExecStart=). The baseline is a
temporary second llama-server on another loopback port, a transient systemd unit
(`BENCH_UNIT`) with the deployed command line minus every draft and RPC flag: the same model on
main's own devices, run only when it fits them (bench_figures.fit_on_main; otherwise the result
says why, with both figures). This build's server has no per-request switch for speculation
(server-schema.cpp keeps `speculative.n_max` under `#if 0`), hence a second server. The rpc-servers
serve one client at a time and are held by the deployed server, so a baseline that keeps the RPC
placement (`same_placement`) must stop the deployed server meanwhile: an interruption of serving,
refused unless the caller says yes.

The network wait of a side with --rpc is measured on main while its completions run
(commands/bench/sampler.py, over this connection); a side without --rpc has no tunnel to wait on.
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

from tunnelspec.commands.bench import figures as figs
from tunnelspec.components.front import model as front
from tunnelspec.commands.bench import netwait
from tunnelspec.commands.bench.argv import (
    baseline_argv,
    context_size,
    deployed_kind,
    describe_placement,
    flag_value,
    local_devices,
    parse_exec_start,
    rpc_ports,
)
from tunnelspec.commands.bench.render import render
from tunnelspec.connection import ConnectOptions, connect
from tunnelspec.core.constants import LOOPBACK
from tunnelspec.core.errors import TaskFailed, UsageError
from tunnelspec.components import isolation_host
from tunnelspec.facts import nft, port_owners
from tunnelspec.core import http
from tunnelspec.components.server.args import UNIT
from tunnelspec.components.server.verify import no_progress as verify_no_progress
from tunnelspec.components.server.verify import read_api_key, start_timeout
from tunnelspec.components.server.fit import gguf_facts
from tunnelspec.components.tls.reach import ApiTls, api_opener

__all__ = [
    "BENCH_UNIT",
    "DEFAULT_PROMPT",
    "SCHEMA",
    "baseline_argv",
    "bench_sync",
    "parse_exec_start",
    "refuse_same_placement",
    "render",
    "run_bench",
]

BENCH_UNIT = "tunnelspec-llama-bench.service"
SCHEMA = 2
DEFAULT_PROMPT = "Write a short story about a lighthouse keeper who finds a message in a bottle."
COMPLETION_TIMEOUT = 300.0


def refuse_same_placement(yes: bool) -> None:
    """--same-placement stops the deployed llama-server: never without an explicit yes (and never
    by asking: CI has no terminal)."""
    if not yes:
        raise UsageError(
            "bench --same-placement stops the deployed llama-server on main for the baseline "
            "(the rpc-servers serve one client at a time): serving is interrupted for the "
            "baseline's load and runs, and the server is started again afterwards. Add --yes "
            "to allow it, or leave --same-placement out to compare with main alone (no interruption)."
        )


async def _unit_run(conn, unit: str) -> dict:
    res = await conn.run(["sh", "-c", figs.UNIT_RUN_SCRIPT, "sh", unit], timeout=60)
    return figs.parse_unit_run(res.stdout)


async def _measure(
    conn, unit: str, opener, key, prompt: str, n_predict: int, runs: int, ports: list[int], port_nodes: dict[int, str]
) -> dict:
    """One side: a warm-up (the first request pays allocations), then `runs` completions with the
    network sampled meanwhile when the side has tunnels."""
    await http.completion(opener, prompt, 8, api_key=key, timeout=COMPLETION_TIMEOUT)
    run = await _unit_run(conn, unit)
    sampling = None
    if ports and run["pid"]:
        sampling = await netwait.Sampling.start(conn, run["pid"], ports, runs * COMPLETION_TIMEOUT + 60)
    timings = []
    try:
        for _ in range(runs):
            body = await http.completion(opener, prompt, n_predict, api_key=key, timeout=COMPLETION_TIMEOUT)
            timings.append(body.get("timings") or {})
    finally:
        output = await sampling.stop() if sampling is not None else None
    side = figs.side_figures(timings)
    if not ports:
        side["network_wait"] = netwait.without_rpc()
    elif output is None:
        side["network_wait"] = {"seconds": None, "why": f"{unit} has no main PID on main"}
    else:
        side["network_wait"] = netwait.summarize(output, port_nodes, side["completion_seconds"])
    side["load"] = figs.load_time(run["journal"], run["start_us"])
    side["journal"] = run["journal"]  # for the context size; removed from the result
    return side


def no_progress(e: http.HttpError, argv: list[str]) -> str:
    """A deployed completion that got no answer within COMPLETION_TIMEOUT on 3 or more RPC endpoints:
    the message naming llama.cpp issue 28487; '' otherwise."""
    return verify_no_progress(e, len(rpc_ports(argv)), "the deployed llama-server gave no answer to a bench completion")


def as_user(user: str, argv: list[str]) -> list[str]:
    """argv run as the service's own user: anything that talks to llama-server or an RPC server, or
    runs a llama.cpp binary for bench, never runs as root (a compromised server or node could attack
    its client)."""
    return ["/usr/bin/setpriv", f"--reuid={user}", f"--regid={user}", "--init-groups", "--", *argv]


async def configured_argv(conn, main, running: list[str]) -> list[str]:
    """The command line bench works with: the one of the deploy's root-owned plan (the launcher's
    modes file) that llama-server runs now. The running process's /proc cmdline only says *which*
    mode runs: the process can rewrite it (argv[0] included), so nothing from it is executed, least
    of all as root."""
    raw = await conn.get(front.MODES_PATH)
    try:
        modes = json.loads(raw)["modes"] if raw else {}
    except (ValueError, KeyError, TypeError):
        modes = {}
    binary = f"{main.root}/current/bin/llama-server"
    for argv in (modes or {}).values():
        if isinstance(argv, list) and argv == running and argv and argv[0] == binary:
            return list(argv)
    raise TaskFailed(
        f"main: {UNIT} runs a command line the deploy did not configure ({' '.join(running[:3])} …; "
        f"not a mode of {front.MODES_PATH} with {binary}): bench runs nothing a service chose. "
        "Run `tunnelspec deploy`, or see `tunnelspec status`"
    )


async def _fit(conn, argv: list[str], local: str, n_ctx: int | None, size, shape, note: str, user: str) -> dict:
    """Does the target fit main's own devices (`local`: "none" is the CPU, its RAM)?"""
    if not size:
        return figs.fit_unknown(f"the target's size on main is unknown ({note or 'stat failed'})")
    if local == "none":
        text = (await conn.get("/proc/meminfo") or b"").decode()
        fig = figs.meminfo_figure(text)
        if fig is None:
            return figs.fit_unknown("main's /proc/meminfo has no MemAvailable/MemTotal")
        return figs.fit_on_main(size, shape, n_ctx, [fig], note)
    res = await conn.run(as_user(user, [argv[0], "--list-devices"]), timeout=120)
    found, missing = figs.device_figures(res.stdout + "\n" + res.stderr, local)
    if missing or not found:
        return figs.fit_unknown(f"`{argv[0]} --list-devices` on main does not list {', '.join(missing) or local}")
    return figs.fit_on_main(size, shape, n_ctx, found, note)


async def _guarded_port(conn, main, hv: dict) -> int:
    """bench's baseline port (`bench_port`, the registry of listeners: cluster/ports.py), only when it is
    safe to send the API key there: nothing listens on it now, and the rules in force let only root
    connect and only llama-server's user answer (a local user who bound it, or read it, would get the
    key of bench's completions). With the isolation opted out, a warning (as every run gives)."""
    port = main.front.bench_port
    held = [x for x in await port_owners.observe(conn) if x.port == port]
    if held:
        raise TaskFailed(
            f"main: bench's port {port} (bench_port) is taken: {held[0].describe()}; stop that "
            "process (and find out who started it), or set another bench_port (nothing was changed)"
        )
    if not isolation_host.opted_in(hv.get(isolation_host.OPT_OUT, True)):
        return port
    seen = await nft.observe(conn, [main.users.llama])
    uid = seen.uids.get(main.users.llama)
    gaps = nft.guard_gaps(seen.table, port, uid) if uid is not None else ["no such user " + main.users.llama]
    if seen.table_error or gaps:
        raise TaskFailed(
            f"main: bench's port {port} (bench_port) is not guarded by the isolation rules in force "
            f"({seen.table_error or ', '.join(gaps)}): run `tunnelspec deploy` first, which loads them "
            "(nothing was changed)"
        )
    return port


# A unit that restarts llama-server on its own (the draft's watcher, docs/degraded.md): held while
# --same-placement has llama-server stopped, so the baseline keeps the rpc-servers' one client slot.
WATCHERS = ("tunnelspec-draftwatch.service",)


async def _active(conn, units: tuple[str, ...]) -> list[str]:
    res = await conn.run(["systemctl", "is-active", "--", *units])
    # One word per unit; a failed command may print fewer: a unit without its word is not active.
    return [u for u, state in zip(units, res.stdout.split(), strict=False) if state == "active"]


async def _baseline(
    conn, main, base: list[str], port: int, tls, key, prompt, n_predict, runs, wait_s, port_nodes, same_placement: bool
) -> dict:
    user = main.users.llama
    held: list[str] = []
    if same_placement:
        held = await _active(conn, WATCHERS)
        for unit in held:
            await conn.run(["systemctl", "stop", unit], check=True)
        await conn.run(["systemctl", "stop", UNIT], check=True)
    await conn.run(["systemctl", "stop", BENCH_UNIT])
    await conn.run(["systemctl", "reset-failed", BENCH_UNIT])
    try:
        t0 = time.monotonic()
        await conn.run(
            [
                "systemd-run",
                "--quiet",
                f"--unit={BENCH_UNIT}",
                f"--uid={user}",
                f"--gid={user}",
                "-p",
                "NoNewPrivileges=yes",
                "-p",
                "ProtectSystem=strict",
                "-p",
                "ProtectHome=yes",
                "-p",
                "PrivateTmp=yes",
                "--",
                *base,
            ],
            check=True,
        )
        # On loopback; TLS only when llama-server itself serves it (the deployed flags kept: same
        # client path). Behind a front that terminates TLS, llama-server speaks plain HTTP.
        opener = api_opener(conn, port, LOOPBACK, tls if flag_value(base, "--ssl-key-file") else None)
        try:
            await http.wait_health(opener, wait_s)
        except http.HttpError as e:
            tail = (await conn.run(["journalctl", "--no-pager", "-o", "cat", "-n", "15", "-u", BENCH_UNIT])).stdout
            raise TaskFailed(
                f"main: bench's baseline server ({BENCH_UNIT}) did not become healthy: {e}; "
                f"its last lines:\n{tail.strip()}"
            ) from None
        ready = round(time.monotonic() - t0, 3)
        side = await _measure(conn, BENCH_UNIT, opener, key, prompt, n_predict, runs, rpc_ports(base), port_nodes)
        side["ready_seconds"] = ready
        return side
    finally:
        await conn.run(["systemctl", "stop", BENCH_UNIT])
        await conn.run(["systemctl", "reset-failed", BENCH_UNIT])
        if same_placement:
            await conn.run(["systemctl", "start", UNIT], check=True)
            for unit in held:
                await conn.run(["systemctl", "start", unit], check=True)
            try:
                await http.wait_health(api_opener(conn, main.server_port, main.server_host, tls), wait_s)
            except http.HttpError as e:
                raise TaskFailed(
                    f"main: the deployed llama-server, started again after bench's baseline, is not "
                    f"healthy: {e}; see `tunnelspec status`, and `tunnelspec deploy` restores it"
                ) from None


async def run_bench(
    inventory,
    cluster,
    opts: ConnectOptions,
    prompt: str = DEFAULT_PROMPT,
    n_predict: int = 64,
    runs: int = 3,
    same_placement: bool = False,
    yes: bool = False,
) -> dict:
    """same_placement: the baseline keeps the deployed target placement and drops only the draft;
    it stops the deployed llama-server meanwhile, so it needs yes=True."""
    if same_placement:
        refuse_same_placement(yes)
    main = cluster.main
    conn = await connect(main.name, inventory.host_vars(main.name), opts, inventory.path.parent)
    try:
        key = await read_api_key(conn, main.api_key_file)
        key_s = key.reveal() if key else None
        # What llama-server runs now, from its process (the unit's ExecStart= may be a launcher that
        # chooses the command line and execs it).
        argv = (await _unit_run(conn, UNIT))["argv"]
        if not argv or not argv[0].endswith("llama-server"):
            raise TaskFailed(
                f"main: {UNIT} is not running llama-server (its main process runs "
                f"{' '.join(argv[:2]) or 'nothing'}): run `tunnelspec deploy`, or see `tunnelspec status`"
            )
        argv = await configured_argv(conn, main, argv)
        kind = deployed_kind(argv)
        if same_placement and kind != "speculative":
            raise UsageError(
                f"bench --same-placement drops only the draft, and the deployed llama-server on "
                f"{main.name} has none ({kind}): the baseline would be the deployed server itself. "
                "Leave --same-placement out to compare with the model on main alone."
            )
        tls = ApiTls.of(main)
        port_nodes = {n.tunnel_port: n.name for n in cluster.rpc}
        try:
            deployed = await _measure(
                conn,
                UNIT,
                api_opener(conn, main.server_port, main.server_host, tls),
                key_s,
                prompt,
                n_predict,
                runs,
                rpc_ports(argv),
                port_nodes,
            )
        except http.HttpError as e:
            stuck = no_progress(e, argv)
            raise TaskFailed(
                f"main: {stuck}"
                if stuck
                else f"main: the deployed llama-server did not answer bench's completions: {e}; "
                "see `tunnelspec status` (nothing was changed)"
            ) from None
        deployed.update(kind=kind, placement=describe_placement(argv))
        n_ctx = context_size(argv) or figs.journal_n_ctx(deployed.pop("journal"))
        model = flag_value(argv, "-m", "--model")
        size, shape, note = await gguf_facts(conn, model) if model else (0, None, "no -m in the unit")
        wait_s = start_timeout(main.start_timeout, [size])
        local = local_devices(argv, main.target_devices)
        port = await _guarded_port(conn, main, inventory.host_vars(main.name))
        base = baseline_argv(argv, local, port, same_placement)
        baseline: dict[str, Any] = {
            "kind": "same_placement" if same_placement else "main_alone",
            "title": "same placement, no draft" if same_placement else "main alone",
            "devices": flag_value(base, "-dev", "--device") or local,
            "rpc": bool(rpc_ports(base)),
            "endpoint": f"{LOOPBACK}:{port}",
            "n_ctx": n_ctx,
            "fit": None
            if same_placement
            else await _fit(conn, argv, local, n_ctx, size, shape, note, main.users.llama),
        }
        baseline["placement"] = describe_placement(base) if same_placement else f"-dev {baseline['devices']}, no RPC"
        if baseline["fit"] and baseline["fit"]["fits"] is False:
            baseline.update(ran=False, why=baseline["fit"]["message"])
        else:
            try:
                side = await _baseline(
                    conn, main, base, port, tls, key_s, prompt, n_predict, runs, wait_s, port_nodes, same_placement
                )
                side.pop("journal", None)
                baseline.update(side, ran=True)
            except (TaskFailed, http.HttpError) as e:
                baseline.update(ran=False, error=str(e), why=str(e))
        d_tps, b_tps = deployed.get("predicted_per_second"), baseline.get("predicted_per_second")
        return {
            "schema": SCHEMA,
            "prompt": prompt,
            "n_predict": n_predict,
            "runs": runs,
            "model": {"path": model, "size_mib": round(size / figs.MIB) if size else None},
            "deployed": deployed,
            "baseline": baseline,
            "speedup": round(d_tps / b_tps, 3) if d_tps and b_tps else None,
        }
    finally:
        await conn.close()


def bench_sync(*args, **kw) -> dict:
    return asyncio.run(run_bench(*args, **kw))


def exit_code(result: dict) -> int:
    """1 when the baseline should have run and failed; 0 otherwise (not fitting is a finding, not a failure)."""
    return 1 if result["baseline"].get("error") else 0
