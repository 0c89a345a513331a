"""The preflight `local_isolation_available` against a real kernel (a private network namespace,
`unshare -n`, so this machine's own ruleset is never touched): with no tunnelspec table it proves
nftables usable by a trial load (`nft --check`); with the table loaded, the listing that found it is
the proof and no trial load runs (one nft process less per host on every run)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

SCRIPT = r"""
import asyncio, json, sys
sys.path.insert(0, sys.argv[1])
sys.path.insert(0, sys.argv[2])
from tunnelspec.components.isolation_checks import LocalIsolationAvailable
from tunnelspec.engine.context import HostContext, RunOptions
from support.recording import RecordingConnection

async def go():
    conn = RecordingConnection()
    ctx = HostContext(host="main", conn=conn, vars={}, facts={}, options=RunOptions(), emit=lambda e: None)
    task = LocalIsolationAvailable.build({})
    ch = await task.check(ctx)
    return {"changed": ch.changed, "msg": ch.msg, "ran": conn.ran}

print(json.dumps(asyncio.run(go())))
"""


def _check(table: bool) -> dict:
    load = "nft add table inet tunnelspec && " if table else ""
    res = subprocess.run(
        ["unshare", "-n", "sh", "-c", f'{load}exec "$@"', "sh", sys.executable, "-c", SCRIPT,
         str(REPO), str(REPO / "tests")],
        capture_output=True, text=True, timeout=60,
    )
    assert res.returncode == 0, res.stderr[-2000:]
    return json.loads(res.stdout.splitlines()[-1])


def _trial_loads(ran: list[list[str]]) -> list[list[str]]:
    return [a for a in ran if "--check" in a]


@pytest.mark.skipif(
    sys.platform != "linux" or os.geteuid() != 0 or not shutil.which("nft") or not shutil.which("unshare"),
    reason="needs root on Linux with nft (a network namespace)",
)
def test_trial_load_only_while_no_table_is_loaded():
    bare = _check(table=False)
    assert not bare["changed"]
    assert bare["msg"] == "nftables usable (CAP_NET_ADMIN, nf_tables)"
    assert len(_trial_loads(bare["ran"])) == 1, bare["ran"]

    loaded = _check(table=True)
    assert not loaded["changed"]
    assert "the isolation table is loaded" in loaded["msg"], loaded["msg"]
    assert _trial_loads(loaded["ran"]) == [], loaded["ran"]
