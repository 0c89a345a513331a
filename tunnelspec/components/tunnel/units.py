"""The main host's side of a tunnel, as data: unit names, the pinned files' paths, which nodes a
command means, and the ssh command line each tunnel unit runs. No task and no I/O here (the
tasks in tasks/tunnel*.py and `tunnelspec tunnel status` share it)."""

from __future__ import annotations

import re

from tunnelspec.core.constants import LOOPBACK
from tunnelspec.core.errors import ArgumentError, TaskFailed
from tunnelspec.inventory.addresses import tunnel_address
from tunnelspec.llama.rpc import probe_until

TUNNEL_DIR = "/etc/tunnelspec/tunnel"  # on main: key (tunnel user, 0600) + known_hosts (root)
KEY_PATH = f"{TUNNEL_DIR}/id_ed25519"
KNOWN_HOSTS = f"{TUNNEL_DIR}/known_hosts"
NODE_HOME = "/var/lib/tunnelspec/tunnel"  # on nodes: the tunnel user's home, root-owned
UNIT_TEMPLATE = "tunnelspec-tunnel.service.j2"
_UNIT_SAFE = re.compile(r"^[A-Za-z0-9_.-]+$")


def unit_name(node: str) -> str:
    if not _UNIT_SAFE.match(node):
        raise TaskFailed(f"rpc node name {node!r} cannot be part of a unit name")
    return f"tunnelspec-tunnel-{node}.service"


def node_ssh_target(inv, node: str) -> tuple[str, int]:
    """Where main's ssh reaches the node (inventory/addresses.py: tunnel_ssh_host/port, else ansible_host/port)."""
    return tunnel_address(node, inv.host_vars(node))


def selected_nodes(cluster, nodes) -> list:
    """`nodes`: a list or comma string of node names; empty or "all" means every rpc node."""
    if isinstance(nodes, str):
        nodes = [n for n in nodes.split(",") if n]
    if not nodes or nodes == ["all"]:
        return list(cluster.rpc)
    known = {n.name: n for n in cluster.rpc}
    bad = [n for n in nodes if n not in known]
    if bad:
        raise TaskFailed(f"not rpc node(s): {', '.join(bad)} (rpc nodes: {', '.join(known)})")
    return [known[n] for n in nodes]


# With AES-NI on main, AES-GCM beat OpenSSH's default chacha20-poly1305 through the tunnel here
# (benchmarks/README.md, "Tunnel": bulk +48 %, small-message p50 -23 %, draft decode +12 %).
# Without AES-NI chacha20 is the faster one, so then the default order stays. Both are OpenSSH
# defaults: the set of allowed ciphers is not widened, only the preference changes.
AES_GCM_FIRST = "aes128-gcm@openssh.com,chacha20-poly1305@openssh.com"
AES_NI_PROBE = ["grep", "-m1", "-ow", "aes", "/proc/cpuinfo"]


def ssh_argv(
    node, target: tuple[str, int], user: str, key: str, known_hosts: str, session: bool, aes_ni: bool = False
) -> list[str]:
    host, port = target
    # The host is ssh's last argument: one starting with '-' would be read as an option
    # (-oProxyCommand=… runs a command as the tunnel user); blanks and controls have no place there.
    if not host or host.startswith("-") or any(c.isspace() or ord(c) < 32 for c in host):
        raise ArgumentError(
            f"rpc node {node.name}: {host!r} cannot be the tunnel's ssh host (ansible_host or "
            "tunnel_ssh_host): a name or an address, not starting with '-'"
        )
    opts = {
        "BatchMode": "yes",
        "StrictHostKeyChecking": "yes",
        "UserKnownHostsFile": known_hosts,
        "GlobalKnownHostsFile": "/dev/null",
        "CheckHostIP": "no",
        "UpdateHostKeys": "no",
        "IdentitiesOnly": "yes",
        "IdentityAgent": "none",
        "PubkeyAuthentication": "yes",
        "PasswordAuthentication": "no",
        "KbdInteractiveAuthentication": "no",
        "HostbasedAuthentication": "no",
        "ExitOnForwardFailure": "yes",
        # A node that stops answering (link cut, power) is given up after 4 s without a byte from it
        # (1 s x 3 unanswered keepalives): ssh exits, the watcher sees its listener go and llama-server
        # serves without the draft. With 5 s x 3 requests waited ~20 s. A node that is merely busy still
        # answers keepalives (sshd's own loop), so this does not fire under load.
        "ServerAliveInterval": "1",
        "ServerAliveCountMax": "3",
        "ConnectTimeout": "10",
        "Compression": "no",
        "ForwardAgent": "no",
        "ForwardX11": "no",
        "PermitLocalCommand": "no",
        "ControlMaster": "no",
        "ControlPath": "none",
        "RequestTTY": "no",
    }
    if aes_ni:
        opts["Ciphers"] = AES_GCM_FIRST
    argv = ["/usr/bin/ssh", "-F", "none", "-T"] + (["-N"] if not session else [])
    argv += ["-i", key, "-p", str(port), "-l", user]
    for k, v in opts.items():
        argv += ["-o", f"{k}={v}"]
    argv += ["-L", f"{LOOPBACK}:{node.tunnel_port}:{LOOPBACK}:{node.rpc_port}", host]
    return argv


async def probe_tunnel(conn, node, deadline_s: float, expected=None, busy_timeout: float = 3.0):
    """HELLO (+ device memory) through `node`'s tunnel, from main's own loopback."""
    return await probe_until(
        lambda: conn.open_connection(LOOPBACK, node.tunnel_port), deadline_s, expected, busy_timeout
    )
