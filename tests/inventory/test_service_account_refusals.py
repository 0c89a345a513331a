"""Inventory refusals about service accounts and tunnel hosts (offline, each at file:line): service users must be distinct (the
isolation rules tell services apart by uid), tunnelspec_root must be a directory of tunnelspec's own
(teardown --purge empties it), rpc_env may not name a variable that loads a library. And the rule
that tells an account tunnelspec created from one it must leave alone (modules/users.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from support.cli import tunnelspec
from tunnelspec.core.errors import ClusterError
from tunnelspec.cluster.model import Cluster
from tunnelspec.inventory.loader import load_inventory
from tunnelspec.modules.users import MARK, ours

SHA = "a" * 40


def write(tmp_path: Path, main_extra: str = "", node_extra: str = "", all_extra: str = "") -> Path:
    path = tmp_path / "inv.ini"
    path.write_text(f"[main]\nm1 ansible_host=10.77.0.10 {main_extra}\n\n[rpc]\n"
                    f"r1 ansible_host=10.77.0.11 {node_extra}\n\n[all:vars]\n"
                    f'llama_repo=/srv/llama.cpp\nllama_commit="{SHA}"\n{all_extra}\n')
    return path


def refused(path: Path) -> str:
    with pytest.raises(ClusterError) as e:
        Cluster.from_inventory(load_inventory(path))
    return str(e.value)


@pytest.mark.parametrize("extra,var", [("front_user=tunnelspec-llama", "front_user"),
                                       ("llama_user=tunnelspec-front", "front_user"),
                                       ("tunnel_user=tunnelspec-rpc", "tunnel_user"),
                                       ("llama_user=www tunnel_user=www", "llama_user")])
def test_service_users_must_be_distinct(tmp_path, extra, var):
    msg = refused(write(tmp_path, main_extra=extra))
    assert var in msg and "its own user" in msg and "inv.ini:2:" in msg, msg


@pytest.mark.parametrize("root", ["/srv", "/opt", "/home/alice", "/usr/local/tunnelspec", "/var/lib", "/tmp",
                                  "/opt/../srv", "/etc/tunnelspec"])
def test_tunnelspec_root_must_be_dedicated(tmp_path, root):
    msg = refused(write(tmp_path, all_extra=f"tunnelspec_root={root}"))
    assert "tunnelspec_root" in msg and "inv.ini:" in msg, msg


@pytest.mark.parametrize("root", ["/opt/tunnelspec", "/srv/tunnelspec", "/data/llama/tunnelspec", "/home/alice/ts"])
def test_a_dedicated_root_is_accepted(tmp_path, root):
    assert Cluster.from_inventory(load_inventory(write(tmp_path, all_extra=f"tunnelspec_root={root}"))).main.root == root


@pytest.mark.parametrize("var", ["CUDA_INJECTION64_PATH=/tmp/x.so", "HSA_TOOLS_LIB=/tmp/x.so",
                                 "VK_ICD_FILENAMES=/tmp/icd.json", "VK_ADD_LAYER_PATH=/tmp", "VK_LAYER_PATH=/tmp",
                                 "VK_INSTANCE_LAYERS=VK_LAYER_x", "VK_DRIVER_FILES=/tmp/d.json",
                                 "GGML_BACKEND_PATH=/tmp/b.so", "LD_LIBRARY_PATH=/tmp"])
def test_rpc_env_refuses_library_loading_variables(tmp_path, var):
    msg = refused(write(tmp_path, node_extra=f"rpc_env={var}"))
    assert "rpc_env" in msg and "inv.ini:5:" in msg, msg


def test_rpc_env_keeps_device_selection(tmp_path):
    c = Cluster.from_inventory(load_inventory(write(tmp_path, node_extra="rpc_env='CUDA_VISIBLE_DEVICES=0 GGML_VK_VISIBLE_DEVICES=1'")))
    assert dict(c.rpc[0].env) == {"CUDA_VISIBLE_DEVICES": "0", "GGML_VK_VISIBLE_DEVICES": "1"}


def test_purge_with_a_shared_root_is_refused_before_any_connection(tmp_path):
    # The hosts do not exist: the refusal comes from the inventory, before anything connects.
    r = tunnelspec("teardown", str(write(tmp_path, all_extra="tunnelspec_root=/srv")), "--purge", timeout=60)
    assert r.rc != 0 and "tunnelspec_root" in r.stdout + r.stderr and "/srv" in r.stdout + r.stderr, (r.stdout, r.stderr)


@pytest.mark.parametrize("line,mine", [
    (f"tunnelspec-llama:x:999:999:{MARK}:/nonexistent:/usr/sbin/nologin", True),
    ("tunnelspec-llama:x:999:999::/nonexistent:/usr/sbin/nologin", True),      # created before the mark
    ("ubuntu:x:1000:1000:Ubuntu:/home/ubuntu:/bin/bash", False),
    ("tunnelspec-llama:x:1001:1001::/home/tunnelspec-llama:/bin/bash", False),   # a login account
    ("www-data:x:33:33:www-data:/var/www:/usr/sbin/nologin", False),
    ("tunnelspec-x:x:0:0::/root:/bin/bash", False),
])
def test_which_accounts_are_tunnelspecs(line, mine):
    assert ours(line.split(":")) is mine
