"""Host patterns: the same hosts, in the same order, as ansible-core's own InventoryManager."""

from __future__ import annotations

from pathlib import Path

import pytest

from tunnelspec.inventory import load_inventory

INVENTORY = """\
loose1
[web]
web[01:03]
[db]
db1
db2
[rpc]
rpc-a ansible_host=10.77.0.11
rpc-b ansible_host=10.77.0.12
[main]
main1
[prod:children]
web
db
[cluster:children]
main
rpc
"""

PATTERNS = [
    "all", "*", "web", "web01", "web:db", "web,db", "prod:!db", "prod:&web", "all:!prod",
    "web*", "*1", "rpc-?", "~rpc-[ab]", "~^web0[12]$", "cluster:!rpc-b", "!web",
    "&prod", "web[0]", "web[1:]", "prod[-1]", "web:db:!db2:&prod", "db,web01,db1",
    "ungrouped", "nosuchthing", "web01:nosuch", "main1, rpc-a",
]


@pytest.fixture(scope="module")
def inv_path(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("patterns") / "inventory.ini"
    path.write_text(INVENTORY)
    return path


@pytest.fixture(scope="module")
def ansible_manager(inv_path):
    import ansible  # noqa: F401  (a test dependency: fail loudly if missing)
    from ansible.inventory.manager import InventoryManager
    from ansible.parsing.dataloader import DataLoader

    return InventoryManager(loader=DataLoader(), sources=[str(inv_path)])


# Ansible walks grandchildren of a group through a set of Group objects, so its order below the
# first level of children changes from run to run; `all`, `*` and a bare `!x` / `&x` (which
# start from `all`) are compared as sets, every other pattern in exact order.
UNORDERED = {"all", "*", "!web", "&prod", "all:!prod"}


@pytest.mark.parametrize("pattern", PATTERNS)
def test_match_like_ansible(pattern, inv_path, ansible_manager):
    expected = [h.name for h in ansible_manager.get_hosts(pattern)]
    got = load_inventory(inv_path).match(pattern)
    if pattern in UNORDERED:
        assert sorted(got) == sorted(expected)
        assert len(got) == len(set(got))
    else:
        assert got == expected


def test_unknown_pattern_matches_nothing(inv_path):
    assert load_inventory(inv_path).match("nosuch") == []


def test_precedence_and_origins(tmp_path):
    path = tmp_path / "inv.ini"
    path.write_text(
        "[all:vars]\nv=all\nonly_all=1\n"
        "[parent:children]\nchild\n[parent:vars]\nv=parent\n"
        "[child]\nh1\nh2 v=host\n[child:vars]\nv=child\n"
    )
    inv = load_inventory(path)
    assert inv.host_vars("h1") == {"v": "child", "only_all": 1}
    assert inv.host_vars("h2")["v"] == "host"
    assert inv.var_origin("h1", "v") == (str(path), 12)
    assert inv.var_origin("h1", "only_all") == (str(path), 3)
    assert inv.var_origin("h2", "v") == (str(path), 10)
    assert inv.hosts["h1"].groups == ["child"]
    assert inv.groups["parent"].children == ["child"]
