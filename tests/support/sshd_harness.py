"""Real OpenSSH sshd instances on 127.0.0.1, one per test "host", each with its own host key
and a temp root for the files tasks write. No mocks: asyncssh talks to the real daemon."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

SSHD = shutil.which("sshd") or "/usr/sbin/sshd"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def keygen(path: Path, comment: str = "tunnelspec-test") -> str:
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(path)], check=True)
    return path.with_suffix(".pub").read_text().strip() if path.suffix else Path(str(path) + ".pub").read_text().strip()


@dataclass
class SshdHost:
    name: str
    port: int
    root: Path            # files written by tasks live under here
    host_key_pub: str
    proc: subprocess.Popen
    dir: Path

    def known_hosts_line(self) -> str:
        return f"[127.0.0.1]:{self.port} {self.host_key_pub}"

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)


def start_sshd(base: Path, name: str, client_pub: str, extra_config: tuple[str, ...] = (),
               setenv: dict | None = None, user_keys: bool = False) -> SshdHost:
    """`setenv`: more variables for the sessions (e.g. a PATH without some tool: a host lacking it);
    sshd takes the first SetEnv line only, so they join SHLVL's. `extra_config`: sshd_config lines
    appended. `user_keys`: also each user's own ~/.ssh/authorized_keys (sshd reads it as that user,
    who cannot read this root-only directory): a test logs in as a real non-root user by writing
    the client key there; its account must not be locked (UsePAM no: a `!` password refuses keys)."""
    d = base / name
    d.mkdir(parents=True)
    root = d / "root"
    root.mkdir()
    hk = d / "ssh_host_ed25519_key"
    pub = keygen(hk, name)
    ak = d / "authorized_keys"
    ak.write_text(client_pub + "\n")
    os.chmod(ak, 0o600)
    Path("/run/sshd").mkdir(exist_ok=True, mode=0o755)
    for _attempt in range(5):
        port = free_port()
        cfg = d / "sshd_config"
        cfg.write_text("\n".join([
            f"Port {port}", "ListenAddress 127.0.0.1", f"HostKey {hk}",
            f"AuthorizedKeysFile {ak}" + (" %h/.ssh/authorized_keys" if user_keys else ""),
            f"PidFile {d}/sshd.pid", "PermitRootLogin prohibit-password", "PasswordAuthentication no",
            "KbdInteractiveAuthentication no", "UsePAM no", "StrictModes no", "MaxStartups 100:30:200",
            "MaxSessions 100", "LogLevel ERROR", "AllowTcpForwarding yes",
            # root's ~/.bashrc on these machines runs `pyenv init` (~0.3 s) for every command sshd
            # runs through bash; SHLVL=1 makes Debian's bash skip it, like a login would.
            " ".join(["SetEnv SHLVL=1", *(f"{k}={v}" for k, v in (setenv or {}).items())]),
            *extra_config, ""]))
        proc = subprocess.Popen([SSHD, "-D", "-e", "-f", str(cfg)], stdout=subprocess.DEVNULL,
                                stderr=open(d / "sshd.log", "w"))
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=0.5) as s:
                    if s.recv(4).startswith(b"SSH-"):
                        return SshdHost(name, port, root, pub, proc, d)
            except OSError:
                time.sleep(0.05)
        if proc.poll() is None:
            proc.kill()
        proc.wait(5)
    raise RuntimeError(f"sshd for {name} did not start: {(d / 'sshd.log').read_text()}")


class SshdCluster:
    """N hosts + the files a user would have: a client key, known_hosts, an inventory."""

    def __init__(self, base: Path, n: int, prefix: str = "node", extra_config: tuple[str, ...] = (),
                 setenv: dict | None = None, user_keys: bool = False):
        self.base = base
        base.mkdir(parents=True, exist_ok=True)
        self.key = base / "id_ed25519"
        self.client_pub = keygen(self.key)
        self.hosts = [start_sshd(base, f"{prefix}{i}", self.client_pub, tuple(extra_config), setenv, user_keys)
                      for i in range(n)]
        self.known_hosts = base / "known_hosts"
        self.known_hosts.write_text("".join(h.known_hosts_line() + "\n" for h in self.hosts))

    def inventory(self, extra_host_vars: dict | None = None, group: str = "nodes", name: str = "inventory.ini",
                  all_vars: dict | None = None) -> Path:
        lines = [f"[{group}]"]
        for h in self.hosts:
            # tunnelspec_pending_dir: each "host" its own, not this machine's /var/lib/tunnelspec.
            hv = {"ansible_host": "127.0.0.1", "ansible_port": h.port, "ansible_user": "root",
                  "ansible_ssh_private_key_file": str(self.key), "root": str(h.root),
                  "tunnelspec_pending_dir": str(h.dir / "pending"),
                  **((extra_host_vars or {}).get(h.name, {}))}
            lines.append(h.name + " " + " ".join(f"{k}={v}" for k, v in hv.items()))
        # The run lock (engine/runlock.py) of these "hosts" is this machine's: one per cluster here,
        # so tests running at the same time in other clusters never wait for each other.
        lines += ["", "[all:vars]", f"tunnelspec_known_hosts={self.known_hosts}",
                  f"tunnelspec_lock_dir={self.base / 'run-lock'}"]
        lines += [f"{k}={v}" for k, v in (all_vars or {}).items()]
        p = self.base / name
        p.write_text("\n".join(lines) + "\n")
        return p

    def stop(self) -> None:
        for h in self.hosts:
            h.stop()
