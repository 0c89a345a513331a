"""The places on the hosts that a service user can write (SECURITY.md, invariant A).

Root never follows, reads, writes, chmods, chowns or executes a path inside one of these: the user
that owns it (code running as llama-server, HAProxy, rpc-server) could put a symlink, a FIFO, a hard
link or a huge file there at any time. Each is declared here once, with the account that writes it
(by role: the inventory names the accounts, `llama_user`, `front_user`, `rpc_user`, `tunnel_user`),
the hosts it is on, the unit whose directive creates it, and why it exists. The constants the code
uses (components/front/model.py: FRONT_RUN_DIR, STATE_DIR_NAME) derive from these, and the checks in
tests/invariants/ hold the rendered units, the code that sends commands to hosts and the programs
root runs on main to this list: a new writable place is declared here first, with its reason.

The tunnel user has no such place: its home on the nodes (/var/lib/tunnelspec/tunnel) and its key's
directory on main (/etc/tunnelspec/tunnel) are root's. /tmp and /var/tmp are private to each unit
(PrivateTmp=yes); /dev/shm is the one shared directory every unit can write (PrivateDevices= keeps the
host's /dev/shm): no root command of tunnelspec's may use it either.

Pure: no I/O.
"""

from __future__ import annotations

import posixpath
from dataclasses import dataclass

from tunnelspec.core.constants import ETC_DIR, TLS_KEY


@dataclass(frozen=True)
class WritablePlace:
    path: str  # absolute, no trailing slash
    user: str  # the role of the account that can write it: llama, front, rpc, tunnel, any
    hosts: str  # "main", "rpc" (every rpc node) or "all"
    unit: str  # the unit whose directive creates it ("" : not made by tunnelspec)
    directive: str  # RuntimeDirectory / CacheDirectory / … ("" : none)
    why: str

    @property
    def name(self) -> str:
        """The directive's value: the path below /run (RuntimeDirectory=) or /var/cache (CacheDirectory=)."""
        return self.path.rsplit("/", 1)[-1]

    def holds(self, path: str) -> bool:
        """`path` is this place or lies inside it (by its text: no link is resolved)."""
        return path == self.path or path.startswith(self.path + "/")


LLAMA_RUN = WritablePlace(
    path="/run/tunnelspec-llama",
    user="llama",
    hosts="main",
    unit="tunnelspec-llama-server.service",
    directive="RuntimeDirectory",
    why="the launcher (tunnelspec-draftwatch launch, as llama-server's user) records the serving mode in "
    "mode.json; kept across llama-server's restarts (RuntimeDirectoryPreserve=yes)",
)
FRONT_RUN = WritablePlace(
    path="/run/tunnelspec-front",
    user="front",
    hosts="main",
    unit="tunnelspec-front.service",
    directive="RuntimeDirectory",
    why="HAProxy's stats socket (read by the draft watch) and its metrics socket (read by the exporter, "
    "the front's user too)",
)
RPC_CACHE = WritablePlace(
    path="/var/cache/tunnelspec-rpc",
    user="rpc",
    hosts="rpc",
    unit="tunnelspec-rpc.service",
    directive="CacheDirectory",
    why="rpc-server -c keeps the weights it received across llama-server's restarts (LLAMA_CACHE)",
)
SHARED_SHM = WritablePlace(
    path="/dev/shm",
    user="any",
    hosts="all",
    unit="",
    directive="",
    why="world-writable and shared with every unit (PrivateDevices= keeps the host's /dev/shm)",
)

# The places tunnelspec's own units create for a service user (each unit's directive names one of these).
SERVICE_DIRS: tuple[WritablePlace, ...] = (LLAMA_RUN, FRONT_RUN, RPC_CACHE)
PLACES: tuple[WritablePlace, ...] = (*SERVICE_DIRS, SHARED_SHM)


@dataclass(frozen=True)
class ServiceFile:
    """A file a service user owns in a directory root owns: root may replace it as a whole, and makes it
    private only through components/secret_file.py (no link followed, one name). `var`: the inventory
    variable that names it ("" : a fixed path)."""

    path: str
    user: str
    var: str
    why: str


API_KEY = ServiceFile("", "llama", "llama_server_api_key_file", "llama-server's API key (0600, its user)")
METRICS_TOKEN = ServiceFile(
    "", "front", "metrics_token_file", "the scrape token HAProxy compares (0600, the front's user)"
)
TLS_PRIVATE_KEY = ServiceFile(
    TLS_KEY, "front", "", "the front's TLS key (0600, the front's user; its directory root's)"
)
TUNNEL_KEY = ServiceFile(
    f"{ETC_DIR}/tunnel/id_ed25519",
    "tunnel",
    "",
    "the tunnels' ssh key on main (0600, the tunnel user; its directory root's)",
)
SERVICE_FILES: tuple[ServiceFile, ...] = (API_KEY, METRICS_TOKEN, TLS_PRIVATE_KEY, TUNNEL_KEY)


def place_of(path: str) -> WritablePlace | None:
    """The declared place `path` lies in, else None (`.` and `..` resolved, /var/run read as /run)."""
    if path.startswith("/"):
        path = "/" + posixpath.normpath(path).lstrip("/")
        if path == "/var/run" or path.startswith("/var/run/"):
            path = path[len("/var") :]
    return next((p for p in PLACES if p.holds(path)), None)
