"""Pure parts of the source/build tasks: patch specs and fingerprints, host report parsers, build
keys and options, the tree-hash gate's table. No hosts needed."""

from __future__ import annotations

import pytest

from tunnelspec.core.errors import TaskFailed
from tunnelspec.llama import build_plan as bp
from tunnelspec.llama import source_stack as ss
from tunnelspec.components.source.gate import compare_trees

BASE = "8c22f3ff082f60e8b97ed51afbf8e51e63208260"


PR_SHA = "1a6fee5" + "0" * 33
REMOTE_SHA = "abcdef1" + "2" * 33


def test_patch_specs_and_fingerprint(tmp_path):
    (tmp_path / "x.patch").write_bytes(b"diff --git a/README b/README\n")
    specs = ss.parse_patches([{"pr": 26636, "commit": PR_SHA.upper()},
                              {"remote": "https://example.invalid/r.git", "ref": "fix", "commit": REMOTE_SHA},
                              {"file": "x.patch"}, {"pr": 26636, "head": PR_SHA}], tmp_path)
    assert [s.kind for s in specs] == ["pr", "remote", "file", "pr"]
    assert [s.whole for s in specs] == [False, False, False, True]
    assert specs[0].id == f"pr 26636 @{PR_SHA}" and specs[3].id == f"pr 26636 head {PR_SHA}"
    assert specs[2].data.startswith(b"diff") and len(specs[2].sha256) == 64
    fp = ss.fingerprint(BASE, specs)
    assert fp == ss.fingerprint(BASE, ss.parse_patches([{"pr": 26636, "commit": PR_SHA},
                                                        {"remote": "https://example.invalid/r.git", "ref": "fix",
                                                         "commit": REMOTE_SHA}, {"file": "x.patch"},
                                                        {"pr": 26636, "head": PR_SHA}], tmp_path))
    # The same SHA as one commit or as the whole PR's head is another stack.
    assert ss.fingerprint(BASE, specs[:1]) != ss.fingerprint(BASE, specs[3:])
    # Changing the patch file's bytes, the order, or the base changes the fingerprint.
    (tmp_path / "x.patch").write_bytes(b"diff --git a/README b/README\n+x\n")
    assert ss.fingerprint(BASE, ss.parse_patches([{"pr": 26636, "commit": PR_SHA},
                                                  {"remote": "https://example.invalid/r.git", "ref": "fix",
                                                   "commit": REMOTE_SHA}, {"file": "x.patch"},
                                                  {"pr": 26636, "head": PR_SHA}], tmp_path)) != fp
    assert ss.fingerprint(BASE, specs[::-1]) != fp
    assert ss.fingerprint("0" * 40, specs) != fp


@pytest.mark.parametrize("entry", [{"pr": 0, "commit": PR_SHA}, {"pr": 1, "commit": "xyz"},
                                   {"remote": "-oops", "ref": "r", "commit": PR_SHA}, {"pr": 1},
                                   {"file": "missing.patch"}, {"pr": 1, "commit": PR_SHA, "head": PR_SHA},
                                   {"pr": 0, "head": PR_SHA}])
def test_bad_patch_specs_are_refused(entry, tmp_path):
    with pytest.raises(TaskFailed):
        ss.parse_patches([entry], tmp_path)


@pytest.mark.parametrize("entry", [{"pr": 1, "commit": "1a6fee5"}, {"pr": 1, "head": "1a6fee5"},
                                   {"remote": "https://example.invalid/r.git", "ref": "b", "commit": PR_SHA[:39]}])
def test_short_patch_shas_are_refused_with_the_way_to_the_full_one(entry, tmp_path):
    with pytest.raises(TaskFailed) as err:
        ss.parse_patches([entry], tmp_path)
    assert "short SHA" in str(err.value) and "git rev-parse" in str(err.value) and "full 40-hex" in str(err.value)


def _rev_list(*rows: tuple[str, ...]) -> str:
    return "".join(" ".join(r) + "\n" for r in rows)


def test_pr_commits_oldest_first_and_refusals():
    spec = ss.PatchSpec("pr", commit="c" * 40, pr=9, whole=True)
    a, b, c, m = "a" * 40, "b" * 40, "c" * 40, "d" * 40
    assert ss.pr_commits(_rev_list((a, BASE), (b, a), (c, b)), spec, BASE, "main") == [a, b, c]
    with pytest.raises(TaskFailed) as err:
        ss.pr_commits(_rev_list((a, BASE), (m, a, "e" * 40), (c, m)), spec, BASE, "main")
    assert "1 merge commit(s) (dddddddddddd)" in str(err.value) and "on main" in str(err.value)
    with pytest.raises(TaskFailed) as err:
        ss.pr_commits("", spec, BASE, "main")
    assert "already contained in llama_commit" in str(err.value)
    many = _rev_list(*[(f"{i:040x}", f"{i - 1:040x}") for i in range(1, ss.PR_MAX_COMMITS + 2)])
    with pytest.raises(TaskFailed) as err:
        ss.pr_commits(many, spec, BASE, "main")
    assert f"{ss.PR_MAX_COMMITS + 1} commits" in str(err.value) and "older than" in str(err.value)


def test_parse_source_state():
    text = ("head " + "a" * 40 + "\ntree " + "b" * 40 + "\norigin /srv/r.git\nshallow false\nop cherry-pick\n"
            "dirty  M README.md\ndirty ?? junk\ndescribe b4589-12-gabcdef0\n--- stack\n{\"fingerprint\": \"f\"}\n")
    st = ss.parse_state(text)
    assert st.head == "a" * 40 and st.tree == "b" * 40 and st.origin == "/srv/r.git"
    assert st.operation == "cherry-pick" and st.dirty == (" M README.md", "?? junk")
    assert st.stack == {"fingerprint": "f"}
    assert ss.build_number_from_describe(st.describe) == 4601
    assert ss.build_number_from_describe(None) is None
    assert ss.parse_state("absent\n").absent
    assert ss.parse_state("head none\ntree none\n--- stack\nnot json").stack is None


def test_build_key_and_options():
    opts = bp.keyed_options(BASE, None, "cpu", [])
    assert "-DGGML_RPC=ON" in opts and "-DGGML_RPC_RDMA=OFF" in opts and "-DLLAMA_BUILD_NUMBER=0" in opts
    assert f"-DLLAMA_BUILD_COMMIT={BASE[:9]}" in opts
    assert "-DGGML_CUDA=ON" in bp.keyed_options(BASE, 1, "cuda", [])
    k = bp.build_key("t" * 40, opts)
    assert k == bp.build_key("t" * 40, list(opts)) and len(k) == 16
    assert k != bp.build_key("u" * 40, opts)
    assert k != bp.build_key("t" * 40, bp.keyed_options(BASE, None, "cpu", ["-DGGML_NATIVE=OFF"]))
    assert bp.tree_options(bp.option_names("option(LLAMA_CURL \"use curl\" ON)")) == ["-DLLAMA_CURL=OFF"]
    assert bp.tree_options(bp.option_names("llama_option_depr(WARNING     LLAMA_CURL)")) == []


def test_offline_ui_options_follow_the_tree():
    """The UI options of the real trees (their option() lines): b9093 builds its web UI by default
    (and its sdist lacks the sources), b11434 downloads a prebuilt one; neither option is passed to
    a tree that does not declare it."""
    b9093 = bp.option_names('option(LLAMA_BUILD_WEBUI    "llama: build the embedded Web UI for server"  ON)\n'
                            'option(GGML_RPC  "ggml: use RPC"  OFF)\n')
    b11434 = bp.option_names('option(LLAMA_BUILD_UI        "llama: build the embedded Web UI for server" OFF)\n'
                             '  option(LLAMA_USE_PREBUILT_UI "llama: use prebuilt UI from HF Bucket when available" ON)\n'
                             'option(GGML_RPC "ggml: use RPC" OFF)\n')
    assert bp.tree_options(b9093) == ["-DLLAMA_BUILD_WEBUI=OFF"]
    assert bp.tree_options(b11434) == ["-DLLAMA_USE_PREBUILT_UI=OFF", "-DLLAMA_BUILD_UI=OFF"]
    bp.check_tree(b9093, "x")
    with pytest.raises(ValueError, match="no GGML_RPC option"):
        bp.check_tree(bp.option_names('option(LLAMA_BUILD_TESTS "t" ON)'), "/opt/t/src/llama.cpp")
    assert bp.launcher_options(False, "cpu") == []
    assert bp.targets_for("rpc", "rpc-server") == ["rpc-server"]
    assert bp.targets_for("main", "ggml-rpc-server") == ["llama-server"]
    assert bp.progress_percent("[ 42%] Building CXX object x.o") == 42
    assert bp.progress_percent("[100%] Built target llama-server") == 100
    assert bp.progress_percent("-- Configuring done") is None


def test_parse_build_state_and_stamp():
    text = ("tree abc\nnproc 2\nccache yes\ncurrent /opt/t/build/k1\nbin ggml-rpc-server\n--- stamp\n"
            "{\"key\": \"k1\", \"targets\": [\"ggml-rpc-server\"]}\n--- rpc-cmakelists\nset(TARGET ggml-rpc-server)\n"
            "--- options\noption(GGML_RPC \"ggml: use RPC\" OFF)\n")
    st = bp.parse_state(text)
    assert st.tree == "abc" and st.nproc == 2 and st.ccache and st.current == "/opt/t/build/k1"
    assert st.rpc_target == "ggml-rpc-server" and st.options == {"GGML_RPC"}
    assert bp.stamp_ok(st.stamp, "k1", ["ggml-rpc-server"], st.bins)
    assert not bp.stamp_ok(st.stamp, "k2", ["ggml-rpc-server"], st.bins)
    assert not bp.stamp_ok(st.stamp, "k1", ["llama-server"], st.bins)
    assert not bp.stamp_ok(st.stamp, "k1", ["ggml-rpc-server"], set())  # binary deleted by hand


def _src(commit, tree, steps=()):
    return {"commit": commit, "tree": tree, "patches": [{"id": i, "tree": t} for i, t in steps]}


def test_gate_equal_and_differing_trees():
    same = {h: _src(BASE, "t1") for h in ("main", "rpc-a", "rpc-b")}
    assert "equal on 3" in compare_trees(same)
    diff = dict(same, **{"rpc-b": _src("4670f1d8edd2104a2f2464982fc0b02a944051fc", "t2")})
    with pytest.raises(TaskFailed) as e:
        compare_trees(diff)
    msg = str(e.value)
    assert "stopping before any build" in msg
    row = next(line for line in msg.splitlines() if line.strip().startswith("rpc-b"))
    assert "4670f1d8edd2" in row and "t2" in row and "base commit" in row
    assert "(reference)" in next(line for line in msg.splitlines() if line.strip().startswith("main"))


def test_gate_names_first_differing_patch():
    a = _src(BASE, "t3", [("pr 1 @abc1234", "t2"), ("file x.patch sha256:1", "t3")])
    b = _src(BASE, "t9", [("pr 1 @abc1234", "t2"), ("file x.patch sha256:2", "t9")])
    with pytest.raises(TaskFailed) as e:
        compare_trees({"main": a, "rpc-a": a, "rpc-b": b})
    row = next(line for line in str(e.value).splitlines() if line.strip().startswith("rpc-b"))
    assert "patch 2" in row and "sha256:2" in row


def test_gate_without_source_play_or_in_check_mode():
    assert "did not run" in compare_trees({"main": None, "rpc-a": None})
    pending = {"commit": BASE, "tree": None, "pending": True, "patches": []}
    assert "check mode" in compare_trees({"main": pending, "rpc-a": pending})
    with pytest.raises(TaskFailed):
        compare_trees({"main": _src(BASE, "t1"), "rpc-a": None})


def test_status_parser_and_rows():
    from tunnelspec.commands.status_source import format_rows, parse_status

    text = ("head h1\ntree t1\ndirty 0\ncurrent /opt/t/build/k1\n--- stack\n"
            '{"base": "%s", "head": "h1", "patches": [{"id": "file x.patch sha256:1"}]}\n--- stamp\n'
            '{"key": "k1", "targets": ["llama-server"], "tree": "t1"}\n' % BASE)
    st = parse_status(text)
    assert st.commit == BASE and st.patches == ["file x.patch sha256:1"] and st.stack_current
    assert st.build_key == "k1" and st.targets == ["llama-server"]
    other = parse_status("head h2\ntree t2\ndirty 2\ncurrent none\n--- stack\n--- stamp\n")
    rows = format_rows({"main": st, "rpc-a": other})
    assert rows[1].startswith("main") and "trees differ" in rows[1]
    assert "2 local modification(s)" in rows[2] and "HEAD is not the applied stack" in rows[2]


@pytest.mark.parametrize("number,allowed,expect", [
    (8000, False, "refuse"),        # < b8492: GHSA-j8rj-fmpv-wcxw
    (8000, True, "WARNING known-vulnerable"),
    (None, False, "build number unknown"),
    (13000, False, ""),
])
def test_build_refuses_known_vulnerable_pins(number, allowed, expect):
    from types import SimpleNamespace

    from tunnelspec.components.build.build import LlamaBuild

    task = LlamaBuild(LlamaBuild.validate({"root": "/opt/t", "role": "main", "commit": BASE, "build_number": number}))
    from tunnelspec.llama import advisories

    ctx = SimpleNamespace(options=SimpleNamespace(accepted=frozenset({advisories.ACCEPT_VULNERABLE} if allowed else ())))
    if expect == "refuse":
        with pytest.raises(TaskFailed, match="known-vulnerable.*--allow-vulnerable-llama"):
            task._advisory_note(ctx)
    else:
        note = task._advisory_note(ctx)
        assert (expect in note) if expect else note == ""


def test_ccache_env_hits_across_callers_with_other_locales(tmp_path):
    """A real ccache and compiler: the same file compiled under the build's env from a shell with
    LANG=C.UTF-8 (the controller) and from one without any locale (an SSH session on a host) is one
    cache entry — ccache hashes LANG/LC_*, so the build env pins them."""
    import os
    import shutil
    import subprocess

    if not (shutil.which("ccache") and shutil.which("gcc")):
        pytest.skip("needs ccache and gcc")
    (tmp_path / "a.c").write_text("int f(void) { return 1; }\n")
    base = {k: v for k, v in os.environ.items() if not k.startswith(("LANG", "LC_", "CCACHE_"))}
    base["CCACHE_DIR"] = str(tmp_path / "cache")

    def compile_with(extra: dict[str, str]) -> None:
        env = {**base, **extra}
        argv = ["env", *bp.ccache_env(str(tmp_path)), "ccache", "gcc", "-c", "a.c", "-o", "a.o"]
        subprocess.run(argv, cwd=tmp_path, env=env, check=True, timeout=60, capture_output=True)

    def hits() -> int:
        out = subprocess.run(["ccache", "--print-stats"], env=base, capture_output=True, text=True,
                             timeout=30, check=True).stdout
        stats = dict(line.split("\t", 1) for line in out.splitlines() if "\t" in line)
        return int(stats["direct_cache_hit"]) + int(stats["preprocessed_cache_hit"])

    compile_with({"LANG": "C.UTF-8", "LC_MESSAGES": "en_US.UTF-8"})
    compile_with({})
    assert hits() == 1


def test_status_names_each_rpc_device_by_what_its_node_serves():
    from tunnelspec.commands.status import render

    served = [{"name": "Vulkan0", "description": "llvmpipe (LLVM 19.1.7, 256 bits)", "kind": "gpu",
               "total_mib": 17920, "free_mib": 17900}]
    host = {"commit": None, "tree": None, "build": None}
    report = {"hosts": {
        "main": {**host, "role": "main", "tunnels": [
            {"node": "rpc-a", "unit": "active", "endpoint": "127.0.0.1:15052", "listening": True, "role": "draft",
             "devices": ["RPC0"]},
            {"node": "rpc-b", "unit": "active", "endpoint": "127.0.0.1:15053", "listening": True, "role": "target",
             "devices": ["RPC1"]}]},
        "rpc-a": {**host, "role": "rpc (draft)", "unit": "active",
                  "rpc": {"version": "7.0.0", "devices": None, "state": "serving llama-server", "served": served}},
        "rpc-b": {**host, "role": "rpc (target)", "unit": "active",
                  "rpc": {"version": "7.0.0", "devices": 1, "state": "idle", "served": None}},
    }}
    text = render(report)
    assert "devices RPC0 = Vulkan0 (llvmpipe (LLVM 19.1.7, 256 bits), 17900/17920 MiB free)" in text, text
    assert "devices RPC1\n" in text + "\n"  # the node's banner unknown: the name alone
