"""One lab host: an overlay of the image, booted by `systemd-nspawn --boot` in its own netns.

Each host lives under `<state>/<host>/`: `upper/`, `work/`, `root/` (the overlay mount),
`nspawn.log`. The nspawn process runs under a tiny `sh` supervisor in its own session, so the
recorded PID is also the process group to kill, and a reboot inside the host (nspawn exit 133)
boots it again.
"""

from __future__ import annotations

import os
import signal
import subprocess
from typing import TypeGuard
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

from tunnelspec.core.errors import LabError
from tunnelspec.lab import cgroups
from tunnelspec.lab.keys import ensure_keypair, write_private

# The ccache every lab host shares (bind-mounted). TUNNELSPEC_LAB_CCACHE points a lab at another
# directory: an empty one measures cold builds (benchmarks/builds.py).
CCACHE_DIR = Path(os.environ.get("TUNNELSPEC_LAB_CCACHE") or "/var/cache/tunnelspec/ccache")
FIXTURES_DIR = Path("/var/cache/tunnelspec/fixtures")
CCACHE_IN_HOST = "/var/cache/ccache"
FIXTURES_IN_HOST = "/srv/tunnelspec-fixtures"
MAX_REBOOTS = 50

# Re-runs nspawn only when the host asked for a reboot (exit 133); bounded like every loop.
SUPERVISE = (
    'n=0; while [ "$n" -lt ' + str(MAX_REBOOTS) + ' ]; do "$@"; rc=$?; '
    '[ "$rc" -eq 133 ] || exit "$rc"; n=$((n+1)); done; exit 133'
)


@dataclass
class HostStatus:
    """One lab host as `Lab.status()` reports it."""

    name: str
    ip: str
    pid: int | None
    running: bool
    system_state: str  # `systemctl is-system-running`, or "-" when the host is down
    link_up: bool


@dataclass
class HostSpec:
    name: str
    index: int
    ip: str
    netns: str
    machine: str  # unique across labs: names nspawn's /run/systemd/nspawn entries
    home: Path  # <state>/<host>


def is_mounted(path: Path) -> bool:
    return os.path.ismount(path)


def mount_overlay(spec: HostSpec, image: Path) -> Path:
    root = spec.home / "root"
    if is_mounted(root):
        return root
    for sub in ("upper", "work", "root"):
        (spec.home / sub).mkdir(parents=True, exist_ok=True)
    opts = f"lowerdir={image},upperdir={spec.home / 'upper'},workdir={spec.home / 'work'}"
    res = subprocess.run(
        ["mount", "-t", "overlay", "overlay", "-o", opts, str(root)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    if res.returncode != 0:
        raise LabError(f"host {spec.name}: overlay mount failed: {res.stdout.strip()}")
    return root


def unmount(path: Path) -> None:
    if is_mounted(path):
        subprocess.run(["umount", "--lazy", str(path)], check=False)


@dataclass(frozen=True)
class LoginUser:
    """A sudoer the lab's inventory logs in as (`lab up --login-user`), instead of root."""

    name: str
    password: str | None = None  # None: passwordless sudo (NOPASSWD)


def _chroot(root: Path, argv: list[str], input: str | None = None) -> None:
    res = subprocess.run(["chroot", str(root), *argv], input=input, capture_output=True, text=True)
    if res.returncode != 0:
        raise LabError(f"{argv[0]} in {root} failed: {res.stderr.strip()[-500:]}")


def add_login_user(root: Path, login: LoginUser, client_pub: str) -> None:
    """The login user in the host's tree (before boot): a home, the lab key, sudo rights."""
    if subprocess.run(["chroot", str(root), "getent", "passwd", login.name], capture_output=True).returncode != 0:
        _chroot(root, ["useradd", "--create-home", "--shell", "/bin/bash", login.name])
    if login.password is not None:
        # On stdin, never on an argv (chpasswd hashes it with the host's default method).
        _chroot(root, ["chpasswd"], input=f"{login.name}:{login.password}\n")
    rule = "ALL=(ALL:ALL) ALL" if login.password is not None else "ALL=(ALL:ALL) NOPASSWD: ALL"
    sudoers = root / "etc/sudoers.d" / f"tunnelspec-lab-{login.name}"
    sudoers.write_text(f"# tunnelspec lab: the login user\n{login.name} {rule}\n")
    sudoers.chmod(0o440)
    _chroot(root, ["install", "-d", "-m", "700", "-o", login.name, "-g", login.name, f"/home/{login.name}/.ssh"])
    keys = root / "home" / login.name / ".ssh" / "authorized_keys"
    keys.write_text(client_pub + "\n")
    keys.chmod(0o600)
    _chroot(root, ["chown", f"{login.name}:{login.name}", f"/home/{login.name}/.ssh/authorized_keys"])


def personalise(
    spec: HostSpec, root: Path, client_pub: str, apt_source: str = "", login: LoginUser | None = None
) -> str:
    """Own machine-id, hostname, host key, root's authorized_keys, the package source (the lab's
    repository on the bridge) and the login user; returns the host pub key."""
    key_path = spec.home / "ssh_host_ed25519_key"
    host_pub = ensure_keypair(key_path, f"root@{spec.name}")
    mid = spec.home / "machine-id"
    if not mid.exists():
        mid.write_text(uuid.uuid4().hex + "\n")
    (root / "etc/machine-id").write_text(mid.read_text())
    (root / "etc/hostname").write_text(spec.name + "\n")
    (root / "etc/hosts").write_text(
        f"127.0.0.1\tlocalhost\n{spec.ip}\t{spec.name}\n::1\tlocalhost ip6-localhost ip6-loopback\n"
    )
    write_private(root / "etc/ssh/ssh_host_ed25519_key", key_path.read_bytes())
    (root / "etc/ssh/ssh_host_ed25519_key.pub").write_text(host_pub + "\n")
    ssh_dir = root / "root/.ssh"
    ssh_dir.mkdir(mode=0o700, exist_ok=True)
    os.chmod(ssh_dir, 0o700)
    write_private(ssh_dir / "authorized_keys", (client_pub + "\n").encode())
    if apt_source:
        (root / "etc/apt/sources.list").write_text(
            "# tunnelspec lab: Debian's files, served on the lab bridge\n" + apt_source
        )
    if login is not None:
        add_login_user(root, login, client_pub)
    return host_pub


def nspawn_argv(spec: HostSpec, root: Path) -> list[str]:
    return [
        "systemd-nspawn",
        "--boot",
        "--quiet",
        f"--directory={root}",
        f"--machine={spec.machine}",
        f"--hostname={spec.name}",
        # No systemd on the controller: nothing to register with, no unit to move into.
        "--register=no",
        "--keep-unit",
        f"--network-namespace-path=/run/netns/{spec.netns}",
        "--resolv-conf=off",
        "--link-journal=no",
        "--console=passive",
        # Root inside the host may change its own firewall (tunnelspec's loopback isolation loads
        # nftables rules): the host has its own network namespace, so nothing of the machine's
        # network is reachable with it.
        "--capability=CAP_NET_ADMIN",
        f"--bind={CCACHE_DIR}:{CCACHE_IN_HOST}",
        f"--bind-ro={FIXTURES_DIR}:{FIXTURES_IN_HOST}",
    ]


def start(spec: HostSpec, root: Path, cgroup_paths: list[Path]) -> int:
    log = open(spec.home / "nspawn.log", "ab")
    paths = [str(p) for p in cgroup_paths]
    try:
        proc = subprocess.Popen(
            ["sh", "-c", SUPERVISE, "sh", *nspawn_argv(spec, root)],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=log,
            start_new_session=True,
            preexec_fn=lambda: cgroups.join(paths),
            close_fds=True,
        )
    finally:
        log.close()
    return proc.pid


def alive(pid: int | None) -> TypeGuard[int]:
    """The process `pid` runs (not a zombie); True also says `pid` is a pid, not None."""
    if not pid:
        return False
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


def supervisor_alive(pid: int | None, machine: str) -> bool:
    """Alive and really our supervisor: a PID read from a state file may have been reused by an
    unrelated process after a crash or a reboot of the machine, and must never be killed."""
    if not alive(pid):
        return False
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    return f"--machine={machine}".encode() in argv


def _children(pid: int) -> list[int]:
    kids: list[int] = []
    try:
        for tid in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{tid}/children") as f:
                kids.extend(int(x) for x in f.read().split())
    except OSError:
        pass
    return kids


def container_init(supervisor_pid: int) -> int | None:
    """The host's PID 1 as seen from the controller: the descendant whose NSpid ends in 1."""
    todo, seen = [supervisor_pid], 0
    while todo and seen < 64:
        pid = todo.pop()
        seen += 1
        try:
            with open(f"/proc/{pid}/status") as f:
                nspid = next((row.split()[1:] for row in f if row.startswith("NSpid:")), [])
        except OSError:
            continue
        if len(nspid) >= 2 and nspid[-1] == "1":
            return pid
        todo.extend(_children(pid))
    return None


def enter_argv(init_pid: int, argv: list[str]) -> list[str]:
    """Run argv inside the host (all its namespaces, its root), with a clean login-like env."""
    return [
        "nsenter",
        f"--target={init_pid}",
        "--mount",
        "--uts",
        "--ipc",
        "--net",
        "--pid",
        "--cgroup",
        "--root",
        "--wd",
        "env",
        "-i",
        "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        "HOME=/root",
        "LANG=C.UTF-8",
        "CCACHE_DIR=" + CCACHE_IN_HOST,
        *argv,
    ]


def request_poweroff(supervisor_pid: int | None) -> None:
    """Ask the host's systemd to power off; returns at once (nspawn then exits 0)."""
    init = container_init(supervisor_pid) if alive(supervisor_pid) else None
    if init:
        try:
            subprocess.run(
                enter_argv(init, ["systemctl", "poweroff", "--no-block"]),
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                timeout=20,
            )
        except subprocess.TimeoutExpired:
            pass  # a wedged host: the kill below ends it


def stop(supervisor_pid: int | None, cgroup_paths: list[str], deadline: float = 0.0) -> None:
    """Wait for the host to be gone until `deadline` (time.monotonic()), then kill whatever is
    left: the process group we started and every process in the host's cgroups."""
    while alive(supervisor_pid) and time.monotonic() < deadline:
        time.sleep(0.2)
    if alive(supervisor_pid):
        try:
            os.killpg(supervisor_pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    # Anything still in the host's cgroups (e.g. a crashed nspawn's payload) is ours to end.
    for _ in range(50):
        left = cgroups.pids(cgroup_paths)
        if not left:
            break
        for pid in left:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(0.1)
