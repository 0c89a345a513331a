"""`tunnelspec inventory list` on a YAML inventory must print what `ansible-inventory --list`
(ansible-core's yaml plugin) prints, file by file."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

CORPUS = sorted(p for p in (Path(__file__).parent / "corpus_yaml").iterdir() if p.suffix in (".yml", ".yaml"))


def test_corpus_is_big_enough():
    assert len(CORPUS) >= 10


@pytest.mark.parametrize("path", CORPUS, ids=[p.name for p in CORPUS])
def test_same_as_ansible_inventory(path: Path, run_tunnelspec, ansible_inventory_list):
    res = run_tunnelspec("inventory", "list", str(path))
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout) == ansible_inventory_list(path, "yaml")
