"""`tunnelspec bench`: the same prompt with the remote draft (the deployed llama-server) and with
speculation off, side by side.

This build's server has no per-request switch for speculation (server-schema.cpp keeps the
`speculative.n_max` request field under `#if 0`), so the baseline is a temporary second llama-server
on another loopback port, started as a transient systemd unit with the deployed command line minus
every draft and RPC flag (the rpc-servers serve one client at a time and are held by the deployed
server): target on the main host's own devices, no draft. It is stopped by its unit name afterwards.
"""

from __future__ import annotations

import asyncio
import re
import shlex

from tunnelspec.connection import ConnectOptions, connect
from tunnelspec.constants import LOOPBACK
from tunnelspec.errors import TaskFailed
from tunnelspec.facts import sockets
from tunnelspec.llama import http
from tunnelspec.llama.server_args import UNIT
from tunnelspec.llama.verify import read_api_key
from tunnelspec.tls.reach import ApiTls, api_opener

BENCH_UNIT = "tunnelspec-llama-bench.service"
# Flags (every spelling across builds) that carry the draft or the RPC placement, each with a value.
# -sm/-ts describe the deployed devices: kept with them (same placement), dropped with them.
_PLACEMENT_FLAGS = {"--rpc", "-dev", "--device", "-sm", "--split-mode", "-ts", "--tensor-split"}
_DRAFT_RPC_FLAGS = _PLACEMENT_FLAGS | {
    "--spec-type", "--spec-draft-model", "-md", "--model-draft",
    "--spec-draft-device", "-devd", "--device-draft", "--spec-draft-ngl", "-ngld", "--gpu-layers-draft",
    "--n-gpu-layers-draft", "--spec-draft-n-max", "--draft-max", "--draft-n", "--draft", "--port",
    "--spec-draft-p-min", "--draft-p-min",
}
DEFAULT_PROMPT = "Write a short story about a lighthouse keeper who finds a message in a bottle."


def parse_exec_start(unit_text: str) -> list[str]:
    """The ExecStart= argv of a unit tunnelspec rendered (systemd_exec quoting: doubled % and $,
    double quotes with backslash escapes, which POSIX shlex reads the same way)."""
    m = re.search(r"^ExecStart=(.+)$", unit_text, re.M)
    if not m:
        raise TaskFailed(f"no ExecStart= in {UNIT}: deploy first")
    return [a.replace("%%", "%").replace("$$", "$") for a in shlex.split(m.group(1))]


def baseline_argv(argv: list[str], local_devices: str, port: int, same_placement: bool = False) -> list[str]:
    """The deployed argv without the draft. Default: without RPC too (target on the main host's own
    devices). same_placement: keep --rpc and -dev, so target layers stay where they are deployed."""
    drop = _DRAFT_RPC_FLAGS - _PLACEMENT_FLAGS if same_placement else _DRAFT_RPC_FLAGS
    out, skip = [], False
    for a in argv:
        if skip:
            skip = False
            continue
        if a in drop:
            skip = True
            continue
        if out and out[-1] == "--host":
            a = LOOPBACK  # a public bind's address: the temporary baseline is never reachable from outside
        out.append(a)
    if same_placement:
        return out + ["--port", str(port)]
    return out + ["-dev", local_devices or "none", "--port", str(port)]


async def _free_port(conn, start: int) -> int:
    used = {s.port for s in await sockets.listening_sockets(conn)}
    for port in range(start, start + 100):
        if port not in used:
            return port
    raise TaskFailed(f"no free loopback port in {start}..{start + 99} on the main host")


async def _measure(opener, prompt: str, n_predict: int, runs: int, key) -> dict:
    await http.completion(opener, prompt, 8, api_key=key)  # warm-up: first request pays allocations
    rows = []
    for _ in range(runs):
        body = await http.completion(opener, prompt, n_predict, api_key=key, timeout=300)
        rows.append(body.get("timings") or {})
    tps = sorted(r.get("predicted_per_second") or 0.0 for r in rows)
    return {"tokens_per_second": tps[len(tps) // 2], "predicted_n": rows[-1].get("predicted_n"),
            "draft_n": sum(r.get("draft_n") or 0 for r in rows),
            "draft_n_accepted": sum(r.get("draft_n_accepted") or 0 for r in rows), "runs": runs}


async def run_bench(inventory, cluster, opts: ConnectOptions, prompt: str = DEFAULT_PROMPT,
                    n_predict: int = 64, runs: int = 3, health_timeout: float = 180,
                    same_placement: bool = False) -> dict:
    """same_placement: the baseline keeps the deployed target placement (target-role RPC devices);
    the rpc-servers serve one client at a time, so the deployed llama-server is stopped meanwhile
    and started again afterwards (a short outage)."""
    main = cluster.main
    conn = await connect(main.name, inventory.host_vars(main.name), opts, inventory.path.parent)
    try:
        key = await read_api_key(conn, main.api_key_file)
        key_s = key.reveal() if key else None
        unit_text = (await conn.get(f"/etc/systemd/system/{UNIT}") or b"").decode()
        argv = parse_exec_start(unit_text)
        tls = ApiTls.of(main)
        spec = await _measure(api_opener(conn, main.server_port, main.server_host, tls), prompt, n_predict, runs, key_s)
        port = await _free_port(conn, main.server_port + 1)
        base = baseline_argv(argv, main.target_devices, port, same_placement)
        user = main.users.llama
        if same_placement:
            await conn.run(["systemctl", "stop", UNIT], check=True)
        await conn.run(["systemctl", "stop", BENCH_UNIT])
        await conn.run(["systemctl", "reset-failed", BENCH_UNIT])
        await conn.run(["systemd-run", "--quiet", f"--unit={BENCH_UNIT}", f"--uid={user}", f"--gid={user}",
                        "-p", "NoNewPrivileges=yes", "-p", "ProtectSystem=strict", "-p", "ProtectHome=yes",
                        "-p", "PrivateTmp=yes", "--", *base], check=True)
        try:
            # The baseline keeps the deployed TLS flags (same path, fair numbers) and is on loopback.
            opener = api_opener(conn, port, LOOPBACK, tls)
            await http.wait_health(opener, health_timeout)
            plain = await _measure(opener, prompt, n_predict, runs, key_s)
        finally:
            await conn.run(["systemctl", "stop", BENCH_UNIT])
            await conn.run(["systemctl", "reset-failed", BENCH_UNIT])
            if same_placement:
                await conn.run(["systemctl", "start", UNIT], check=True)
                await http.wait_health(api_opener(conn, main.server_port, main.server_host, tls), health_timeout)
        dev = base[base.index("-dev") + 1] if "-dev" in base else main.target_devices
        return {"schema": 1, "prompt": prompt, "n_predict": n_predict, "remote_draft": spec, "no_speculation": plain,
                "baseline_devices": dev, "baseline_rpc": same_placement, "baseline_endpoint": f"{LOOPBACK}:{port}"}
    finally:
        await conn.close()


def render(r: dict) -> str:
    s, p = r["remote_draft"], r["no_speculation"]

    def acc(x):
        return f"{x['draft_n_accepted']}/{x['draft_n']}" if x["draft_n"] else "-"

    speedup = s["tokens_per_second"] / p["tokens_per_second"] if p["tokens_per_second"] else 0.0
    return "\n".join([
        f"prompt: {r['prompt'][:60]!r}, n_predict {r['n_predict']}, median of {s['runs']} runs",
        f"{'':<34} {'tok/s':>9}  draft accepted",
        f"{'remote draft (deployed server)':<34} {s['tokens_per_second']:>9.1f}  {acc(s)}",
        f"{'no speculation (-dev ' + r['baseline_devices'] + ')':<34} {p['tokens_per_second']:>9.1f}  {acc(p)}",
        f"speed ratio remote-draft / none: {speedup:.2f}x",
        *([] if r.get("baseline_rpc") else [
            "baseline without --rpc: target entirely local; with target-role RPC nodes use --same-placement"]),
    ])


def bench_sync(*args, **kw) -> dict:
    return asyncio.run(run_bench(*args, **kw))
