"""Resilience in the lab: what happens between runs and across reboots.

- A deploy SIGKILLed at a chosen point (TUNNELSPEC_TEST_KILL_AT, tunnelspec/core/testhooks.py):
  during the source step, during the build, after the rpc unit changed, after the tunnel key line
  changed, after the llama-server unit changed. The next deploy exits 0 and leaves the services
  running with the new settings; the one after reports changed=0; serving resumes.
- Two deploys started together, both changing rpc_threads: one waits for the other's run lock;
  both exit 0, the cluster ends converged, a third deploy reports changed=0.
- A reboot of the draft node, then of main, with no deploy: serving again (the time is printed,
  `pytest -s`, and bounded by a deadline), then a deploy reports changed=0.

Every test starts from a converged lab and ends with the lab's own inventory deployed.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from support.cli import tunnelspec
from support.labdeploy import completion_on_main, deploy, failures, inventory_copy

pytestmark = pytest.mark.lab

LLAMA_UNIT = "tunnelspec-llama-server.service"
RPC_UNIT = "tunnelspec-rpc.service"
ROOT = "/opt/tunnelspec"
SERVE_DEADLINE_S = 240     # the bound checked for "serving again" (measured values are printed)
SOURCE_TASK = "llama.cpp source at the pinned commit with the patch stack"
BUILD_TASK = "llama.cpp binaries for the host's role"


def sh(lab, host: str, script: str, *args: str, timeout: float = 90) -> str:
    return lab.exec(host, ["sh", "-c", script, "sh", *args], timeout=timeout).stdout or ""


def unchanged(r) -> bool:
    return r.rc == 0 and all(h["changed"] == 0 for h in r.recap.values())


def changed_tasks(r) -> list[tuple[str, str]]:
    return [(e["host"], e["task"]) for e in r.results("changed")]


def serving_within(lab, deadline_s: float = SERVE_DEADLINE_S) -> float:
    """Seconds until a completion on main drafts through the remote device; fails at the deadline."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < deadline_s:
        body = completion_on_main(lab)
        if body and body["timings"].get("draft_n", 0) > 0:
            return time.monotonic() - t0
        time.sleep(0.5)   # poll interval of the deadline loop
    raise AssertionError(f"no completion with draft tokens within {deadline_s}s")


def cmdline(lab, host: str, unit: str) -> list[str]:
    out = sh(lab, host, 'p=$(systemctl show -P MainPID "$1"); [ "$p" -gt 0 ] && tr "\\0" "\\n" < /proc/$p/cmdline',
             unit)
    return out.split("\n")


def killed_deploy(inventory, kill_at: str, *args: str):
    r = tunnelspec("deploy", str(inventory), "--format", "json", *args,
                   env={"TUNNELSPEC_TEST_KILL_AT": kill_at}, timeout=3600)
    assert r.rc == -9, ("the deploy was not killed at " + kill_at, r.rc, failures(r))
    return r


def repaired(lab, inventory) -> None:
    """The next deploy exits 0, the one after changes nothing, and the cluster serves."""
    r = deploy(inventory)
    assert r.rc == 0, failures(r)
    again = deploy(inventory)
    assert unchanged(again), changed_tasks(again)
    print(f"\n  repaired by: {changed_tasks(r)}; serving after {serving_within(lab):.1f}s")


@pytest.fixture
def converged(lab):
    r = deploy(lab.inventory)
    assert r.rc == 0, failures(r)
    return lab.inventory


@pytest.fixture
def restore(lab):
    """For tests that deploy a changed inventory: the lab's own settings again afterwards."""
    yield
    r = deploy(lab.inventory)
    assert r.rc == 0, failures(r)


# ---- a deploy killed at several points -------------------------------------------------------------
def test_killed_during_the_source_step(lab, converged):
    src = f"{ROOT}/src/llama.cpp"
    sh(lab, "rpc-b", 'rm -rf -- "$1"', src)
    # rpc-b clones again: killed after the clone (command 3 of the apply), before any checkout. The
    # clone has no files: a check that took it for the user's local modifications would refuse.
    # --forks 1: one host at a time, so the commands counted are rpc-b's apply alone.
    killed_deploy(converged, f"{SOURCE_TASK}:3", "--forks", "1")
    assert sh(lab, "rpc-b", '[ -e "$1/.git/tunnelspec-applying" ] && echo marked', src).strip() == "marked"
    repaired(lab, converged)
    assert not sh(lab, "rpc-b", 'git -C "$1" status --porcelain', src).strip()


def test_killed_during_the_build(lab, converged):
    cur = sh(lab, "rpc-a", 'readlink -f -- "$1/current"', ROOT).strip()
    # The finished build loses its stamp and its RPC server: the next build relinks it. Killed at the
    # build's second progress event: inside `cmake --build` (the first is the configure step).
    sh(lab, "rpc-a", 'rm -f -- "$1/.tunnelspec-stamp" "$1"/bin/*rpc-server', cur)
    killed_deploy(converged, f"{BUILD_TASK}:progress:2")
    assert sh(lab, "rpc-a", '[ -e "$1/.tunnelspec-stamp" ] || echo none', cur).strip() == "none"
    repaired(lab, converged)
    assert sh(lab, "rpc-a", '[ -e "$1/.tunnelspec-stamp" ] && echo ok', cur).strip() == "ok"


def test_killed_after_the_rpc_unit_changed(lab, converged, restore, tmp_path):
    inv = inventory_copy(lab, tmp_path, host_vars={"rpc-a": "rpc_threads=1"})
    killed_deploy(inv, "rpc unit:apply")
    assert "-t" not in cmdline(lab, "rpc-a", RPC_UNIT)   # the new unit is on disk, the old server runs
    repaired(lab, inv)
    argv = cmdline(lab, "rpc-a", RPC_UNIT)
    assert argv[argv.index("-t") + 1] == "1", argv


def _main_pid(lab, host: str, unit: str) -> int:
    return int(sh(lab, host, 'systemctl show -P MainPID "$1"', unit).strip() or 0)


def test_rpc_server_restarted_between_runs_restarts_llama_server(lab, converged):
    """llama-server's connection to a restarted rpc-server is dead (it would abort at its next
    request). The target node's (rpc-b): the next deploy restarts llama-server before anyone asks it
    anything, so its own verify completion succeeds at the first try. The draft node's (rpc-a): the
    draft watch restarts it by itself within seconds, no deploy (docs/degraded.md)."""
    pid = _main_pid(lab, "main", LLAMA_UNIT)
    sh(lab, "rpc-b", 'systemctl restart "$1"', RPC_UNIT)
    r = deploy(converged)
    assert r.rc == 0, failures(r)
    assert ("main", "llama-server's RPC connections open") in changed_tasks(r), changed_tasks(r)
    assert _main_pid(lab, "main", LLAMA_UNIT) not in (0, pid)
    verify = [e for e in r.results() if e.get("module") == "llama_verify"]
    assert verify and verify[0]["status"] == "ok", verify
    assert "first completion failed" not in verify[0]["msg"], verify[0]["msg"]
    pid = _main_pid(lab, "main", LLAMA_UNIT)
    sh(lab, "rpc-a", 'systemctl restart "$1"', RPC_UNIT)
    deadline = time.monotonic() + 60
    while _main_pid(lab, "main", LLAMA_UNIT) in (0, pid):
        assert time.monotonic() < deadline, "the draft watch did not restart llama-server"
        time.sleep(0.5)   # poll interval of the deadline loop
    assert "draft on rpc-a lost" in sh(lab, "main", 'journalctl -u tunnelspec-draftwatch -o cat -n 20')
    again = deploy(converged)
    assert unchanged(again), changed_tasks(again)


def _tunnel_sessions(lab, node: str) -> set[int]:
    out = sh(lab, node, 'pgrep -u tunnelspec-tunnel -x sshd || :')
    return {int(p) for p in out.split()}


def test_killed_after_the_tunnel_key_line_changed(lab, converged):
    before = {n: _tunnel_sessions(lab, n) for n in ("rpc-a", "rpc-b")}
    assert all(before.values()), before
    pub_before = sh(lab, "main", "cat /etc/tunnelspec/tunnel/id_ed25519.pub").split()[1]
    # keys rotate, killed once a node has its new authorized_keys line: the new key is on main, and
    # that node's sessions, opened with the old key, are not renewed yet.
    r = tunnelspec("keys", "rotate", str(converged), "--format", "json",
                   env={"TUNNELSPEC_TEST_KILL_AT": "restricted authorized_keys line:apply"}, timeout=600)
    assert r.rc == -9, failures(r)
    pub = sh(lab, "main", "cat /etc/tunnelspec/tunnel/id_ed25519.pub").split()[1]
    assert pub != pub_before
    repaired(lab, converged)
    for node in ("rpc-a", "rpc-b"):
        keys = sh(lab, node, "cat /var/lib/tunnelspec/tunnel/.ssh/authorized_keys")
        assert pub in keys and pub_before not in keys, node
        # No session opened with the old key survives on either node.
        assert not (before[node] & _tunnel_sessions(lab, node)), node


def test_killed_after_the_llama_server_unit_changed(lab, converged, restore, tmp_path):
    inv = inventory_copy(lab, tmp_path, main_vars={"spec_draft_n_max": "5"})
    before = cmdline(lab, "main", LLAMA_UNIT)
    # The command line lives in the launcher's modes file (the unit runs the launcher).
    killed_deploy(inv, "llama-server modes:apply")
    assert cmdline(lab, "main", LLAMA_UNIT) == before    # new modes file on disk, old server running
    repaired(lab, inv)
    after = cmdline(lab, "main", LLAMA_UNIT)
    drafted = lambda argv: [b for a, b in zip(argv, argv[1:]) if a.startswith("--") and "draft" in a and b == "5"]
    assert drafted(after) and not drafted(before), after


# ---- two deploys at once -----------------------------------------------------------------------------
def _start_deploy(inventory: Path) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TUNNELSPEC_")}
    return subprocess.Popen([sys.executable, "-m", "tunnelspec", "deploy", str(inventory), "--format", "json"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                            stdin=subprocess.DEVNULL)


def test_two_concurrent_deploys_changing_the_same_setting(lab, converged, restore, tmp_path):
    inv = inventory_copy(lab, tmp_path, host_vars={"rpc-a": "rpc_threads=1", "rpc-b": "rpc_threads=1"})
    runs = [_start_deploy(inv), _start_deploy(inv)]
    outs = [p.communicate(timeout=3600) for p in runs]
    events = [[json.loads(l) for l in out.splitlines() if l.startswith("{")] for out, _ in outs]
    for p, (out, err) in zip(runs, outs):
        assert p.returncode == 0, (out[-3000:], err[-2000:])
    waited = [i for i, evs in enumerate(events) if any(e["event"] == "run_lock" for e in evs)]
    assert len(waited) == 1, "exactly one of the two runs waits for the other's lock"
    first = events[1 - waited[0]]
    second = events[waited[0]]
    rpc_changes = lambda evs: [e for e in evs if e.get("event") == "task_result" and e["status"] == "changed"
                               and e["task"] == "rpc unit"]
    assert len(rpc_changes(first)) == 2 and not rpc_changes(second)    # applied once, by the first
    assert any(e["holder"].get("command") == "deploy" for e in second if e["event"] == "run_lock")
    third = deploy(inv)
    assert unchanged(third), changed_tasks(third)
    for node in ("rpc-a", "rpc-b"):
        argv = cmdline(lab, node, RPC_UNIT)
        assert argv[argv.index("-t") + 1] == "1", argv
    serving_within(lab)


# ---- reboots -------------------------------------------------------------------------------------------
def _boot_id(lab, host: str) -> str:
    try:
        return sh(lab, host, "cat /proc/sys/kernel/random/boot_id", timeout=10).strip()
    except Exception:  # noqa: BLE001 - the host is down between its two boots
        return ""


def _reboot_and_serve(lab, host: str) -> float:
    before = _boot_id(lab, host)
    t0 = time.monotonic()
    lab.exec(host, ["systemctl", "reboot"], timeout=30)
    deadline = t0 + SERVE_DEADLINE_S
    while _boot_id(lab, host) in ("", before):
        assert time.monotonic() < deadline, f"{host} did not come back"
        time.sleep(0.5)   # poll interval of the deadline loop
    serving_within(lab, deadline - time.monotonic())
    return time.monotonic() - t0


def test_reboots_serve_again_without_a_deploy(lab, converged):
    for host in ("rpc-a", "main"):   # rpc-a holds the draft
        took = _reboot_and_serve(lab, host)
        print(f"\n  reboot of {host}: serving again {took:.1f}s after `systemctl reboot`")
        r = deploy(converged)
        assert unchanged(r), changed_tasks(r)
