"""The draft node lost 20 times, each loss 0.1 s after a request started (a client every 0.5 s
through the front, so a request is in flight at nearly every cut), with 40 short cuts between the
losses: every request answered.

Two kinds of cut, in 20 rounds, on the lab's own cluster (rpc-a holds the draft):
- a blip: the link down 1 s, well under the tunnel's keepalive bound (3 keepalives unanswered; TCP's
  retransmission backoff makes a 2 s cut a silence of 3 s or more, which ends the tunnel): the
  tunnel and llama-server live through it, the request in flight waits for TCP's retransmission;
- a loss: the link down until the watcher has switched to degraded (llama-server restarted without
  the draft, the request in flight retried once by the front), then back; the draft rejoins after
  `draft_rejoin_after` (2 s here) of steady answers.
Each round: the draft back (speculative) → two blips 5 s apart → a loss 32 s after the rejoin, so it
is a new fault, not a flap (a loss within 30 s of a rejoin doubles the next wait: docs/degraded.md).
20 rounds: 20 losses and 40 blips.

In the `extended` tier (scripts/test-extended.sh, or name it with -k): about 14 minutes of
cuts, which the default run's budget does not have; the single long cut and the other faults are in
the default run (tests/deploy/test_degraded_lab.py)."""

from __future__ import annotations

import json
import math
import time

import pytest

from support.lab_client import Client
from support.labdeploy import converge, inventory_copy, sh

pytestmark = [pytest.mark.lab, pytest.mark.extended]

INTERVAL_S = 0.5
OFFSET_S = 0.1  # each cut this long after a request's start
ROUNDS, BLIPS = 20, 2
BLIP_S = 1.0
NEW_FAULT_AFTER_S = 32  # > the 30 s in which a loss after a rejoin counts as a flap
WORST_WAIT_S = 25  # as tests/deploy/test_degraded_lab.py: a loss's detection and a restart, generously


def mode(lab) -> str:
    raw = sh(lab, "main", "sh", "-c", "cat /run/tunnelspec-llama/mode.json 2>/dev/null || echo '{}'")
    return json.loads(raw or "{}").get("mode", "")


def wait_mode(lab, want: str, timeout: float) -> float:
    t0 = time.monotonic()
    while (m := mode(lab)) != want:
        assert time.monotonic() - t0 < timeout, f"not {want} within {timeout}s (mode {m!r})"
        time.sleep(0.5)  # poll interval of the deadline loop
    return time.time()


@pytest.fixture(scope="module")
def served(lab_tools, tmp_path_factory):
    lab = lab_tools
    inv = inventory_copy(lab, tmp_path_factory.mktemp("cuts"), main_vars={"draft_rejoin_after": 2})
    converge(inv)
    wait_mode(lab, "speculative", 120)
    try:
        yield lab
    finally:
        lab.link("rpc-a", True)
        sh(lab, "main", "sh", "-c", "systemctl stop 'tunnelspec-test-client-*' 2>/dev/null; :")
        converge(lab.inventory)  # the lab's own settings again (the default rejoin wait)


def cut_after_a_start(lab, phase: float) -> float:
    """Cut rpc-a's link OFFSET_S after the next request's start (the client's schedule is
    phase + k * INTERVAL_S on main's clock, which is this machine's); the time of the cut."""
    now = time.time()
    k = math.ceil((now + 0.05 - phase - OFFSET_S) / INTERVAL_S)
    time.sleep(max(0.0, phase + k * INTERVAL_S + OFFSET_S - time.time()))
    t = time.time()
    lab.link("rpc-a", False)
    return t


def test_draft_node_lost_20_times_each_just_after_a_request_every_request_answered(served):
    lab = served
    client = Client(lab, "cuts20", ROUNDS * 60, interval=INTERVAL_S)
    cuts: list[tuple[str, float]] = []
    try:
        for _ in range(60):  # the first record gives the client's schedule; bounded
            first = client.records()
            if first:
                break
            time.sleep(0.5)  # poll interval of the deadline loop
        assert first, "the client answered nothing"
        phase = first[0]["sent"]
        for _round in range(ROUNDS):
            t_rejoin = wait_mode(lab, "speculative", 90)
            for _ in range(BLIPS):
                time.sleep(3)
                try:
                    cuts.append(("blip", cut_after_a_start(lab, phase)))
                    time.sleep(BLIP_S)
                finally:
                    lab.link("rpc-a", True)
            time.sleep(max(0.0, t_rejoin + NEW_FAULT_AFTER_S - time.time()))
            assert mode(lab) == "speculative", "a blip made the watcher switch"
            try:
                cuts.append(("loss", cut_after_a_start(lab, phase)))
                wait_mode(lab, "degraded", 30)
            finally:
                lab.link("rpc-a", True)
        wait_mode(lab, "speculative", 90)
    finally:
        lab.link("rpc-a", True)
        records = client.finish()
    failed = [r for r in records if r.get("status") != 200]
    worst = max(records, key=lambda r: r["done"] - r["sent"])
    starts = sorted(r["sent"] for r in records)
    print(f"\n  {len(cuts)} cuts ({sum(k == 'loss' for k, _ in cuts)} losses), {len(records)} requests, "
          f"{len(failed)} failed, worst wait {worst['done'] - worst['sent']:.1f}s")
    assert len(cuts) == ROUNDS * (BLIPS + 1) and sum(k == "loss" for k, _ in cuts) == 20
    for kind, t in cuts:  # each cut within a second of a request's start, with the request in flight
        assert min(abs(s - t) for s in starts) <= 1.0, (kind, t)
    assert not failed, failed[:5]
    assert worst["done"] - worst["sent"] <= WORST_WAIT_S, worst
    # The draft was used again after every loss: accepted draft tokens after the last one.
    assert any(r.get("accepted", 0) > 0 for r in records if r["sent"] > cuts[-1][1] + 5), records[-10:]
