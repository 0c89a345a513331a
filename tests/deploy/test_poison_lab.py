"""A poison request in the lab: one request that crashes llama-server is sent to it twice, then
answered with an error, while every other client keeps being served.

A test-only local patch makes llama-server abort (a line to stderr, then abort()) when a completion's
prompt contains MARKER. The lab is deployed with it (the patch changes one file of tools/server: ccache
has the rest). Then, on main, one client asks the front every 2 s throughout, and another sends the
marker once: the marker's client gets the front's 502 within the hold budget, llama-server aborted
exactly twice on it (the first drop retried once, the second answered), the unit restarted at most
twice for it, and the steady client got every answer. The lab's own inventory is deployed again at the
end (try/finally): its build is kept, so that is a switch back, no compile.

In the `extended` tier (scripts/test-extended.sh): the patched build and the two deploys cost about
four minutes, which the default run's budget does not have (docs/ci.md). The front's rule itself is
proven in the default run against a stand-in backend (tests/server/test_front_poison.py)."""

from __future__ import annotations

import difflib
import json
import subprocess
import time
from pathlib import Path

import pytest

from support.labdeploy import completion_on_main, converge, deploy, failures, inventory_copy, sh

pytestmark = [pytest.mark.lab, pytest.mark.extended]

MARKER = "TUNNELSPEC-TEST-POISON-7f3a"
ABORT_LINE = "tunnelspec-test: poison prompt, aborting"
REL = "tools/server/server-context.cpp"
ANCHOR = '        const auto & prompt = data.at("prompt");\n'
UNIT = "tunnelspec-llama-server.service"

# Runs on main: a completion every 2 s through the front (each in its own thread, at most 100 at
# once) for `steady` seconds; the marker sent once after 5 s. One JSON line per request. Bounded.
CLIENT = r"""
import json, sys, threading, time, urllib.error, urllib.request
marker, steady = sys.argv[1], float(sys.argv[2])
lock, threads = threading.Lock(), []

def ask(prompt, kind):
    rec = {"kind": kind, "t0": time.time()}
    body = json.dumps({"prompt": prompt, "n_predict": 8, "temperature": 0, "top_k": 1,
                       "cache_prompt": False}).encode()
    try:
        req = urllib.request.Request("http://127.0.0.1:8080/completion", data=body,
                                     headers={"Content-Type": "application/json"})
        out = json.loads(urllib.request.urlopen(req, timeout=300).read())
        rec.update(status=200, content=bool(out.get("content") is not None))
    except urllib.error.HTTPError as e:
        rec.update(status=e.code, body=e.read().decode(errors="replace")[:400])
    except Exception as e:
        rec.update(status=0, error=str(e)[:200])
    rec["t1"] = time.time()
    with lock:
        print(json.dumps(rec), flush=True)

start = time.time()
sent_marker = False
while time.time() - start < steady:
    t0 = time.time()
    threads = [t for t in threads if t.is_alive()]
    if len(threads) < 100:
        t = threading.Thread(target=ask, args=("Once upon a time", "steady"), daemon=True)
        t.start()
        threads.append(t)
    if not sent_marker and t0 - start >= 5:
        sent_marker = True
        t = threading.Thread(target=ask, args=("Once upon a time " + marker, "poison"), daemon=True)
        t.start()
        threads.append(t)
    time.sleep(max(0.0, t0 + 2.0 - time.time()))
for t in threads:
    t.join(timeout=300)
"""


def poison_patch(llama_fixtures, path: Path) -> Path:
    text = subprocess.run(["git", "-C", llama_fixtures.repo_local, "show", f"{llama_fixtures.commit}:{REL}"],
                          capture_output=True, text=True, check=True).stdout
    assert text.count(ANCHOR) == 1, f"the fixture's {REL} changed: find where a completion's prompt is read again"
    hook = (f'        if (prompt.is_string() && prompt.get<std::string>().find("{MARKER}") != std::string::npos) {{\n'
            f'            fprintf(stderr, "%s\\n", "{ABORT_LINE}");\n            fflush(stderr);\n'
            f"            abort();\n        }}\n")
    new = text.replace(ANCHOR, ANCHOR + hook)
    diff = difflib.unified_diff(text.splitlines(keepends=True), new.splitlines(keepends=True), f"a/{REL}", f"b/{REL}")
    path.write_text("".join(diff))
    return path


def restarts(lab) -> int:
    return int(sh(lab, "main", "systemctl", "show", "-p", "NRestarts", "--value", UNIT).strip() or 0)


def test_a_poison_request_is_sent_twice_then_refused_while_others_are_served(lab, lab_tools, llama_fixtures,
                                                                              tmp_path):
    patch = poison_patch(llama_fixtures, tmp_path / "poison.patch")
    poisoned = inventory_copy(lab, tmp_path, "poison.ini", extra=(f'llama_patches=[{{"file": "{patch}"}}]',))
    try:
        r = deploy(poisoned)
        assert r.rc == 0, failures(r)
        assert completion_on_main(lab) is not None
        hold = int(sh(lab, "main", "sh", "-c",
                      "sed -n 's/.*for up to \\([0-9]*\\) s.*/\\1/p' /etc/tunnelspec/front.cfg | head -1").strip()
                   or 0)
        assert hold > 0, "the front's configuration names its hold"
        before = restarts(lab)
        since = sh(lab, "main", "date", "+%Y-%m-%d %H:%M:%S").strip()
        out = sh(lab, "main", "python3", "-c", CLIENT, MARKER, "40", timeout=400)
        records = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
        poison = [x for x in records if x["kind"] == "poison"]
        steady = [x for x in records if x["kind"] == "steady"]
        assert len(poison) == 1, records
        p = poison[0]
        assert p["status"] == 502 and "dropped this request twice" in p.get("body", ""), p
        assert p["t1"] - p["t0"] <= 2 * hold + 30, (p, hold)
        assert len(steady) >= 15 and all(x["status"] == 200 for x in steady), [x for x in steady if x["status"] != 200]
        time.sleep(3)  # the second restart's start line
        aborts = sh(lab, "main", "sh", "-c", f"journalctl -u {UNIT} --since '{since}' -o cat | grep -c '{ABORT_LINE}'"
                    " || true").strip()
        assert aborts == "2", f"llama-server aborted {aborts} times on the marker (want exactly 2)"
        assert 1 <= restarts(lab) - before <= 2, (before, restarts(lab))
        assert completion_on_main(lab) is not None, "llama-server serves again after the poison request"
        print(f"\npoison: 502 after {p['t1'] - p['t0']:.1f} s (hold {hold} s); steady client {len(steady)}/{len(steady)} "
              f"answered, longest {max(x['t1'] - x['t0'] for x in steady):.1f} s; restarts +{restarts(lab) - before}")
    finally:
        converge(lab.inventory)
