"""Secrets in what tunnelspec prints or bundles: `inventory list` masks secret-named
variables at any depth unless --show-secrets; the logs bundle's inventory masks nested ones too,
and its files (directory or .tar.gz) are 0600 from creation."""

from __future__ import annotations

import json
import stat
import tarfile

from support.cli import tunnelspec
from tunnelspec.core.secrets import MASK, masked, secret_values

INV = """all:
  vars:
    llama_repo: /srv/llama.cpp
    my_service: {api_key: sk-nested-1, url: http://x}
    hooks: [{name: a, auth_token: tok-in-list}]
  children:
    main: {hosts: {m1: {ansible_host: 10.77.0.10, ansible_become_password: pw-top}}}
    rpc: {hosts: {r1: {ansible_host: 10.77.0.11}}}
"""


def test_masked_and_secret_values_reach_nested_keys():
    data = {"a_password": "p", "svc": {"api_key": "k", "x": 1}, "l": [{"x_token": "t"}], "plain": "v"}
    assert masked(data) == {"a_password": MASK, "svc": {"api_key": MASK, "x": 1}, "l": [{"x_token": MASK}],
                            "plain": "v"}
    assert sorted(secret_values(data)) == ["k", "p", "t"]


def test_inventory_list_masks_by_default(tmp_path):
    path = tmp_path / "inv.yml"
    path.write_text(INV)
    r = tunnelspec("inventory", "list", str(path))
    assert r.rc == 0, r.stderr
    for secret in ("sk-nested-1", "tok-in-list", "pw-top"):
        assert secret not in r.stdout, secret
    assert json.loads(r.stdout)["_meta"]["hostvars"]["m1"]["ansible_become_password"] == MASK
    shown = tunnelspec("inventory", "list", str(path), "--show-secrets")
    assert shown.rc == 0 and "sk-nested-1" in shown.stdout and "pw-top" in shown.stdout


def test_bundle_files_are_0600_from_creation(tmp_path):
    from tunnelspec.commands.logs import write_bundle
    from tunnelspec.inventory import load_inventory

    path = tmp_path / "inv.yml"
    path.write_text(INV)
    inv = load_inventory(path)
    out = tmp_path / "bundle.tar.gz"
    write_bundle(out, [], {"hosts": {}}, inv, [])
    assert stat.S_IMODE(out.stat().st_mode) == 0o600
    with tarfile.open(out) as tar:
        text = "".join(tar.extractfile(m).read().decode() for m in tar.getmembers() if m.isfile())
    assert "sk-nested-1" not in text and "tok-in-list" not in text
    d = tmp_path / "bundle-dir"
    write_bundle(d, [], {"hosts": {}}, inv, [])
    files = [p for p in d.rglob("*") if p.is_file()]
    assert files and all(stat.S_IMODE(p.stat().st_mode) == 0o600 for p in files)
