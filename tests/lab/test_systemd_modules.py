"""The generic systemd and user modules against real systemd in a lab host: changed, then ok;
a changed unit reloads systemd and restarts the service (handlers); removal converges too."""

from __future__ import annotations

import time

import pytest

from support.cli import failed_report, tunnelspec

pytestmark = pytest.mark.lab

HOST = "rpc-b"
UNIT = "tunnelspec-modtest.service"

PLAY = """
- hosts: {host}
  tasks:
    - name: service user
      user: {{name: tunnelspec-modtest}}
    - name: unit file
      systemd_unit:
        name: {unit}
        content: |
          [Unit]
          Description=tunnelspec module test ({{{{ flavour }}}})
          [Service]
          User=tunnelspec-modtest
          ExecStart=/bin/sleep infinity
          [Install]
          WantedBy=multi-user.target
      notify: [reload, restart]
    - name: service running
      service: {{name: {unit}, state: started, enabled: true}}
  handlers:
    - name: reload
      daemon_reload: {{}}
    - name: restart
      service_restart: {{name: {unit}}}
"""

REMOVE = """
- hosts: {host}
  tasks:
    - systemd_unit_absent: {{name: {unit}}}
    - user: {{name: tunnelspec-modtest, state: absent}}
"""


def _statuses(res) -> dict:
    return {e["task"]: e["status"] for e in res.results()}


def _pid(lab) -> int:
    out = lab.exec(HOST, ["systemctl", "show", "-p", "MainPID", "--value", UNIT]).stdout.strip()
    return int(out or 0)


def test_systemd_and_user_modules_converge(lab, tmp_path):
    pb = tmp_path / "systemd.yml"
    pb.write_text(PLAY.format(host=HOST, unit=UNIT))
    rm = tmp_path / "remove.yml"
    rm.write_text(REMOVE.format(host=HOST, unit=UNIT))
    inv = str(lab.inventory)
    try:
        first = tunnelspec("play", inv, str(pb), "-e", "flavour=one", "--format", "json")
        assert first.rc == 0, failed_report(first)
        # The service task started the unit from its new file: the restart handler does not start it a
        # second time (service_restart, modules/systemd.py).
        assert _statuses(first) == {"service user": "changed", "unit file": "changed", "service running": "changed",
                                    "reload": "changed", "restart": "ok"}
        assert lab.exec(HOST, ["systemctl", "is-active", UNIT]).stdout.strip() == "active"
        assert lab.exec(HOST, ["systemctl", "is-enabled", UNIT]).stdout.strip() == "enabled"
        assert lab.exec(HOST, ["ps", "-o", "user=", "-p", str(_pid(lab))]).stdout.strip() == "tunnelspec-modtest"
        pid = _pid(lab)

        second = tunnelspec("play", inv, str(pb), "-e", "flavour=one", "--format", "json")
        assert second.rc == 0 and set(_statuses(second).values()) == {"ok"}, second.stdout
        assert _pid(lab) == pid  # nothing restarted

        third = tunnelspec("play", inv, str(pb), "-e", "flavour=two", "--format", "json")
        st = _statuses(third)
        assert third.rc == 0 and st["unit file"] == "changed" and st["restart"] == "changed", third.stdout
        assert _pid(lab) not in (0, pid)
        assert "flavour" not in lab.exec(HOST, ["systemctl", "cat", UNIT]).stdout
        assert "(two)" in lab.exec(HOST, ["systemctl", "cat", UNIT]).stdout

        gone = tunnelspec("play", inv, str(rm), "--format", "json")
        assert gone.rc == 0 and set(_statuses(gone).values()) == {"changed"}, gone.stdout
        again = tunnelspec("play", inv, str(rm), "--format", "json")
        assert again.rc == 0 and set(_statuses(again).values()) == {"ok"}, again.stdout
        assert lab.exec(HOST, ["getent", "passwd", "tunnelspec-modtest"]).returncode == 2
        assert lab.exec(HOST, ["test", "-e", f"/etc/systemd/system/{UNIT}"]).returncode == 1
    finally:
        tunnelspec("play", inv, str(rm), "--format", "json")


def test_broken_unit_is_never_installed(lab, tmp_path):
    pb = tmp_path / "broken.yml"
    pb.write_text(f"""
- hosts: {HOST}
  tasks:
    - systemd_unit:
        name: tunnelspec-broken.service
        content: |
          [Service]
          ExecStart=relative/path/is/invalid
""")
    res = tunnelspec("play", str(lab.inventory), str(pb), "--format", "json")
    assert res.rc == 1
    assert "systemd-analyze verify rejected" in res.results("failed")[0]["msg"]
    assert lab.exec(HOST, ["test", "-e", "/etc/systemd/system/tunnelspec-broken.service"]).returncode == 1


def test_user_removal_waits_until_killed_processes_have_exited(lab_tools, tmp_path):
    """SIGKILL is asynchronous: a process still tearing down its memory counts as the user's, and
    userdel refuses ("currently used by process N"; a CI teardown failed so on the tunnel user).
    Here the user's process holds 1 GiB of written memory, which takes a while to free."""
    lab = lab_tools
    user = "tunnelspec-reaptest"
    add = tmp_path / "add.yml"
    add.write_text(f"- hosts: {HOST}\n  tasks:\n    - user: {{name: {user}}}\n")
    rm = tmp_path / "rm.yml"
    rm.write_text(f"- hosts: {HOST}\n  tasks:\n    - user: {{name: {user}, state: absent}}\n")
    inv = str(lab.inventory)
    try:
        assert tunnelspec("play", inv, str(add), "--format", "json").rc == 0
        hog = "import sys, time\nb = b'\\x01' * 2**30\nprint('ready', flush=True)\ntime.sleep(300)\n"
        # A unit of an earlier run of this test on the same lab (killed: failed) would refuse the name.
        lab.exec(HOST, ["systemctl", "reset-failed", "tunnelspec-reaptest"])
        assert lab.exec(HOST, ["systemd-run", "-q", "--unit", "tunnelspec-reaptest", "-p", f"User={user}",
                               "python3", "-c", hog]).returncode == 0
        for _ in range(100):                     # bounded: until the memory is written
            if "ready" in lab.exec(HOST, ["journalctl", "-o", "cat", "-u", "tunnelspec-reaptest"]).stdout:
                break
            time.sleep(0.1)
        gone = tunnelspec("play", inv, str(rm), "--format", "json")
        assert gone.rc == 0, failed_report(gone)
        assert lab.exec(HOST, ["getent", "passwd", user]).returncode == 2
    finally:
        lab.exec(HOST, ["systemctl", "stop", "tunnelspec-reaptest"])
        # Its process was killed with its user: the unit stays failed (the host "degraded") unless reset.
        lab.exec(HOST, ["systemctl", "reset-failed", "tunnelspec-reaptest"])
        tunnelspec("play", inv, str(rm), "--format", "json")
