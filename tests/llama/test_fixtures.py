"""Fixture repo and model: reproducible byte for byte, cached, usable by git as lab hosts use it."""

from __future__ import annotations

import hashlib
import subprocess
import time
from pathlib import Path

import pytest

from tunnelspec.lab import fixtures
from tunnelspec.lab import gguf_tiny


def git(cwd, *args) -> str:
    return subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, check=True,
                          timeout=120).stdout.strip()


# The commits are made with a fixed identity and dates: the same SHAs on every machine, so
# inventories and tests can pin them.
PINNED = {"b9093": "05c534942ce8fcc01d06b72d859b052398fb7f0f",
          "b11434": "d4f3039b1fa47e918560a0e6f29b9dec16fc54b5"}


@pytest.fixture(scope="module")
def sdist():
    """The downloads dir holding every tree's verified sdist."""
    paths = [fixtures.ensure_sdist(src) for src in fixtures.TREE_SOURCES]
    return paths[0]


def test_sdists_are_verified(sdist):
    for src in fixtures.TREE_SOURCES:
        assert fixtures.sha256_file(sdist.parent / src.sdist_file) == src.sdist_sha256


def test_fresh_fixtures_are_identical_and_then_cached(sdist, tmp_path, llama_fixtures):
    """Built from scratch in another directory: same SHAs and model bytes as the machine's cache
    (itself made in an earlier run), and the second call only reads the stamp."""
    fresh = fixtures.ensure_fixtures(str(tmp_path / "fx"), downloads_dir=str(sdist.parent))
    assert (fresh.commit, fresh.side_commit, fresh.model_sha256) == (
        llama_fixtures.commit, llama_fixtures.side_commit, llama_fixtures.model_sha256)
    assert fresh.trees == llama_fixtures.trees
    assert {t.name: t.commit for t in fresh.trees} == PINNED
    assert fresh.repo_local == str(tmp_path / "fx" / "llama.cpp-upstream.git")
    started = time.monotonic()
    assert fixtures.ensure_fixtures(str(tmp_path / "fx"), downloads_dir=str(sdist.parent)) == fresh
    assert time.monotonic() - started < 1.0


def test_repo_shape(llama_fixtures, tmp_path):
    fx = llama_fixtures
    assert len(fx.commit) == 40 and len(fx.side_commit) == 40
    assert fx.repo == f"{fixtures.HOST_MOUNT}/llama.cpp-upstream.git"
    assert git(fx.repo_local, "rev-parse", "--is-bare-repository") == "true"
    # Lab hosts clone it and fetch commits by SHA; the side commit is a child of the main one.
    clone = tmp_path / "clone"
    git(tmp_path, "clone", "-q", fx.repo_local, str(clone))
    assert git(clone, "rev-parse", "HEAD") == fx.commit
    git(clone, "fetch", "-q", "origin", fx.side_branch)
    assert git(clone, "rev-parse", "FETCH_HEAD") == fx.side_commit
    assert git(clone, "rev-parse", f"{fx.side_commit}^") == fx.commit
    git(clone, "-c", "user.name=t", "-c", "user.email=t@t.invalid", "cherry-pick", fx.side_commit)
    assert fixtures.SIDE_LINE.strip() in (clone / fixtures.SIDE_FILE).read_text()
    # The whole tree is there, including files its own .gitignore would hide.
    assert (clone / "ggml/include/ggml-rpc.h").is_file()
    assert (clone / "tools/rpc/CMakeLists.txt").is_file()
    assert not (clone / ".git" / "modules").exists()


@pytest.mark.parametrize("name,proto,target", [("b9093", (4, 0, 0), "rpc-server"),
                                               ("b11434", (7, 0, 0), "ggml-rpc-server")])
def test_each_upstream_tree_on_its_branch(llama_fixtures, tmp_path, name, proto, target):
    """Each tree is a branch whose commit is pinned; what tunnelspec reads from it (RPC protocol,
    RPC server target) is that tree's own."""
    from tunnelspec.llama import versions

    t = llama_fixtures.tree(name)
    assert t.commit == PINNED[name] and t.build_number == int(name[1:])
    assert git(llama_fixtures.repo_local, "rev-parse", f"refs/heads/{name}") == t.commit
    header = git(llama_fixtures.repo_local, "show", f"{t.commit}:{versions.RPC_HEADER}")
    assert versions.rpc_proto_version(header) == proto
    cm = git(llama_fixtures.repo_local, "show", f"{t.commit}:{versions.RPC_TOOL_CMAKELISTS}")
    assert versions.rpc_server_target(cm) == target


def test_default_tree_has_a_real_build_number(llama_fixtures):
    # The lab deploys the default tree: its upstream number is known, so the advisory gate judges it.
    assert (llama_fixtures.build_number, llama_fixtures.upstream_commit) == (11434, "515e85511")
    assert llama_fixtures.commit == llama_fixtures.tree(fixtures.DEFAULT_TREE).commit


def test_model_is_reproducible(llama_fixtures, tmp_path):
    sha = gguf_tiny.write_tiny_llama(tmp_path / "m.gguf")
    assert sha == llama_fixtures.model_sha256
    assert hashlib.sha256(Path(llama_fixtures.model_local).read_bytes()).hexdigest() == sha
    assert 300_000 < (tmp_path / "m.gguf").stat().st_size < 1_000_000


def test_model_metadata(llama_fixtures):
    import gguf

    r = gguf.GGUFReader(llama_fixtures.model_local)
    def val(key):
        return r.fields[key].contents()
    assert val("general.architecture") == "llama"
    assert val("llama.context_length") == 512
    assert val("llama.embedding_length") == 64
    assert val("llama.block_count") == 2
    assert val("llama.attention.head_count") == 4
    assert val("llama.rope.dimension_count") == 16
    assert val("tokenizer.ggml.model") == "llama"
    tokens = val("tokenizer.ggml.tokens")
    # `▁` and the printable ASCII bytes only: any sampled text is valid UTF-8.
    assert len(tokens) == 4 + 95 and tokens[:4] == ["<unk>", "<s>", "</s>", "\u2581"]
    assert (tokens[4], tokens[-1]) == ("<0x20>", "<0x7E>")
    assert (val("tokenizer.ggml.bos_token_id"), val("tokenizer.ggml.eos_token_id")) == (1, 2)
    names = {t.name for t in r.tensors}
    assert {"token_embd.weight", "output.weight", "blk.1.ffn_down.weight"} <= names
    assert len(names) == 3 + 2 * 9


def test_ensure_is_cached(llama_fixtures):
    started = time.monotonic()
    again = fixtures.ensure_fixtures()
    assert again == llama_fixtures
    assert time.monotonic() - started < 1.0


def test_sdist_download_verifies_checksum(tmp_path):
    """Real `pip download` from PyPI into an empty dir; a checksum mismatch is refused, not kept."""
    from tunnelspec.errors import LabError

    import dataclasses

    src = fixtures.TREE_SOURCES[0]  # the small one (4 MB)
    with pytest.raises(LabError, match="sha256"):
        fixtures.ensure_sdist(dataclasses.replace(src, sdist_sha256="0" * 64), str(tmp_path))
    assert not (tmp_path / src.sdist_file).exists()
    path = fixtures.ensure_sdist(src, str(tmp_path))
    assert fixtures.sha256_file(path) == src.sdist_sha256
