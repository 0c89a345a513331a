"""--check where nothing is deployed yet: a lab just booted (its overlays new), `deploy --check` and
`deploy --check --diff` exit 3 with the whole plan — source, build, rpc service, tunnels,
llama-server — and no failed task (the steps that need what earlier steps would create are marked
`after`); `teardown --check` on a deployed cluster likewise, and changes nothing."""

from __future__ import annotations

import pytest

from support.cli import tunnelspec
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


@pytest.fixture(scope="module")
def fresh_lab(lab):
    if touched(lab):
        # `lab down` removes the hosts' overlays: the next `up` boots them as the image made them.
        hosts = list(lab.hosts)
        lab.down()
        lab.up(hosts)
    assert not touched(lab)
    return lab


@pytest.mark.parametrize("diff", [False, True], ids=["check", "check-diff"])
def test_deploy_check_on_a_fresh_lab_shows_the_whole_plan(fresh_lab, diff):
    args = ["deploy", str(fresh_lab.inventory), "--check", "--format", "json", *(["--diff"] if diff else [])]
    r = tunnelspec(*args, timeout=900)
    assert r.rc == 3, (r.rc, problems(r), r.stderr[-2000:])
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
