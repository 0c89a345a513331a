"""The files of the inventory's CA directory on the controller (components/tls/ca.py): created
without following a link (O_EXCL, O_NOFOLLOW) and fsynced, keys 0600 and refused when others may
read them (ssh's rule), one lock for the directory, the directory itself 0700 with a .gitignore."""

from __future__ import annotations

import fcntl
import os
import stat
from contextlib import contextmanager
from pathlib import Path

from tunnelspec.core.errors import UsageError

LOCK = ".lock"
GITIGNORE = "# tunnelspec: the CA's private key stays on this controller\n*.key\n*.key.new\n.lock\n"


class CertError(UsageError):
    """A certificate, key or CA file that cannot be used; the message names the file."""

    def __init__(self, message: str, file: str | os.PathLike | None = None):
        self.file = str(file) if file is not None else None
        super().__init__(f"{file}: {message}" if file is not None else message)


def create(path: Path, data: bytes, mode: int) -> None:
    """Create `path` with `mode` (O_EXCL: never through an existing file or link) and fsync it."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, mode)
    try:
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)


def write_private(path: Path, data: bytes) -> None:
    create(path, data, 0o600)


def write_public(path: Path, data: bytes) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.unlink(missing_ok=True)
    create(tmp, data, 0o644)
    os.replace(tmp, path)


def fsync_dir(d: Path) -> None:
    fd = os.open(d, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def check_private_file(path: Path) -> None:
    """Refuse a private key that is not a regular file of ours, or that others may read (ssh's rule)."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        raise CertError("missing", path) from None
    if not stat.S_ISREG(st.st_mode):
        raise CertError("not a regular file (a link or something else): refused for a private key", path)
    if st.st_mode & 0o077:
        raise CertError(
            f"permissions {stat.S_IMODE(st.st_mode):04o} are too open for a private key: "
            f"others may read it; chmod 600 it (and consider it leaked if others did)",
            path,
        )
    if st.st_uid != os.getuid():
        raise CertError("owned by another user: refused for a private key", path)


@contextmanager
def locked(d: Path):
    fd = os.open(d / LOCK, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def prepare_dir(d: Path) -> None:
    d.mkdir(mode=0o700, parents=True, exist_ok=True)
    st = os.lstat(d)
    if not stat.S_ISDIR(st.st_mode):
        raise CertError("not a directory", d)
    if stat.S_IMODE(st.st_mode) & 0o077:
        os.chmod(d, 0o700)
    gi = d / ".gitignore"
    if not gi.exists():
        write_public(gi, GITIGNORE.encode())
