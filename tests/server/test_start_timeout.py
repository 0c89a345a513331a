"""verify's wait for /health: from the inventory's llama_server_start_timeout, else
from the size of the models llama-server loads — never the old fixed 180 s for a 40 GiB model."""

from __future__ import annotations

import asyncio
import os

import pytest

from tunnelspec.connection.local import LocalConnection
from tunnelspec.core.errors import ClusterError
from tunnelspec.inventory import load_inventory
from tunnelspec.cluster.model import Cluster
from tunnelspec.components.server.verify import BASE_START_TIMEOUT, model_paths, model_sizes, start_timeout

SHA = "0123456789abcdef0123456789abcdef01234567"
GIB = 1 << 30


def inventory(tmp_path, main_vars=()):
    path = tmp_path / "inventory.ini"
    path.write_text("\n".join(["[main]", "m1 ansible_host=10.77.0.10", "", "[rpc]",
                               "r1 ansible_host=10.77.0.11", "", "[all:vars]", "llama_repo=/srv/llama.cpp",
                               f'llama_commit="{SHA}"', "", "[main:vars]", *main_vars]) + "\n")
    return path


def test_the_inventory_value_wins(tmp_path):
    c = Cluster.from_inventory(load_inventory(inventory(tmp_path, ["llama_server_start_timeout=1200"])))
    assert c.main.start_timeout == 1200
    assert start_timeout(c.main.start_timeout, [80 * GIB]) == 1200


def test_unset_grows_with_the_models():
    assert start_timeout(None, []) == BASE_START_TIMEOUT
    small = start_timeout(None, [30 << 20, 5 << 20])  # the lab's tiny models: the old wait
    assert small - BASE_START_TIMEOUT <= 1
    big = start_timeout(None, [40 * GIB, 1 * GIB])
    assert big == BASE_START_TIMEOUT + 15 * 41
    assert start_timeout(0, [40 * GIB]) > start_timeout(0, [4 * GIB]) > BASE_START_TIMEOUT


@pytest.mark.parametrize("value", ["5", "soon", "-1"])
def test_bad_values_name_file_and_line(tmp_path, value):
    path = inventory(tmp_path, [f"llama_server_start_timeout={value}"])
    with pytest.raises(ClusterError) as info:
        Cluster.from_inventory(load_inventory(path))
    msg = str(info.value)
    line = path.read_text().splitlines().index(f"llama_server_start_timeout={value}") + 1
    assert f"{path}:{line}" in msg and "llama_server_start_timeout" in msg


def test_model_paths_of_each_spelling():
    argv = ["llama-server", "--rpc", "127.0.0.1:15052", "-m", "/m/t.gguf", "--spec-draft-model", "/m/d.gguf",
            "--port", "8080"]
    assert model_paths(argv) == ["/m/t.gguf", "/m/d.gguf"]
    assert model_paths(["llama-server", "--model", "/a", "-md", "/b"]) == ["/a", "/b"]
    assert model_paths(["llama-server", "--rpc", "x"]) == []


def test_sizes_read_on_the_host(tmp_path):
    # A real stat through tunnelspec's local connection; a sparse file has its apparent size.
    t = tmp_path / "t.gguf"
    with open(t, "wb") as f:
        f.truncate(3 * GIB)
    d = tmp_path / "d.gguf"
    d.write_bytes(b"x" * 1000)
    os.symlink(d, tmp_path / "link.gguf")
    sizes = asyncio.run(model_sizes(LocalConnection("local"), [str(t), str(tmp_path / "link.gguf")]))
    assert sizes == [3 * GIB, 1000]
    assert start_timeout(None, sizes) == BASE_START_TIMEOUT + 45
