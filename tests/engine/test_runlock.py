"""The run lock (engine/runlock.py) against real sshd hosts: a second mutating run waits for the
first or, with --no-wait, exits 5 naming the holder; --check never waits; a SIGKILLed holder leaves
no lock behind. Run A holds its lock while its one task waits for a file the test creates."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import jsonschema

from support.cli import tunnelspec
from tunnelspec.reporting.schema import EVENT_SCHEMA

PLAYBOOK = """
- name: slow
  hosts: all
  tasks:
    - name: wait for the go file
      command:
        argv: [sh, -c, 'i=0; while [ ! -e "$1" ] && [ $i -lt 1200 ]; do sleep 0.1; i=$((i+1)); done; touch "$2"',
               sh, "{{ go }}", "{{ root }}/done"]
        creates: "{{ root }}/done"
"""


def _start(inv: Path, pb: Path, *args: str) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TUNNELSPEC_")}
    return subprocess.Popen([sys.executable, "-m", "tunnelspec", "play", str(inv), str(pb), "--format", "json", *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                            stdin=subprocess.DEVNULL)


def _wait_for(cond, what: str, deadline_s: float = 60):
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        got = cond()
        if got:
            return got
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def _holder(lock_dir: Path) -> dict | None:
    try:
        return json.loads((lock_dir / "run.holder").read_text())
    except (OSError, ValueError):
        return None


def _setup(sshd_cluster, tmp_path, n=2):
    cluster = sshd_cluster(n)
    go = tmp_path / "go"
    inv = cluster.inventory(all_vars={"go": str(go)})
    pb = tmp_path / "slow.yml"
    pb.write_text(PLAYBOOK)
    return cluster, inv, pb, go, cluster.base / "run-lock"


def test_second_run_no_wait_exits_5_naming_the_holder_then_waits(sshd_cluster, tmp_path):
    cluster, inv, pb, go, lock_dir = _setup(sshd_cluster, tmp_path)
    a = _start(inv, pb)
    try:
        holder = _wait_for(lambda: _holder(lock_dir), "run A's holder record")
        assert holder["pid"] == a.pid and holder["command"] == "play slow.yml", holder
        b = tunnelspec("play", str(inv), str(pb), "--no-wait", timeout=60)
        assert b.rc == 5, (b.stdout, b.stderr)
        assert f"pid {a.pid}" in b.stderr and "tunnelspec play slow.yml" in b.stderr and "--no-wait" in b.stderr
        bj = tunnelspec("play", str(inv), str(pb), "--no-wait", "--format", "json", timeout=60)
        err = [e for e in bj.events if e["event"] == "error"]
        assert bj.rc == 5 and err and err[0]["exit_code"] == 5, bj.stdout
        for e in bj.events:
            jsonschema.validate(e, EVENT_SCHEMA)
        # Nothing of run B ran: its task would have created `done` on the hosts.
        assert not any((h.root / "done").exists() for h in cluster.hosts)
        # --check never takes nor waits for the lock: it reports the drift and ends while A holds.
        chk = tunnelspec("play", str(inv), str(pb), "--check", "--format", "json", timeout=60)
        assert chk.rc == 3, (chk.stdout, chk.stderr)
        # A waiting run says who it waits for, then runs when A ends.
        c = _start(inv, pb, "--lock-timeout", "120")
        first = _wait_for(lambda: c.stdout.readline(), "run C's first event")
        lines = [first]
        while '"run_lock"' not in lines[-1]:
            lines.append(_wait_for(lambda: c.stdout.readline(), "run C's run_lock event"))
        ev = json.loads(lines[-1])
        jsonschema.validate(ev, EVENT_SCHEMA)
        assert ev["status"] == "waiting" and ev["holder"]["pid"] == a.pid, ev
        assert c.poll() is None
        go.touch()
        assert a.wait(60) == 0, a.stderr.read()
        out, err_c = c.communicate(timeout=60)
        assert c.returncode == 0, (out, err_c)
        # C took the lock after A: its recap shows the task already done (A created the files).
        recap = [json.loads(l) for l in out.splitlines() if '"recap"' in l][0]
        assert all(h["changed"] == 0 and h["failed"] == 0 for h in recap["hosts"].values()), recap
    finally:
        go.touch()
        for p in (a,):
            if p.poll() is None:
                p.kill()
                p.wait(10)
    # Released: the holder record goes with the lock.
    _wait_for(lambda: not (lock_dir / "run.holder").exists(), "the holder record to go")


def test_lock_timeout_exits_5(sshd_cluster, tmp_path):
    cluster, inv, pb, go, lock_dir = _setup(sshd_cluster, tmp_path, n=1)
    a = _start(inv, pb)
    try:
        _wait_for(lambda: _holder(lock_dir), "run A's holder record")
        b = tunnelspec("play", str(inv), str(pb), "--lock-timeout", "2", timeout=60)
        assert b.rc == 5 and "--lock-timeout" in b.stderr and f"pid {a.pid}" in b.stderr, (b.stdout, b.stderr)
    finally:
        go.touch()
        a.wait(60)


def test_sigkilled_holder_leaves_no_lock(sshd_cluster, tmp_path):
    cluster, inv, pb, go, lock_dir = _setup(sshd_cluster, tmp_path)
    a = _start(inv, pb)
    _wait_for(lambda: _holder(lock_dir), "run A's holder record")
    os.kill(a.pid, signal.SIGKILL)
    a.wait(10)
    # The lock process ends with A's SSH session; no manual step. The next run takes the lock.
    go.touch()
    b = tunnelspec("play", str(inv), str(pb), "--lock-timeout", "60", "--format", "json", timeout=120)
    assert b.rc == 0, (b.stdout, b.stderr)
    assert all((h.root / "done").exists() for h in cluster.hosts)


def test_two_names_for_one_lock_are_locked_once(sshd_cluster, tmp_path):
    # Both harness hosts share one lock dir (one machine): the second is recognised as this run's.
    cluster, inv, pb, go, lock_dir = _setup(sshd_cluster, tmp_path, n=3)
    go.touch()
    r = tunnelspec("play", str(inv), str(pb), "--no-wait", "--format", "json", timeout=120)
    assert r.rc == 0, (r.stdout, r.stderr)
    assert all(h["changed"] == 1 for h in r.recap.values()), r.recap


CONC_PB = """
- name: conc
  hosts: all
  tasks:
    - name: setting
      copy: {dest: "{{ root }}/setting", content: "{{ setting }}", mode: "0644"}
      notify: [restart]
    - name: slow step
      command:
        argv: [sh, -c, 'i=0; while [ ! -e "$1" ] && [ $i -lt 1200 ]; do sleep 0.1; i=$((i+1)); done; touch "$2"',
               sh, "{{ go }}", "{{ root }}/slow-done"]
        creates: "{{ root }}/slow-done"
  handlers:
    - name: restart
      command:
        argv: [sh, -c, 'cat "$1" >> "$2"; echo >> "$2"; touch "$3"', sh, "{{ root }}/setting",
               "{{ root }}/restarts", "{{ root }}/restarted-{{ setting }}"]
        creates: "{{ root }}/restarted-{{ setting }}"
"""


def test_two_concurrent_runs_changing_one_setting(sshd_cluster, tmp_path):
    """Both end, one after the other; the change and its handler happen once; a third run: nothing."""
    cluster = sshd_cluster(2)
    go = tmp_path / "go"
    pb = tmp_path / "conc.yml"
    pb.write_text(CONC_PB)
    inv = cluster.inventory(all_vars={"go": str(go), "setting": "two"})
    a, b = _start(inv, pb), _start(inv, pb)
    try:
        # Whichever got the lock holds it in its slow step; the other waits and says for whom.
        holder = _wait_for(lambda: _holder(cluster.base / "run-lock"), "a holder record")
        waiter = b if holder["pid"] == a.pid else a
        line = ""
        while '"run_lock"' not in line:
            line = _wait_for(lambda: waiter.stdout.readline(), "the waiting run's run_lock event")
        go.touch()
        outs = {p.pid: p.communicate(timeout=120) for p in (a, b)}
    finally:
        go.touch()
        for p in (a, b):
            if p.poll() is None:
                p.kill()
    assert a.returncode == 0 and b.returncode == 0, outs
    changed = {pid: [json.loads(l) for l in out.splitlines() if '"changed"' in l and '"task_result"' in l]
               for pid, (out, _) in outs.items()}
    assert len(changed[holder["pid"]]) == 6          # 2 hosts × setting, slow step, restart
    assert changed[waiter.pid] == []                  # it found everything converged
    assert all((h.root / "restarts").read_text() == "two\n" for h in cluster.hosts)   # one restart each
    third = tunnelspec("play", str(inv), str(pb), "--format", "json", timeout=60)
    assert third.rc == 0 and all(h["changed"] == 0 for h in third.recap.values())


def _path_without(tmp_path: Path, missing: str) -> Path:
    """A directory holding every command of this machine's PATH but `missing` (links)."""
    d = tmp_path / f"bin-without-{missing}"
    d.mkdir()
    for src in ("/usr/local/sbin", "/usr/local/bin", "/usr/sbin", "/usr/bin", "/sbin", "/bin"):
        if not os.path.isdir(src):
            continue
        for name in os.listdir(src):
            if name != missing and not (d / name).exists() and not os.path.islink(d / name):
                os.symlink(os.path.join(src, name), d / name)
    return d


def test_host_without_flock_is_refused_at_once(tmp_path):
    """A real sshd host whose sessions' PATH has no flock (sshd's SetEnv): an immediate error naming
    the host, not a 30-minute wait (it used to print BUSY in a tight loop until --lock-timeout)."""
    from support.sshd_harness import SshdCluster

    bindir = _path_without(tmp_path, "flock")
    cluster = SshdCluster(tmp_path / "sshd", 1, setenv={"PATH": str(bindir)})
    try:
        go = tmp_path / "go"
        go.touch()
        inv = cluster.inventory(all_vars={"go": str(go)})
        pb = tmp_path / "slow.yml"
        pb.write_text(PLAYBOOK)
        t0 = time.monotonic()
        r = tunnelspec("play", str(inv), str(pb), timeout=60)
        took = time.monotonic() - t0
        assert r.rc == 1, (r.rc, r.stdout, r.stderr)
        assert took < 45, took       # a hang bound: the spin it replaces lasted --lock-timeout (1800 s)
        assert "node0" in r.stderr and "flock not found (util-linux)" in r.stderr, r.stderr
        assert "BUSY" not in r.stdout + r.stderr and "holder not recorded" not in r.stdout + r.stderr
        j = tunnelspec("play", str(inv), str(pb), "--format", "json", timeout=60)
        err = [e for e in j.events if e["event"] == "error"]
        assert j.rc == 1 and err and "flock not found (util-linux)" in err[0]["msg"], j.stdout
        assert not (cluster.hosts[0].root / "done").exists(), "no task ran"
    finally:
        cluster.stop()


def _lock_script(tmp_path: Path, fake_flock: str, wait: int) -> tuple[list[str], float]:
    from tunnelspec.engine.runlock import _SCRIPT

    fake = tmp_path / "fakebin"
    fake.mkdir(exist_ok=True)
    (fake / "flock").write_text("#!/bin/sh\n" + fake_flock + "\n")
    os.chmod(fake / "flock", 0o755)
    t0 = time.monotonic()
    p = subprocess.run(["sh", "-c", _SCRIPT, "sh", str(tmp_path / "lock"), "{}", "tok", str(wait), "1", ""],
                       capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL,
                       env={**os.environ, "PATH": f"{fake}:/usr/bin:/bin"})
    return p.stdout.splitlines(), time.monotonic() - t0


def test_lock_script_never_spins(tmp_path):
    """A flock that fails at once instead of waiting its -w (busy, rc 1): the script paces itself
    (at most about one BUSY a second) and times out; any other failure of flock ends it at once."""
    lines, took = _lock_script(tmp_path, "exit 1", wait=3)
    assert lines[-1].startswith("TIMEOUT"), lines
    assert sum(l.startswith("BUSY") for l in lines) <= 6 and 2 <= took < 30, (lines, took)
    lines, took = _lock_script(tmp_path, "exit 66", wait=30)
    assert lines == ["FLOCKERR flock -n exited 66"] and took < 20, lines   # not the 30 s wait
