"""TCP connections to a run's first hosts, opened before the SSH machinery is even imported.

On every connection sshd forks, re-executes itself, loads its config and host keys, then sends its
banner: several milliseconds of the host's CPU before any SSH byte. A run opens the TCP connections
of its first play's first `--forks` hosts at its start, then imports asyncssh and sets up the rest
(≈ 0.15 s); meanwhile the hosts do that part on their own cores — or, in the lab and the benchmarks,
on the controller's other core. The SSH handshake then starts on the already-connected socket.

Conservative on purpose, because it decides where a packet goes before ssh_config is consulted:
- only IP-literal `ansible_host` addresses of `ssh` hosts (no DNS lookup here);
- not when the user's ssh_config could send the connection elsewhere or differently (any HostName,
  Port, ProxyJump, ProxyCommand, Match, Include, BindAddress, BindInterface or AddressFamily in
  ~/.ssh/config — the only file asyncssh reads);
- a socket is used only if its connect has already finished without error when the SSH connection
  is made; otherwise it is closed and the normal connect runs (with its timeout and retries), so
  an unreachable host costs nothing extra. Unused sockets are closed at the end of the run.
"""

from __future__ import annotations

import errno
import ipaddress
import os
import re
import select
import socket

_REROUTING = re.compile(
    r"^\s*(hostname|port|proxyjump|proxycommand|match|include|bindaddress|bindinterface|"
    r"addressfamily)\b",
    re.I | re.M,
)


def ssh_config_may_reroute(path: str = "~/.ssh/config") -> bool:
    try:
        with open(os.path.expanduser(path), encoding="utf-8", errors="replace") as f:
            return bool(_REROUTING.search(f.read()))
    except FileNotFoundError:
        return False
    except OSError:
        return True  # unreadable: cannot tell, so assume it might


class Preconnect:
    def __init__(self) -> None:
        self._socks: dict[tuple[str, int], socket.socket] = {}

    def start(self, targets) -> int:
        """Begin non-blocking connects to (address, port) pairs; returns how many were started."""
        for address, port in targets:
            if (address, port) in self._socks:
                continue
            try:
                ip = ipaddress.ip_address(address)
            except ValueError:
                continue
            s = socket.socket(socket.AF_INET6 if ip.version == 6 else socket.AF_INET, socket.SOCK_STREAM)
            s.setblocking(False)
            if s.connect_ex((address, port)) not in (0, errno.EINPROGRESS):
                s.close()
                continue
            self._socks[(address, port)] = s
        return len(self._socks)

    def take(self, address: str, port: int) -> socket.socket | None:
        """The connected socket for address:port, if its connect already succeeded; else None."""
        s = self._socks.pop((address, port), None)
        if s is None:
            return None
        poller = select.poll()  # not select(): descriptors above 1023 are fine
        poller.register(s, select.POLLOUT)
        ready = poller.poll(0)
        if not ready or s.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR) != 0:
            s.close()
            return None
        return s

    def close(self) -> None:
        for s in self._socks.values():
            s.close()
        self._socks.clear()

    def __len__(self) -> int:
        return len(self._socks)
