"""Root never runs what a service chose: llama-server rewrites its own argv[0] (bash's
`exec -a`, what any process can do to its /proc cmdline) to point at a program in a place its user
writes. `tunnelspec bench` reads the running command line, and used to run `<argv[0]> --list-devices`
as root; now it works only with the deploy's root-owned plan, refuses a command line that is not one
of it, and the planted program never runs.

The lab is left deployed and serving as found: the drop-in lives under /run and is removed, the unit
restarted, a deploy converges."""

from __future__ import annotations

import json
import shlex

import pytest

from support import polling
from support.cli import tunnelspec
from support.labdeploy import MODES, UNIT, converge, running_argv, sh

pytestmark = pytest.mark.lab

EVIL = "/var/tmp/tunnelspec-test-evil"
DROPIN_DIR = f"/run/systemd/system/{UNIT}.d"
DROPIN = f"{DROPIN_DIR}/zz-tunnelspec-test-argv0.conf"
PLANTED = f"""#!/bin/sh
id -u >> {EVIL}/ran
exec /opt/tunnelspec/current/bin/llama-server "$@"
"""


poll = polling.poller(90.0, 0.5)


def test_bench_never_runs_a_rewritten_argv0(lab):
    converge(lab.inventory)
    argv = json.loads(sh(lab, "main", "cat", MODES))["modes"]["speculative"]
    sh(lab, "main", "install", "-d", "-m", "755", "-o", "tunnelspec-llama", EVIL)
    sh(lab, "main", "sh", "-c", f"cat > {EVIL}/llama-server && chmod 755 {EVIL}/llama-server "
       f"&& chown tunnelspec-llama {EVIL}/llama-server", input=PLANTED)
    exec_start = "/bin/bash -c 'exec -a %s/llama-server \"$$@\"' bash %s" % (EVIL, shlex.join(argv))
    sh(lab, "main", "sh", "-c", f"mkdir -p {DROPIN_DIR} && cat > {DROPIN}",
       input=f"[Service]\nExecStart=\nExecStart={exec_start}\n")
    try:
        sh(lab, "main", "systemctl", "daemon-reload")
        sh(lab, "main", "systemctl", "restart", UNIT)
        assert poll(lambda: (running_argv(lab) or [""])[0] == f"{EVIL}/llama-server"), running_argv(lab)
        b = tunnelspec("bench", str(lab.inventory), "--runs", "1", "--n-predict", "8", timeout=600)
        ran = sh(lab, "main", "sh", "-c", f"cat {EVIL}/ran 2>/dev/null || :").split()
        assert ran == [], f"the planted argv[0] ran as uid(s) {ran}"
        assert b.rc != 0 and "did not configure" in b.stdout + b.stderr, (b.rc, b.stdout[-2000:], b.stderr[-2000:])
    finally:
        sh(lab, "main", "rm", "-rf", DROPIN_DIR, EVIL)
        sh(lab, "main", "systemctl", "daemon-reload")
        sh(lab, "main", "systemctl", "restart", UNIT)
    converge(lab.inventory)
    assert poll(lambda: running_argv(lab)[0].endswith("python3") or running_argv(lab)[0].endswith("llama-server"))


def test_rpc_device_discovery_runs_as_llama_servers_user(lab):
    """The deploy's `llama-server --rpc … --list-devices` speaks RPC to every node: it runs as
    llama-server's user (setpriv), and still finds every node's devices through the tunnels that
    the isolation opens to that user only."""
    from support.labdeploy import deploy, failures, task

    converge(lab.inventory)
    sh(lab, "main", "rm", "-f", "/var/lib/tunnelspec/rpc-devices.json")
    r = deploy(lab.inventory)
    assert r.rc == 0, failures(r)
    ev = task(r, "RPC device names through the tunnels")
    assert ev["status"] == "changed", ev
    cached = json.loads(sh(lab, "main", "cat", "/var/lib/tunnelspec/rpc-devices.json"))
    assert sorted(cached["devices"]) == ["15052", "15053"], cached
