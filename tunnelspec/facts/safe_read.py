"""SafeRead: a file root reads from a directory a service user can write, without following a link.

SECURITY.md, invariant A: root never follows, reads, writes, chmods or executes a path inside a
directory a service user can write (llama-server's runtime directory holds the launcher's mode file;
code running as that user could put a symlink to /etc/shadow, a FIFO or a huge file there). This
reader walks the path one component at a time with O_NOFOLLOW (a link anywhere is refused, not
followed), opens without blocking (a FIFO is refused, never waited on), and reads only a regular file
with one name (a hard link to another file is refused) up to a cap. Python 3's standard library is on
every host (a prerequisite), so the command is one round trip with no helper installed.
"""

from __future__ import annotations

from tunnelspec.facts.fact import Fact

DEFAULT_CAP = 1 << 20

# Exit codes: 0 read; 3 absent; 4 refused (a link, not a regular file, several names, too big) or
# unreadable — the reason on stderr.
ABSENT, REFUSED = 3, 4
SCRIPT = r"""
import os, stat, sys
path, cap = sys.argv[1], int(sys.argv[2])
parts = [p for p in path.split("/") if p]
if not path.startswith("/") or not parts or ".." in parts:
    sys.stderr.write("not an absolute path\n"); sys.exit(4)
fd = os.open("/", os.O_RDONLY | os.O_DIRECTORY)
try:
    for i, name in enumerate(parts):
        flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NOCTTY | os.O_NONBLOCK | os.O_CLOEXEC
        if i < len(parts) - 1:
            flags |= os.O_DIRECTORY
        nfd = os.open(name, flags, dir_fd=fd)
        os.close(fd)
        fd = nfd
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        sys.stderr.write("not a regular file\n"); sys.exit(4)
    if st.st_nlink != 1:
        sys.stderr.write("a file with several names (a hard link)\n"); sys.exit(4)
    if st.st_size > cap:
        sys.stderr.write("larger than %d bytes\n" % cap); sys.exit(4)
    data = b""
    while len(data) <= cap:
        chunk = os.read(fd, cap + 1 - len(data))
        if not chunk:
            break
        data += chunk
    if len(data) > cap:
        sys.stderr.write("larger than %d bytes\n" % cap); sys.exit(4)
    sys.stdout.buffer.write(data)
except FileNotFoundError:
    sys.exit(3)
except OSError as e:
    sys.stderr.write((e.strerror or str(e)) + (" (a symbolic link)" if e.errno == 40 else "") + "\n"); sys.exit(4)
"""


def _text(out: str) -> str:
    """The file's text as read: the reader prints it unchanged (its exit code says absent or refused)."""
    return out


def file_text(path: str, cap: int = DEFAULT_CAP) -> Fact[str]:
    """The text of the regular file at `path`, read without following a link; the probe's exit code
    says what else it was (0 read, ABSENT, REFUSED with the reason on stderr)."""
    return Fact(["python3", "-I", "-S", "-c", SCRIPT, path, str(cap)], _text)


async def read(conn, path: str, cap: int = DEFAULT_CAP, timeout: float = 20) -> tuple[str | None, str]:
    """(the file's text, '') — or (None, why): absent, or refused and why. Never follows a link."""
    fact = file_text(path, cap)
    res = await conn.probe(fact.argv, timeout=timeout)
    if res.rc == 0:
        return fact.parse(res.stdout), ""
    if res.rc == ABSENT:
        return None, "absent"
    return None, (res.stderr.strip() or f"exit {res.rc}")
