"""Build times per llama.cpp tree: cold (an empty ccache) and with a warm ccache.

    flock /tmp/tunnelspec-lab.lock python benchmarks/builds.py                 # b11434 and b9093
    flock /tmp/tunnelspec-lab.lock python benchmarks/builds.py --trees b9093 --json
    flock /tmp/tunnelspec-lab.lock python benchmarks/builds.py --trees b11434 --release bullseye

Two passes on fresh labs (new host overlays: no build directory survives between passes), both
with one ccache directory of their own, empty at the start (what TUNNELSPEC_LAB_CCACHE sets for a
lab; the machine's shared ccache is not touched):
  cold  every tree deployed in turn on one lab: the first build of each tree compiles everything
  warm  the same deploys on a new lab with the ccache the cold pass filled
For each tree and host the `llama_build` task's own duration is reported (main builds llama-server
and the RPC server, a node the RPC server only), with the deploy's wall time. `--forks 1`, as the
lab's tests deploy trees: main builds first, the nodes then hit the ccache entries of the ggml
objects main compiled (even in the cold pass).

Not part of CI (a cold pass of both trees takes ≈ 25 min on 2 cores). Only one lab per machine:
run it under the lab lock, nothing else building.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests"))  # tests/support: the upstream-builds fixtures

LAB_DIR = "/var/tmp/tunnelspec-builds-lab"
DEPLOY_TIMEOUT_S = 3600
TREES = ("b11434", "b9093")


def deploy(inventory: Path) -> tuple[float, list[dict]]:
    t0 = time.monotonic()
    p = subprocess.run([sys.executable, "-m", "tunnelspec", "deploy", str(inventory), "--format", "json",
                        "--forks", "1"], capture_output=True, text=True, timeout=DEPLOY_TIMEOUT_S,
                       stdin=subprocess.DEVNULL, cwd=REPO)
    wall = time.monotonic() - t0
    events = []
    for line in p.stdout.splitlines():
        try:
            events.append(json.loads(line))
        except ValueError:
            continue
    if p.returncode != 0:
        failed = [e.get("msg") for e in events if e.get("status") == "failed"]
        raise SystemExit(f"deploy of {inventory} failed (rc={p.returncode}): {failed or p.stderr[-2000:]}")
    return wall, events


def one_pass(name: str, ccache_dir: Path, trees: tuple[str, ...], log, release: str = "bookworm") -> list[dict]:
    from tunnelspec.lab import Lab
    from tunnelspec.lab import host as lab_host
    from support.upstream_fixtures import ensure_upstream_fixtures, pinned_inventory

    # What TUNNELSPEC_LAB_CCACHE sets when the lab's host module loads, set for this process's labs.
    lab_host.CCACHE_DIR = ccache_dir
    upstream = ensure_upstream_fixtures()
    lab = Lab(LAB_DIR)
    hosts = ["main", "rpc-a", "rpc-b"]
    lab.up(hosts, releases={h: release for h in hosts})
    rows = []
    try:
        for tree in trees:
            inv = Path(LAB_DIR) / f"builds-{tree}.ini"
            inv.write_text(pinned_inventory(Path(lab.inventory).read_text(), upstream, tree))
            wall, events = deploy(inv)
            builds = {e["host"]: e for e in events if e.get("event") == "task_result"
                      and e.get("module") == "llama_build"}
            installs = {e["host"]: e for e in events if e.get("event") == "task_result"
                        and e.get("task") == "prerequisites installed" and e.get("status") == "changed"}
            row = {"pass": name, "tree": tree, "release": release, "deploy_s": round(wall, 1),
                   "install_s": {h: round(e.get("duration", 0.0), 1) for h, e in sorted(installs.items())},
                   "build_s": {h: round(e.get("duration", 0.0), 1) for h, e in sorted(builds.items())},
                   "status": {h: e.get("status") for h, e in sorted(builds.items())}}
            rows.append(row)
            log(f"{name:5} {release:8} {tree:7} deploy {row['deploy_s']:7.1f} s  install " +
                "  ".join(f"{h} {s:5.1f} s" for h, s in row["install_s"].items()) + "  build " +
                "  ".join(f"{h} {s:6.1f} s" for h, s in row["build_s"].items()))
    finally:
        lab.down()
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--trees", default=",".join(TREES), help="comma-separated: b11434,b9093")
    ap.add_argument("--release", default="bookworm", help="Debian release of every lab host (bullseye, bookworm, trixie)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    trees = tuple(t for t in args.trees.split(",") if t)
    unknown = set(trees) - set(TREES)
    if unknown:
        ap.error(f"unknown tree(s): {', '.join(sorted(unknown))} (have {', '.join(TREES)})")
    log = (lambda m: print(m, file=sys.stderr)) if args.json else print
    ccache = Path(tempfile.mkdtemp(prefix="tunnelspec-bench-ccache-", dir="/var/tmp"))
    try:
        rows = (one_pass("cold", ccache, trees, log, args.release)
                + one_pass("warm", ccache, trees, log, args.release))
    finally:
        shutil.rmtree(ccache, ignore_errors=True)
    if args.json:
        print(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
