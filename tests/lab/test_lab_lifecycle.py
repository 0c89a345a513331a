"""A lab's whole life: up, reboot inside a host, down leaving nothing behind, down again."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tunnelspec.core.errors import LabError
from tunnelspec.lab import Lab, cgroups, host, prereq, state

from support import polling

# A second, one-host lab beside the session's lab: its own bridge and a sub-range of the lab net.
SMALL_BRIDGE = "tslab9"
SMALL_SUBNET = "10.77.0.128/25"


poll = polling.poller(60.0, 0.2)


def test_missing_tools_error_gives_the_apt_line(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))  # really absent from PATH, not mocked
    with pytest.raises(LabError) as err:
        prereq.check_tools()
    assert prereq.APT_LINE in str(err.value)
    assert "systemd-nspawn" in str(err.value)


def _nspawn_processes(machine: str) -> list[int]:
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if f"--machine={machine}".encode() in cmdline:
            found.append(int(pid))
    return found


def _boot_id(lab: Lab, name: str) -> str:
    try:
        res = lab.exec(name, ["cat", "/proc/sys/kernel/random/boot_id"], timeout=10)
    except (LabError, subprocess.TimeoutExpired):
        return ""
    return res.stdout.strip()


def _system_state(lab: Lab, name: str) -> str:
    try:
        return lab.exec(name, ["systemctl", "is-system-running"], timeout=10).stdout.strip()
    except (LabError, subprocess.TimeoutExpired):
        return ""


REBOOT_BOUND = 300.0


def _not_back(lab: Lab, rec: dict, supervisor: int) -> str:
    """Why a host is not back from a reboot: the supervisor, the container's init, nspawn's log."""
    log = Path(rec["root"]).parent / "nspawn.log"
    tail = log.read_text(errors="replace")[-3000:] if log.exists() else "(no nspawn.log)"
    return (f"host did not come back within {REBOOT_BOUND:g} s: supervisor {supervisor} "
            f"{'alive' if host.alive(supervisor) else 'gone'}, init {host.container_init(supervisor)}, "
            f"system state {_system_state(lab, 'solo')!r}; nspawn.log:\n{tail}")


@pytest.mark.lab
def test_small_lab_reboots_and_down_leaves_nothing(tmp_path):
    if sys.platform != "linux" or os.geteuid() != 0:
        pytest.skip("the lab needs root on Linux")
    lab = Lab(tmp_path / "small", subnet=SMALL_SUBNET, bridge=SMALL_BRIDGE, log=print)
    lab.down()  # a crashed earlier run of this test must not stand in the way
    try:
        lab.up(["solo"])
        assert lab.hosts == {"solo": "10.77.0.138"}
        rec = state.load(SMALL_BRIDGE)["hosts"]["solo"]
        root = Path(rec["root"])
        supervisor = rec["pid"]
        init = host.container_init(supervisor)
        # Everything we are about to check for absence exists now (the checks can fail).
        assert Path("/run/netns/tslab9-solo").exists()
        assert Path("/sys/class/net/tslab9").exists() and Path("/sys/class/net/tslab9v0").exists()
        assert os.path.ismount(root)
        assert host.alive(supervisor) and init and host.alive(init)
        assert _nspawn_processes("tslab9-solo")
        assert all(Path(p).is_dir() for p in rec["cgroups"])

        # A reboot inside the host ends nspawn with 133; the supervisor boots it again.
        # Booted before asked to reboot (a stop job queued behind start jobs waits longer).
        assert poll(lambda: _system_state(lab, "solo") in ("running", "degraded"), REBOOT_BOUND)
        before = _boot_id(lab, "solo")
        started = time.monotonic()
        lab.exec("solo", ["systemctl", "reboot"])
        # A hang bound, not a speed check: a reboot is a shutdown and a boot, measured at 4-6 s on an
        # idle 2-core machine and well over a minute when other labs compile on both cores.
        assert poll(lambda: _boot_id(lab, "solo") not in ("", before), REBOOT_BOUND), _not_back(lab, rec, supervisor)
        assert poll(lambda: _system_state(lab, "solo") == "running", REBOOT_BOUND), _not_back(lab, rec, supervisor)
        print(f"reboot: back and running after {time.monotonic() - started:.1f} s")
        assert state.load(SMALL_BRIDGE)["hosts"]["solo"]["pid"] == supervisor

        # `up` again keeps a running host, refuses another host list, restarts a dead host.
        lab.up(["solo"])
        assert state.load(SMALL_BRIDGE)["hosts"]["solo"]["pid"] == supervisor
        with pytest.raises(LabError, match="lab down"):
            lab.up(["solo", "two"])
        rebooted_init = host.container_init(supervisor)
        os.killpg(supervisor, signal.SIGKILL)  # a crash: nspawn gone, the container orphaned
        assert poll(lambda: not host.alive(supervisor))
        lab.up(["solo"])
        restarted = state.load(SMALL_BRIDGE)["hosts"]["solo"]["pid"]
        assert restarted != supervisor and host.alive(restarted)
        assert not host.alive(rebooted_init)  # the orphan was ended from its cgroup
        assert _system_state(lab, "solo") == "running"
        init = host.container_init(restarted)
    finally:
        lab.down()

    assert not Path("/run/netns/tslab9-solo").exists()
    assert "tslab9" not in subprocess.run(["ip", "netns", "list"], capture_output=True,
                                          text=True).stdout
    assert not Path("/sys/class/net/tslab9").exists()
    assert not Path("/sys/class/net/tslab9v0").exists()
    assert str(root) not in Path("/proc/mounts").read_text()
    assert "tslab9-solo" not in Path("/proc/mounts").read_text()
    assert not host.alive(supervisor) and not host.alive(init)
    assert not host.alive(restarted)
    assert _nspawn_processes("tslab9-solo") == []
    assert not any(Path(p).exists() for p in rec["cgroups"])
    assert not any(h.joinpath(cgroups.PARENT, "tslab9-solo").exists()
                   for h in cgroups.hierarchies())
    assert state.load(SMALL_BRIDGE) is None
    assert not state.state_dir(SMALL_BRIDGE).exists()
    lab.down()  # safe to re-run

