"""A real non-CPU device in the lab: rpc-a made a Vulkan node with Mesa's lavapipe (a Vulkan
implementation on the CPU; `llvmpipe`), as a user's GPU box with its driver installed.

Its own two-host lab (bridge tsvk0, 10.77.7.0/24): main on Debian 12, rpc-a on Debian 13 — both
upstream trees use VK_EXT_layer_settings, which Debian 12's Vulkan headers (1.3.239) lack
(tunnelspec/llama/vulkan.py refuses such a node before configuring; tests/accel checks that).

The deploy installs the Vulkan build tools (glslc, libvulkan-dev, spirv-headers — the driver is the
user's, here the lab's `mesa-vulkan-drivers`), builds rpc-a's RPC server with GGML_VULKAN, and the
draft runs on RPC0 = rpc-a's Vulkan0 through the tunnel. Then the failures users meet: the build
tools missing with installs switched off (stopped before the build, naming glslc), and the driver
gone (its ICD files removed, the server restarted as after a reboot): the preflight warns, naming
the node and what brings a driver (`deploy --check` too), the server falls back to the CPU, and the
deploy refuses the node before llama-server changes, saying "serves CPU only"; and a
draft bigger than the memory the Vulkan device reports, refused with both figures."""

from __future__ import annotations

import json
import os
import re
import time

import pytest

from support.cli import failed_report, tunnelspec
from support.labdeploy import MODES, UNIT, converge, deploy, inventory_copy, main_pid, sh, verify_stats

RELEASES = {"main": "bookworm", "rpc-a": "trixie"}

pytestmark = pytest.mark.lab
NODE = "rpc-a"
RPC_UNIT = "tunnelspec-rpc.service"
ICD_DIR = "/usr/share/vulkan/icd.d"
ICD_AWAY = "/root/tunnelspec-test-icd-away"
APT = ["env", "DEBIAN_FRONTEND=noninteractive", "apt-get", "-q", "-y"]
BUILD_TOOLS = ("glslc", "libvulkan-dev", "spirv-headers")


def apt_install(lab, *pkgs: str) -> None:
    r = lab.exec(NODE, [*APT, "install", "--no-install-recommends", *pkgs], timeout=900)
    if r.returncode != 0:  # stale or empty lists on a fresh host
        lab.exec(NODE, [*APT, "update"], timeout=600)
        r = lab.exec(NODE, [*APT, "install", "--no-install-recommends", *pkgs], timeout=900)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]


def restore_icd(lab) -> None:
    sh(lab, NODE, "sh", "-c", f"if [ -d {ICD_AWAY} ]; then mv {ICD_AWAY}/* {ICD_DIR}/ && rmdir {ICD_AWAY}; fi")


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    """This module's own lab (the session's `lab` fixture is not used here)."""
    from tunnelspec.lab import Lab

    vlab = Lab(tmp_path_factory.mktemp("vulkan-lab"), subnet="10.77.7.0/24", bridge="tsvk0")
    vlab.down()  # what a crashed earlier run left
    vlab.up(list(RELEASES), releases=RELEASES)
    try:
        yield vlab
    finally:
        vlab.down()


@pytest.fixture(scope="module")
def vulkan_node(lab, tmp_path_factory):
    """rpc-a with its Vulkan driver (lavapipe) installed and visible; the inventory that makes it a
    Vulkan node."""
    restore_icd(lab)
    apt_install(lab, "mesa-vulkan-drivers")
    # ggml-vulkan skips CPU-type Vulkan devices (llvmpipe) unless chosen by index.
    return inventory_copy(lab, tmp_path_factory.mktemp("vulkan"), name="vulkan.ini",
                          host_vars={NODE: "llama_backend=vulkan rpc_env=GGML_VK_VISIBLE_DEVICES=0"})


def test_build_tools_missing_with_installs_off_stop_before_the_build(lab, vulkan_node, tmp_path):
    lab.exec(NODE, ["dpkg", "-r", "glslc"], timeout=300)  # as on a node without the Vulkan build tools
    inv = inventory_copy(lab, tmp_path, name="vulkan-noinstall.ini",
                         host_vars={NODE: "llama_backend=vulkan tunnelspec_install_packages=false"})
    res = deploy(inv)
    assert res.rc != 0, failed_report(res)
    msgs = {e["host"]: e["msg"] for e in res.results("failed")}
    assert "glslc" in msgs.get(NODE, "") and "tunnelspec_install_packages=false" in msgs[NODE], failed_report(res)
    assert "No host was changed" in msgs[NODE], msgs[NODE]
    assert not [e for e in res.results() if e.get("module") in ("llama_source", "llama_build")], failed_report(res)
    assert sh(lab, NODE, "sh", "-c", "command -v glslc || echo absent").strip() == "absent"


@pytest.fixture(scope="module")
def vulkan_deployed(lab, vulkan_node):
    t0 = time.monotonic()
    res = deploy(vulkan_node)
    assert res.rc == 0, failed_report(res)
    print(f"\nvulkan deploy (rpc-a's RPC server built with GGML_VULKAN): {time.monotonic() - t0:.0f} s")
    return res


def test_draft_runs_on_the_vulkan_device(lab, vulkan_deployed):
    served = next(e for e in vulkan_deployed.results()
                  if e.get("module") == "rpc_served_devices" and e["host"] == NODE)
    assert served["status"] == "ok" and served["msg"].startswith(f"{NODE} serves Vulkan0 (llvmpipe"), served
    draft_n, accepted = verify_stats(vulkan_deployed)
    assert draft_n > 0 and accepted > 0
    journal = sh(lab, "main", "journalctl", "--no-pager", "-o", "cat", "-u", UNIT, "-n", "3000")
    assert "RPC0[127.0.0.1:15052] model buffer size" in journal, journal[-3000:]
    # The node's RPC server is a Vulkan build, and the tools that built it were installed by the deploy.
    node_journal = sh(lab, NODE, "journalctl", "--no-pager", "-o", "cat", "-u", RPC_UNIT, "-n", "400")
    assert "Vulkan0: llvmpipe" in node_journal, node_journal[-2000:]
    for pkg in BUILD_TOOLS:
        assert "Status: install ok installed" in sh(lab, NODE, "dpkg", "-s", pkg), pkg


def test_status_shows_rpc0_as_the_nodes_vulkan_device(lab, vulkan_node, vulkan_deployed):
    st = tunnelspec("status", str(vulkan_node), "--format", "json", timeout=120)
    assert st.rc == 0, failed_report(st)
    hosts = json.loads(st.stdout)["hosts"]
    (served,) = hosts[NODE]["rpc"]["served"]
    assert served["name"] == "Vulkan0" and served["description"].startswith("llvmpipe"), served
    assert served["total_mib"] > 0 and served["free_mib"] > 0, served
    human = tunnelspec("status", str(vulkan_node), timeout=120)
    assert re.search(r"devices RPC0 = Vulkan0 \(llvmpipe .*, \d+/\d+ MiB free\)", human.stdout), human.stdout
    print("\n" + human.stdout)


def driver_warnings(res) -> list[str]:
    return [e["msg"] for e in res.events if e.get("event") == "message" and e.get("msg", "").startswith("WARNING:")
            and "Vulkan driver" in e["msg"]]


def test_second_deploy_changes_nothing(lab, vulkan_node, vulkan_deployed):
    again = deploy(vulkan_node)
    assert again.rc == 0, failed_report(again)
    assert all(c["changed"] == 0 for c in again.recap.values()), (again.recap, again.results("changed"))
    assert driver_warnings(again) == []  # lavapipe's ICD is there: no driver warning


def test_driver_gone_is_refused_before_llama_server_changes(lab, vulkan_node, vulkan_deployed, tmp_path):
    """The driver's ICD files removed, as a broken driver upgrade leaves a node: the preflight warns
    (a driver may come before the server starts), the Vulkan build then finds no device and serves
    the CPU (with or without the device chosen by index). The deploy refuses the node in the rpc
    play, naming it, "serves CPU only" and what to check; llama-server on main is not restarted or
    rewritten by it."""
    unit, modes = sh(lab, "main", "systemctl", "cat", UNIT), sh(lab, "main", "cat", MODES)
    no_env = inventory_copy(lab, tmp_path, name="vulkan-no-env.ini", host_vars={NODE: "llama_backend=vulkan"})
    try:
        # Every manifest (Mesa's package has one per driver: lavapipe's and the GPU drivers'): no driver at all.
        sh(lab, NODE, "sh", "-c", f"mkdir -p {ICD_AWAY} && mv {ICD_DIR}/*.json {ICD_AWAY}/")
        chk = tunnelspec("deploy", str(no_env), "--check", timeout=600)
        warning = f"WARNING: {NODE}: llama_backend=vulkan but a Vulkan driver (an ICD manifest in {ICD_DIR}"
        assert warning in chk.stdout and "mesa-vulkan-drivers" in chk.stdout, chk.stdout[-4000:]
        # --no-rollback: what is shown is the deploy's own refusal; a failed deploy otherwise returns the
        # node to the last verified generation (docs/generations.md), restarting its server.
        res = deploy(no_env, "--no-rollback")
        assert res.rc != 0, failed_report(res)
        (said,) = driver_warnings(res)  # the preflight said it once, and did not refuse
        assert said.startswith(warning), said
        failed = {e["host"]: e for e in res.results("failed")}
        assert failed[NODE]["module"] == "rpc_served_devices", failed_report(res)
        msg = failed[NODE]["msg"]
        assert f"{NODE}: built for vulkan" in msg and "serves CPU only" in msg and "vulkaninfo" in msg, msg
        assert "GGML_VK_VISIBLE_DEVICES" in msg, msg  # the hint for CPU-type devices, among the causes
        print("\nrpc-a's RPC server without its driver:\n" + sh(lab, NODE, "journalctl", "--no-pager", "-o", "cat",
                                                               "-u", RPC_UNIT, "-n", "12"))
        assert failed["main"]["task"] == "every rpc node serves its devices", failed_report(res)
        assert not [e for e in res.results() if e.get("play") == "llama-server"], failed_report(res)
        # Not rewritten by the deploy. Its process may well be new: the node's server restarted under the
        # tunnel, and the draft watch serves without the draft (docs/degraded.md) — that is not the deploy.
        assert sh(lab, "main", "systemctl", "cat", UNIT) == unit and sh(lab, "main", "cat", MODES) == modes

        # The device chosen by index (rpc_env, as deployed) and still no driver: the same refusal.
        res = deploy(vulkan_node, "--no-rollback")
        assert res.rc != 0, failed_report(res)
        failed = {e["host"]: e for e in res.results("failed")}
        assert failed[NODE]["module"] == "rpc_served_devices" and "serves CPU only" in failed[NODE]["msg"], \
            failed_report(res)
        assert sh(lab, "main", "systemctl", "cat", UNIT) == unit and sh(lab, "main", "cat", MODES) == modes
    finally:
        restore_icd(lab)
        converge(vulkan_node)


def test_draft_bigger_than_the_device_is_refused_with_both_figures(lab, vulkan_node, vulkan_deployed, tmp_path):
    """A 30 GiB draft (a well-formed GGUF, sparse on disk) against lavapipe's heap (3/4 of the
    machine's memory, as the device reports it): refused on main before llama-server restarts."""
    from tunnelspec.lab.fixtures import FIXTURES_DIR, HOST_MOUNT
    from tunnelspec.lab.gguf_tiny import write_sparse_llama

    rel = "test-models/huge-draft.gguf"
    local = f"{FIXTURES_DIR}/{rel}"
    write_sparse_llama(local, 30 * 2**30)
    pid, unit = main_pid(lab), sh(lab, "main", "systemctl", "cat", UNIT)
    try:
        inv = tmp_path / "huge-draft.ini"
        inv.write_text(re.sub(r"^llama_draft_model=.*$", f"llama_draft_model={HOST_MOUNT}/{rel}",
                              vulkan_node.read_text(), flags=re.M))
        res = deploy(inv)
        assert res.rc != 0, failed_report(res)
        ev = next((e for e in res.results("failed") if e.get("module") == "model_fit"), None)
        assert ev and ev["host"] == "main", failed_report(res)
        msg = ev["msg"]
        assert msg.startswith(f"{NODE}: the draft does not fit: the draft needs 307") and "MiB" in msg, msg
        assert re.search(rf"{NODE} reports \d+ MiB free \(Vulkan0 \d+ MiB free of \d+ MiB\)", msg), msg
        assert main_pid(lab) == pid and sh(lab, "main", "systemctl", "cat", UNIT) == unit
    finally:
        os.unlink(local)
