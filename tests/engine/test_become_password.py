"""The whole CLI with a sudo login that needs a password (ansible_become_password), against a real
sshd host, a real non-root user and real sudo (connection/become.py).

What is proved: the run (its run lock held through sudo, its task) runs as root; the password is
in none of the tool's output (human with -v, and --format json) and on no argv of any process of
the host while the task runs (`ps -eo args` sampled throughout); a wrong password is one clear
failure naming the host and the login, and runs nothing."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time

import pytest

from support.cli import tunnelspec

pytestmark = pytest.mark.skipif(sys.platform != "linux" or os.geteuid() != 0,
                                reason="needs root on Linux (real users, sudo)")

PASSWORD = "Cli-sudo-pw-4d2a"

PLAYBOOK = """
- name: become
  hosts: all
  tasks:
    - name: as root, for a while
      command:
        argv: [sh, -c, 'id -u > "$1"; sleep 2.5', sh, "{{ root }}/uid"]
        creates: "{{ root }}/uid"
"""


@pytest.fixture
def pw_host(tmp_path):
    from support.sudo_users import make_user, remove_user
    from support.sshd_harness import SshdCluster

    cluster = SshdCluster(tmp_path / "sshd", 1, user_keys=True)
    user = None
    try:
        user = make_user("password", cluster.client_pub, PASSWORD)
        yield cluster, user
    finally:
        cluster.stop()
        if user is not None:
            remove_user(user)


class PsSampler:
    """`ps -eo args` of this machine (the host) every 50 ms while a run goes on."""

    def __init__(self):
        self.samples: list[str] = []
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        while not self._stop.is_set():
            self.samples.append(subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout)
            time.sleep(0.05)

    def __enter__(self):
        self._t.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._t.join(5)


@pytest.mark.parametrize("fmt", ["human", "json"])
def test_password_login_runs_as_root_and_the_password_shows_nowhere(pw_host, tmp_path, fmt):
    cluster, user = pw_host
    inv = cluster.inventory({"node0": {"ansible_user": user.name, "ansible_become": "true",
                                       "ansible_become_password": PASSWORD}})
    pb = tmp_path / "become.yml"
    pb.write_text(PLAYBOOK)
    args = ["--format", "json"] if fmt == "json" else ["-v"]
    with PsSampler() as ps:
        r = tunnelspec("play", str(inv), str(pb), *args, timeout=120)
    assert r.rc == 0, (r.stdout, r.stderr)
    assert (cluster.hosts[0].root / "uid").read_text().strip() == "0"
    assert PASSWORD not in r.stdout + r.stderr
    assert any("sleep 2.5" in s for s in ps.samples), "ps ran while the task ran"
    assert any("sudo -S -k -p" in s for s in ps.samples), "the commands ran under sudo -S"
    assert not any(PASSWORD in s for s in ps.samples)
    if fmt == "json":
        assert any(e.get("event") == "recap" for e in r.events)


def test_wrong_password_fails_naming_host_and_login(pw_host, tmp_path):
    cluster, user = pw_host
    wrong = "Wrong-pw-9e1b"
    inv = cluster.inventory({"node0": {"ansible_user": user.name, "ansible_become": "true",
                                       "ansible_become_pass": wrong}})
    pb = tmp_path / "become.yml"
    pb.write_text(PLAYBOOK)
    t0 = time.monotonic()
    r = tunnelspec("play", str(inv), str(pb), "--format", "json", timeout=120)
    assert time.monotonic() - t0 < 30
    assert r.rc == 1, (r.stdout, r.stderr)
    text = r.stdout + r.stderr
    assert "node0" in text and user.name in text and "rejected the become password" in text, text
    assert wrong not in text and PASSWORD not in text
    assert not (cluster.hosts[0].root / "uid").exists(), "nothing ran"
