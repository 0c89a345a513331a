"""Progress on the /health wait, in the lab: a deploy that restarts llama-server with a draft
that takes seconds to load says, while it waits, how long it has waited, the budget, and llama-server's
newest journal line — a `progress` event with `waiting_for: "/health"`.

The slow load is a real one: a 1 GiB draft (tests/support/gguf_wide.py) whose weights llama-server
sends through the tunnel to rpc-a at every start, rpc-a's tensor cache off (`rpc_cache=false`), so
nothing is served from a warm cache. The lab's own inventory is deployed again at the end: the other
modules expect it."""

from __future__ import annotations

from pathlib import Path

import pytest

from support.labdeploy import converge, deploy, failures, inventory_copy

pytestmark = pytest.mark.lab

MODELS_IN_HOSTS = "/srv/tunnelspec-fixtures/models"  # the lab's fixture store, as the hosts see it
DRAFT = "wide-draft-1024m.gguf"


@pytest.fixture(scope="module")
def slow_draft():
    from tunnelspec.lab.fixtures import FIXTURES_DIR
    from support.gguf_wide import write_wide_llama

    size = write_wide_llama(Path(FIXTURES_DIR) / "models" / DRAFT, 1024)
    assert size > 1 << 30
    return f"{MODELS_IN_HOSTS}/{DRAFT}"


def test_a_slow_start_reports_the_health_wait(lab, tmp_path, slow_draft):
    inv = inventory_copy(lab, tmp_path, main_vars={"llama_draft_model": slow_draft},
                         host_vars={"rpc-a": "rpc_cache=false"})
    try:
        r = deploy(inv)
        assert r.rc == 0, failures(r)
        waits = [e for e in r.events if e.get("event") == "progress" and e.get("waiting_for") == "/health"]
        assert waits, ("no progress during the /health wait",
                       [e for e in r.events if e.get("event") == "progress"][-10:])
        for e in waits:
            assert e["host"] == "main"
            assert e["msg"].startswith(f"llama-server not healthy yet: {e['elapsed_s']:.0f} s of {e['budget_s']:g} s (")
            assert 0 <= e["elapsed_s"] < e["budget_s"]
        # llama-server's own words come with it: the launcher's or the model load's newest line.
        assert any(e["journal"] for e in waits), waits
        assert all(f"; journal: {e['journal'][:40]}" in e["msg"] for e in waits if e["journal"]), waits
        # The reports come after 1 s (or at the first unhealthy answer), then every 5 s, not at every poll.
        elapsed = [e["elapsed_s"] for e in waits]
        assert all(b - a >= 3.5 for a, b in zip(elapsed, elapsed[1:])), elapsed
        print("\n".join(e["msg"] for e in waits))
    finally:
        converge(lab.inventory)
