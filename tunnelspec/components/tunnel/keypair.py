"""Tunnel keys: ed25519 made with `cryptography`, in OpenSSH formats, and the authorized_keys
options that confine such a key to one forward.

The private key exists only in memory on the controller (a `Secret`) and is written once, by the
caller, straight to the main host (`conn.put`, 0600, owned by the tunnel user).
"""

from __future__ import annotations

import base64
import hashlib
import re
import secrets
from dataclasses import dataclass

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from tunnelspec.core.constants import LOOPBACK
from tunnelspec.core.secrets import Secret

# The tunnel's session runs this instead of anything the client asks for. A session (rather than
# `ssh -N`, forward only) is what keeps small RPC messages from stalling: see docs/design.md, deploy step 6, and
# benchmarks/tunnel.py --only rtt for the measurement on this build of OpenSSH.
# `exec` + setpriv's parent-death signal: sleep's parent is then the sshd session process itself, and
# sleep dies with it. A plain `sleep infinity` outlived every session that sshd dropped (a cut link
# reaped by ClientAlive, a reset after it came back): two orphaned processes per link flap, forever.
# setpriv is util-linux (Essential on Debian and Ubuntu).
TUNNEL_FORCED_COMMAND = "exec /usr/bin/setpriv --pdeathsig KILL /bin/sleep infinity"
_ADDRESS = re.compile(r"^[0-9A-Fa-f:.]+$")


@dataclass(frozen=True)
class KeyPair:
    private_openssh: Secret  # "-----BEGIN OPENSSH PRIVATE KEY-----..." (never logged)
    public_line: str  # "ssh-ed25519 AAAA... comment"


def generate_ed25519(comment: str) -> KeyPair:
    key = Ed25519PrivateKey.generate()
    private = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH, serialization.NoEncryption()
    ).decode()
    return KeyPair(Secret(private), public_line_of(key, comment))


def public_line_of(key, comment: str = "") -> str:
    pub = key.public_key().public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH).decode()
    return f"{pub} {comment}".strip()


def public_from_private(private_openssh: str, comment: str = "") -> str | None:
    """The public line of an OpenSSH private key, or None when the text is not an unencrypted
    ed25519 key (a half-written or foreign file is replaced, not trusted)."""
    try:
        key = serialization.load_ssh_private_key(private_openssh.encode(), password=None)
    except (ValueError, TypeError):
        return None
    if not isinstance(key, Ed25519PrivateKey):
        return None
    return public_line_of(key, comment)


def key_body(public_line: str) -> str:
    """'ssh-ed25519 AAAA…' without the comment."""
    parts = public_line.split()
    return " ".join(parts[:2])


def fingerprint(public_line: str) -> str:
    """SHA256:… as `ssh-keygen -l` prints it."""
    blob = base64.b64decode(public_line.split()[1])
    return "SHA256:" + base64.b64encode(hashlib.sha256(blob).digest()).decode().rstrip("=")


def tunnel_key_options(
    rpc_port: int, from_address: str | None = None, command: str | None = TUNNEL_FORCED_COMMAND
) -> str:
    """The options of the tunnel key's authorized_keys line.

    `restrict` turns off every capability (pty, agent/X11/port forwarding, user rc); only what is
    listed after it comes back: local forwarding, and only to the RPC port on the node's loopback.
    A forced `command` means a session can run nothing else (sshd runs it via the user's shell,
    which is why that shell is /bin/sh, not nologin). `from` pins where the key may be used from.
    """
    if not 0 < int(rpc_port) < 65536:
        raise ValueError(f"bad rpc_port {rpc_port!r}")
    # `port-forwarding` re-enables -R too, and authorized_keys has no "permitlisten none": allow
    # listening only on port 1, which sshd refuses to non-root users (IPPORT_RESERVED), so no
    # remote forward can ever be opened (tests: test_tunnel_key_cannot_remote_forward).
    opts = ["restrict", "port-forwarding", f'permitopen="{LOOPBACK}:{int(rpc_port)}"', f'permitlisten="{LOOPBACK}:1"']
    if from_address:
        if not _ADDRESS.match(from_address):
            raise ValueError(f"from address must be an IP literal, got {from_address!r}")
        opts.append(f'from="{from_address}"')
    if command:
        if '"' in command or "\\" in command:
            raise ValueError("forced command must not contain quotes or backslashes")
        opts.append(f'command="{command}"')
    return ",".join(opts)


def authorized_keys_line(public_line: str, options: str, comment: str = "") -> str:
    return f"{options} {key_body(public_line)} {comment}".strip()


def known_hosts_line(address: str, port: int, public_line: str) -> str:
    """A known_hosts entry in OpenSSH's spelling ([addr]:port only when the port is not 22)."""
    pattern = address if int(port) == 22 else f"[{address}]:{int(port)}"
    return f"{pattern} {key_body(public_line)}"


def new_rotation_token() -> str:
    """A fresh token for `tunnelspec keys rotate`: the tunnel_keypair task replaces the key once
    per token, so a rotation converges (the second run with the same token changes nothing)."""
    return secrets.token_hex(8)
