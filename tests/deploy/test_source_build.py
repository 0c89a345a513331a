"""Source and build in the lab: the same llama.cpp source on every host, proven by tree hash, and built.

Real hosts (systemd-nspawn), real git, real cmake/ccache builds. The tests share one install
root of their own (ROOT, not the default /opt/tunnelspec other engineers deploy to). Each requests
`deployed`: the pinned commit's source and build current on every host, an idempotent run — the
first one builds (the expensive part), later ones change nothing unless a test before left a patch
or another commit — so any one of them runs alone; the file order is the cheap one.
Build times are printed (pytest -s) and recorded in each build's stamp.
"""

from __future__ import annotations

import json
import re
import time
import uuid
from pathlib import Path

import pytest

from support.cli import failed_report, tunnelspec

pytestmark = pytest.mark.lab

ROOT = "/opt/tunnelspec-t4"  # a root of its own, same depth as the default: ccache hits carry over
PLAYBOOK = str(Path(__file__).parent / "data" / "source_build.yml")
SOURCE_ONLY = str(Path(__file__).resolve().parents[2] / "playbooks" / "source.yml")
HOSTS = ("main", "rpc-a", "rpc-b")
BUILD_TIMEOUT = 3600  # a cold llama-server build on 2 shared cores takes ≈ 8-15 min


# ---- helpers ------------------------------------------------------------------------------------
def write_inventory(lab, path: Path, extra_vars: list[str] = (), cluster: bool = True,
                    host_vars: dict[str, str] | None = None) -> Path:
    """The lab's inventory with our own root (+ extra [all:vars]). cluster=False renames the
    groups so no Cluster is built (the only way to give one host another commit: the Cluster
    model refuses that statically, the gate is what catches it at run time)."""
    text = Path(lab.inventory).read_text()
    text = text.replace("[all:vars]\n", "[all:vars]\n" + "".join(f"{v}\n" for v in [f"tunnelspec_root={ROOT}",
                                                                                       *extra_vars]))
    if not cluster:
        text = text.replace("[main]\n", "[controlplane]\n").replace("[rpc]\n", "[workers]\n")
    for host, var in (host_vars or {}).items():
        text = re.sub(rf"^({re.escape(host)} ansible_host=\S+)", rf"\1 {var}", text, flags=re.M)
    path.write_text(text)
    return path


def sh(lab, host: str, script: str, *args: str) -> str:
    res = lab.exec(host, ["sh", "-c", script, "sh", *args], timeout=60)
    assert res.returncode == 0, f"{host}: {script}: {res.stderr}"
    return res.stdout


def run(inv: Path, playbook: str = PLAYBOOK, *extra: str, timeout: float = BUILD_TIMEOUT):
    # --forks 1: the lab's hosts share the machine's 2 cores; one build at a time lets the
    # second and third host hit the ccache the first one filled.
    return tunnelspec("play", str(inv), playbook, "--format", "json", "--forks", "1", *extra, timeout=timeout)


def results(res, module: str) -> dict[str, dict]:
    return {e["host"]: e for e in res.results() if e.get("module") == module}


def gate(res) -> dict:
    """The source play's tree-hash gate (the hosts play has a gate of its own before it)."""
    return next(e for e in res.events if e.get("event") == "gate" and e.get("play") == "llama.cpp source")


def source_tree(lab, host: str) -> str:
    return sh(lab, host, 'git -C "$1/src/llama.cpp" rev-parse "HEAD^{tree}"', ROOT).strip()


def current(lab, host: str) -> str:
    return sh(lab, host, 'readlink "$1/current"', ROOT).strip()


def binaries(lab, host: str) -> dict[str, str]:
    """name → mtime of the executables (not the shared libraries) in current/bin."""
    out = sh(lab, host, 'find "$(readlink -f "$1/current")/bin/" -maxdepth 1 -type f -perm -u+x '
                        '! -name "*.so*" -printf "%f %T@\\n"', ROOT)
    return dict(line.split() for line in out.splitlines() if line.strip())


def files_newer_than_stamp(lab, host: str) -> list[str]:
    out = sh(lab, host, 'd=$(readlink -f "$1/current"); find "$d" -newer "$d/.tunnelspec-stamp" -type f '
                        '! -name "*.lock" ! -name .tunnelspec-used | head -20', ROOT)   # used: touched when made current
    return out.split()


@pytest.fixture(scope="module")
def inv_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("srcbuild")


@pytest.fixture(scope="module")
def fixtures():
    from tunnelspec.lab.fixtures import ensure_fixtures

    return ensure_fixtures()


@pytest.fixture
def deployed(lab, inv_dir, fixtures):
    """Source + build of the pinned commit, without patches, current on all three hosts: the first
    run in ROOT builds (the expensive part), later ones are no-ops unless a test left the hosts
    otherwise. (inventory, the run's result)."""
    inv = write_inventory(lab, inv_dir / "inventory.ini")
    started = time.monotonic()
    res = run(inv, PLAYBOOK, "--tags", "source,build")
    elapsed = time.monotonic() - started
    assert res.rc == 0, failed_report(res)
    builds = results(res, "llama_build")
    print(f"\nsource+build run: {elapsed:.0f}s; per host: " +
          ", ".join(f"{h} {builds[h]['status']} {builds[h]['duration']:.0f}s" for h in HOSTS))
    return inv, res


# ---- tests (in order) ---------------------------------------------------------------------------
def test_source_and_build_on_every_host(lab, deployed, fixtures):
    inv, res = deployed
    g = gate(res)
    assert g["status"] == "ok" and "equal on 3 host(s)" in g["msg"]
    trees = {h: source_tree(lab, h) for h in HOSTS}
    assert len(set(trees.values())) == 1 and trees["main"] in g["msg"]
    for h, r in results(res, "llama_source").items():
        assert r["status"] in ("ok", "changed")
    for h in HOSTS:
        head = sh(lab, h, 'git -C "$1/src/llama.cpp" rev-parse HEAD; git -C "$1/src/llama.cpp" status --porcelain',
                  ROOT).split()
        assert head == [fixtures.commit], f"{h}: not detached at the pinned commit and clean: {head}"
    # Only what the role needs: the RPC server on rpc nodes, llama-server on main.
    bins = {h: set(binaries(lab, h)) for h in HOSTS}
    assert "llama-server" in bins["main"] and not bins["main"] & {"ggml-rpc-server", "rpc-server"}
    for h in ("rpc-a", "rpc-b"):
        assert bins[h] & {"ggml-rpc-server", "rpc-server"} and "llama-server" not in bins[h], bins[h]
    ver = lab.exec("main", [f"{ROOT}/current/bin/llama-server", "--version"], timeout=60)
    from tunnelspec.llama.flags import parse_version

    v = parse_version(ver.stderr + ver.stdout)
    assert v.commit and fixtures.commit.startswith(v.commit), ver.stderr
    stamp = json.loads(sh(lab, "main", 'cat "$1/current/.tunnelspec-stamp"', ROOT))
    print(f"\nbuild seconds recorded in stamps: main {stamp['seconds']}s, " + ", ".join(
        f"{h} {json.loads(sh(lab, h, 'cat $1/current/.tunnelspec-stamp', ROOT))['seconds']}s"
        for h in ("rpc-a", "rpc-b")))


def test_second_run_changes_nothing_and_compiles_nothing(lab, deployed):
    inv, _ = deployed
    before = {h: (binaries(lab, h), current(lab, h)) for h in HOSTS}
    res = run(inv, PLAYBOOK, "--tags", "source,build", timeout=600)
    assert res.rc == 0, failed_report(res)
    for h in HOSTS:
        assert res.recap[h]["changed"] == 0, res.recap
        # The source and build tasks themselves reported ok (besides the hosts and prerequisites plays).
        assert {e["module"]: e["status"] for e in res.results() if e["host"] == h
                and e["module"] in ("llama_source", "llama_build")} == {"llama_source": "ok", "llama_build": "ok"}
        assert (binaries(lab, h), current(lab, h)) == before[h]
        assert files_newer_than_stamp(lab, h) == [], f"{h}: something was rebuilt"
    assert not [e for e in res.events if e.get("event") == "progress"], "a build step ran"
    assert "equal on 3 host(s)" in gate(res)["msg"]


def test_local_patch_changes_tree_everywhere_and_removing_it_reuses_the_build(lab, deployed, inv_dir):
    inv, _ = deployed
    base_tree = source_tree(lab, "main")
    base_build = {h: current(lab, h) for h in HOSTS}
    base_bins = {h: binaries(lab, h) for h in HOSTS}
    # A unique line per session, so the patched build is really built (with ccache hits) each time.
    token = uuid.uuid4().hex[:12]
    (inv_dir / "patches").mkdir(exist_ok=True)
    (inv_dir / "patches" / "readme.patch").write_text(
        f"diff --git a/TUNNELSPEC-TEST.md b/TUNNELSPEC-TEST.md\nnew file mode 100644\n--- /dev/null\n"
        f"+++ b/TUNNELSPEC-TEST.md\n@@ -0,0 +1 @@\n+tunnelspec test patch {token}\n")
    patched = write_inventory(lab, inv_dir / "patched.ini", ['llama_patches=[{"file": "patches/readme.patch"}]'])
    res = run(patched, PLAYBOOK, "--tags", "source,build")
    assert res.rc == 0, failed_report(res)
    trees = {h: source_tree(lab, h) for h in HOSTS}
    assert len(set(trees.values())) == 1 and base_tree not in trees.values()
    assert trees["main"] in gate(res)["msg"]
    builds = results(res, "llama_build")
    try:
        for h in HOSTS:
            assert builds[h]["status"] == "changed" and builds[h]["msg"].startswith("build "), builds[h]
            assert current(lab, h) != base_build[h]
        print("\npatched rebuild (warm ccache): " + ", ".join(f"{h} {builds[h]['duration']:.0f}s" for h in HOSTS))
        # The patch is a commit with a fixed identity and date: same commit SHA on every host.
        heads = {sh(lab, h, 'git -C "$1/src/llama.cpp" rev-parse HEAD', ROOT).strip() for h in HOSTS}
        assert len(heads) == 1
        patched_dirs = {h: current(lab, h) for h in HOSTS}

        # Back to no patch: the previous keyed build is reused, nothing is compiled.
        res = run(inv, PLAYBOOK, "--tags", "source,build", timeout=600)
        assert res.rc == 0, failed_report(res)
        builds = results(res, "llama_build")
        for h in HOSTS:
            assert source_tree(lab, h) == base_tree
            assert builds[h]["status"] == "changed" and "no compile" in builds[h]["msg"], builds[h]
            assert current(lab, h) == base_build[h]
            assert binaries(lab, h) == base_bins[h]
            assert files_newer_than_stamp(lab, h) == []
        assert not [e for e in res.events if e.get("event") == "progress" and not e["msg"].startswith("removed old")]
    finally:
        # The session-unique patched builds are not needed again.
        for h in HOSTS:
            d = locals().get("patched_dirs", {}).get(h)
            if d and d != current(lab, h):
                sh(lab, h, 'case "$1" in "$2"/build/*) rm -rf -- "$1" "$1.lock";; esac', d, ROOT)


def _build_dirs(lab) -> dict[str, str]:
    return {h: sh(lab, h, 'ls -1 "$1/build" 2>/dev/null; true', ROOT) for h in HOSTS}


def test_host_with_another_commit_stops_before_any_build(lab, deployed, inv_dir, fixtures):
    inv, _ = deployed
    # The Cluster model already refuses a per-host commit statically (exit 2, names host + variable).
    static = write_inventory(lab, inv_dir / "static.ini", host_vars={"rpc-b": f"llama_commit={fixtures.side_commit}"})
    res = run(static, PLAYBOOK, "--tags", "source,build", timeout=120)
    assert res.rc == 2 and "rpc-b" in res.stderr and "llama_commit" in res.stderr, res.stderr
    # Without a Cluster (groups renamed) the hosts really diverge and the tree_hash gate stops the run.
    before = _build_dirs(lab)
    diverged = write_inventory(lab, inv_dir / "diverged.ini", cluster=False,
                               host_vars={"rpc-b": f"llama_commit={fixtures.side_commit}"})
    try:
        res = run(diverged, PLAYBOOK, "--tags", "source,build", timeout=600)
        assert res.rc == 1, res.stdout[-3000:]
        g = gate(res)
        assert g["status"] == "failed" and "stopping before any build" in g["msg"]
        rows = {line.split()[0]: line for line in g["msg"].splitlines()[2:] if line.startswith("  ")}
        tree_b = source_tree(lab, "rpc-b")
        assert fixtures.side_commit[:12] in rows["rpc-b"] and tree_b[:12] in rows["rpc-b"]
        assert "base commit" in rows["rpc-b"]
        assert "(reference)" in rows["main"] or "(reference)" in rows["rpc-a"]
        assert results(res, "llama_build") == {}, "a build task ran after the gate failed"
        assert all(res.recap[h]["failed"] == 1 for h in HOSTS), res.recap
        assert _build_dirs(lab) == before, "something was built"
    finally:
        res = run(inv, SOURCE_ONLY, timeout=600)
        assert res.rc == 0, failed_report(res)


def test_patch_that_does_not_apply_is_named_and_leaves_the_checkout_clean(lab, deployed, inv_dir, fixtures):
    inv, _ = deployed
    base_tree = source_tree(lab, "main")
    (inv_dir / "patches").mkdir(exist_ok=True)
    (inv_dir / "patches" / "bad.patch").write_text(
        "diff --git a/README.md b/README.md\n--- a/README.md\n+++ b/README.md\n@@ -1,2 +1,3 @@\n"
        " this line is not in the file\n and neither is this one\n+so the patch cannot apply\n")
    bad = write_inventory(lab, inv_dir / "bad.ini", ['llama_patches=[{"file": "patches/bad.patch"}]'])
    res = run(bad, SOURCE_ONLY, timeout=600)
    assert res.rc == 1
    for h, r in results(res, "llama_source").items():
        assert r["status"] == "failed" and "bad.patch" in r["msg"] and h in r["msg"], r
    for h in HOSTS:
        assert sh(lab, h, 'cd "$1/src/llama.cpp" && git status --porcelain && ls .git/CHERRY_PICK_HEAD 2>/dev/null;'
                          ' true', ROOT) == ""

    # A cherry-pick that conflicts (a file patch touches the same lines as the side branch commit)
    # is aborted: clean checkout, error naming the patch.
    (inv_dir / "patches" / "tail.patch").write_text(
        _append_patch(sh(lab, "main", 'tail -n 3 "$1/src/llama.cpp/README.md"', ROOT),
                      sh(lab, "main", 'wc -l < "$1/src/llama.cpp/README.md"', ROOT)))
    conflict = write_inventory(lab, inv_dir / "conflict.ini", [
        'llama_patches=[{"file": "patches/tail.patch"}, {"remote": "%s", "ref": "%s", "commit": "%s"}]'
        % (fixtures.repo, fixtures.side_branch, fixtures.side_commit)])
    res = run(conflict, SOURCE_ONLY, timeout=600)
    assert res.rc == 1
    for h, r in results(res, "llama_source").items():
        assert r["status"] == "failed" and "does not apply" in r["msg"] and fixtures.side_commit[:10] in r["msg"], r
    for h in HOSTS:
        assert sh(lab, h, 'cd "$1/src/llama.cpp" && git status --porcelain && ls .git/CHERRY_PICK_HEAD 2>/dev/null;'
                          ' true', ROOT) == ""

    # The side-branch commit alone applies: a commit from another remote, reproducible everywhere.
    remote = write_inventory(lab, inv_dir / "remote.ini", [
        'llama_patches=[{"remote": "%s", "ref": "%s", "commit": "%s"}]'
        % (fixtures.repo, fixtures.side_branch, fixtures.side_commit)])
    res = run(remote, SOURCE_ONLY, timeout=600)
    assert res.rc == 0, failed_report(res)
    trees = {source_tree(lab, h) for h in HOSTS}
    assert len(trees) == 1 and base_tree not in trees

    # And the next plain run proceeds back to the pinned commit.
    res = run(inv, SOURCE_ONLY, timeout=600)
    assert res.rc == 0, failed_report(res)
    assert {source_tree(lab, h) for h in HOSTS} == {base_tree}


def _append_patch(tail: str, count: str) -> str:
    """A patch appending a line at the end of README.md (where the side branch appends too)."""
    lines = tail.splitlines()
    n = int(count.strip())
    start = n - len(lines) + 1
    body = "".join(f" {line}\n" for line in lines)
    return (f"diff --git a/README.md b/README.md\n--- a/README.md\n+++ b/README.md\n"
            f"@@ -{start},{len(lines)} +{start},{len(lines) + 1} @@\n{body}+tunnelspec conflicting line\n")


def test_pr_head_cherry_pick_is_reproducible(lab, deployed, inv_dir, fixtures):
    """`{pr, commit}`: fetch refs/pull/N/head from origin, cherry-pick the pinned commit. GitHub is
    not reachable here, so each host gets a real bare clone of the fixture repo that carries a
    refs/pull/7/head ref (as GitHub publishes them) pointing at the side-branch commit."""
    inv, _ = deployed
    base_tree = source_tree(lab, "main")
    pr_repo = "/var/tmp/tunnelspec-pr-test.git"
    for h in HOSTS:
        sh(lab, h, 'rm -rf -- "$1" && git clone -q --bare "$2" "$1" && git -C "$1" update-ref refs/pull/7/head "$3"'
                   ' && git -C "$1" branch -q -D "$4"', pr_repo, fixtures.repo, fixtures.side_commit,
           fixtures.side_branch)
    try:
        pr = write_inventory(lab, inv_dir / "pr.ini", [f'llama_patches=[{{"pr": 7, "commit": "{fixtures.side_commit}"}}]'])
        pr.write_text(pr.read_text().replace(f"llama_repo={fixtures.repo}", f"llama_repo={pr_repo}"))
        res = run(pr, SOURCE_ONLY, timeout=600)
        assert res.rc == 0, failed_report(res)
        heads = {sh(lab, h, 'git -C "$1/src/llama.cpp" log -1 --format="%H %cn %cd"', ROOT).strip() for h in HOSTS}
        assert len(heads) == 1, heads  # fixed committer identity and date: the same commit SHA everywhere
        assert {source_tree(lab, h) for h in HOSTS} != {base_tree}
        again = run(pr, SOURCE_ONLY, timeout=600)
        assert again.rc == 0 and all(again.recap[h]["changed"] == 0 for h in HOSTS), again.recap
    finally:
        res = run(inv, SOURCE_ONLY, timeout=600)
        assert res.rc == 0, failed_report(res)
        for h in HOSTS:
            sh(lab, h, 'rm -rf -- "$1"', pr_repo)
    assert {source_tree(lab, h) for h in HOSTS} == {base_tree}


def test_old_builds_are_pruned_least_recently_used_first(lab, deployed):
    """keep_builds: after a switch only the newest dirs stay — never the current one, one a
    tunnelspec unit still runs from, or one another run is building (flock held). Last in the module:
    it removes the other tests' builds on main."""
    inv, _ = deployed
    base = current(lab, "main")
    key = base.rsplit("/", 1)[1]
    build = f"{ROOT}/build"
    unit = "/etc/systemd/system/tunnelspec-test-prune.service"
    sh(lab, "main", """
set -e
cd "$1"
for d in oldaaaa oldbbbb oldcccc oldddd; do mkdir -p $d/bin; echo '{}' > $d/.tunnelspec-stamp; done
touch -d '2 days ago' oldaaaa/.tunnelspec-stamp
touch -d '3 days ago' oldbbbb/.tunnelspec-stamp oldcccc/.tunnelspec-stamp
touch oldddd/.tunnelspec-used
printf '[Service]\\nExecStart=%s/oldbbbb/bin/x\\n' "$1" > "$2"
""", build, unit)
    holder = ["systemd-run", "-q", "--unit", "tunnelspec-test-prune-lock", "flock", f"{build}/oldcccc.lock", "sleep", "120"]
    assert lab.exec("main", holder).returncode == 0
    try:
        deadline = time.monotonic() + 10
        while "oldcccc.lock" not in sh(lab, "main", "ls -1 \"$1\"", build) and time.monotonic() < deadline:
            time.sleep(0.2)   # bounded: until the holder has the lock
        sh(lab, "main", 'ln -sfn /nonexistent "$1/current"', ROOT)      # so the build task switches back
        res = run(inv, PLAYBOOK, "--tags", "source,build", "--limit", "main", "-e", "llama_keep_builds=2", timeout=600)
        assert res.rc == 0, failed_report(res)
        ev = results(res, "llama_build")["main"]
        assert ev["status"] == "changed" and "no compile" in ev["msg"], ev
        left = set(sh(lab, "main", 'cd "$1" && for d in */; do echo "${d%/}"; done', build).split())
        assert left == {key, "oldddd", "oldbbbb", "oldcccc"}, left
        assert current(lab, "main") == base
        removed = [e["msg"] for e in res.events if e.get("event") == "progress" and e["msg"].startswith("removed old")]
        assert removed and "oldaaaa" in removed[0], removed
        again = run(inv, PLAYBOOK, "--tags", "source,build", "--limit", "main", "-e", "llama_keep_builds=2", timeout=600)
        assert again.rc == 0 and again.recap["main"]["changed"] == 0, again.recap
        assert set(sh(lab, "main", 'cd "$1" && for d in */; do echo "${d%/}"; done', build).split()) == left
    finally:
        lab.exec("main", ["systemctl", "stop", "tunnelspec-test-prune-lock"])
        sh(lab, "main", 'rm -rf -- "$1"/oldaaaa "$1"/oldbbbb "$1"/oldcccc "$1"/oldddd "$1"/old*.lock "$2"; '
                        '[ -e "$3/current" ] || ln -sfn "$4" "$3/current"', build, unit, ROOT, base)
