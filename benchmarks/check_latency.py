"""How long `tunnelspec check` takes to answer on the slowest kinds of broken inventory (several
mistakes in one file, a broken header, YAML), interpreter start included: the target is a median
under one second. Offline: no record of an earlier deploy (an empty XDG_CACHE_HOME), so the
settings are checked against the planned spelling, as on a new controller.

    python benchmarks/check_latency.py [--runs 3]

Each of the corpus files with three mistakes or more (tests/check/corpus, at most 9 of them) is
checked --runs times, one whole process each; every run must exit 2 (the mistakes found). Prints
each file's median, and the median over all runs against the target.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
CORPUS = REPO / "tests" / "check" / "corpus"
TARGET_S = 1.0


def slowest_kinds() -> list[Path]:
    cases = sorted([*CORPUS.glob("*.ini"), *CORPUS.glob("*.yml")])
    return [c for c in cases if len(re.findall(r"^# expect: ", c.read_text(), re.M)) >= 3][:9]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=3)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="tunnelspec-check-latency-") as cache:
        env = {k: v for k, v in os.environ.items() if not k.startswith("TUNNELSPEC_")}
        env.update(PYTHONPATH=str(REPO) + os.pathsep + env.get("PYTHONPATH", ""), XDG_CACHE_HOME=cache)
        every: list[float] = []
        for case in slowest_kinds():
            took = []
            for _ in range(max(1, a.runs)):
                t0 = time.perf_counter()
                p = subprocess.run([sys.executable, "-m", "tunnelspec", "check", case.name], cwd=CORPUS, env=env,
                                   capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
                took.append(time.perf_counter() - t0)
                if p.returncode != 2:
                    raise SystemExit(f"{case.name}: exit {p.returncode}, expected 2\n{p.stdout[-2000:]}{p.stderr[-2000:]}")
            every.extend(took)
            print(f"  {case.name:<48} median {statistics.median(took):.3f} s")
    med = statistics.median(every)
    print(f"median over {len(every)} runs: {med:.3f} s (target < {TARGET_S:.1f} s: {'met' if med < TARGET_S else 'NOT met'}); "
          f"load {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
