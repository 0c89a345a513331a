"""The cluster model for the two new input forms: pinned hf:// models and `controller:` sources."""

from __future__ import annotations

from pathlib import Path

import pytest

from tunnelspec.core.errors import ClusterError
from tunnelspec.inventory import load_inventory
from tunnelspec.cluster.model import Cluster
from tunnelspec.components.source.controller_repo import check_controller_source

from support.cli import make_repo

REV = "0123456789ABCDEF0123456789abcdef01234567"


def write(tmp_path: Path, repo: str, commit: str, model: str = "/srv/t.gguf", patches: str = "") -> Path:
    text = ("[main]\nm1 ansible_host=10.77.0.10\n\n[rpc]\nr1 ansible_host=10.77.0.11\n\n[all:vars]\n"
            f"llama_repo={repo}\nllama_commit=\"{commit}\"\nllama_model={model}\nllama_draft_model=/srv/d.gguf\n"
            + (f"llama_patches={patches}\n" if patches else ""))
    path = tmp_path / "inv" / "inventory.ini"
    path.parent.mkdir(exist_ok=True)
    path.write_text(text)
    return path


def error(path: Path) -> ClusterError:
    with pytest.raises(ClusterError) as info:
        Cluster.from_inventory(load_inventory(path), source_check=check_controller_source)
    assert info.value.exit_code == 2
    return info.value


def test_hub_model_is_normalised(tmp_path):
    path = write(tmp_path, "/srv/llama.cpp", "a" * 40, model=f"hf://org/Repo-GGUF/q/m-00001-of-00002.gguf@{REV}")
    c = Cluster.from_inventory(load_inventory(path))
    assert c.main.model == f"hf://org/Repo-GGUF/q/m-00001-of-00002.gguf@{REV.lower()}"


def test_controller_repo_relative_to_the_inventory(tmp_path):
    commit = make_repo(tmp_path / "llama.cpp")
    c = Cluster.from_inventory(load_inventory(write(tmp_path, "controller:../llama.cpp", commit)))
    assert c.source.repo == "controller:../llama.cpp"


def test_controller_repo_lacking_the_commit_names_the_variable_and_line(tmp_path):
    make_repo(tmp_path / "llama.cpp")
    path = write(tmp_path, "controller:../llama.cpp", "b" * 40)
    err = error(path)
    assert f"{path}:8:" in str(err) and "llama_repo" in str(err) and "does not contain commit " + "b" * 40 in str(err)


def test_controller_repo_that_does_not_exist(tmp_path):
    err = error(write(tmp_path, "controller:/nonexistent/llama.cpp", "b" * 40))
    assert "/nonexistent/llama.cpp does not exist" in str(err)


def test_controller_repo_needs_the_patch_commits_too(tmp_path):
    commit = make_repo(tmp_path / "llama.cpp")
    missing = "abcdef1" * 5 + "abcde"
    err = error(write(tmp_path, "controller:../llama.cpp", commit, patches='[{"pr": 5, "commit": "%s"}]' % missing))
    assert f"patch commit {missing} is not in the controller repository" in str(err)
    # A whole-PR entry's head must be there too.
    err = error(write(tmp_path, "controller:../llama.cpp", commit, patches='[{"pr": 5, "head": "%s"}]' % missing))
    assert f"patch commit {missing} is not in the controller repository" in str(err)


def test_controller_path_inside_another_repository_is_not_taken_for_it(tmp_path):
    commit = make_repo(tmp_path / "outer")
    (tmp_path / "outer" / "sub").mkdir()
    err = error(write(tmp_path, f"controller:{tmp_path / 'outer' / 'sub'}", commit))
    assert "is not a git repository itself" in str(err) and str(tmp_path / "outer") in str(err)


def test_bare_controller_repository(tmp_path):
    import subprocess

    commit = make_repo(tmp_path / "work")
    subprocess.run(["git", "clone", "-q", "--bare", str(tmp_path / "work"), str(tmp_path / "llama.git")], check=True)
    c = Cluster.from_inventory(load_inventory(write(tmp_path, f"controller:{tmp_path / 'llama.git'}", commit)))
    assert c.source.commit == commit
