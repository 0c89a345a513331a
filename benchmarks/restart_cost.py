"""What a switch costs: llama-server's restart-to-first-token with a draft of at least 500 MB,
its weights sent through the tunnel (the node's RPC tensor cache empty), with the cache warm (the
node already holds them: hashes are sent instead), and the same draft on main's own CPU (no RPC).

    flock /tmp/tunnelspec-lab.lock python benchmarks/restart_cost.py [--mib 512] [--runs 3] [--json]

Against the deployed default lab (`tunnelspec lab up` + a deploy; the test lab is reused when it is
up). The draft is a generated llama GGUF with the lab target's vocabulary (random f32 weights, two
blocks of width 2048: every weight tensor is over the RPC cache's 10 MiB threshold), written once into
the lab's fixture store. The run deploys the lab's inventory with that draft, measures, and deploys
the lab's own inventory again at the end.

Restart-to-first-token: llama-server stopped (untimed), then from `systemctl start` of its unit (the
launcher, then llama-server) on main to the end of a one-token completion sent through the front at
once (the front holds it until llama-server is up); the local variant starts the same command line
with the draft on main's CPU the same way.
Bytes through the tunnel: rpc-a's eth0 receive counter around the restart. Not part of CI.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE.parent / "tests"))

from tunnelspec.lab import DEFAULT_BRIDGE, Lab  # noqa: E402
from tunnelspec.lab import state as lab_state  # noqa: E402
from tunnelspec.lab.fixtures import FIXTURES_DIR  # noqa: E402
from support.gguf_wide import write_wide_llama  # noqa: E402

UNIT = "tunnelspec-llama-server.service"
RPC_CACHE = "/var/cache/tunnelspec-rpc"
MODELS_IN_HOSTS = "/srv/tunnelspec-fixtures/models"

_FIRST_TOKEN = r'''
import json, subprocess, sys, time, urllib.request
# The old process is stopped first, untimed: every variant is measured from its start to its first
# token (the stop is the same for all of them: llama-server frees its buffers and exits).
if sys.argv[1] == "restart":
    subprocess.run(["systemctl", "stop", "tunnelspec-llama-server.service"], check=True)
t0 = time.time()
if sys.argv[1] == "restart":
    subprocess.run(["systemctl", "start", "--no-block", "tunnelspec-llama-server.service"], check=True)
elif sys.argv[1] == "local":
    subprocess.run(["systemd-run", "--unit", "tunnelspec-bench-local", "--collect", "--quiet", "--uid",
                    "tunnelspec-llama", "--gid", "tunnelspec-llama", *sys.argv[2:]], check=True)
req = urllib.request.Request("http://127.0.0.1:8080/completion", data=json.dumps(
    {"prompt": "Once upon a time", "n_predict": 1, "cache_prompt": False}).encode(),
    headers={"Content-Type": "application/json"})
body = json.loads(urllib.request.urlopen(req, timeout=900).read())
print(json.dumps({"seconds": time.time() - t0, "content": body.get("content", "")}))
'''


def sh(lab, host, *argv, timeout=900, input=None) -> str:
    r = lab.exec(host, list(argv), input=input, timeout=timeout)
    if r.returncode != 0:
        raise SystemExit(f"{host}: {' '.join(argv)} failed ({r.returncode}): {r.stderr[-1500:]}")
    return r.stdout or ""


def rx_bytes(lab) -> int:
    """Bytes rpc-a's eth0 received (its own network namespace's /proc/net/dev)."""
    for line in sh(lab, "rpc-a", "cat", "/proc/net/dev").splitlines():
        name, _, rest = line.partition(":")
        if name.strip() == "eth0":
            return int(rest.split()[0])
    raise SystemExit("rpc-a has no eth0 in /proc/net/dev")


def first_token(lab, *args) -> float:
    out = sh(lab, "main", "python3", "-c", _FIRST_TOKEN, *args)
    return json.loads(out.strip().splitlines()[-1])["seconds"]


def wait_idle_speculative(lab, timeout=300) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        st = sh(lab, "main", "sh", "-c", "cat /run/tunnelspec-llama/mode.json 2>/dev/null || echo {}")
        active = sh(lab, "main", "sh", "-c", f"systemctl is-active {UNIT} || :").strip()
        if '"speculative"' in st and active == "active":
            return
        time.sleep(1)
    raise SystemExit("llama-server is not serving speculative")


def deploy(inventory) -> None:
    from support.labdeploy import deploy as run_deploy, failures

    r = run_deploy(inventory)
    if r.rc != 0:
        raise SystemExit(f"deploy failed: {failures(r)}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mib", type=int, default=512, help="draft size in MiB (at least 500 for the issue's figure)")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    st = lab_state.load(DEFAULT_BRIDGE)
    if st is None:
        raise SystemExit("no lab is up: `tunnelspec lab up` and deploy first")
    lab = Lab(st["dir"])
    name = f"bench-draft-{a.mib}m.gguf"
    size = write_wide_llama(Path(FIXTURES_DIR) / "models" / name, a.mib)
    inv = Path("/tmp/tunnelspec-restart-cost.ini")
    inv.write_text(lab.inventory.read_text().replace(
        "llama_draft_model=/srv/tunnelspec-fixtures/models/tiny-llama.gguf",
        f"llama_draft_model={MODELS_IN_HOSTS}/{name}"))
    deploy(inv)
    wait_idle_speculative(lab)
    rows = {"cold": [], "warm": [], "local": [], "local_nommap": []}
    for _ in range(a.runs):
        # Cold: the node's cache emptied, its RPC server restarted; the weights go through the tunnel.
        sh(lab, "rpc-a", "sh", "-c", f"systemctl stop tunnelspec-rpc.service; rm -rf {RPC_CACHE}/rpc; "
           "systemctl start tunnelspec-rpc.service")
        time.sleep(2)  # the watcher notices the closed connection; a restart of ours follows anyway
        wait_idle_speculative(lab)
        before = rx_bytes(lab)
        secs = first_token(lab, "restart")
        rows["cold"].append({"seconds": secs, "bytes_to_node": rx_bytes(lab) - before})
        wait_idle_speculative(lab)
        # Warm: the same restart again; the node holds the weights.
        before = rx_bytes(lab)
        secs = first_token(lab, "restart")
        rows["warm"].append({"seconds": secs, "bytes_to_node": rx_bytes(lab) - before})
        wait_idle_speculative(lab)
        # Local: the same command line with the draft on main's CPU (no RPC device for it).
        modes = json.loads(sh(lab, "main", "cat", "/etc/tunnelspec/llama-server.json"))
        argv_local = list(modes["modes"]["speculative"])
        argv_local[argv_local.index("--spec-draft-device") + 1] = "none"
        # And once more without mmap (`--load-mode none`: b11434's spelling; older trees said --no-mmap):
        # the weights read into memory, as an accelerator's upload needs them (the CPU backend otherwise
        # maps the file and copies nothing).
        for key, extra in (("local", []), ("local_nommap", ["--load-mode", "none"])):
            sh(lab, "main", "systemctl", "stop", UNIT)
            before = rx_bytes(lab)
            try:
                secs = first_token(lab, "local", *argv_local, *extra)
            finally:
                sh(lab, "main", "sh", "-c", "systemctl stop tunnelspec-bench-local 2>/dev/null || :")
                sh(lab, "main", "systemctl", "start", UNIT)
            rows[key].append({"seconds": secs, "bytes_to_node": rx_bytes(lab) - before})
            wait_idle_speculative(lab)
    deploy(lab.inventory)
    summary = {k: {"median_s": round(statistics.median(r["seconds"] for r in v), 2),
                   "runs_s": [round(r["seconds"], 2) for r in v],
                   "median_mib_to_node": round(statistics.median(r["bytes_to_node"] for r in v) / (1 << 20), 1)}
               for k, v in rows.items()}
    summary["draft_mib"] = round(size / (1 << 20), 1)
    summary["warm_over_local"] = round(summary["warm"]["median_s"] / summary["local"]["median_s"], 2)
    summary["warm_over_local_nommap"] = round(summary["warm"]["median_s"] / summary["local_nommap"]["median_s"], 2)
    if a.json:
        print(json.dumps(summary, indent=1))
    else:
        print(f"draft {summary['draft_mib']} MiB; restart to first token (median of {a.runs}):")
        print("| draft | restart → first token | MiB received by the node |")
        print("|---|---:|---:|")
        for k, label in (("cold", "on rpc-a, cache empty (weights through the tunnel)"),
                         ("warm", "on rpc-a, cache warm"), ("local", "on main's CPU (no RPC), mapped"),
                         ("local_nommap", "on main's CPU (no RPC), --load-mode none")):
            print(f"| {label} | {summary[k]['median_s']} s | {summary[k]['median_mib_to_node']} |")
        print(f"warm / local = {summary['warm_over_local']}; warm / local without mmap = {summary['warm_over_local_nommap']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
