"""YAML inventories beside INI: the format chosen by extension or content, the example kept
equivalent, and the cluster checks giving the INI messages with the YAML file's lines."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from tunnelspec.core.errors import ClusterError, InventoryError
from tunnelspec.inventory import load_inventory
from tunnelspec.cluster.model import Cluster

REPO = Path(__file__).resolve().parents[2]
SHA = "0123456789abcdef0123456789abcdef01234567"


# ---- format ----------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["hosts", "inventory.txt", "inv.yaml", "inv.json"])
def test_yaml_chosen_by_extension_or_content(tmp_path, name):
    path = tmp_path / name
    path.write_text("# comment first\n---\nall:\n  children:\n    web:\n      hosts:\n        w[1:2]:\n")
    inv = load_inventory(path)
    assert inv.groups["web"].hosts == ["w1", "w2"]


def test_ini_without_extension_is_still_ini(tmp_path):
    path = tmp_path / "hosts"
    path.write_text("; comment\nweb1 x=1\n[db]\ndb1:2222\n")
    inv = load_inventory(path)
    assert inv.hosts["web1"].vars == {"x": 1} and inv.hosts["db1"].vars == {"ansible_port": 2222}


def test_empty_yaml_is_an_error_naming_the_file(tmp_path, run_tunnelspec):
    path = tmp_path / "empty.yml"
    path.write_text("# nothing yet\n")
    res = run_tunnelspec("inventory", "list", str(path))
    assert res.returncode == 2 and f"{path}:1: the YAML inventory is empty" in res.stderr


def test_yaml_origins_point_at_lines(tmp_path):
    path = tmp_path / "inv.yml"
    path.write_text("all:\n  vars:\n    a: 1\n  hosts:\n    h1:\n      b: 2\n    h2:\n")
    inv = load_inventory(path)
    assert inv.var_origin("h1", "a") == (str(path), 3)
    assert inv.var_origin("h1", "b") == (str(path), 6)
    assert inv.hosts["h2"].line == 7


# ---- the example -----------------------------------------------------------------------------
def _normalized(value):
    # INI reads `false` as the string "false", YAML as a boolean: the cluster reads both as False.
    return str(value).lower() if isinstance(value, (bool, str)) else value


def test_example_yml_equals_example_ini():
    ini = load_inventory(REPO / "inventory.example.ini")
    yml = load_inventory(REPO / "inventory.example.yml")
    a, b = ini.to_ansible_list(), yml.to_ansible_list()
    assert {k: v for k, v in a.items() if k != "_meta"} == {k: v for k, v in b.items() if k != "_meta"}
    norm = lambda d: {h: {k: _normalized(v) for k, v in hv.items()} for h, hv in d["_meta"]["hostvars"].items()}
    assert norm(a) == norm(b)
    ci, cy = Cluster.from_inventory(ini), Cluster.from_inventory(yml)
    assert (ci.main, ci.rpc, ci.source) == (cy.main, cy.rpc, cy.source)


# ---- cluster checks: same messages as INI, with the YAML lines ----------------------------------
def _write_both(tmp_path: Path, groups: dict[str, dict], all_vars: dict) -> tuple[Path, Path]:
    """The same cluster as INI and YAML. groups: name -> {"hosts": {host: vars}, "vars": {..}}."""
    ini_lines, tree = [], {"all": {"children": {}, "vars": all_vars}}
    for name, spec in groups.items():
        ini_lines.append(f"[{name}]")
        for host, hv in spec.get("hosts", {}).items():
            ini_lines.append(" ".join([host, *(f"{k}={v}" for k, v in hv.items())]))
        if spec.get("vars"):
            ini_lines += [f"[{name}:vars]", *(f"{k}={v}" for k, v in spec["vars"].items())]
        tree["all"]["children"][name] = {"hosts": {h: (hv or None) for h, hv in spec.get("hosts", {}).items()},
                                        **({"vars": spec["vars"]} if spec.get("vars") else {})}
    ini_lines += ["[all:vars]", *(f"{k}={v}" for k, v in all_vars.items())]
    ini, yml = tmp_path / "inventory.ini", tmp_path / "inventory.yml"
    ini.write_text("\n".join(ini_lines) + "\n")
    yml.write_text(yaml.safe_dump(tree, sort_keys=False))
    return ini, yml


GOOD_ALL = {"llama_repo": "/srv/llama.cpp", "llama_commit": SHA}
CASES = {
    "short_sha": ({"main": {"hosts": {"m1": {}}}, "rpc": {"hosts": {"r1": {}}}},
                  {"llama_repo": "/srv/llama.cpp", "llama_commit": "abc1234"}, "llama_commit"),
    "bad_role": ({"main": {"hosts": {"m1": {}}}, "rpc": {"hosts": {"r1": {"rpc_role": "drafty"}}}}, GOOD_ALL,
                 "rpc_role"),
    "public_rpc_bind": ({"main": {"hosts": {"m1": {}}}, "rpc": {"hosts": {"r1": {"rpc_bind": "0.0.0.0"}}}}, GOOD_ALL,
                        "rpc_bind"),
    "bad_port": ({"main": {"hosts": {"m1": {}}}, "rpc": {"hosts": {"r1": {}}, "vars": {"rpc_port": 70000}}},
                 GOOD_ALL, "rpc_port"),
    "two_mains": ({"main": {"hosts": {"m1": {}, "m2": {}}}, "rpc": {"hosts": {"r1": {}}}}, GOOD_ALL, None),
    "no_rpc": ({"main": {"hosts": {"m1": {}}}}, GOOD_ALL, None),
    "main_in_rpc": ({"main": {"hosts": {"m1": {}}}, "rpc": {"hosts": {"m1": {}, "r1": {}}}}, GOOD_ALL, None),
    "owned_flag": ({"main": {"hosts": {"m1": {}}, "vars": {"llama_server_extra_args": "--rpc x"}},
                    "rpc": {"hosts": {"r1": {}}}}, GOOD_ALL, "llama_server_extra_args"),
}


def _line_of(path: Path, var: str) -> int:
    return next(i for i, line in enumerate(path.read_text().splitlines(), 1)
                if re.search(rf"(^|\s){re.escape(var)}[=:]", line))


@pytest.mark.parametrize("case", CASES, ids=list(CASES))
def test_cluster_errors_identical_to_ini(tmp_path, case):
    groups, all_vars, var = CASES[case]
    ini, yml = _write_both(tmp_path, groups, all_vars)
    errors = []
    for path in (ini, yml):
        with pytest.raises(ClusterError) as info:
            Cluster.from_inventory(load_inventory(path))
        errors.append(info.value)
    e_ini, e_yml = errors
    strip = lambda e, p: str(e).replace(f"{p}:{e.line}:" if e.line else f"{p}:", "<where>")
    assert strip(e_ini, ini) == strip(e_yml, yml)
    assert (e_ini.host, e_ini.var) == (e_yml.host, e_yml.var)
    if var is not None:
        assert e_yml.var == var and e_yml.file == str(yml) and e_yml.line == _line_of(yml, var)


def test_yaml_inventory_error_is_usage_error(tmp_path):
    path = tmp_path / "bad.yml"
    path.write_text("all:\n  hosts: [a]\n")
    with pytest.raises(InventoryError) as info:
        load_inventory(path)
    assert info.value.exit_code == 2 and info.value.line == 2


# ---- the YAML reader: libyaml, as Ansible -----------------------------------------------------
def test_yaml_is_read_by_libyaml_like_ansible():
    """Ansible's AnsibleLoader parses with libyaml's CParser whenever PyYAML has it; so does
    tunnelspec (the pure-Python scanner refuses `w<TAB>eb:`, libyaml reads the group `w\\teb`)."""
    from ansible.module_utils.common.yaml import HAS_LIBYAML

    from tunnelspec.inventory import yaml_inv

    assert HAS_LIBYAML == yaml.__with_libyaml__
    assert yaml_inv._LOADER is (yaml.CSafeLoader if HAS_LIBYAML else yaml.SafeLoader)
    if not HAS_LIBYAML:
        pytest.skip("PyYAML without libyaml: Ansible and tunnelspec both use the pure-Python reader")


@pytest.mark.skipif(not yaml.__with_libyaml__, reason="PyYAML without libyaml")
def test_libyaml_marks_give_lines_after_multibyte_text(tmp_path):
    # libyaml reports a control character at its offset in UTF-8 bytes: the line must still be the
    # character's line when multi-byte characters come before it (and past libyaml's first chunk).
    path = tmp_path / "inv.yml"
    path.write_text("all:\n  vars:\n    a: " + "é" * 3000 + "\n    b: ü\n    c: x\x07y\n", encoding="utf-8")
    with pytest.raises(InventoryError) as info:
        load_inventory(path)
    assert info.value.line == 5 and "U+0007" in str(info.value)
    path.write_text("all:\n  hosts:\n    hé\tst:\n      v: \"é\" \n    h2:\n      v: [a, b\n", encoding="utf-8")
    with pytest.raises(InventoryError) as info:
        load_inventory(path)
    # the unclosed flow at the end of the file is cited where it opened
    assert info.value.line == 6 and "close the [ or {" in str(info.value)
