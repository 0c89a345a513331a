"""TCP connections opened as root on a host whose login is not root (ansible_become).

An SSH direct-tcpip channel is opened by the login's sshd session, so the connection's owner is the
login (say `ops`); the isolation rules (facts/nft.py) let only root and one service user reach the
RPC and tunnel ports, so a probe through the channel would be reset. With become, the connection is
opened by a small relay run through sudo instead: `sudo … -- python3 -c RELAY HOST PORT LIMIT`,
whose socket belongs to root. Its stdin and stdout are the stream; stderr carries one status line
(`tunnelspec-relay: connected`, `… error ECONNREFUSED …`, `… timeout`) and nothing else.

The relay ends when either side closes: EOF on its stdin (the controller closed the writer, the
channel or the whole SSH connection died) or EOF/reset from the server. While it connects it also
watches its stdin, so a controller that gives up (a caller's timeout) ends it at once.
"""

from __future__ import annotations

import asyncio
import errno

from tunnelspec.core.errors import TaskFailed

RELAY_LIMIT_S = 30  # the relay's own connect timeout (callers usually give up sooner)
_MARK = "tunnelspec-relay: "
_MAX_NOISE = 20  # lines of other stderr (sudo's) kept for an error message

# Python 3.5+ stdlib only (python3 is a prerequisite on every host). Unbuffered os.read/os.write.
RELAY = r"""
import errno, os, select, socket, sys, time
def say(m):
    os.write(2, ("tunnelspec-relay: " + m + "\n").encode())
host, port, limit = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
try:
    fam, kind, proto, _, addr = socket.getaddrinfo(host, port, 0, socket.SOCK_STREAM)[0]
except socket.gaierror as e:
    say("error EHOSTUNREACH cannot resolve %s: %s" % (host, e)); sys.exit(2)
s = socket.socket(fam, kind, proto)
s.setblocking(False)
rc = s.connect_ex(addr)
end = time.monotonic() + limit
while rc in (errno.EINPROGRESS, errno.EAGAIN, errno.EALREADY):
    left = end - time.monotonic()
    if left <= 0:
        say("timeout"); sys.exit(3)
    r, w, x = select.select([0], [s], [], left)
    if w:
        rc = s.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
    elif r:
        sys.exit(0)
if rc:
    say("error %s %s" % (errno.errorcode.get(rc, "EIO"), os.strerror(rc))); sys.exit(2)
s.setblocking(True)
s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
say("connected")
try:
    while True:
        r, w, x = select.select([0, s], [], [])
        if 0 in r:
            data = os.read(0, 65536)
            if not data:
                break
            s.sendall(data)
        if s in r:
            data = s.recv(65536)
            if not data:
                break
            view = memoryview(data)
            while view:
                view = view[os.write(1, view):]
except OSError:
    pass
s.close()
"""


def relay_argv(host: str, port: int, limit: float = RELAY_LIMIT_S) -> list[str]:
    return ["python3", "-c", RELAY, str(host), str(int(port)), format(limit, "g")]


class RelayFailed(TaskFailed):
    """The relay did not start (sudo or python3 failed). Not an OSError on purpose: it says nothing
    about the port, and a caller proving a port unreachable (an OSError is its good outcome) must
    not count it as a refusal."""


async def handshake(stderr_readline, host: str, port: int, where: str) -> None:
    """Read the relay's status line. Raises OSError (ConnectionRefusedError for ECONNREFUSED),
    TimeoutError, or RelayFailed with what sudo/python said when there is no status line."""
    noise: list[str] = []
    while True:
        raw = await stderr_readline()
        if not raw:
            said = "; ".join(noise) or "no message"
            raise RelayFailed(f"{where}: the relay to {host}:{port} ended before connecting ({said})")
        line = (raw.decode(errors="replace") if isinstance(raw, bytes) else raw).strip()
        if not line.startswith(_MARK):
            if len(noise) < _MAX_NOISE and line:
                noise.append(line)
            continue
        status = line[len(_MARK) :]
        if status == "connected":
            return
        if status == "timeout":
            raise TimeoutError(f"connect to {host}:{port} timed out (from {where})")
        word, _, rest = status.partition(" ")
        name, _, msg = rest.partition(" ")
        code = getattr(errno, name, errno.EIO)
        # OSError(errno, …) is the matching subclass: ConnectionRefusedError for ECONNREFUSED.
        raise OSError(code, f"{msg or name} ({host}:{port} from {where})")


class RelayWriter:
    """The writing half, shaped like asyncio's StreamWriter for the callers (write, drain, close,
    wait_closed). Closing ends the relay's stdin: the relay then closes its socket and exits."""

    def __init__(self, stdin, send_eof, wait_exit, kill, peer):
        self._stdin = stdin
        self._send_eof = send_eof
        self._wait_exit = wait_exit
        self._kill = kill
        self._peer = peer
        self._closing = False

    def write(self, data: bytes) -> None:
        if not self._closing:
            self._stdin.write(data)

    def writelines(self, chunks) -> None:
        for c in chunks:
            self.write(c)

    async def drain(self) -> None:
        if self._closing:
            raise ConnectionResetError("the relay is closed")
        try:
            await self._stdin.drain()
        except (BrokenPipeError, ConnectionError) as e:
            raise ConnectionResetError(f"the relay ended: {e}") from None
        except Exception as e:  # noqa: BLE001 - asyncssh's channel errors are not OSErrors
            raise ConnectionResetError(f"the relay ended: {e}") from None

    def can_write_eof(self) -> bool:
        return False

    def is_closing(self) -> bool:
        return self._closing

    def get_extra_info(self, name: str, default=None):
        return self._peer if name == "peername" else default

    def close(self) -> None:
        if self._closing:
            return
        self._closing = True
        try:
            self._send_eof()
        except Exception:  # noqa: BLE001 - the relay ended already
            pass

    async def wait_closed(self) -> None:
        """The relay has exited (killed after 5 s, which only a wedged host needs)."""
        self.close()
        try:
            await asyncio.wait_for(self._wait_exit(), 5)
        except TimeoutError:
            self._kill()
        except Exception:  # noqa: BLE001 - a lost connection ended it already
            pass


async def open_ssh(conn, command: str, stdin_prefix: bytes, where: str, host: str, port: int):
    """The relay as a process on an asyncssh connection; (reader, writer) once it is connected."""
    proc = await conn.create_process(command, encoding=None)
    try:
        if stdin_prefix:
            proc.stdin.write(stdin_prefix)
        await handshake(proc.stderr.readline, host, port, where)
    except BaseException:
        proc.close()  # the channel closes: the relay sees EOF and exits
        raise

    def send_eof():
        proc.stdin.write_eof()

    def kill():
        proc.close()

    return proc.stdout, RelayWriter(proc.stdin, send_eof, proc.wait_closed, kill, (host, port))


async def open_local(argv: list[str], stdin_prefix: bytes, where: str, host: str, port: int):
    """The relay as a local subprocess (ansible_connection=local with become)."""
    proc = await asyncio.create_subprocess_exec(
        *argv,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        start_new_session=True,
    )
    assert proc.stdin is not None and proc.stderr is not None  # both PIPE

    def kill():
        try:
            proc.kill()
        except (ProcessLookupError, PermissionError):
            pass

    def send_eof():
        assert proc.stdin is not None  # stdin=PIPE
        if not proc.stdin.is_closing():
            proc.stdin.close()

    try:
        if stdin_prefix:
            proc.stdin.write(stdin_prefix)
        await handshake(proc.stderr.readline, host, port, where)
    except BaseException:
        send_eof()  # EOF: the relay exits (it runs as root: a kill may not be allowed)
        kill()
        raise
    return proc.stdout, RelayWriter(proc.stdin, send_eof, proc.wait, kill, (host, port))
