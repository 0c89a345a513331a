"""The real `tunnelspec deploy`, converged (no-op), on the lab, against raw floors: trivial commands
(as many per host as the deploy opened, or one), and the deploy's own reads with nothing around them.

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
   - floor-reads: one connection per host (asyncssh, raw_floor.py --lean's settings) running the
             deploy's own reads as the counted run sent them: every part of every batch, a batch's
             parts side by side, then each TCP channel's request (verify's HTTP requests, the
             isolation's port probes), each answer read to its end. Nothing else.
   - floor-reads-mux: the same reads through OpenSSH masters kept open (no key exchange): one `ssh`
             per part, `ssh -W` per channel. The lesser of the two is the reads' true floor: the
             least a no-op that checks what this deploy checks can cost; the deploy's ratio to it is
             what tunnelspec adds.
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

    import contextvars

    from tunnelspec.connection import base as ts_base
    from tunnelspec.connection.base import quote

    busy: dict = collections.defaultdict(collections.Counter)   # host -> program -> seconds on the host
    # host -> its batches, each the command lines of its parts as sent (the reads the deploy does)
    reads: dict = collections.defaultdict(list)
    in_batch: contextvars.ContextVar = contextvars.ContextVar("in_batch", default=None)
    orig_exec, orig_batch = ts_ssh.SSHConnection._exec, ts_base.Connection._batch

    async def timed_exec(self, argv, *a, **kw):
        parts = in_batch.get()
        if parts is not None:
            parts.append(quote(argv))
        t0 = time.perf_counter()
        try:
            return await orig_exec(self, argv, *a, **kw)
        finally:
            busy[self.name][argv[0][:40]] += time.perf_counter() - t0

    async def batch(self, probes):
        parts: list = []
        reads[self.name].append(parts)
        token = in_batch.set(parts)
        try:
            return await orig_batch(self, probes)
        finally:
            in_batch.reset(token)

    # host -> the TCP channels it opened (verify's HTTP requests, the isolation's port probes): where
    # to, and the bytes sent, so that the reads' floor can send the same requests.
    channels: dict = collections.defaultdict(list)
    orig_open = ts_ssh.SSHConnection.open_connection

    async def open_connection(self, host, port):
        sent = bytearray()
        channels[self.name].append(([host, port], sent))
        reader, writer = await orig_open(self, host, port)
        write = writer.write
        writer.write = lambda data: (sent.extend(data), write(data))[1]
        return reader, writer

    ts_ssh.SSHConnection._exec = timed_exec
    ts_base.Connection._batch = batch
    ts_ssh.SSHConnection.open_connection = open_connection
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
                                              "reads": reads,
                                              "channels": {h: [(to, bytes(b).decode("latin-1")) for to, b in c]
                                                           for h, c in channels.items()},
                                              "seconds": {k: {p: round(t, 4) for p, t in v.most_common()}
                                                          for k, v in busy.items()}}))
    sys.exit(rc if isinstance(rc, int) else 1)


# ---- child: the floor -------------------------------------------------------------------------------
def floor_child(spec_path: str, lean: bool = False) -> None:
    import asyncssh

    spec = json.loads(Path(spec_path).read_text())
    sys.path.insert(0, str(HERE))
    from raw_floor import asyncssh_options

    options = asyncssh_options(spec, lean)   # --lean: raw_floor.py --lean's settings

    async def one(h):
        async with asyncssh.connect(h["address"], port=22, username="root", **options) as conn:
            for _ in range(h.get("commands", 0)):
                res = await conn.run("true", check=True)
                assert res.exit_status == 0
            for parts in h.get("reads", []):   # the deploy's own batches, their parts side by side
                done = await asyncio.gather(*(conn.run(cmd, encoding=None) for cmd in parts))
                assert all(r.exit_status == 0 for r in done), [r.exit_status for r in done]
            for (host, port), sent in h.get("channels", []):   # the same requests, one after another
                try:
                    reader, writer = await conn.open_connection(host, port)
                except (asyncssh.ChannelOpenError, OSError):
                    continue   # refused, as the isolation's probes expect
                writer.write(sent.encode("latin-1"))
                writer.write_eof()
                await asyncio.wait_for(reader.read(), 60)   # the whole answer, to the server's close
                writer.close()

    async def all_hosts():
        await asyncio.gather(*(one(h) for h in spec["hosts"]))

    asyncio.run(all_hosts())


def mux_child(spec_path: str, control_dir: str, stop: bool = False) -> None:
    """The reads through OpenSSH masters kept open between runs (raw_floor.py --openssh): no key
    exchange, no Python client; one `ssh` process per part of each batch, a host's parts side by side.
    With `stop`, only closes the masters."""
    spec = json.loads(Path(spec_path).read_text())
    sys.path.insert(0, str(HERE))
    from raw_floor import ssh_argv

    def argv(h: dict) -> list[str]:
        return ssh_argv(spec, {"address": h["address"], "port": 22, "user": "root"}, control_dir)

    if stop:
        for h in spec["hosts"]:
            subprocess.run(argv(h) + ["-O", "exit"], stdin=subprocess.DEVNULL, capture_output=True, timeout=60)
        return
    rounds = max((len(h.get("reads", [])) for h in spec["hosts"]), default=0)
    for i in range(rounds):   # batch i of every host at once, as the deploy's plays run them
        procs = [subprocess.Popen(argv(h) + [cmd], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
                 for h in spec["hosts"] if i < len(h.get("reads", [])) for cmd in h["reads"][i]]
        for p in procs:
            if p.wait(timeout=120) != 0:
                raise SystemExit(f"a batch part through the master failed (rc={p.returncode})")
    for h in spec["hosts"]:   # then each host's TCP channels, the same requests (`ssh -W`), in order
        for (host, port), sent in h.get("channels", []):
            subprocess.run(argv(h) + ["-W", f"{host}:{port}"], input=sent.encode("latin-1"),
                           capture_output=True, timeout=60)   # a refused one (isolation's probes) fails


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
    recap = [json.loads(x) for x in p.stdout.splitlines() if x.startswith("{") and '"recap"' in x]
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
        # The reads' floor: one connection per host running the deploy's own batched reads, as the
        # deploy sent them (same parts side by side), and nothing else: what checking the hosts'
        # state costs at the least, so the ratio is tunnelspec's own overhead over it.
        reads = tmp / "floor-reads.json"
        reads.write_text(json.dumps({**json.loads(spec.read_text()), "hosts": [
            {"address": lab.hosts[name], "reads": counted["reads"].get(name, []),
             "channels": counted["channels"].get(name, [])} for name in lab.hosts]}))
        contenders["floor-reads"] = [sys.executable, __file__, "--floor-child", str(reads), "--lean"]
        # The same reads through persisted OpenSSH masters (the masters opened before the timed runs).
        control = tmp / "mux"
        control.mkdir()
        contenders["floor-reads-mux"] = [sys.executable, __file__, "--mux-child", str(reads), str(control)]
        timed(contenders["floor-reads-mux"])
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
        timed([sys.executable, __file__, "--mux-child", str(reads), str(control), "--stop"])
        count(inventory, tmp)                          # still a no-op at the end
    med = {k: statistics.median(v) for k, v in times.items()}
    return {"round_trips_per_host": per_host, "commands_by_program": counted["what"], "recap": counted["recap"],
            "command_seconds_by_program": counted["seconds"],
            "median_s": med, "all_s": times, "ratio": med["deploy"] / med["floor"], "runs": runs,
            "ratio_floor_1": med["deploy"] / med["floor-1"], "held": held,
            "ratio_floor_reads": med["deploy"] / min(med["floor-reads"], med["floor-reads-mux"]),
            "batches_per_host": {h: [len(p) for p in b] for h, b in counted["reads"].items()},
            "channels_per_host": {h: [f"{to[0]}:{to[1]}" for to, _ in c] for h, c in counted["channels"].items()},
            "ratio_held": med["deploy"] / med["floor-held"] if held else None, "load": os.getloadavg()}


def main() -> None:
    if len(sys.argv) > 2 and sys.argv[1] == "--count-child":
        sys.path.insert(0, str(REPO))
        return count_child(sys.argv[2], sys.argv[4:])
    if len(sys.argv) > 2 and sys.argv[1] == "--floor-child":
        return floor_child(sys.argv[2], lean="--lean" in sys.argv[3:])
    if len(sys.argv) > 3 and sys.argv[1] == "--mux-child":
        return mux_child(sys.argv[2], sys.argv[3], stop="--stop" in sys.argv[4:])
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
    print(f"floor-reads {r['median_s']['floor-reads']:.3f} s (one lean asyncssh connection per host and the deploy's "
          f"own batched reads and TCP requests; parts per batch: {r['batches_per_host']})")
    print(f"floor-reads-mux {r['median_s']['floor-reads-mux']:.3f} s (the same reads through persisted OpenSSH masters)")
    if r["held"]:
        print(f"floor-held {r['median_s']['floor-held']:.3f} s ({', '.join(f'{h} {n}' for h, n in r['held'].items())})")
    print(f"deploy {r['median_s']['deploy']:.3f} s ({r['ratio']:.2f}x floor, {r['ratio_floor_1']:.2f}x floor-1, "
          f"{r['ratio_floor_reads']:.2f}x the reads' true floor"
          + (f", {r['ratio_held']:.2f}x floor-held)" if r["held"] else ")"))


if __name__ == "__main__":
    main()
