"""--check where nothing is deployed yet: a lab just booted (its overlays new), `deploy --check` and
`deploy --check --diff` exit 3 with the whole plan — source, build, rpc service, tunnels,
llama-server — and no failed task (the steps that need what earlier steps would create are marked
`after`); `teardown --check` on a deployed cluster likewise, and changes nothing.

The fresh hosts are a lab of their own (bridge tsfresh0, 10.77.6.0/24), booted for this module and
taken down after it: the session's lab stays as the other modules left it (deployed, built), so
nothing has to be rebuilt there after this module."""

from __future__ import annotations

import os
import sys

import pytest

from support.cli import failed_report, tunnelspec
from support.labdeploy import converge

pytestmark = pytest.mark.lab

PLAN = {  # (host, task) the plan must hold
    "source": [("main", "llama.cpp source at the pinned commit with the patch stack"),
               ("rpc-a", "llama.cpp source at the pinned commit with the patch stack")],
    "build": [("main", "llama.cpp binaries for the host's role"), ("rpc-b", "llama.cpp binaries for the host's role")],
    "rpc service": [("rpc-a", "rpc unit"), ("rpc-a", "rpc service running"), ("rpc-b", "rpc unit")],
    "tunnels": [("main", "tunnel units")],
    "llama-server": [("main", "llama-server unit"), ("main", "llama-server running")],
}


def problems(r) -> list:
    return [e for e in r.events if e.get("status") == "failed" or e.get("event") in ("unreachable", "error")]


def touched(lab) -> list[str]:
    """Hosts where anything of tunnelspec is (a unit, its directories, its users)."""
    probe = ("ls /etc/systemd/system | grep -q '^tunnelspec' || [ -e /opt/tunnelspec ] || "
             "[ -e /var/lib/tunnelspec ] || [ -e /etc/tunnelspec ] || getent passwd tunnelspec-rpc >/dev/null")
    return [h for h in lab.hosts if lab.exec(h, ["sh", "-c", probe], timeout=60).returncode == 0]


FRESH_BRIDGE = "tsfresh0"
FRESH_SUBNET = "10.77.6.0/24"
FRESH_HOSTS = ("main", "rpc-a", "rpc-b")


@pytest.fixture(scope="module")
def fresh_lab(tmp_path_factory):
    """Three hosts as the image makes them (new overlays), on a bridge of their own."""
    if sys.platform != "linux" or os.geteuid() != 0:
        pytest.skip("the lab needs root on Linux")
    from tunnelspec.lab import Lab

    fresh = Lab(tmp_path_factory.mktemp("fresh-lab"), subnet=FRESH_SUBNET, bridge=FRESH_BRIDGE)
    fresh.down()  # what a crashed earlier run left on that bridge must not stand in the way
    try:
        fresh.up(FRESH_HOSTS)
        assert not touched(fresh)
        yield fresh
    finally:
        fresh.down()


@pytest.mark.parametrize("diff", [False, True], ids=["check", "check-diff"])
def test_deploy_check_on_a_fresh_lab_shows_the_whole_plan(fresh_lab, diff):
    args = ["deploy", str(fresh_lab.inventory), "--check", "--format", "json", *(["--diff"] if diff else [])]
    r = tunnelspec(*args, timeout=900)
    assert r.rc == 3, failed_report(r)
    assert not problems(r), problems(r)
    assert not [e for e in r.events if e.get("event") == "gate" and e["status"] == "failed"]
    would = {(e["host"], e["task"]): e for e in r.results("changed") if e.get("would_change")}
    for step, items in PLAN.items():
        missing = [i for i in items if i not in would]
        assert not missing, (step, missing, sorted(would))
    # Later steps say what they wait for.
    assert would[("main", "llama-server unit")].get("after") or would[("main", "tunnel units")].get("after")
    # Nothing was deployed by the check.
    assert not touched(fresh_lab)


def test_teardown_check_on_a_deployed_cluster(lab):
    converge(lab.inventory)
    r = tunnelspec("teardown", str(lab.inventory), "--check", "--diff", "--format", "json", timeout=900)
    assert r.rc == 3, (problems(r), r.stderr[-2000:])
    assert not problems(r), problems(r)
    assert r.results("changed")
    active = lab.exec("main", ["systemctl", "is-active", "tunnelspec-llama-server.service"], timeout=60)
    assert active.stdout.strip() == "active"
