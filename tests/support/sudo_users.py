"""Real non-root users with real sudoers entries for the become tests, removed afterwards.

Each user gets a unique name, a home with the test cluster's client key in ~/.ssh/authorized_keys
(the sshd harness with `user_keys=True` reads it), and one of three sudo policies: NOPASSWD, a
password (set with chpasswd, on its stdin), or no sudoers entry at all."""

from __future__ import annotations

import os
import pwd
import secrets
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

SUDOERS_DIR = Path("/etc/sudoers.d")


def require_sudo() -> None:
    if os.geteuid() != 0 or not shutil.which("useradd"):
        pytest.skip("needs root (real users with sudoers entries)")
    if not shutil.which("sudo") or not SUDOERS_DIR.is_dir():
        pytest.skip("needs sudo on this machine (apt-get install sudo)")


@dataclass
class TestUser:
    name: str
    uid: int
    home: Path
    password: str | None
    policy: str

    __test__ = False      # not a test class for pytest


def make_user(policy: str, client_pub: str | None = None, password: str | None = None) -> TestUser:
    """policy: "nopasswd" (NOPASSWD: ALL), "password" (ALL, sudo asks for the password), "partial"
    (only `true`, with the password: a sudoers rule for some commands) or "none"."""
    require_sudo()
    name = "tsb" + secrets.token_hex(4)
    subprocess.run(["useradd", "--create-home", "--shell", "/bin/bash", name], check=True)
    if password is not None:
        subprocess.run(["chpasswd"], input=f"{name}:{password}\n", text=True, check=True)
    else:
        subprocess.run(["usermod", "-p", "*", name], check=True)   # unlocked (sshd refuses "!"), no password
    pw = pwd.getpwnam(name)
    home = Path(pw.pw_dir)
    if client_pub:
        ssh = home / ".ssh"
        ssh.mkdir(mode=0o700, exist_ok=True)
        (ssh / "authorized_keys").write_text(client_pub + "\n")
        for p in (ssh, ssh / "authorized_keys"):
            os.chown(p, pw.pw_uid, pw.pw_gid)
        os.chmod(ssh / "authorized_keys", 0o600)
    if policy != "none":
        allowed = "/usr/bin/true, /bin/true" if policy == "partial" else "ALL"
        rule = f"{name} ALL=(ALL:ALL) {'NOPASSWD: ' if policy == 'nopasswd' else ''}{allowed}\n"
        path = SUDOERS_DIR / f"tunnelspec-test-{name}"
        tmp = path.with_name(path.name + ".new")     # sudo skips names with a dot
        tmp.write_text(rule)
        os.chmod(tmp, 0o440)
        subprocess.run(["visudo", "-cqf", str(tmp)], check=True)
        tmp.rename(path)
    return TestUser(name, pw.pw_uid, home, password, policy)


def processes_of(uid: int) -> list[int]:
    out = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                if d.stat().st_uid == uid:
                    out.append(int(d.name))
            except OSError:
                continue
    return out


def remove_user(user: TestUser) -> None:
    (SUDOERS_DIR / f"tunnelspec-test-{user.name}").unlink(missing_ok=True)
    # Processes this test started as the user (its sshd sessions), each by its pid.
    for _ in range(20):
        pids = processes_of(user.uid)
        if not pids:
            break
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(0.1)
    subprocess.run(["userdel", "--force", "--remove", user.name], capture_output=True)
    subprocess.run(["rm", "-rf", f"/var/lib/sudo/lectured/{user.name}", f"/run/sudo/ts/{user.name}"])
