"""rpc_env: the GPU runtime's environment of a node's RPC server — NAME=VALUE pairs (space-separated,
a list, or a YAML mapping), names limited to the runtimes' prefixes, refused at file:line otherwise."""

from __future__ import annotations

from pathlib import Path

import pytest

from tunnelspec.core.errors import ClusterError
from tunnelspec.cluster.model import Cluster
from tunnelspec.inventory.loader import load_inventory

SHA = "a" * 40


def cluster(tmp_path: Path, node_line_extra: str):
    path = tmp_path / "inv.ini"
    path.write_text("[main]\nm1 ansible_host=10.77.0.10\n\n[rpc]\n"
                    f"r1 ansible_host=10.77.0.11 {node_line_extra}\n\n[all:vars]\n"
                    f'llama_repo=/srv/llama.cpp\nllama_commit="{SHA}"\n')
    return Cluster.from_inventory(load_inventory(path))


def test_pairs_are_read(tmp_path):
    c = cluster(tmp_path, "rpc_env='GGML_VK_VISIBLE_DEVICES=0 CUDA_VISIBLE_DEVICES=0,1'")
    assert c.rpc[0].env == (("GGML_VK_VISIBLE_DEVICES", "0"), ("CUDA_VISIBLE_DEVICES", "0,1"))
    assert cluster(tmp_path, "").rpc[0].env == ()


def test_yaml_mapping(tmp_path):
    path = tmp_path / "inv.yml"
    path.write_text(f"""all:
  vars: {{llama_repo: /srv/llama.cpp, llama_commit: "{SHA}"}}
  children:
    main: {{hosts: {{m1: {{ansible_host: 10.77.0.10}}}}}}
    rpc:
      hosts:
        r1:
          ansible_host: 10.77.0.11
          rpc_env: {{GGML_VK_VISIBLE_DEVICES: 0}}
""")
    assert Cluster.from_inventory(load_inventory(path)).rpc[0].env == (("GGML_VK_VISIBLE_DEVICES", "0"),)


@pytest.mark.parametrize("value,words", [
    ("LD_PRELOAD=/tmp/x.so", "not a GPU runtime variable"),
    ("GGML_VK_VISIBLE_DEVICES", "is not NAME=VALUE"),
    ("'GGML_X=a;b'", "may hold letters"),
    ("lower=1", "is not NAME=VALUE"),
])
def test_refused_at_the_line(tmp_path, value, words):
    with pytest.raises(ClusterError) as e:
        cluster(tmp_path, f"rpc_env={value}")
    assert "rpc_env" in str(e.value) and words in str(e.value) and "inv.ini:5:" in str(e.value), str(e.value)
