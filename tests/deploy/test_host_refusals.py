"""A lab host without `flock` is refused in the run's first seconds, before the run lock and before
any host changes: the lock never spins waiting for a tool that is not there."""

from __future__ import annotations

import time

import pytest

from support.cli import tunnelspec

pytestmark = pytest.mark.lab

HOST = "rpc-b"


def test_a_host_without_flock_is_refused_before_any_change(lab):
    hidden = lab.exec(HOST, ["sh", "-c", 'p=$(command -v flock) && mv "$p" "$p.tunnelspec-hidden" && echo "$p"'])
    assert hidden.returncode == 0, hidden.stderr
    path = hidden.stdout.strip()
    try:
        t0 = time.monotonic()
        r = tunnelspec("deploy", str(lab.inventory), "--format", "json", timeout=300)
        print(f"\nrefused in {time.monotonic() - t0:.1f} s")
        assert r.rc == 1, r.stdout[-3000:] + r.stderr[-2000:]
        failed = {e["host"]: e["msg"] for e in r.results("failed")}
        assert "flock not found (package util-linux)" in failed[HOST], failed
        # The other hosts stop at the gate, which names the refused one.
        gate = [e for e in r.events if e.get("event") == "gate"]
        assert gate and gate[0]["status"] == "failed" and HOST in gate[0]["msg"], gate
        assert all(HOST in m for h, m in failed.items() if h != HOST), failed
        # Every host stopped at the gate: nothing after the preflight plays ran anywhere.
        plays = {e["play"] for e in r.results()}
        assert plays == {"hosts"}, plays
        assert all(h["changed"] == 0 for h in r.recap.values()), r.recap
    finally:
        lab.exec(HOST, ["mv", path + ".tunnelspec-hidden", path])
    assert lab.exec(HOST, ["sh", "-c", "command -v flock"]).returncode == 0
