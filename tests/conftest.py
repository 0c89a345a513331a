"""Shared pytest fixtures. Each section belongs to one part of the code; keep them apart."""

# --- lab fixture ------------------------------------------------------------------------------
# One lab (3 real hosts) for the whole session. If a lab is already up on the default bridge
# (someone ran `tunnelspec lab up`), it is reused and left running. TUNNELSPEC_KEEP_LAB=1 keeps
# the lab this session started, so the next run skips the boot.
import os
import sys

import pytest

# The one sys.path entry of the suite: tests/, so that the shared helpers import as `support.*`
# (tests/support/) from every test module; no test module imports another.
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def pytest_collection_modifyitems(config, items):
    """The upstream-builds matrix (tests/deploy/test_builds.py) last, in its own order: it leaves
    other trees' builds on the lab's hosts, and its first step reuses the default tree's build.
    `extended` modules are skipped unless TUNNELSPEC_EXTENDED=1: on a cold machine (no images, no
    ccache) they add ≈ 25 of the default run's minutes (docs/ci.md, "The extended run"). A run that
    names its tests (`-k EXPR`, or a module or node id as an argument) runs the extended ones it names."""
    if os.environ.get("TUNNELSPEC_EXTENDED") != "1" and not _names_its_tests(config):
        skip = pytest.mark.skip(reason="extended lab module: TUNNELSPEC_EXTENDED=1 (scripts/test-extended.sh) runs it")
        for i in items:
            if i.get_closest_marker("extended"):
                i.add_marker(skip)
    for i in items:
        i.add_marker(getattr(pytest.mark, tier_of(i)))
    last = [i for i in items if i.get_closest_marker("upstream_builds")]
    if last:
        items[:] = [i for i in items if not i.get_closest_marker("upstream_builds")] + last


def _names_its_tests(config) -> bool:
    """`-k` given, or an argument that is a test module or a node id (not a directory)."""
    if config.getoption("keyword", ""):
        return True
    return any("::" in a or a.split("::")[0].endswith(".py") for a in config.args)


# --- test tiers -------------------------------------------------------------------------------
# Every test gets one tier marker, from what it uses (docs/ci.md, "Test tiers"): `lab` (the
# systemd-nspawn hosts), `build` (a llama.cpp build on this machine, or a module marked `build`: it
# downloads from PyPI or installs a wheel), `sshd` (real sshd/sudo on
# 127.0.0.1), else `unit` (pure: no process of its own beyond short-lived tools).
# `bash scripts/test.sh --fast` runs the unit tier alone.
LAB_FIXTURES = {"lab", "lab_tools"}
BUILD_FIXTURES = {"llama_bin", "rpc_server", "llama_fixtures"}
SSHD_FIXTURES = {"sshd_cluster", "user_cluster", "sudo_user"}
_SSHD_SOURCE = ("sshd_harness", "start_sshd", "sudo_users", "SshdCluster")
_module_text: dict[str, str] = {}


def tier_of(item) -> str:
    names = set(getattr(item, "fixturenames", ()))
    if item.get_closest_marker("lab") or names & LAB_FIXTURES:
        return "lab"
    if item.get_closest_marker("llama") or item.get_closest_marker("build") or names & BUILD_FIXTURES:
        return "build"
    path = str(getattr(item, "path", "") or item.fspath)
    if path not in _module_text:
        try:
            with open(path, encoding="utf-8") as f:
                _module_text[path] = f.read()
        except OSError:
            _module_text[path] = ""
    if names & SSHD_FIXTURES or any(w in _module_text[path] for w in _SSHD_SOURCE):
        return "sshd"
    return "unit"


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item):
    """A unit-tier test's `tunnelspec …` runs (support/cli.py) go through the fork server
    (support/zygote.py): the same CLI code, without an interpreter start and imports per run."""
    from support import cli

    cli.FORK = item.get_closest_marker("unit") is not None
    try:
        yield
    finally:
        cli.FORK = False
# --- end of test tiers ---------------------------------------------------------------------------


LAB_TEST_DIR = os.environ.get("TUNNELSPEC_LAB_DIR", "/var/tmp/tunnelspec-test-lab")
LAB_TEST_HOSTS = ("main", "rpc-a", "rpc-b")


@pytest.fixture(scope="session")
def lab():
    if sys.platform != "linux" or os.geteuid() != 0:
        pytest.skip("the lab needs root on Linux")
    from tunnelspec.lab import DEFAULT_BRIDGE, Lab
    from tunnelspec.lab import state as lab_state

    existing = lab_state.load(DEFAULT_BRIDGE)
    if existing is not None and os.environ.get("TUNNELSPEC_LAB_DIR") is None:
        the_lab = Lab(existing["dir"])
        # Every host running: used as it is. `up` would also set every host's link up again — and
        # a link may be cut on purpose right now by a fault test of another session (which holds the
        # lab's lock; tests/deploy/test_degraded_lab.py).
        if not all(h.running for h in the_lab.status()) or len(the_lab.status()) != len(existing["order"]):
            the_lab.up(existing["order"])
        yield the_lab
        return
    the_lab = Lab(LAB_TEST_DIR)
    the_lab.up(LAB_TEST_HOSTS)
    yield the_lab
    if os.environ.get("TUNNELSPEC_KEEP_LAB") != "1":
        the_lab.down()


@pytest.fixture(scope="session")
def lab_tools(lab):
    """The lab's hosts with tunnelspec's prerequisites (python3, gcc, ccache, ...): the images are bare,
    as a fresh server is, so a test that runs those tools on a host says so by using this fixture.
    The deploy's own prerequisites play installs them (a no-op when a deploy already did)."""
    import subprocess

    from tunnelspec.engine.playbook import builtin_playbook

    r = subprocess.run([sys.executable, "-m", "tunnelspec", "play", str(lab.inventory),
                        str(builtin_playbook("prerequisites.yml"))], capture_output=True, text=True,
                       timeout=1800, stdin=subprocess.DEVNULL)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]
    return lab
# --- end of lab fixture -----------------------------------------------------------------------


# --- llama build fixture ----------------------------------------------------------------------
# The fixture repo/model and a CPU build of ggml-rpc-server + llama-server from it, made once per
# machine and reused (stamp). The first build takes ≈ 8 min on 2 cores: start it ahead of the test
# run with `cd tests && python3 -m support.devbuild`.
@pytest.fixture(scope="session")
def llama_fixtures():
    from tunnelspec.lab.fixtures import ensure_fixtures

    return ensure_fixtures()


@pytest.fixture(scope="session")
def llama_bin(llama_fixtures):
    """DevBuild: .rpc_server, .llama_server (absolute paths), .bin_dir, .commit, .source_dir."""
    from support.devbuild import ensure_dev_build

    return ensure_dev_build(llama_fixtures)


@pytest.fixture
def rpc_server(llama_bin, tmp_path):
    """A real ggml-rpc-server on 127.0.0.1:<free port>, ready (HELLO answered); stopped by PID."""
    from support.localserver import free_port, start_rpc_server

    proc = start_rpc_server(llama_bin.rpc_server, free_port(), tmp_path / "rpc-server.log")
    yield proc
    proc.stop()
# --- end of llama build fixture ---------------------------------------------------------------


# --- sshd fixture -----------------------------------------------------------------------------
# Real OpenSSH sshd hosts on 127.0.0.1 (tests/support/sshd_harness.py). Owned by the engine tests.
os.environ.setdefault("NO_COLOR", "1")


@pytest.fixture
def sshd_cluster(tmp_path):
    """Factory: sshd_cluster(n) → SshdCluster with n real sshd hosts on 127.0.0.1."""
    from support.sshd_harness import SshdCluster

    made = []

    def make(n: int = 1, prefix: str = "node"):
        c = SshdCluster(tmp_path / f"sshd-{len(made)}", n, prefix)
        made.append(c)
        return c

    yield make
    for c in made:
        c.stop()
# --- end of sshd fixture ----------------------------------------------------------------------
