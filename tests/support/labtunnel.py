"""The tunnel as the lab deploys it: its key, the tunnel user, each node's tunnel port on main, and
probes run *on* a lab host (python3 in the lab image), so what they measure is the tunnel, not the
controller's SSH hop."""

from __future__ import annotations

import json

from support.rtt_probe import SCRIPT as RTT_SCRIPT

RPC_PORT = 50052
KEY = "/etc/tunnelspec/tunnel/id_ed25519"
KNOWN = "/etc/tunnelspec/tunnel/known_hosts"
TUNNEL_USER = "tunnelspec-tunnel"
NODES = {"rpc-a": 15052, "rpc-b": 15053}  # lab inventory: tunnel_port defaults 15052 + index

# Measured from inside a host, on its own loopback (see tests/support/rtt_probe.py).
PROBE = RTT_SCRIPT


def probe_on(lab, host: str, port: int, n: int = 0, timeout: float = 60) -> dict | None:
    res = lab.exec(host, ["python3", "-c", PROBE, "127.0.0.1", str(port), str(n)], timeout=timeout)
    if res.returncode != 0:
        return None
    return json.loads(res.stdout)


def ssh_as_tunnel_key(lab, node_ip: str, *extra: str, command: tuple = (), timeout_s: int = 6):
    """Run OpenSSH on main with the tunnel key (as root, who can read it), bounded by `timeout`."""
    argv = ["timeout", str(timeout_s), "ssh", "-F", "none", "-i", KEY, "-l", TUNNEL_USER,
            "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=yes", "-o", f"UserKnownHostsFile={KNOWN}",
            "-o", "GlobalKnownHostsFile=/dev/null", "-o", "IdentitiesOnly=yes", "-o", "ConnectTimeout=5",
            *extra, node_ip, *command]
    return lab.exec("main", argv, timeout=timeout_s + 10)
