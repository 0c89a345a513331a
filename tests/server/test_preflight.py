"""The early check: inventory settings against a build's --help before any host is touched
(controller record, read by `tunnelspec check` and so first by deploy; real CLI, no host reachable:
exit 2 proves nothing was even connected to). Without a record, main's current build is read by the
deploy's preflight play (the lab's tests/deploy/test_spec_placement.py and test_builds.py)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tunnelspec.core.errors import ClusterError
from tunnelspec.inventory import load_inventory
from tunnelspec.cluster.model import Cluster
from tunnelspec.components.server import preflight
from tunnelspec.llama.props import spec_types

from support.offline import SHA, unreachable_inventory

HELP = Path(__file__).parent / "data" / "llama-server-help.txt"
LABEL = "0.5.0-dev (build 0, commit 8c22f3ff0)"


def inventory(tmp_path: Path, main_vars: str) -> Path:
    # Port 9 on loopback: nothing listens; a connection attempt would end in exit 4, not 2.
    return unreachable_inventory(tmp_path, main_vars)


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    return tmp_path / "cache"


def test_record_round_trip_and_key_follows_the_pin(tmp_path, cache):
    c = Cluster.from_inventory(load_inventory(inventory(tmp_path, "")))
    assert preflight.load_record(c) is None
    preflight.save_record(c, LABEL, HELP.read_text())
    h = preflight.load_record(c)
    assert h.build == LABEL and h.supports("--spec-type")
    assert preflight.check_known(c, h, "record").types.startswith("draft-simple, draft-eagle3")
    (tmp_path / "x").mkdir()
    other = inventory(tmp_path / "x", "")
    other.write_text(other.read_text().replace(SHA, "1" * 40))
    assert preflight.load_record(Cluster.from_inventory(load_inventory(other))) is None


def test_lacking_type_is_exit_2_naming_build_and_types(tmp_path, cache):
    inv = inventory(tmp_path, "spec_type=draft-dspark")
    c = Cluster.from_inventory(load_inventory(inv))
    # The fixture's help without draft-dspark: the --spec-type list of b10001.
    preflight.save_record(c, "b10001-shaped", HELP.read_text().replace("draft-dflash,draft-dspark,", "draft-dflash,"))
    with pytest.raises(ClusterError) as e:
        preflight.check_known(c, preflight.load_record(c), "record")
    assert e.value.var == "spec_type" and e.value.line == 2 and "no host was changed" in str(e.value)
    env = {**os.environ, "XDG_CACHE_HOME": str(cache)}
    res = subprocess.run([sys.executable, "-m", "tunnelspec", "deploy", str(inv)], env=env,
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 2, res.stdout + res.stderr
    assert f"{inv}:2:" in res.stderr and "b10001-shaped" in res.stderr
    assert "draft-simple, draft-eagle3, draft-mtp, draft-dflash" in res.stderr
    assert "unreachable" not in (res.stdout + res.stderr).lower()
    # `tunnelspec check` runs the same check: what deploy refuses, check finds first.
    checked = subprocess.run([sys.executable, "-m", "tunnelspec", "check", str(inv)], env=env,
                             capture_output=True, text=True, timeout=60)
    assert checked.returncode == 2, checked.stdout + checked.stderr
    assert f"ERROR: {inv}:2: host main: variable spec_type:" in checked.stderr and "b10001-shaped" in checked.stderr


def test_extra_flag_the_build_lacks_is_exit_2(tmp_path, cache):
    inv = inventory(tmp_path, 'llama_server_extra_args="--spec-draft-ctx-size 128"')
    c = Cluster.from_inventory(load_inventory(inv))
    preflight.save_record(c, LABEL, HELP.read_text())
    with pytest.raises(ClusterError) as e:
        preflight.check_known(c, preflight.load_record(c), "record")
    assert e.value.var == "llama_server_extra_args" and "--spec-draft-ctx-size" in str(e.value)


def test_active_type_from_slots_wins_over_props():
    props = {"default_generation_settings": {"params": {"speculative.types": "none"}}}
    slots = [{"id": 0}, {"id": 1, "params": {"speculative.types": "none,draft-mtp"}}]
    assert spec_types(props, slots) == {"props": "none", "slots": "draft-mtp", "active": "draft-mtp"}
    assert spec_types(props, [])["active"] == "none"
    assert spec_types(None, None)["active"] is None
