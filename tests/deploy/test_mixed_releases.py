"""Hosts as users have them: three Debian releases in one cluster — main on trixie
(OpenSSH 10, systemd 257, gcc 14), rpc-a on bullseye (OpenSSH 8.4, systemd 247, gcc 10), rpc-b on
bookworm —, bare (no build toolchain in the images), logged in as a sudoer whose sudo asks for a
password given with `-e @FILE`. The deploy installs each host's prerequisites from the lab's
package repository (Debian's own signed files served on the lab bridge) and serves the draft on
RPC0 through the tunnel; the password appears nowhere.

Its own lab (bridge tsmix0, 10.77.5.0/24), so the session's shared lab is not touched. One test,
in steps: each step needs the one before (a bare host first, then deployed, rotated, torn down).
"""

from __future__ import annotations

import re
import secrets
import threading
import time

import pytest

from support.cli import failed_report, tunnelspec

pytestmark = [pytest.mark.lab, pytest.mark.extended]  # two more release images and gcc 10/14 builds, cold

RELEASES = {"main": "trixie", "rpc-a": "bullseye", "rpc-b": "bookworm"}
EXPECT = {  # what the facts must detect on each release (Debian's packages, 2026-12)
    "main": {"os_version": "13", "openssh": (10, 0), "systemd": 257, "gcc": 14},
    "rpc-a": {"os_version": "11", "openssh": (8, 4), "systemd": 247, "gcc": 10},
    "rpc-b": {"os_version": "12", "openssh": (9, 2), "systemd": 252, "gcc": 12},
}
USER = "ops"
RPC_PORT = 50052
TUNNEL_PORTS = (15052, 15053)
KEY = "/etc/tunnelspec/tunnel/id_ed25519"
KNOWN = "/etc/tunnelspec/tunnel/known_hosts"
DEPLOY_TIMEOUT = 3600
CONNECT = r"""
import socket, sys
s = socket.socket(); s.settimeout(5)
try:
    s.connect(("127.0.0.1", int(sys.argv[1]))); print("ok")
except ConnectionRefusedError:
    print("ECONNREFUSED")
except Exception as e:
    print(type(e).__name__)
"""


@pytest.fixture(scope="module")
def mixed(tmp_path_factory):
    from tunnelspec.lab import Lab

    password = "pw-" + secrets.token_urlsafe(18)
    lab = Lab(tmp_path_factory.mktemp("mixed"), subnet="10.77.5.0/24", bridge="tsmix0")
    lab.up(list(RELEASES), releases=RELEASES, login_user=USER, login_password=password)
    pw_file = lab.dir / "become.yml"
    pw_file.write_text(f"ansible_become_password: {password}\n")
    pw_file.chmod(0o600)
    try:
        yield lab, password, pw_file
    finally:
        lab.down()


def run_cli(outputs: list, *args, timeout=DEPLOY_TIMEOUT):
    r = tunnelspec(*args, timeout=timeout)
    outputs.append(r.stdout + r.stderr)
    return r


def sh(lab, host, *argv, timeout=60):
    return lab.exec(host, list(argv), timeout=timeout)


class ProcessWatch:
    """Every command line seen on the hosts while a run goes on (`ps -eo args` every 0.3 s)."""

    def __init__(self, lab):
        self.lab, self.seen, self._stop = lab, set(), threading.Event()
        self._t = threading.Thread(target=self._loop, daemon=True)

    def _loop(self):
        for _ in range(20000):
            if self._stop.is_set():
                return
            for host in RELEASES:
                try:
                    self.seen.update(sh(self.lab, host, "ps", "-eo", "args", timeout=20).stdout.splitlines())
                except Exception:  # noqa: BLE001 - a host busy for a moment: the next look sees it
                    pass
            time.sleep(0.3)

    def __enter__(self):
        self._t.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._t.join(30)


def test_mixed_releases_bare_hosts_as_a_sudoer_with_a_password(mixed, tmp_path):
    lab, password, pw_file = mixed
    inv = str(lab.inventory)
    pw = f"@{pw_file}"
    outputs: list[str] = []
    assert f"ansible_user={USER}" in lab.inventory.read_text() and "ansible_become=true" in lab.inventory.read_text()

    # 1. The facts, read-only: each release detected as it is; --check lists the packages to install.
    chk = run_cli(outputs, "deploy", inv, "-e", pw, "--check", "--format", "json")
    assert chk.rc == 3, chk.stdout[-4000:] + chk.stderr[-2000:]
    facts = {e["host"]: e["msg"] for e in chk.results() if e["module"] == "host_facts"}
    print("\nfacts:\n" + "\n".join(f"  {h}: {m}" for h, m in facts.items()))
    for host, want in EXPECT.items():
        msg = facts[host]
        assert f"Debian GNU/Linux {want['os_version']} ({RELEASES[host]})" in msg, msg
        assert f"systemd {want['systemd']}" in msg and f"OpenSSH {want['openssh'][0]}.{want['openssh'][1]}" in msg, msg
        assert "gcc" not in msg, f"{host} is not bare: {msg}"
    planned = {e["host"]: e["msg"] for e in chk.results() if e["task"] == "prerequisites installed"}
    assert all("install git cmake make g++ ccache python3 nftables" in m for m in planned.values()), planned
    assert "haproxy" in planned["main"] and "openssh-server" not in planned["rpc-a"]

    # 2. A bare host that may not install packages: stopped before any change, naming what is missing.
    no = run_cli(outputs, "deploy", inv, "-e", pw, "-e", "tunnelspec_install_packages=false", "--format", "json")
    assert no.rc == 1, no.stdout[-3000:]
    failed = {e["host"]: e["msg"] for e in no.results("failed")}
    assert set(failed) == set(RELEASES), failed
    for host, msg in failed.items():
        assert "missing git, cmake, make, g++, ccache, python3, nft" in msg and "No host was changed" in msg, msg
    for host in RELEASES:
        assert sh(lab, host, "test", "-e", "/opt/tunnelspec").returncode == 1, host
        assert sh(lab, host, "test", "-e", "/run/tunnelspec/run.lock").returncode == 1, host  # not even locked
        assert sh(lab, host, "dpkg", "-s", "git").returncode != 0, host

    # 3. The deploy: prerequisites installed, builds on three compilers, the draft on RPC0.
    with ProcessWatch(lab) as watch:
        t0 = time.monotonic()
        dep = run_cli(outputs, "deploy", inv, "-e", pw, "--format", "json")
        took = time.monotonic() - t0
    assert dep.rc == 0, failed_report(dep)
    print(f"\nmixed deploy from bare hosts: {took:.0f} s")
    for e in dep.results("changed"):
        if e["task"] in ("prerequisites installed", "llama.cpp binaries for the host's role"):
            print(f"  {e['host']}: {e['task']}: {e.get('duration', 0):.0f} s")
    installed = {e["host"] for e in dep.results("changed") if e["task"] == "prerequisites installed"}
    assert installed == set(RELEASES)
    ver = next(e for e in dep.results() if e["module"] == "llama_verify")
    m = re.search(r"draft_n=(\d+) draft_n_accepted=(\d+)", ver["msg"])
    assert ver["status"] == "ok" and m and int(m.group(2)) > 0, ver
    assert "RPC0" in ver["msg"], ver
    for host, want in EXPECT.items():
        gcc = sh(lab, host, "gcc", "-dumpversion").stdout.strip()
        assert gcc.split(".")[0] == str(want["gcc"]), (host, gcc)
    assert not any(password in line for line in watch.seen), "the password was on a host's process list"
    assert any("sudo" in line for line in watch.seen), "the watch saw no sudo command: it watched nothing"

    # 4. Nobody else on the hosts reaches an RPC or tunnel port (the probes above went through sudo).
    for host, port in [("rpc-a", RPC_PORT), ("rpc-b", RPC_PORT), ("main", TUNNEL_PORTS[0]), ("main", TUNNEL_PORTS[1])]:
        got = sh(lab, host, "setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups",
                 "python3", "-c", CONNECT, str(port)).stdout.strip()
        assert got == "ECONNREFUSED", (host, port, got)
        root = sh(lab, host, "python3", "-c", CONNECT, str(port)).stdout.strip()
        assert root in ("ok", "TimeoutError", "timeout"), (host, port, root)  # reachable for root (busy or not)

    # 5. keys rotate: the old key opens no tunnel on any release, the new one serves.
    old = sh(lab, "main", "sh", "-c", 'umask 077; t=$(mktemp /root/oldkey.XXXXXX); cat "$1" > "$t"; echo "$t"',
             "sh", KEY).stdout.strip()
    rot = run_cli(outputs, "keys", "rotate", inv, "-e", pw, "--format", "json")
    assert rot.rc == 0, failed_report(rot)
    for node in ("rpc-a", "rpc-b"):
        r = sh(lab, "main", "timeout", "8", "ssh", "-F", "none", "-i", old, "-l", "tunnelspec-tunnel",
               "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=yes", "-o", f"UserKnownHostsFile={KNOWN}",
               "-o", "IdentitiesOnly=yes", "-o", "ConnectTimeout=5", "-T", "-N", lab.hosts[node])
        assert r.returncode == 255 and "Permission denied" in r.stderr, (node, r.returncode, r.stderr)
    sh(lab, "main", "rm", "-f", old)
    for _ in range(40):
        v = run_cli(outputs, "verify", inv, "-e", pw, "--format", "json", timeout=300)
        if v.rc == 0:
            break
        time.sleep(3)
    assert v.rc == 0, failed_report(v)

    # 6. A second deploy changes nothing; status shows the facts.
    again = run_cli(outputs, "deploy", inv, "-e", pw, "--format", "json")
    assert again.rc == 0 and all(h["changed"] == 0 for h in again.recap.values()), again.results("changed")
    human = run_cli(outputs, "deploy", inv, "-e", pw)
    assert human.rc == 0, failed_report(human)

    # 7. The logs bundle and the journals hold no password.
    bundle = tmp_path / "bundle"
    lg = run_cli(outputs, "logs", inv, "-e", pw, "--output", str(bundle), timeout=600)
    assert lg.rc == 0, lg.stdout[-3000:] + lg.stderr[-2000:]
    files = [p for p in bundle.rglob("*") if p.is_file()]
    assert files and not any(password in p.read_text(errors="replace") for p in files)
    for host in RELEASES:
        j = sh(lab, host, "journalctl", "--no-pager", "-o", "cat", timeout=120).stdout
        assert password not in j and len(j) > 1000, host
    assert not any(password in o for o in outputs), "the password was printed"

    # 8. Teardown leaves nothing listening and no tunnelspec unit.
    td = run_cli(outputs, "teardown", inv, "-e", pw, "--format", "json")
    assert td.rc == 0, failed_report(td)
    for host in RELEASES:
        units = sh(lab, host, "systemctl", "list-units", "--all", "--plain", "--no-legend", "tunnelspec*").stdout
        assert units.strip() == "", (host, units)
        listening = sh(lab, host, "ss", "-Hltn").stdout
        assert not re.search(r":(50052|15052|15053|8080)\s", listening), (host, listening)
    assert not any(password in o for o in outputs)
