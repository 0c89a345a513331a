"""The connection interface every task talks to."""

from __future__ import annotations

import abc
import asyncio
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from tunnelspec.core import testhooks
from tunnelspec.core.errors import HostUnreachable, TaskFailed
from tunnelspec.connection import become as become_mod
from tunnelspec.connection import probes as probes_mod
from tunnelspec.connection.probes import ProbeCache, batch_argv, parse_batch, plan
from tunnelspec.core.secrets import Secret, display_argv

if TYPE_CHECKING:
    from tunnelspec.connection.become import Become
    from tunnelspec.connection.preconnect import Preconnect

# Writes go to a temp file in the target's directory, then a rename: readers never see half a file
# and a failure leaves the old file in place.
_PUT_SCRIPT = r"""
set -eu
umask 077
dir=$(dirname -- "$1")
tmp=$(mktemp "$dir/.tunnelspec.XXXXXXXX")
trap 'rm -f -- "$tmp"' EXIT
cat > "$tmp"
chmod "$2" "$tmp"
if [ -n "$3" ]; then chown "$3" "$tmp"; fi
mv -f -- "$tmp" "$1"
trap - EXIT
"""


@dataclass
class Result:
    argv: list
    rc: int
    stdout: str
    stderr: str
    stdout_bytes: bytes = field(default=b"", repr=False)

    @property
    def ok(self) -> bool:
        return self.rc == 0


@dataclass
class ConnectOptions:
    known_hosts: str | None = None  # path or file content (from TUNNELSPEC_KNOWN_HOSTS)
    accept_new_host_keys: bool = False
    connect_timeout: float = 10.0
    login_timeout: float = 20.0
    keepalive_interval: float = 15.0
    keepalive_count_max: int = 3
    private_key: Secret | None = None  # key content from TUNNELSPEC_SSH_KEY
    use_ssh_config: bool = True


@dataclass
class ConnectSession:
    """What the connections of one run share, apart from the options (which a run never changes):
    the TCP sockets opened ahead (connection/preconnect.py) and the host keys pinned on first use."""

    preconnect: Preconnect | None = None
    new_host_keys: list = field(default_factory=list)  # (host, known_hosts line) pinned this run


def reveal_argv(argv) -> list[str]:
    return [a.reveal() if isinstance(a, Secret) else str(a) for a in argv]


class Connection(abc.ABC):
    """One host. Every command is an argv list; secrets in argv are revealed only at the edge."""

    name: str
    is_root: bool = True

    @abc.abstractmethod
    async def _exec(self, argv: list[str], input: bytes | None, timeout: float | None) -> tuple[int, bytes, bytes]: ...

    @abc.abstractmethod
    async def open_connection(self, host: str, port: int):
        """A TCP stream (reader, writer) to host:port as seen from this host."""

    def server_host_key(self) -> str | None:
        """The host key this connection verified (OpenSSH public-key line), or None when the
        connection is not SSH (a local connection has no host key to pin)."""
        return None

    def cache_identity(self) -> tuple[str, ...] | None:
        """Whom this connection reaches, for what the controller keeps of a host between runs (the
        host's version lines: components/host/facts_cache.py): the address, port and login, and
        the jump hosts; None: nothing to key on."""
        return None

    @abc.abstractmethod
    async def close(self) -> None: ...

    # ---- become (connection/become.py): set by a subclass when the login is not root ----------
    _becomer: Become | None = None  # None: commands run as the login

    @property
    def become_user(self) -> str | None:
        return self._becomer.user if self._becomer is not None else None

    async def _exec_login(self, argv: list[str], input: bytes | None) -> tuple[int, bytes, bytes]:
        return await self._exec(argv, input, None)

    async def check_become(self) -> None:
        """Decide now how sudo is used (otherwise at the first command that needs root). Raises
        become.BecomeError naming the host and the login when sudo cannot give root."""
        if self._becomer is not None:
            await self._becomer.ensure(self._exec_login)

    async def _as_root(self, argv: list[str]) -> tuple[list[str], bytes]:
        """argv wrapped in sudo when this connection becomes root, and what its stdin must start
        with (the become password line, or nothing)."""
        if self._becomer is None:
            return argv, b""
        await self._becomer.ensure(self._exec_login)
        return self._becomer.wrap(argv), self._becomer.stdin_prefix()

    async def spawn(self, argv) -> Spawned:
        """A long-lived command whose stdin stays open until `Spawned.close()` or until this
        connection dies (the run lock: engine/runlock.py). stderr is merged into stdout."""
        raise NotImplementedError(f"{type(self).__name__} cannot hold a process open")

    # ---- read-only probes, batched (see connection/probes.py) -------------------------------
    _probes: ProbeCache | None = None
    _changes_started = 0  # commands that may change the host: started, and still running
    _changes_running = 0

    def _host_may_change(self) -> None:
        self._changes_started += 1
        if self._probes is not None:
            self._probes.clear()

    @property
    def changes_started(self) -> int:
        """How many commands that may change the host this connection has started (any `run`,
        upload or stream): equal counts mean the host is as the last batch saw it."""
        return self._changes_started

    def drop_probes(self) -> None:
        """Forget every batched result (they were read before another host changed)."""
        if self._probes is not None:
            self._probes.clear()

    def probes_tried(self, argvs: list[list[str]]) -> bool:
        """Did a batch since the host last changed already run all of these, with each answer still
        to be served (or failed)? (`ProbeCache.covers`)"""
        return self._probes is not None and all(self._probes.covers(tuple(reveal_argv(a))) for a in argvs)

    async def prefetch(self, argvs: list[list[str]], *, more: bool = False) -> int:
        """Run these read-only commands in one round trip; `probe()` serves their results until
        anything else runs on this connection. Returns how many results are cached. `more`: add to
        the results of earlier batches (nothing changed since) instead of replacing them, and leave out
        what they answered and still hold (`ProbeCache.covers`)."""
        wanted: dict[tuple, int] = {}
        for a in argvs:
            key = tuple(reveal_argv(a))
            if more and self._probes is not None and self._probes.covers(key):
                continue
            wanted[key] = wanted.get(key, 0) + 1
        unique = list(wanted)
        if len(unique) < 2:
            return 0
        batch, expand = plan([list(a) for a in unique])
        if self._probes is not None and not more:
            self._probes.clear()
        started, busy = self._changes_started, self._changes_running
        parsed = await self._batch(batch)
        parsed = expand(parsed) if parsed is not None else None
        # A command that may change the host ran alongside the batch (another host's task using this
        # connection): what the batch saw may already be stale, so keep none of it.
        if parsed is None or busy or self._changes_running or self._changes_started != started:
            return 0
        if self._probes is None:
            self._probes = ProbeCache()
        self._probes.fill([list(a) for a in unique], parsed, wanted)
        return len(self._probes)

    _batch_sessions = probes_mod.SESSIONS  # 1 once the host refused a second session at once

    async def _batch(self, batch: list[list[str]]) -> list[tuple[int, bytes]] | None:
        """(rc, stdout) per probe of `batch`, its parts run side by side (probes.parts); None when a
        part's output is not what the batch prints."""
        cut = probes_mod.parts(len(batch), self._batch_sessions)

        async def part(idx: list[int]) -> list[tuple[int, bytes]] | None:
            argv, boundary = batch_argv([batch[i] for i in idx])
            res = await self._run(argv, None, None, False, True)
            return parse_batch(res.stdout_bytes, boundary, len(idx)) if res.rc == 0 else None

        got = await asyncio.gather(*(part(idx) for idx in cut), return_exceptions=True)
        failed = [g for g in got if isinstance(g, BaseException)]
        if failed and len(cut) > 1 and not any(isinstance(g, HostUnreachable) for g in failed):
            # Sessions refused (a MaxSessions below ours): one session per batch on this host.
            self._batch_sessions = 1
            return await self._batch(batch)
        if failed:
            raise failed[0]
        out: list[tuple[int, bytes]] = [(-1, b"")] * len(batch)
        for idx, res in zip(cut, got, strict=True):
            if res is None:
                return None
            for i, r in zip(idx, res, strict=True):  # type: ignore[arg-type]
                out[i] = r
        return out

    async def probe(
        self,
        argv,
        *,
        check: bool = False,
        input: bytes | str | None = None,
        timeout: float | None = None,
        become: bool = True,
    ) -> Result:
        """A read-only command (a fact): from the last prefetch if the host is unchanged since.
        Unlike `run`, it never drops the prefetched results: it changes nothing on the host, so what
        the batch read is still true after it. A probe with `input` is never served from a batch."""
        # A batch runs as root: it answers a probe run as the login only where the login is root's.
        served = input is None and (become or self._becomer is None)
        out = self._probes.take(reveal_argv(argv)) if self._probes is not None and served else None
        if out is not None:
            return Result(list(argv), 0, out.decode(errors="replace"), "", out)
        return await self._run(argv, input, timeout, check, become)

    @abc.abstractmethod
    async def _stream(
        self, argv: list[str], on_line, timeout: float | None, stdin: bytes | None = None
    ) -> tuple[int, str]:
        """Run argv, calling on_line(str) for each line of stdout+stderr; returns (rc, last output).
        `stdin`: written to the command's stdin, then EOF (the become password line)."""

    async def run_stream(
        self, argv, on_line, *, timeout: float | None = None, check: bool = False, become: bool = True
    ) -> Result:
        """For long commands (builds): progress as it happens, not only at the end."""
        self._host_may_change()
        self._changes_running += 1
        try:
            return await self._run_stream(argv, on_line, timeout, check, become)
        finally:
            self._changes_running -= 1
            testhooks.command_done()

    async def _run_stream(self, argv, on_line, timeout, check, become) -> Result:
        real, stdin = reveal_argv(argv), b""
        if become:
            real, stdin = await self._as_root(real)
        try:
            rc, tail = await (
                asyncio.wait_for(self._stream(real, on_line, timeout, stdin or None), timeout)
                if timeout
                else self._stream(real, on_line, None, stdin or None)
            )
        except TimeoutError:
            raise TaskFailed(f"command timed out after {timeout:g}s: {display_argv(argv)}") from None
        res = Result(list(argv), rc, tail, "")
        self._refused(argv, rc, tail, become)
        if check and rc != 0:
            raise TaskFailed(f"command failed (rc={rc}): {display_argv(argv)}\n{_tail(tail, 30)}")
        return res

    async def run(
        self,
        argv,
        *,
        input: bytes | str | None = None,
        timeout: float | None = None,
        check: bool = False,
        become: bool = True,
    ) -> Result:
        self._host_may_change()
        self._changes_running += 1
        try:
            return await self._run(argv, input, timeout, check, become)
        finally:
            self._changes_running -= 1
            testhooks.command_done()

    async def _run(self, argv, input, timeout, check, become) -> Result:
        real, prefix = reveal_argv(argv), b""
        if become:
            real, prefix = await self._as_root(real)
        data = input.encode() if isinstance(input, str) else input
        if prefix:
            data = prefix + (data or b"")
        try:
            rc, out, err = (
                await asyncio.wait_for(self._exec(real, data, timeout), timeout)
                if timeout
                else await self._exec(real, data, None)
            )
        except TimeoutError:
            raise TaskFailed(f"command timed out after {timeout:g}s: {display_argv(argv)}") from None
        res = Result(list(argv), rc, out.decode(errors="replace"), err.decode(errors="replace"), out)
        self._refused(argv, rc, res.stderr, become)
        if check and rc != 0:
            raise TaskFailed(f"command failed (rc={rc}): {display_argv(argv)}\n{_tail(res.stderr or res.stdout)}")
        return res

    def _refused(self, argv, rc: int, said_on_stderr: str, become: bool) -> None:
        """sudo refused the command itself (a partial sudoers rule): it never ran, so there is no rc
        of its own to read; raise naming the host, the login, the command and sudo's line."""
        if become and rc != 0 and self._becomer is not None:
            said = become_mod.refused_by_sudo(said_on_stderr)
            if said:
                raise become_mod.refusal_error(self.name, self._becomer.user, display_argv(argv), said)

    async def put(self, data: bytes | str, path: str, mode: int = 0o644, owner: str | None = None) -> None:
        if isinstance(data, str):
            data = data.encode()
        await self.run(["sh", "-c", _PUT_SCRIPT, "sh", path, format(mode, "o"), owner or ""], input=data, check=True)

    async def get(self, path: str) -> bytes | None:
        res = await self.probe(read_argv(path))
        if res.rc == 3:
            return None
        if res.rc != 0:
            raise TaskFailed(f"cannot read {path}: {_tail(res.stderr)}")
        return res.stdout_bytes


class Spawned(abc.ABC):
    """A process started by `Connection.spawn`: its output line by line, and a way to end it."""

    @abc.abstractmethod
    async def readline(self) -> str:
        """The next line of output without its newline; "" at the end of output."""

    @abc.abstractmethod
    async def close(self) -> None:
        """End its stdin (it exits on EOF) and wait briefly; kill it if it lingers."""


def read_argv(path: str) -> list[str]:
    """What `get(path)` runs (rc 3: no such file); tasks list it in their probes."""
    return ["sh", "-c", '[ -e "$1" ] || exit 3; exec cat -- "$1"', "sh", path]


def _tail(text: str, lines: int = 15) -> str:
    return "\n".join(text.rstrip().splitlines()[-lines:])


def quote(argv: list[str]) -> str:
    return shlex.join(argv)


def expand_user_path(p: str | None, base: Path | None = None) -> str | None:
    if not p:
        return None
    path = Path(p).expanduser()
    if not path.is_absolute() and base is not None:
        path = base / path
    return str(path)
