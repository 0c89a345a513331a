"""A client of the lab's API that outlives nothing: completions through main's front every few seconds,
run on main itself as a transient unit (stopped by name at the end), each outcome a JSON line with its
times on main's clock. Shared by the degraded-mode lab tests and benchmarks/node_loss.py."""

from __future__ import annotations

import json
import time

SCRIPT_PATH = "/var/tmp/tunnelspec-test-client.py"
SCRIPT = r'''
import json, os, sys, threading, time, urllib.error, urllib.request
port, interval, count, out = int(sys.argv[1]), float(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
lock = threading.Lock()
def one(i, sent):
    rec = {"i": i, "sent": sent}
    # Not streamed: nothing is sent before the answer is whole, so the front may send it again.
    body = json.dumps({"prompt": "Once upon a time", "n_predict": 16, "temperature": 0, "top_k": 1,
                       "cache_prompt": False}).encode()
    try:
        req = urllib.request.Request("http://127.0.0.1:%d/completion" % port, data=body,
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=400) as r:
            t = json.loads(r.read()).get("timings") or {}
            rec.update(status=r.status, draft_n=t.get("draft_n", 0), accepted=t.get("draft_n_accepted", 0))
    except urllib.error.HTTPError as e:
        rec.update(status=e.code, error=str(e))
    except Exception as e:
        rec.update(status=None, error="%s: %s" % (type(e).__name__, e))
    rec["done"] = time.time()
    with lock, open(out, "a") as f:
        f.write(json.dumps(rec) + "\n")
start = time.time()
threads = []
for i in range(count):
    time.sleep(max(0.0, start + i * interval - time.time()))
    if os.path.exists(out + ".stop"):  # Client.finish: no new request; the ones in flight end as usual
        break
    t = threading.Thread(target=one, args=(i, time.time()))
    t.start()
    threads.append(t)
for t in threads:
    t.join(420)
'''


def _sh(lab, host: str, *argv: str, timeout: float = 90) -> str:
    return lab.exec(host, list(argv), timeout=timeout).stdout or ""


class Client:
    """`count` = seconds / interval + 1 completions, one started every `interval` s whatever the
    others are doing (a request the front holds does not delay the next), each bounded by 400 s."""

    def __init__(self, lab, name: str, seconds: float, interval: float = 3.0, port: int = 8080):
        self.lab, self.unit, self.out = lab, f"tunnelspec-test-client-{name}", f"/var/tmp/{name}.jsonl"
        # A client left running by an interrupted run would keep writing the same file.
        self.stop()
        _sh(lab, "main", "rm", "-f", self.out, self.out + ".stop")
        lab.exec("main", ["sh", "-c", f"cat > {SCRIPT_PATH}"], input=SCRIPT, timeout=30)
        count = int(seconds / interval) + 1
        r = lab.exec("main", ["systemd-run", "--unit", self.unit, "--collect", "--quiet", "/usr/bin/python3",
                              SCRIPT_PATH, str(port), str(interval), str(count), self.out], timeout=30)
        assert r.returncode == 0, r.stderr

    def stop(self) -> None:
        _sh(self.lab, "main", "sh", "-c", f"systemctl stop {self.unit} 2>/dev/null; systemctl reset-failed "
            f"{self.unit} 2>/dev/null; :")

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()

    def records(self) -> list[dict]:
        out = _sh(self.lab, "main", "sh", "-c", f"cat {self.out} 2>/dev/null || :")
        return sorted((json.loads(l) for l in out.splitlines() if l.startswith("{")), key=lambda r: r["i"])

    def finish(self, timeout: float = 480) -> list[dict]:
        """No new request from now on; wait for the ones in flight; every record."""
        _sh(self.lab, "main", "touch", self.out + ".stop")
        return self.wait_done(timeout)

    def wait_done(self, timeout: float = 480) -> list[dict]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if _sh(self.lab, "main", "systemctl", "is-active", self.unit).strip() not in ("active", "activating"):
                break
            time.sleep(2)   # poll interval of the deadline loop
        self.stop()
        return self.records()


def main_time(lab) -> float:
    return float(_sh(lab, "main", "date", "+%s.%N").strip())


def reactions(lab, since: float, units=("tunnelspec-draftwatch.service", "tunnelspec-llama-server.service")) -> list[tuple[float, str, str]]:
    """How main reacted since `since` (epoch s): the watcher's and the launcher's lines, and systemd's line
    when llama-server (the last of `units`) ended; (time, unit, message), oldest first."""
    argv = ["journalctl", "-o", "json", "--no-pager", "--since", "@%.3f" % since]
    for u in units:
        argv += ["-u", u]
    out = _sh(lab, "main", *argv, timeout=60)
    rows = []
    for line in out.splitlines():
        try:
            e = json.loads(line)
        except ValueError:
            continue
        msg = e.get("MESSAGE")
        if not isinstance(msg, str):
            continue
        if msg.startswith("tunnelspec: "):
            msg = msg[len("tunnelspec: "):]
        elif not (e.get("UNIT") == units[-1] and "Main process exited" in msg):
            continue  # systemd's line when llama-server ended by itself (an abort on an RPC error) counts too
        t = int(e["__REALTIME_TIMESTAMP"]) / 1e6
        if t >= since:
            rows.append((t, e.get("_SYSTEMD_UNIT", ""), msg))
    return sorted(rows)
