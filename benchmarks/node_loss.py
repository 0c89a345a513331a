"""A node's loss, request by request: for each fault a client asks the front for a completion every
2 s while the fault is injected in the lab; reported per fault: how long tunnelspec took to react
(fault → the first line of the draft watch or of the launcher in main's journal), the worst latency of
a request, and the requests that failed. Not part of CI, and not a timed test.

    flock /tmp/tunnelspec-lab.lock python benchmarks/node_loss.py --deploy [--faults link_cut,ssh_kill,rpc_kill]
        [--cut 60] [--json] [--journal DIR]
    flock /tmp/tunnelspec-lab.lock python benchmarks/node_loss.py --split [--cut 60]

Against the default lab (`tunnelspec lab up`; the test lab is reused), deployed first by this checkout
with --deploy (another lab user may have deployed their own since). Faults, all on rpc-a (the
draft-only node):
  link_cut   rpc-a's link down for --cut seconds, then up
  ssh_kill   SIGKILL the draft tunnel's ssh on main (systemd starts it again)
  rpc_kill   SIGKILL rpc-a's rpc-server (systemd starts it again 2 s later)
  split_cut  with --split: examples/seed003-layers-on-two-nodes.ini deployed on the lab (no draft, both
             nodes target layers, an 11-block tiny llama the rest holds without rpc-a), rpc-a's link
             down for --cut seconds: served split-degraded from main's CPU and rpc-b meanwhile
Before each fault the cluster serves speculative and a drafted answer came back (the full split:
plain and an answer); the client starts
6 s before the fault and runs until 40 s after it ended (a request every 2 s, each bounded by 400 s).
--journal DIR writes main's journal around each fault (watcher, launcher and llama-server, front,
tunnel) for reading.
"""

from __future__ import annotations

import argparse
import json
import signal
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE.parent / "tests"))

from support.lab_client import Client, main_time, reactions  # noqa: E402

from tunnelspec.lab import DEFAULT_BRIDGE, Lab  # noqa: E402
from tunnelspec.lab import state as lab_state  # noqa: E402

FAULTS = ("link_cut", "ssh_kill", "rpc_kill")
SPLIT_FAULTS = ("split_cut",)
SEED003 = HERE.parent / "examples" / "seed003-layers-on-two-nodes.ini"
NODE = "rpc-a"
INTERVAL_S = 2.0
LEAD_S, TAIL_S = 6.0, 40.0
UNITS = ("tunnelspec-draftwatch.service", "tunnelspec-llama-server.service", "tunnelspec-front.service",
         f"tunnelspec-tunnel-{NODE}.service")


def sh(lab, host, script: str, timeout: float = 60) -> str:
    return lab.exec(host, ["sh", "-c", script], timeout=timeout).stdout or ""


def wait_speculative(lab, timeout: float = 300, mode: str = "speculative") -> None:
    """The mode file says speculative, llama-server is active and a completion through the front drafts
    (mode "plain", the full split: an answer, no draft)."""
    client_probe = ("import json,urllib.request\n"
                    "r=urllib.request.Request('http://127.0.0.1:8080/completion',data=json.dumps({'prompt':'Hi',"
                    "'n_predict':8,'cache_prompt':False}).encode(),headers={'Content-Type':'application/json'})\n"
                    "try:\n print((json.loads(urllib.request.urlopen(r,timeout=30).read()).get('timings') or {})"
                    ".get('draft_n',0))\nexcept Exception:\n print(0)\n")
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        mode_file = sh(lab, "main", "cat /run/tunnelspec-llama/mode.json 2>/dev/null || echo {}")
        active = sh(lab, "main", "systemctl is-active tunnelspec-llama-server.service || :").strip()
        if f'"{mode}"' in mode_file and active == "active":
            out = lab.exec("main", ["python3", "-c", client_probe], timeout=60).stdout.strip()
            if out.splitlines() and out.splitlines()[-1] not in ("", "0" if mode == "speculative" else "x"):
                return
        time.sleep(1)   # poll interval of the deadline loop
    raise SystemExit(f"the lab does not serve {mode}: deploy it first")


def inject(lab, kind: str, cut: float) -> float:
    """Start the fault; returns when it is over (the link cut lasts `cut` s)."""
    if kind in ("link_cut", "split_cut"):
        lab.link(NODE, False)
        try:
            time.sleep(cut)  # the fault's own length
        finally:
            lab.link(NODE, True)
    elif kind == "ssh_kill":
        sh(lab, "main", f"kill -KILL $(systemctl show -P MainPID tunnelspec-tunnel-{NODE}.service)")
    elif kind == "rpc_kill":
        sh(lab, NODE, "kill -KILL $(systemctl show -P MainPID tunnelspec-rpc.service)")
    else:
        raise ValueError(kind)
    return main_time(lab)


def journal(lab, since: float, until: float) -> str:
    argv = f"journalctl --no-pager -o short-precise --since @{since:.3f} --until @{until:.3f}"
    for u in UNITS:
        argv += f" -u {u}"
    # llama-server's own verbose lines (-lv 4) drown the rest: its tunnelspec lines, errors and starts.
    keep = "tunnelspec|rpc|RPC|error|Error|abort|terminat|fail|Fail|listening|HTTP server|DOWN|UP|backup|-- "
    return sh(lab, "main", f"{argv} | grep -E '{keep}' | grep -v 'slot\\|srv  log_server_r' | tail -400")


def one_fault(lab, kind: str, cut: float, journal_dir: Path | None) -> dict:
    wait_speculative(lab, mode="plain" if kind in SPLIT_FAULTS else "speculative")
    held = cut if kind in ("link_cut", "split_cut") else 0.0
    client = Client(lab, f"node-loss-{kind}", LEAD_S + held + TAIL_S, interval=INTERVAL_S)
    try:
        time.sleep(LEAD_S)  # a few drafted answers before the fault
        t0 = main_time(lab)
        t_end = inject(lab, kind, cut)
        records = client.wait_done(timeout=held + TAIL_S + 480)
    finally:
        client.stop()
    lines = reactions(lab, t0)
    failed = [r for r in records if r.get("status") != 200]
    worst = max(records, key=lambda r: r["done"] - r["sent"]) if records else None
    after = [r for r in records if r["sent"] >= t0 and r.get("status") == 200]
    res = {
        "fault": kind, "held_s": round(t_end - t0, 1), "requests": len(records), "failed": len(failed),
        "detection_s": round(lines[0][0] - t0, 2) if lines else None,
        "reaction": [f"+{t - t0:.1f}s {m}" for t, _, m in lines[:6]],
        "worst_latency_s": round(worst["done"] - worst["sent"], 1) if worst else None,
        "worst_sent_at_s": round(worst["sent"] - t0, 1) if worst else None,
        "first_answer_after_fault_s": round(min(r["done"] for r in after) - t0, 1) if after else None,
        "failures": [{"sent_at_s": round(r["sent"] - t0, 1), "after_s": round(r["done"] - r["sent"], 1),
                      "status": r.get("status"), "error": (r.get("error") or "")[:160]} for r in failed],
    }
    if journal_dir is not None:
        journal_dir.mkdir(parents=True, exist_ok=True)
        (journal_dir / f"{kind}.log").write_text(f"fault at {t0:.3f}\n" + journal(lab, t0 - 3, main_time(lab)))
        (journal_dir / f"{kind}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    return res


def render(rows: list[dict]) -> str:
    out = ["| fault | requests | failed | detection | worst latency | first answer sent after the fault |",
           "|---|---:|---:|---:|---:|---:|"]
    for r in rows:
        det = f"{r['detection_s']} s" if r["detection_s"] is not None else "no reaction"
        out.append(f"| {r['fault']} ({r['held_s']} s) | {r['requests']} | {r['failed']} | {det} | "
                   f"{r['worst_latency_s']} s (sent at +{r['worst_sent_at_s']} s) | {r['first_answer_after_fault_s']} s |")
    for r in rows:
        out.append(f"\n{r['fault']}: reaction " + "; ".join(r["reaction"]))
        for f in r["failures"]:
            out.append(f"  failed: sent at +{f['sent_at_s']} s, after {f['after_s']} s: {f['status']} {f['error']}")
    return "\n".join(out)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--faults", help="comma-separated, in order (default all; with --split: split_cut)")
    ap.add_argument("--cut", type=float, default=60.0, help="seconds the link stays cut (default 60)")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--journal", type=Path, help="write main's journal around each fault into this directory")
    ap.add_argument("--deploy", action="store_true", help="deploy the lab's inventory with this checkout first")
    ap.add_argument("--split", action="store_true",
                    help="deploy seed 003's split (examples/) on the lab with this checkout; faults: split_cut")
    a = ap.parse_args(argv)
    known = SPLIT_FAULTS if a.split else FAULTS
    faults = [f for f in (a.faults or ",".join(known)).split(",") if f]
    bad = [f for f in faults if f not in known]
    if bad:
        ap.error(f"unknown fault(s) {', '.join(bad)}; known{' with --split' if a.split else ''}: {', '.join(known)}")
    if not 0 < a.cut <= 600:
        ap.error("--cut: between 0 and 600 seconds")
    st = lab_state.load(DEFAULT_BRIDGE)
    if st is None:
        ap.error("no lab is up: `tunnelspec lab up` and deploy first")
    lab = Lab(st["dir"])
    # A stopped run still stops its client on main (the `finally` below).
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    inventory = lab.inventory
    if a.split:
        from support.labdeploy import example_in_lab

        from tunnelspec.lab import gguf_tiny

        model = Path(lab.dir) / "node-loss-tiny-llama-11-blocks.gguf"
        gguf_tiny.write_tiny_llama(model, blocks=11)  # main's CPU and rpc-b hold it without rpc-a
        inventory = example_in_lab(SEED003, lab, model)
    if a.deploy or a.split:
        d = subprocess.run([sys.executable, "-m", "tunnelspec", "deploy", str(inventory)], capture_output=True,
                           text=True, timeout=3600, stdin=subprocess.DEVNULL, cwd=HERE.parent)
        if d.returncode != 0:
            raise SystemExit(f"deploy failed (exit {d.returncode}): {d.stdout[-2000:]}{d.stderr[-1000:]}")
    rows = []
    for kind in faults:
        rows.append(one_fault(lab, kind, a.cut, a.journal))
        if not a.json:
            print(render(rows[-1:]), flush=True)
    print(json.dumps(rows, indent=1) if a.json else "\n" + render(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
