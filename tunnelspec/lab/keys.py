"""Keys the lab writes: a client key for the controller, one ed25519 host key per host.

Generated on the controller with `cryptography` before boot, so the known_hosts file is written
from keys we chose, never learned by trust-on-first-use.
"""

from __future__ import annotations

import os
from pathlib import Path

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey


def write_private(path: Path, data: bytes) -> None:
    """Create with 0600 from the start: the key never exists with wider permissions."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.unlink(missing_ok=True)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    os.replace(tmp, path)


def ensure_keypair(path: Path, comment: str) -> str:
    """Keep an existing OpenSSH ed25519 key at `path`, or create one; return the public line."""
    if not path.exists():
        new = Ed25519PrivateKey.generate()
        write_private(
            path,
            new.private_bytes(
                serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH, serialization.NoEncryption()
            ),
        )
    os.chmod(path, 0o600)
    key = serialization.load_ssh_private_key(path.read_bytes(), password=None)
    pub = key.public_key().public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH).decode()
    line = f"{pub} {comment}".strip()
    Path(str(path) + ".pub").write_text(line + "\n")
    return line
