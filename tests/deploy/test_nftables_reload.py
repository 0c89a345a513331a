"""Isolation survives Debian's nftables.service: its start, reload and restart run
`nft -f /etc/nftables.conf`, which begins with `flush ruleset`; its stop flushes everything.

After a deploy, /etc/nftables.conf includes tunnelspec's rules (one marked line after the flush: one
transaction, no moment without them), and tunnelspec-isolation.service is reloaded with
nftables.service (ReloadPropagatedFrom=) for a configuration that lost the line. So on a node and on
main, after `systemctl start` / `reload nftables` — with and without the line — `nobody` is still
refused on every guarded port, the next deploy repairs what changed and the one after is changed=0;
`systemctl stop nftables` stops the guarded services with the rules. The lab is left deployed and
serving (a deploy converges; nftables.service is stopped again as it was found)."""

from __future__ import annotations


import pytest

from support import polling
from support.labdeploy import converge, deploy, failures, sh

pytestmark = pytest.mark.lab

GUARDED = {"rpc-a": [50052], "main": [15052, 15053, 18080]}
CONF = "/etc/nftables.conf"
INCLUDE = 'include "/etc/tunnelspec/isolation.nf[t]"'

CONNECT = r"""
import errno, socket, sys
for port in sys.argv[1:]:
    s = socket.socket(); s.settimeout(5)
    rc = s.connect_ex(("127.0.0.1", int(port)))
    print(port, "ok" if rc == 0 else errno.errorcode.get(rc, str(rc)))
    s.close()
"""


poll = polling.poller(60.0, 0.3)


def nobody_gets_in(lab) -> dict:
    """{host: {port: result}} of every guarded port nobody could connect to (empty: all refused)."""
    leaks = {}
    for host, ports in GUARDED.items():
        out = sh(lab, host, "setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups", "python3", "-c",
                 CONNECT, *map(str, ports))
        got = dict(l.split(None, 1) for l in out.splitlines() if l.strip())
        bad = {p: r for p, r in got.items() if r != "ECONNREFUSED"}
        if bad or len(got) != len(ports):
            leaks[host] = got
    return leaks


def table_loaded(lab, host: str) -> bool:
    return "tcp dport" in sh(lab, host, "sh", "-c", "nft list table inet tunnelspec 2>/dev/null || :")


def test_rules_survive_start_reload_and_restart_of_nftables(lab):
    converge(lab.inventory)
    for host in GUARDED:
        assert INCLUDE in sh(lab, host, "cat", CONF).splitlines(), host
    try:
        for host in GUARDED:
            sh(lab, host, "systemctl", "start", "nftables.service")
            assert table_loaded(lab, host), f"{host}: starting nftables.service removed the rules"
            sh(lab, host, "systemctl", "reload", "nftables.service")
            assert table_loaded(lab, host), f"{host}: reloading nftables.service removed the rules"
            sh(lab, host, "systemctl", "restart", "nftables.service")
            assert poll(lambda: table_loaded(lab, host)), f"{host}: restarting nftables.service removed the rules"
        assert nobody_gets_in(lab) == {}
        # A configuration that lost the line (rewritten by hand or by config management): the
        # isolation unit's reload, propagated from nftables.service, loads the rules again.
        for host in GUARDED:
            sh(lab, host, "sed", "-i", "/tunnelspec/d", CONF)
            sh(lab, host, "systemctl", "reload", "nftables.service")
            assert poll(lambda: table_loaded(lab, host), 30), f"{host}: no rules after a reload without the line"
        assert nobody_gets_in(lab) == {}
        r = deploy(lab.inventory)
        assert r.rc == 0, failures(r)
        fixed = {e["host"] for e in r.results() if e.get("module") == "local_isolation" and e["status"] == "changed"}
        assert fixed == set(GUARDED), fixed
        r = deploy(lab.inventory)
        assert r.rc == 0 and all(h.get("changed", 0) == 0 for h in r.recap.values()), r.recap
        # A stop of nftables.service flushes every rule: the guarded services stop with them.
        sh(lab, "rpc-a", "systemctl", "stop", "nftables.service")
        assert not table_loaded(lab, "rpc-a")
        assert sh(lab, "rpc-a", "systemctl", "is-active", "tunnelspec-rpc.service").strip() != "active"
    finally:
        for host in GUARDED:
            sh(lab, host, "systemctl", "stop", "nftables.service")
    converge(lab.inventory)
    assert nobody_gets_in(lab) == {}
