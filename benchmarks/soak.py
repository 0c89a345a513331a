"""Soak: completions through the remote draft, every few seconds, while faults are
injected on a schedule; no manual step, no deploy during the soak. Not part of CI (it is long).

    python benchmarks/soak.py --duration 1500            # against a deployed lab (reused)
    python benchmarks/soak.py --up --duration 1500       # boot a lab, deploy, soak, lab down
    python benchmarks/soak.py --duration 300 --faults tunnel_kill,rpc_kill --json

Faults, in turn (the node alternates rpc-a — the draft — and rpc-b — the target's remote device):
  tunnel_kill   SIGKILL the tunnel's ssh on main (tunnelspec-tunnel-<node>.service)
  rpc_kill      SIGKILL the node's rpc-server (tunnelspec-rpc.service)
  link_cut_10   the node's link down for 10 s, then up
  link_cut_60   the node's link down for 60 s, then up
  node_reboot   `systemctl reboot` on the node
After each fault the soak waits until a completion drafts again (or --recover-timeout), then
--gap seconds of quiet before the next one. Outage: from the fault to the end of the first served
request that started after it.

Each request is a real completion made on main through the front (docs/degraded.md), 24 tokens, one
started every --interval seconds whatever the others are doing (a held request does not delay the
next), bounded by a 400 s timeout (longer than the front's hold). It counts as **answered** when it
returns HTTP 200 with timings, and as **drafted** when those show draft tokens (a degraded answer has
none). Reported: requests, answered, failed, the fraction answered, the fraction drafted, and per
fault kind the longest wait of a request around it and the time until the draft was accepted again
(from the fault to the end of the first drafted answer started after it), and whether the service
always came back. Every request's outcome is in the JSON output (`requests_log`).
At the end a `tunnelspec deploy` must report changed=0 (the faults left nothing to repair).

Run it under the lab lock like every lab command: flock /tmp/tunnelspec-lab.lock python benchmarks/soak.py …
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(REPO))

from tunnelspec.lab import DEFAULT_BRIDGE, Lab  # noqa: E402
from tunnelspec.lab import state as lab_state  # noqa: E402

FAULTS = ("tunnel_kill", "rpc_kill", "link_cut_10", "link_cut_60", "node_reboot")
NODES = ("rpc-a", "rpc-b")
LAB_DIR = "/var/tmp/tunnelspec-soak-lab"
REQUEST_TIMEOUT_S = 400  # longer than the front's hold (llama_server_hold_timeout, 180 s)

_COMPLETION = (
    "import json,sys,time,urllib.request\n"
    "req=urllib.request.Request('http://127.0.0.1:%d/completion',data=json.dumps({'prompt':'Once upon a time',"
    "'n_predict':24,'temperature':0,'top_k':1,'cache_prompt':False}).encode(),"
    "headers={'Content-Type':'application/json'})\n"
    "try:\n b=json.loads(urllib.request.urlopen(req,timeout=%d).read().decode())\n"
    " t=b.get('timings')\n print(json.dumps({'ok':t is not None,'drafted':bool(t and t.get('draft_n',0)>0),"
    "'draft_n':(t or {}).get('draft_n',0),'accepted':(t or {}).get('draft_n_accepted',0)}))\n"
    "except Exception as e:\n print(json.dumps({'ok':False,'error':type(e).__name__+': '+str(e)[:200]}))\n")


def completion(lab: Lab, port: int) -> dict:
    try:
        res = lab.exec("main", ["python3", "-c", _COMPLETION % (port, REQUEST_TIMEOUT_S)],
                       timeout=REQUEST_TIMEOUT_S + 15)
        return json.loads(res.stdout.strip().splitlines()[-1])
    except Exception as e:  # noqa: BLE001 - main itself down (rebooting) is an outcome too
        return {"ok": False, "error": f"{type(e).__name__}: {str(e)[:200]}"}


class Requests(threading.Thread):
    """A completion every `interval` seconds until stopped; every outcome kept with its times."""

    def __init__(self, lab: Lab, port: int, interval: float):
        super().__init__(daemon=True)
        self.lab, self.port, self.interval = lab, port, interval
        self.records: list[dict] = []
        self.lock = threading.Lock()
        self.stop = threading.Event()

    def one(self) -> None:
        t0 = time.time()
        got = completion(self.lab, self.port)
        with self.lock:
            self.records.append({"start": t0, "end": time.time(), **got})

    def run(self) -> None:
        # One request every `interval`, each in its own thread: a request the front holds does not
        # delay the next. Bounded: the soak stops it; each request by REQUEST_TIMEOUT_S.
        self.threads: list[threading.Thread] = []
        start = time.time()
        for i in range(10 ** 6):
            if self.stop.is_set():
                break
            t = threading.Thread(target=self.one, daemon=True)
            t.start()
            self.threads.append(t)
            self.stop.wait(max(0.0, start + (i + 1) * self.interval - time.time()))
        for t in self.threads:
            t.join(REQUEST_TIMEOUT_S + 30)

    def served_since(self, t: float) -> float | None:
        """When the first request started after `t` came back drafted (its end: a request started
        during a fault may be held by the front, then answered)."""
        with self.lock:
            ok = [r for r in self.records if r.get("drafted") and r["start"] >= t]
        return min(ok, key=lambda r: r["start"])["end"] if ok else None

    def longest_wait(self, t0: float, t1: float) -> float | None:
        with self.lock:
            waits = [r["end"] - r["start"] for r in self.records if r["ok"] and t0 <= r["start"] <= t1]
        return max(waits) if waits else None


def _sh(lab: Lab, host: str, script: str, timeout: float = 30) -> str:
    return lab.exec(host, ["sh", "-c", script], timeout=timeout).stdout or ""


def inject(lab: Lab, kind: str, node: str) -> None:
    if kind == "tunnel_kill":
        _sh(lab, "main", f"kill -KILL $(systemctl show -P MainPID tunnelspec-tunnel-{node}.service)")
    elif kind == "rpc_kill":
        _sh(lab, node, "kill -KILL $(systemctl show -P MainPID tunnelspec-rpc.service)")
    elif kind.startswith("link_cut_"):
        lab.link(node, up=False)
        try:
            time.sleep(int(kind.rsplit("_", 1)[1]))   # the fault's own length
        finally:
            lab.link(node, up=True)
    elif kind == "node_reboot":
        try:
            lab.exec(node, ["systemctl", "reboot"], timeout=30)
        except Exception:  # noqa: BLE001 - the host may drop the command as it goes down
            pass
    else:
        raise ValueError(kind)


def deploy(inventory: Path) -> dict:
    p = subprocess.run([sys.executable, "-m", "tunnelspec", "deploy", str(inventory), "--format", "json"],
                       capture_output=True, text=True, timeout=3600, stdin=subprocess.DEVNULL)
    recap = next((json.loads(line) for line in p.stdout.splitlines() if '"recap"' in line), {"hosts": {}})
    return {"rc": p.returncode, "changed": sum(h.get("changed", 0) for h in recap["hosts"].values()),
            "changed_tasks": [(e["host"], e["task"]) for e in map(json.loads, filter(None, p.stdout.splitlines()))
                              if e.get("event") == "task_result" and e.get("status") == "changed"]}


def soak(lab: Lab, duration: float, interval: float, faults: list[str], gap: float, recover_timeout: float,
         port: int, log=print) -> dict:
    req = Requests(lab, port, interval)
    req.start()
    started = time.time()
    events = []
    try:
        # A first served request before any fault: the baseline the outages are measured against.
        if req.served_since(0) is None:
            deadline = time.time() + recover_timeout
            while req.served_since(0) is None and time.time() < deadline:
                time.sleep(0.5)
        i = 0
        while time.time() - started < duration:
            kind, node = faults[i % len(faults)], NODES[(i // len(faults)) % len(NODES)]
            i += 1
            t_fault = time.time()
            log(f"[{t_fault - started:7.1f}s] fault {kind} on {node}")
            inject(lab, kind, node)
            deadline = time.time() + recover_timeout
            back = req.served_since(t_fault)
            while back is None and time.time() < deadline:
                time.sleep(0.5)
                back = req.served_since(t_fault)
            outage = (back - t_fault) if back is not None else None
            wait = req.longest_wait(t_fault, back if back is not None else time.time())
            events.append({"kind": kind, "node": node, "at": round(t_fault - started, 1),
                           "outage_s": round(outage, 1) if outage is not None else None,
                           "longest_wait_s": round(wait, 1) if wait is not None else None,
                           "recovered": back is not None})
            log(f"           {'drafting again after %.1fs' % outage if back else 'NOT RECOVERED'}"
                + (f"; longest wait of an answered request {wait:.1f}s" if wait is not None else ""))
            end_gap = time.time() + gap
            while time.time() < end_gap and time.time() - started < duration:
                time.sleep(0.5)
    finally:
        req.stop.set()
        req.join(REQUEST_TIMEOUT_S + 30)
    recs = req.records
    served = sum(1 for r in recs if r["ok"])
    drafted = sum(1 for r in recs if r.get("drafted"))
    per_kind = {}
    for k in dict.fromkeys(e["kind"] for e in events):
        evs = [e for e in events if e["kind"] == k]
        outs = [e["outage_s"] for e in evs if e["outage_s"] is not None]
        waits = [e["longest_wait_s"] for e in evs if e["longest_wait_s"] is not None]
        per_kind[k] = {"injected": len(evs), "recovered": sum(e["recovered"] for e in evs),
                       "longest_outage_s": max(outs) if outs else None,
                       "median_outage_s": sorted(outs)[len(outs) // 2] if outs else None,
                       "longest_wait_s": max(waits) if waits else None}
    errors = {}
    for r in recs:
        if not r["ok"]:
            key = (r.get("error") or "no timings").split(":")[0]
            errors[key] = errors.get(key, 0) + 1
    return {"duration_s": round(time.time() - started, 1), "interval_s": interval, "requests": len(recs),
            "served": served, "failed": len(recs) - served, "drafted": drafted,
            "fraction_served": round(served / len(recs), 4) if recs else 0.0,
            "fraction_drafted": round(drafted / len(recs), 4) if recs else 0.0,
            "always_recovered": all(e["recovered"] for e in events), "faults": per_kind,
            "failure_kinds": errors, "events": events,
            "requests_log": [{"t": round(r["start"] - started, 2), "s": round(r["end"] - r["start"], 2),
                              "ok": r["ok"], "drafted": bool(r.get("drafted")),
                              **({"error": r["error"]} if r.get("error") else {})} for r in recs]}


def render(result: dict) -> str:
    lines = [f"soak {result['duration_s']:.0f}s, a completion every {result['interval_s']:g}s: "
             f"{result['requests']} requests, {result['served']} answered, {result['failed']} failed "
             f"({100 * result['fraction_served']:.1f}% answered; {100 * result['fraction_drafted']:.1f}% with the draft)",
             f"{'fault':<14} {'injected':>8} {'recovered':>9} {'draft back (max)':>17} {'median':>8} {'longest wait':>13}"]
    for k, v in result["faults"].items():
        lo = f"{v['longest_outage_s']:.1f}s" if v["longest_outage_s"] is not None else "-"
        me = f"{v['median_outage_s']:.1f}s" if v["median_outage_s"] is not None else "-"
        wa = f"{v['longest_wait_s']:.1f}s" if v.get("longest_wait_s") is not None else "-"
        lines.append(f"{k:<14} {v['injected']:>8} {v['recovered']:>9} {lo:>17} {me:>8} {wa:>13}")
    lines.append(f"service always came back without a manual step: {'yes' if result['always_recovered'] else 'NO'}")
    if "deploy_after" in result:
        d = result["deploy_after"]
        lines.append(f"deploy after the soak: exit {d['rc']}, changed={d['changed']} {d['changed_tasks'] or ''}")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--duration", type=float, default=1500, help="seconds of soak (default 1500 = 25 min)")
    ap.add_argument("--interval", type=float, default=3.0, help="seconds between request starts")
    ap.add_argument("--faults", default=",".join(FAULTS), help="comma-separated, in order (default all)")
    ap.add_argument("--gap", type=float, default=30.0, help="quiet seconds after each recovery")
    ap.add_argument("--recover-timeout", type=float, default=300.0)
    ap.add_argument("--port", type=int, default=8080, help="llama-server's port on main")
    ap.add_argument("--up", action="store_true", help=f"boot a lab in {LAB_DIR} and deploy first; down at the end")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    faults = [f for f in args.faults.split(",") if f]
    bad = [f for f in faults if f not in FAULTS]
    if bad:
        ap.error(f"unknown fault(s) {', '.join(bad)}; known: {', '.join(FAULTS)}")
    existing = lab_state.load(DEFAULT_BRIDGE)
    if args.up:
        lab = Lab(LAB_DIR)
        lab.up(["main", *NODES])
    elif existing is not None:
        lab = Lab(existing["dir"])
    else:
        ap.error("no lab is up: bring one up and deploy it, or pass --up")
    try:
        if args.up:
            d = deploy(lab.inventory)
            if d["rc"] != 0:
                print(f"deploy failed (exit {d['rc']})", file=sys.stderr)
                return 1
        result = soak(lab, args.duration, args.interval, faults, args.gap, args.recover_timeout, args.port,
                      log=(lambda m: print(m, file=sys.stderr)) if args.json else print)
        result["deploy_after"] = deploy(lab.inventory)
    finally:
        if args.up:
            lab.down()
    print(json.dumps(result, indent=2) if args.json else render(result))
    ok = result["always_recovered"] and result["deploy_after"]["rc"] == 0 and result["deploy_after"]["changed"] == 0
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
