"""Safe deploys, in the lab: a deploy never leaves the cluster worse than it found it.

A local patch makes the new llama-server abort (an fprintf to stderr, then abort()) just before it
loads the model. The deploy builds it (one file of tools/server recompiles, ccache has the rest),
starts it, sees it restart in a loop, and returns every host to the last verified generation: it
exits non-zero naming llama-server's own abort line and "serving generation N again". Throughout, a
client on main asks the API (through the front) every 2 s: at least 99 % of its requests are
answered, and the cluster serves the previous generation with draft tokens accepted within 60 s of
the failure. The next deploy of the previous inventory changes nothing. Then `rollback --to N` to a
generation of the test's own (another spec_draft_n_max) and a deploy forward again, each verified,
changed=0 after each. And `deploy --no-rollback` leaves it broken, saying so, and `tunnelspec rollback`
repairs it. A node's new rpc-server that aborts at start: every host goes back. A target model that is
a copy cut short: refused before anything serving changes, nothing to roll back; so is a finished
build whose RPC server cannot start, before `current` moves to it.
The lab's own inventory is deployed again at the end (try/finally): the other modules expect it."""

from __future__ import annotations

import difflib
import json
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from support.cli import tunnelspec
from support.labdeploy import completion_on_main, converge, deploy, failures, inventory_copy, main_pid, sh
from tunnelspec.engine.playbook import builtin_playbook

pytestmark = pytest.mark.lab

ABORT_LINE = "tunnelspec-test: deliberate abort while loading the model"
ANCHOR = "        if (!ctx_server.load_model(params)) {\n"

# Runs on main (llama-server and its front listen on main's loopback): a completion every 2 s through
# the front, each in its own thread (at most 200 at once) so a request the front holds does not delay
# the next, until the stop file appears (bounded: at most 40 minutes). One JSON line per request.
CLIENT = r"""
import json, os, sys, threading, time, urllib.request
stop, end = sys.argv[1], time.time() + 2400
body = json.dumps({"prompt": "Once upon a time", "n_predict": 8, "temperature": 0, "top_k": 1,
                   "cache_prompt": False}).encode()
lock, threads = threading.Lock(), []

def ask(t0):
    rec = {"t0": t0}
    try:
        req = urllib.request.Request("http://127.0.0.1:8080/completion", data=body,
                                     headers={"Content-Type": "application/json"})
        out = json.loads(urllib.request.urlopen(req, timeout=400).read())
        rec.update(ok=True, accepted=(out.get("timings") or {}).get("draft_n_accepted"))
    except Exception as e:
        rec.update(ok=False, error=str(e)[:200])
    rec["t1"] = time.time()
    with lock:
        print(json.dumps(rec), flush=True)

while time.time() < end and not os.path.exists(stop):
    t0 = time.time()
    threads = [t for t in threads if t.is_alive()]
    if len(threads) < 200:      # bounded: a request held by the front waits in its own thread
        t = threading.Thread(target=ask, args=(t0,), daemon=True)
        t.start()
        threads.append(t)
    time.sleep(max(0.0, t0 + 2.0 - time.time()))
for t in threads:
    t.join(timeout=400)
"""


def abort_patch(llama_fixtures, path: Path) -> Path:
    rel = "tools/server/server.cpp"
    text = subprocess.run(["git", "-C", llama_fixtures.repo_local, "show", f"{llama_fixtures.commit}:{rel}"],
                          capture_output=True, text=True, check=True).stdout
    assert text.count(ANCHOR) == 1, "the fixture's server.cpp changed: find the model load call again"
    new = text.replace(ANCHOR, f'        fprintf(stderr, "%s\\n", "{ABORT_LINE}");\n        fflush(stderr);\n'
                               f"        abort();\n{ANCHOR}")
    diff = difflib.unified_diff(text.splitlines(keepends=True), new.splitlines(keepends=True),
                                f"a/{rel}", f"b/{rel}")
    path.write_text("".join(diff))
    return path


class Client:
    """The client on main, run by a bounded thread of the test (lab.exec into main)."""

    def __init__(self, lab):
        self.lab, self.stop = lab, "/run/tunnelspec-test-client.stop"
        self.out: str = ""
        lab.exec("main", ["rm", "-f", self.stop], timeout=30)
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        res = self.lab.exec("main", ["python3", "-c", CLIENT, self.stop], timeout=2500)
        self.out = res.stdout or ""

    def __enter__(self):
        self.thread.start()
        return self

    def finish(self) -> list[dict]:
        self.lab.exec("main", ["touch", self.stop], timeout=30)
        self.thread.join(timeout=600)
        self.lab.exec("main", ["rm", "-f", self.stop], timeout=30)
        return [json.loads(l) for l in self.out.splitlines() if l.startswith("{")]

    def __exit__(self, *exc):
        if self.thread.is_alive():
            self.finish()


def streamed_deploy(inventory: Path) -> tuple[int, list[tuple[float, dict]]]:
    """deploy --format json with each event's arrival time (wall clock, as the client's on main)."""
    p = subprocess.Popen([sys.executable, "-m", "tunnelspec", "deploy", str(inventory), "--format", "json"],
                         stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL, text=True)
    got = []
    for line in p.stdout:
        if line.startswith("{"):
            got.append((time.time(), json.loads(line)))
    return p.wait(timeout=60), got


def changed(result) -> dict:
    return {h: c["changed"] for h, c in result.recap.items() if c["changed"]}


def draft_n_max(lab) -> str | None:
    """The value after the draft-max flag in the speculative command line the launcher runs."""
    modes = json.loads(lab.exec("main", ["cat", "/etc/tunnelspec/llama-server.json"], timeout=30).stdout)
    argv = modes["modes"]["speculative"]
    flag = next((i for i, a in enumerate(argv) if a in ("--spec-draft-n-max", "--draft-max", "--draft-n")), None)
    return argv[flag + 1] if flag is not None else None


def published_status(lab) -> dict:
    """What the metrics exporter reads: /var/lib/tunnelspec/generation.json on main (world-readable)."""
    path = "/var/lib/tunnelspec/generation.json"
    assert lab.exec("main", ["stat", "-c", "%a", path], timeout=30).stdout.strip() == "644"
    return json.loads(lab.exec("main", ["cat", path], timeout=30).stdout)


def current_generation(lab) -> int:
    return int(lab.exec("main", ["cat", "/var/lib/tunnelspec/generations/current"], timeout=30).stdout.strip())


def test_a_deploy_whose_llama_server_aborts_returns_to_the_last_generation(lab, lab_tools, llama_fixtures, tmp_path):
    bad = inventory_copy(lab, tmp_path, "bad.ini",
                         extra=(f'llama_patches=[{{"file": "{abort_patch(llama_fixtures, tmp_path / "abort.patch")}"}}]',))
    try:
        converge(lab.inventory)                        # the lab's state, verified: a generation
        good = current_generation(lab)
        before = published_status(lab)
        assert before["generation"] == good, before
        with Client(lab) as client:
            time.sleep(4)                              # a request or two before the deploy starts
            started = time.time()
            rc, evs = streamed_deploy(bad)
            records = client.finish()
        took = time.time() - started
        events = [e for _, e in evs]
        text = "\n".join(json.dumps(e) for e in events)
        assert rc == 1, text[-4000:]
        fail_t, fail = next((t, e) for t, e in evs if e.get("status") == "failed")
        assert ABORT_LINE in fail["msg"], fail
        assert "restarts in a loop" in fail["msg"], fail
        last = events[-1]
        assert last["event"] == "message" and f"serving generation {good} again" in last["msg"], events[-6:]
        assert ABORT_LINE in last["msg"], last
        back_t, back = next((t, e) for t, e in evs if e.get("module") == "llama_verify" and e.get("status") == "ok"
                            and e.get("play") == "main back to the generation")
        assert back_t - fail_t <= 60, (back_t - fail_t, back)
        assert current_generation(lab) == good
        # The return is counted for the metrics (tunnelspec_rollbacks_total), the generation unchanged.
        after = published_status(lab)
        assert (after["generation"], after["rollbacks"]) == (good, before.get("rollbacks", 0) + 1), (before, after)
        assert after["last_rollback"] >= fail_t - 5, after

        answered = [r for r in records if r["ok"]]
        assert records and len(answered) >= 0.99 * len(records), [r for r in records if not r["ok"]]
        served = [r for r in answered if r["t1"] > fail_t and (r.get("accepted") or 0) > 0]
        assert served and served[0]["t1"] - fail_t <= 60, (served[:1], fail_t)
        longest = max(r["t1"] - r["t0"] for r in records)
        print(f"\ndeploy + rollback {took:.0f} s; failure → generation {good} verified {back_t - fail_t:.1f} s; "
              f"client: {len(answered)}/{len(records)} answered, longest wait {longest:.1f} s, first draft-accepted "
              f"answer {served[0]['t1'] - fail_t:.1f} s after the failure")

        again = deploy(lab.inventory)
        assert again.rc == 0 and changed(again) == {}, (changed(again), failures(again))

        print(f"failure: {fail['msg'][:600]}\nlast line: {last['msg'][:600]}")

        # --no-rollback: left as the failure left it (llama-server restarting), said so; `rollback` repairs it.
        nr = deploy(bad, "--no-rollback")
        assert nr.rc == 1, failures(nr)
        said = [e["msg"] for e in nr.events if e.get("event") == "message"]
        assert said and said[-1].startswith("--no-rollback: the hosts are left as the failed deploy left them"), said
        assert "build" in said[-1] and "tunnelspec rollback INVENTORY" in said[-1], said
        assert "deliberate abort" in lab.exec("main", ["journalctl", "-u", "tunnelspec-llama-server", "-n", "20",
                                                       "--no-pager", "-o", "cat"], timeout=30).stdout
        t0 = time.time()
        rep = tunnelspec("rollback", str(lab.inventory), "--format", "json", timeout=900)
        assert rep.rc == 0 and current_generation(lab) == good, failures(rep)
        assert rep.events[-1]["msg"] == f"serving generation {good} (verified)", rep.events[-1]
        print(f"--no-rollback left it restarting; tunnelspec rollback: {time.time() - t0:.0f} s verified")
        again = deploy(lab.inventory)
        assert again.rc == 0 and changed(again) == {}, (changed(again), failures(again))

        # On purpose: a generation of our own (a serving setting that restarts llama-server), back to
        # the lab's, `rollback --to` the first one, then forward again with a deploy.
        variant = inventory_copy(lab, tmp_path, "variant.ini", main_vars={"spec_draft_n_max": 8})
        v = deploy(variant)
        assert v.rc == 0, failures(v)
        other = current_generation(lab)
        assert other != good
        fwd = deploy(lab.inventory)
        assert fwd.rc == 0, failures(fwd)
        # The lab's state again: generation `good` once more, or a new number when keeping the
        # variant pruned it (tunnelspec_keep_generations=3 in a lab others deploy too).
        good = current_generation(lab)
        status = tunnelspec("status", str(lab.inventory), "--format", "json", timeout=300)
        gens = json.loads(status.stdout)["hosts"]["main"]["generations"]
        assert gens["current"] == good != other and other in gens["kept"], gens
        t0 = time.time()
        r = tunnelspec("rollback", str(lab.inventory), "--to", str(other), "--format", "json", timeout=900)
        assert r.rc == 0, failures(r)
        assert any(e.get("module") == "llama_verify" and e["status"] == "ok" for e in r.results()), r.results()
        assert current_generation(lab) == other and draft_n_max(lab) == "8"
        took_back = time.time() - t0
        r2 = tunnelspec("rollback", str(lab.inventory), "--to", str(other), "--format", "json", timeout=900)
        assert r2.rc == 0 and changed(r2) == {}, changed(r2)
        t0 = time.time()
        fwd = deploy(lab.inventory)
        assert fwd.rc == 0 and current_generation(lab) == good and draft_n_max(lab) != "8", failures(fwd)
        took_fwd = time.time() - t0
        again = deploy(lab.inventory)
        assert again.rc == 0 and changed(again) == {}, (changed(again), failures(again))
        print(f"rollback --to {other}: {took_back:.0f} s verified; deploy forward to {good}: {took_fwd:.0f} s")
    finally:
        converge(lab.inventory)


RPC_ABORT_LINE = "tunnelspec-test: rpc-server refuses to serve"
RPC_ANCHOR = "    start_server_fn(endpoint.c_str(), cache_dir, params.n_threads, devices.size(), devices.data());\n"


# The same abort as the server starts, before its arguments are read: even --help dies.
RPC_START_LINE = "tunnelspec-test: rpc-server aborts at every start"
RPC_START_ANCHOR = "    ggml_backend_load_all();\n"


def rpc_abort_patch(llama_fixtures, path: Path, anchor: str = RPC_ANCHOR, line: str = RPC_ABORT_LINE) -> Path:
    rel = "tools/rpc/rpc-server.cpp"
    text = subprocess.run(["git", "-C", llama_fixtures.repo_local, "show", f"{llama_fixtures.commit}:{rel}"],
                          capture_output=True, text=True, check=True).stdout
    assert text.count(anchor) == 1, "the fixture's rpc-server.cpp changed: find the server start again"
    new = text.replace(anchor, f'    fprintf(stderr, "%s\\n", "{line}");\n    fflush(stderr);\n'
                               f"    abort();\n{anchor}")
    path.write_text("".join(difflib.unified_diff(text.splitlines(keepends=True), new.splitlines(keepends=True),
                                                 f"a/{rel}", f"b/{rel}")))
    return path


def test_a_deploy_whose_rpc_server_does_not_start_returns_every_host(lab, lab_tools, llama_fixtures, tmp_path):
    """The nodes' new rpc-server aborts before it listens: the rpc play fails on the nodes (llama-server on
    main was already stopped for the build change), and every host — nodes and main — goes back."""
    bad = inventory_copy(lab, tmp_path, "bad-rpc.ini",
                         extra=(f'llama_patches=[{{"file": "{rpc_abort_patch(llama_fixtures, tmp_path / "rpc.patch")}"}}]',))
    try:
        converge(lab.inventory)
        good = current_generation(lab)
        t0 = time.time()
        r = deploy(bad)
        took = time.time() - t0
        assert r.rc == 1, r.stdout[-4000:]
        failed = r.results("failed")
        assert failed and failed[0]["host"] in ("rpc-a", "rpc-b"), failed
        assert f"it died: {RPC_ABORT_LINE}" in failed[0]["msg"], failed[0]
        said = [e["msg"] for e in r.events if e.get("event") == "message"]
        assert said and said[-1].endswith(f"rolled back: serving generation {good} again (verified)"), said
        assert any(e.get("module") == "generation_restore" and e["status"] == "changed" and e["host"] == h
                   for e in r.results() for h in ("rpc-a", "rpc-b")), said
        assert current_generation(lab) == good
        print(f"\nrpc-server abort: deploy + rollback {took:.0f} s; failed first: {failed[0]['host']}: "
              f"{failed[0]['task']}: {failed[0]['msg'][:300]}")
        again = deploy(lab.inventory)
        assert again.rc == 0 and changed(again) == {}, (changed(again), failures(again))
    finally:
        converge(lab.inventory)


def serving_pids(lab) -> dict[str, str]:
    """The main process of llama-server on main and of the rpc-server on each node."""
    units = {"main": "tunnelspec-llama-server.service", "rpc-a": "tunnelspec-rpc.service",
             "rpc-b": "tunnelspec-rpc.service"}
    return {h: sh(lab, h, "systemctl", "show", "-p", "MainPID", "--value", u).strip() for h, u in units.items()}


def test_a_node_whose_new_rpc_server_aborts_at_every_start_is_refused_before_serving_moves(
        lab, lab_tools, llama_fixtures, tmp_path):
    """The nodes' new rpc-server aborts as it starts, whatever its arguments: the build play's own
    start of it (--help) fails on the nodes before their `current` moves, and llama-server on main is
    not stopped for the build change (the gate before it sees the nodes' failure). The return to the
    generation moves main's link and the checkouts back and restarts nothing: the same processes
    serve throughout."""
    patch = rpc_abort_patch(llama_fixtures, tmp_path / "rpc-start.patch", RPC_START_ANCHOR, RPC_START_LINE)
    bad = inventory_copy(lab, tmp_path, "bad-rpc-start.ini", extra=(f'llama_patches=[{{"file": "{patch}"}}]',))
    try:
        converge(lab.inventory)
        good = current_generation(lab)
        pids = serving_pids(lab)
        t0 = time.time()
        r = deploy(bad)
        took = time.time() - t0
        assert r.rc == 1, r.stdout[-4000:]
        failed = r.results("failed")
        assert failed[0]["host"] in ("rpc-a", "rpc-b") and failed[0]["module"] == "llama_build", failed
        assert "the new ggml-rpc-server does not run" in failed[0]["msg"] and RPC_START_LINE in failed[0]["msg"], \
            failed[0]["msg"]
        assert ("main", "every node built") in {(e["host"], e["task"]) for e in failed}, failed
        assert not [e for e in r.results() if e.get("module") in ("llama_server_quiesce", "rpc_unit")], \
            "serving was touched"
        said = [e["msg"] for e in r.events if e.get("event") == "message"]
        assert said and said[-1].endswith(f"rolled back: serving generation {good} again (verified)"), said
        assert current_generation(lab) == good
        assert serving_pids(lab) == pids, "a serving process was restarted"
        body = completion_on_main(lab)
        assert body and body["timings"].get("draft_n_accepted", 0) > 0, body
        print(f"\nrpc-server aborting at start: refused before the switch, back in {took:.0f} s, same processes; "
              f"{failed[0]['host']}: {failed[0]['msg'][:240]}")
        again = deploy(lab.inventory)
        assert again.rc == 0 and changed(again) == {}, (changed(again), failures(again))
    finally:
        converge(lab.inventory)


def test_a_model_cut_short_is_refused_before_anything_serving_changes(lab, lab_tools, tmp_path):
    """The target model is a copy cut short (an interrupted copy) on main: the deploy stops in its
    first plays, naming the host, the file and the bytes missing, before the source, a build switch or
    a restart; llama-server and the nodes' rpc-servers keep running (the same processes) and serve the
    current generation with draft tokens accepted; the next deploy of the lab's inventory is changed=0."""
    model = next(l.split("=", 1)[1] for l in lab.inventory.read_text().splitlines() if l.startswith("llama_model="))
    short = "/var/tmp/tunnelspec-test-cut-short.gguf"
    size = int(sh(lab, "main", "stat", "-L", "-c", "%s", model).strip())
    missing = 4096
    sh(lab, "main", "sh", "-c", f'head -c {size - missing} "$1" > "$2"', "sh", model, short)
    bad = inventory_copy(lab, tmp_path, "cut-short.ini", drop=("llama_model=",), extra=(f"llama_model={short}",))
    ok = False
    try:
        converge(lab.inventory)
        good = current_generation(lab)
        pids = {"main": main_pid(lab), **{h: int(sh(lab, h, "systemctl", "show", "-p", "MainPID", "--value",
                                                    "tunnelspec-rpc.service").strip()) for h in ("rpc-a", "rpc-b")}}
        t0 = time.time()
        r = deploy(bad)
        took = time.time() - t0
        assert r.rc == 1 and "Traceback" not in r.stderr, failures(r)
        failed, *stopped = r.results("failed")
        assert (failed["host"], failed["task"]) == ("main", "target model whole"), failed
        # The gate stops the nodes too: nothing moves anywhere.
        assert {(e["host"], e["task"]) for e in stopped} == {("rpc-a", "every model whole"),
                                                             ("rpc-b", "every model whole")}, stopped
        assert (f"model {short} on main is cut short: {size - missing} bytes, its tensors need {size} "
                f"({missing} bytes missing") in failed["msg"], failed["msg"]
        # Nothing after the proofs ran: no source, build, rpc or server task on any host.
        assert {e["play"] for e in r.results()} <= {"hosts", "local isolation available", "prerequisites",
                                                    "models proven before switching"}, \
            sorted({e["play"] for e in r.results()})
        said = [e["msg"] for e in r.events if e.get("event") == "message"]
        assert said and f"every host still runs generation {good} (no rollback needed)" in said[-1], said
        assert current_generation(lab) == good
        assert {"main": main_pid(lab), **{h: int(sh(lab, h, "systemctl", "show", "-p", "MainPID", "--value",
                                                     "tunnelspec-rpc.service").strip())
                                          for h in ("rpc-a", "rpc-b")}} == pids
        body = completion_on_main(lab)
        assert body and body["timings"].get("draft_n_accepted", 0) > 0, body
        t1 = time.time()
        again = deploy(lab.inventory)
        assert again.rc == 0 and changed(again) == {}, (changed(again), failures(again))
        print(f"\nmodel cut short: refused in {took:.1f} s ({failed['msg'][:200]}); same processes serving, "
              f"draft_n_accepted={body['timings']['draft_n_accepted']}; next deploy changed=0 in {time.time() - t1:.1f} s")
        ok = True
    finally:
        sh(lab, "main", "rm", "-f", short)
        if not ok:
            converge(lab.inventory)


def test_a_build_whose_rpc_server_does_not_run_is_not_switched_to(lab, lab_tools, tmp_path):
    """rpc-a's `current` points elsewhere; the lab's own build, finished, would be switched back to
    without a compile — but one of its libraries is gone, so its RPC server cannot start. The build
    play refuses before `current` moves, with the loader's own words; the running rpc-server (its
    unit names the keyed build, and it has the library mapped) serves on. Both are put back after."""
    converge(lab.inventory)
    root = "/opt/tunnelspec"
    build = sh(lab, "rpc-a", "readlink", "--", f"{root}/current").strip()
    lib = sh(lab, "rpc-a", "sh", "-c", 'cd "$1/bin" && ls libggml-rpc.so.* | head -n 1', "sh", build).strip()
    assert lib, "the build has no libggml-rpc.so.N: find another library the RPC server needs"
    pid = sh(lab, "rpc-a", "systemctl", "show", "-p", "MainPID", "--value", "tunnelspec-rpc.service").strip()
    pb = tmp_path / "source-build.yml"
    pb.write_text("".join(f"- import_playbook: {p}\n" for p in
                          (builtin_playbook("source.yml"), builtin_playbook("build.yml"))))
    try:
        sh(lab, "rpc-a", "sh", "-c", 'mv -- "$1/bin/$2" "$1/bin/$2.away" && ln -sfn /nonexistent "$3/current"',
           "sh", build, lib, root)
        r = tunnelspec("play", str(lab.inventory), str(pb), "--limit", "rpc-a", "--format", "json", timeout=600)
        assert r.rc == 1 and "Traceback" not in r.stderr, failures(r)
        [failed] = r.results("failed")
        assert failed["host"] == "rpc-a" and failed["module"] == "llama_build", failed
        assert "the new ggml-rpc-server does not run" in failed["msg"] and lib in failed["msg"], failed["msg"]
        assert failed["msg"].endswith(f"nothing was switched ({root}/current is unchanged)"), failed["msg"]
        assert sh(lab, "rpc-a", "readlink", "--", f"{root}/current").strip() == "/nonexistent"
        assert sh(lab, "rpc-a", "systemctl", "show", "-p", "MainPID", "--value", "tunnelspec-rpc.service").strip() == pid
        print(f"\nrpc-a: {failed['msg'][:300]}")
    finally:
        sh(lab, "rpc-a", "sh", "-c", '[ -e "$1/bin/$2.away" ] && mv -- "$1/bin/$2.away" "$1/bin/$2"; '
                                     'ln -sfn -- "$1" "$3/current"', "sh", build, lib, root)
    again = deploy(lab.inventory)
    assert again.rc == 0 and changed(again) == {}, (changed(again), failures(again))
