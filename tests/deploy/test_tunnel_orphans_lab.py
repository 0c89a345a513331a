"""A node renamed or removed from the inventory leaves no tunnel behind on main: its unit would keep
its ssh running and hold its tunnel port, so a new node given that port could never connect (found
by the README quickstart run over the lab's own deploy: the second deploy was changed=1 forever)."""

from __future__ import annotations

import pytest

from support.cli import tunnelspec
from support.labdeploy import DEPLOY_TIMEOUT, converge, failures, sh

pytestmark = pytest.mark.lab

ORPHAN = "tunnelspec-tunnel-gone.service"
# What a deploy of an older inventory left: a tunnel unit of a node named `gone`, running.
ORPHAN_UNIT = """[Unit]
Description=tunnelspec tunnel to gone (an older inventory's node)
[Service]
ExecStart=/bin/sleep infinity
[Install]
WantedBy=multi-user.target
"""


def test_a_tunnel_unit_of_a_node_no_longer_in_the_inventory_is_removed(lab):
    inventory = str(lab.inventory)
    converge(inventory)
    sh(lab, "main", "sh", "-c", f"cat > /etc/systemd/system/{ORPHAN}", input=ORPHAN_UNIT)
    sh(lab, "main", "sh", "-c", f"systemctl daemon-reload && systemctl enable --now --quiet {ORPHAN}")
    try:
        assert sh(lab, "main", "systemctl", "is-active", ORPHAN).strip() == "active"
        chk = tunnelspec("deploy", inventory, "--tags", "tunnel", "--check", timeout=DEPLOY_TIMEOUT)
        assert chk.rc == 3, chk.stdout[-3000:]
        assert f"{ORPHAN}: remove (its node is no longer in the inventory)" in chk.stdout
        fix = tunnelspec("deploy", inventory, "--tags", "tunnel", "--format", "json", timeout=DEPLOY_TIMEOUT)
        assert fix.rc == 0, failures(fix)
        assert sh(lab, "main", "systemctl", "is-active", ORPHAN).strip() in ("inactive", "unknown")
        assert sh(lab, "main", "sh", "-c", f"test -e /etc/systemd/system/{ORPHAN} && echo present").strip() == ""
        again = tunnelspec("deploy", inventory, "--tags", "tunnel", "--format", "json", timeout=DEPLOY_TIMEOUT)
        assert again.rc == 0 and all(e.get("status") != "changed" for e in again.results()), failures(again)
    finally:
        sh(lab, "main", "sh", "-c", f"systemctl disable --now --quiet {ORPHAN} 2>/dev/null; "
           f"rm -f /etc/systemd/system/{ORPHAN}; systemctl daemon-reload; systemctl reset-failed {ORPHAN} 2>/dev/null; :")
        converge(inventory)
