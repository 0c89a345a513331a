"""The real `tunnelspec deploy`, converged (no-op), on the lab, against the raw asyncssh floor for the
same number of remote commands per host.

    python benchmarks/deploy_noop.py [--lab lab] [--runs 5] [--json]

1. Count: one deploy runs in a child process with asyncssh's channel openings counted per host
   (`SSHClientConnection.create_session` = a command, `create_connection` = a TCP channel such as an
   RPC or HTTP probe through the host), plus SSH connections. Every channel is one round trip at least.
   It must be a no-op (`changed=0` everywhere), else the benchmark stops.
2. Time, interleaved, whole processes (interpreter start included), medians of --runs:
   - deploy: `python -m tunnelspec deploy lab/inventory.ini`
   - floor:  one Python process that connects to every host in parallel (host keys verified) and runs,
             per host, as many trivial commands (`true`) as the deploy opened channels on that host,
             one after another.
   - floor-1: the same with one command per host (the least a no-op can cost).
   - floor-held (--held main=65,rpc-a=19,rpc-b=19): the same with counts held fixed, so that folding
             commands into fewer batches does not also shrink what the deploy is measured against.
The lab's hosts and the controller share the machine's 2 cores: only the ratio means much.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent

_NOT_A_USERS_ENV = ("PYTHONDONTWRITEBYTECODE", "PYTHONUNBUFFERED")   # as in noop.py


def _env() -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TUNNELSPEC_") and k not in _NOT_A_USERS_ENV}
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    return env


# ---- child: a deploy with counted channels --------------------------------------------------------
def count_child(out_path: str, argv: list[str]) -> None:
    import asyncssh

    counts: dict = collections.defaultdict(collections.Counter)
    what: dict = collections.defaultdict(collections.Counter)

    def peer(conn) -> str:
        p = conn.get_extra_info("peername")
        return p[0] if p else "?"

    orig_session, orig_conn, orig_connect = (asyncssh.SSHClientConnection.create_session,
                                             asyncssh.SSHClientConnection.create_connection, asyncssh.connect)

    async def create_session(self, *a, **kw):
        counts[peer(self)]["commands"] += 1
        cmd = kw.get("command") or (a[1] if len(a) > 1 else "")
        what[peer(self)][(cmd or "").split(" ", 1)[0][:40]] += 1
        return await orig_session(self, *a, **kw)

    async def create_connection(self, *a, **kw):
        counts[peer(self)]["tcp_channels"] += 1
        return await orig_conn(self, *a, **kw)

    async def connect(host, *a, **kw):
        counts[host]["connections"] += 1
        return await orig_connect(host, *a, **kw)

    from tunnelspec.connection import ssh as ts_ssh

    busy: dict = collections.defaultdict(collections.Counter)   # host -> program -> seconds on the host
    orig_exec = ts_ssh.SSHConnection._exec

    async def timed_exec(self, argv, *a, **kw):
        t0 = time.perf_counter()
        try:
            return await orig_exec(self, argv, *a, **kw)
        finally:
            busy[self.name][argv[0][:40]] += time.perf_counter() - t0

    ts_ssh.SSHConnection._exec = timed_exec
    asyncssh.SSHClientConnection.create_session = create_session
    asyncssh.SSHClientConnection.create_connection = create_connection
    asyncssh.connect = connect
    from tunnelspec.cli.main import main as cli_main

    rc = 0
    try:
        cli_main(argv, standalone_mode=False)
    except SystemExit as e:
        rc = e.code or 0
    finally:
        Path(out_path).write_text(json.dumps({"rc": rc, "counts": counts, "what": {k: dict(v) for k, v in what.items()},
                                              "seconds": {k: {p: round(t, 4) for p, t in v.most_common()}
                                                          for k, v in busy.items()}}))
    sys.exit(rc if isinstance(rc, int) else 1)


# ---- child: the floor -------------------------------------------------------------------------------
def floor_child(spec_path: str) -> None:
    import asyncssh

    spec = json.loads(Path(spec_path).read_text())

    async def one(h):
        async with asyncssh.connect(h["address"], port=22, username="root", client_keys=[spec["key"]],
                                    known_hosts=spec["known_hosts"], config=None) as conn:
            for _ in range(h["commands"]):
                res = await conn.run("true", check=True)
                assert res.exit_status == 0

    async def all_hosts():
        await asyncio.gather(*(one(h) for h in spec["hosts"]))

    asyncio.run(all_hosts())


# ---- parent -----------------------------------------------------------------------------------------
def timed(argv: list[str]) -> float:
    t0 = time.perf_counter()
    p = subprocess.run(argv, cwd=REPO, env=_env(), stdin=subprocess.DEVNULL, capture_output=True, timeout=900)
    took = time.perf_counter() - t0
    if p.returncode != 0:
        raise SystemExit(f"{argv[:5]}… rc={p.returncode}\n{p.stdout.decode()[-3000:]}\n{p.stderr.decode()[-2000:]}")
    return took


def deploy_argv(inventory: str, *extra: str) -> list[str]:
    return [sys.executable, "-m", "tunnelspec", "deploy", inventory, *extra]


def count(inventory: str, tmp: Path) -> dict:
    out = tmp / "counts.json"
    p = subprocess.run([sys.executable, __file__, "--count-child", str(out), "--", "deploy", inventory,
                        "--format", "json"], cwd=REPO, env=_env(), capture_output=True, text=True, timeout=900)
    got = json.loads(out.read_text())
    recap = [json.loads(l) for l in p.stdout.splitlines() if l.startswith("{") and '"recap"' in l]
    hosts = recap[-1]["hosts"] if recap else {}
    if p.returncode != 0 or not hosts or any(r["changed"] for r in hosts.values()):
        raise SystemExit(f"deploy is not a no-op (rc={p.returncode}): {hosts}\n{p.stdout[-3000:]}\n{p.stderr[-2000:]}")
    got["recap"] = hosts
    return got


def bench(lab_dir: str, runs: int, held: dict[str, int] | None = None) -> dict:
    sys.path.insert(0, str(REPO))
    from tunnelspec.lab import Lab

    lab = Lab(lab_dir)
    inventory = str(lab.inventory)
    with tempfile.TemporaryDirectory(prefix="tunnelspec-deploy-noop-") as tmp:
        tmp = Path(tmp)
        timed(deploy_argv(inventory))                 # converge first (must already be deployed)
        counted = count(inventory, tmp)
        by_ip = {ip: name for name, ip in lab.hosts.items()}
        per_host = {by_ip.get(ip, ip): dict(c) for ip, c in counted["counts"].items()}
        spec = tmp / "floor.json"
        spec.write_text(json.dumps({"key": str(lab.key_file), "known_hosts": str(lab.known_hosts), "hosts": [
            {"address": lab.hosts[name], "commands": c.get("commands", 0) + c.get("tcp_channels", 0)}
            for name, c in per_host.items() if name in lab.hosts]}))
        contenders = {"floor": [sys.executable, __file__, "--floor-child", str(spec)],
                      "deploy": deploy_argv(inventory)}
        # The true floor: one connection and one command per host (the least a no-op can cost).
        one = tmp / "floor-1.json"
        one.write_text(json.dumps({**json.loads(spec.read_text()), "hosts": [
            {"address": lab.hosts[name], "commands": 1} for name in per_host if name in lab.hosts]}))
        contenders["floor-1"] = [sys.executable, __file__, "--floor-child", str(one)]
        if held:
            # A floor held at given counts (those of an earlier tree), so that folding commands into
            # batches does not also shrink what the deploy is measured against.
            fixed = tmp / "floor-held.json"
            fixed.write_text(json.dumps({**json.loads(spec.read_text()), "hosts": [
                {"address": lab.hosts[name], "commands": n} for name, n in held.items()]}))
            contenders["floor-held"] = [sys.executable, __file__, "--floor-child", str(fixed)]
        times = {k: [] for k in contenders}
        for _ in range(runs):
            for name, argv in contenders.items():
                times[name].append(timed(argv))
        count(inventory, tmp)                          # still a no-op at the end
    med = {k: statistics.median(v) for k, v in times.items()}
    return {"round_trips_per_host": per_host, "commands_by_program": counted["what"], "recap": counted["recap"],
            "command_seconds_by_program": counted["seconds"],
            "median_s": med, "all_s": times, "ratio": med["deploy"] / med["floor"], "runs": runs,
            "ratio_floor_1": med["deploy"] / med["floor-1"], "held": held,
            "ratio_held": med["deploy"] / med["floor-held"] if held else None, "load": os.getloadavg()}


def main() -> None:
    if len(sys.argv) > 2 and sys.argv[1] == "--count-child":
        sys.path.insert(0, str(REPO))
        return count_child(sys.argv[2], sys.argv[4:])
    if len(sys.argv) > 2 and sys.argv[1] == "--floor-child":
        return floor_child(sys.argv[2])
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lab", default=str(REPO / "lab"))
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--held", default="", metavar="HOST=N,...",
                    help="also a floor of these commands per host, held fixed (e.g. the counts of an earlier "
                         "tree: main=65,rpc-a=19,rpc-b=19), timed in the same interleaving")
    a = ap.parse_args()
    held = {k: int(v) for k, v in (item.split("=", 1) for item in a.held.split(",") if item)} or None
    r = bench(a.lab, max(1, a.runs), held)
    if a.json:
        print(json.dumps(r, indent=1))
        return
    print(f"load {r['load']}; medians of {r['runs']}")
    for host, c in r["round_trips_per_host"].items():
        print(f"  {host:<8} connections {c.get('connections', 0)}, commands {c.get('commands', 0)}, "
              f"tcp channels {c.get('tcp_channels', 0)}")
    for host, progs in r["command_seconds_by_program"].items():
        print(f"  {host:<8} seconds per program (command channels, counted run): "
              + ", ".join(f"{p} {t:.3f}" for p, t in list(progs.items())[:5]))
    print(f"floor  {r['median_s']['floor']:.3f} s (as many commands per host as the deploy opened)")
    print(f"floor-1 {r['median_s']['floor-1']:.3f} s (one connection and one command per host)")
    if r["held"]:
        print(f"floor-held {r['median_s']['floor-held']:.3f} s ({', '.join(f'{h} {n}' for h, n in r['held'].items())})")
    print(f"deploy {r['median_s']['deploy']:.3f} s ({r['ratio']:.2f}x floor, {r['ratio_floor_1']:.2f}x floor-1"
          + (f", {r['ratio_held']:.2f}x floor-held)" if r["held"] else ")"))


if __name__ == "__main__":
    main()
