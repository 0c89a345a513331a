"""ansible_connection=local: the controller is the host."""

from __future__ import annotations

import asyncio
import getpass
import os

from tunnelspec.connection import relay
from tunnelspec.connection.base import Connection, Spawned, reveal_argv
from tunnelspec.connection.become import Become
from tunnelspec.core.gitenv import git_env
from collections import deque


class LocalConnection(Connection):
    """The host's commands get tunnelspec's environment less the variables that pick a git repository
    (core/gitenv.py), as ssh passes none to a host: the host's `git -C` of its checkout works on that
    checkout, never on the repository whose hook started tunnelspec."""

    def __init__(self, name: str, become: bool = False, become_password=None):
        self.name = name
        self.is_root = os.geteuid() == 0
        self._become = become and not self.is_root
        if self._become:
            self._becomer = Become(name, getpass.getuser(), become_password)

    def cache_identity(self) -> tuple[str, ...] | None:
        return ("local", str(os.geteuid()), os.uname().nodename)

    async def _exec(self, argv, input, timeout):
        proc = await asyncio.create_subprocess_exec(
            *argv,
            stdin=asyncio.subprocess.PIPE if input is not None else asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            start_new_session=True,
            env=git_env(),
        )
        try:
            out, err = await proc.communicate(input)
        except asyncio.CancelledError:
            proc.kill()
            await proc.wait()
            raise
        return proc.returncode, out, err

    async def _stream(self, argv, on_line, timeout, stdin=None):
        proc = await asyncio.create_subprocess_exec(
            *argv,
            stdin=asyncio.subprocess.PIPE if stdin is not None else asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
            start_new_session=True,
            env=git_env(),
        )
        tail: deque[str] = deque(maxlen=60)
        assert proc.stdout is not None  # stdout=PIPE
        if stdin is not None:
            assert proc.stdin is not None  # stdin=PIPE when there is stdin to write
            proc.stdin.write(stdin)
            proc.stdin.close()  # EOF after the password line, as over SSH
        try:
            async for raw in proc.stdout:
                line = raw.decode(errors="replace").rstrip("\n")
                tail.append(line)
                on_line(line)
            rc = await proc.wait()
        except asyncio.CancelledError:
            proc.kill()
            await proc.wait()
            raise
        return rc, "\n".join(tail)

    async def spawn(self, argv):
        # Its own session, so a signal to the controller's group does not reach it; it still ends
        # with the controller: its stdin is a pipe from this process, EOF when the controller dies.
        real, prefix = await self._as_root(reveal_argv(argv))
        proc = await asyncio.create_subprocess_exec(
            *real,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
            start_new_session=True,
            env=git_env(),
        )
        if prefix:
            assert proc.stdin is not None  # stdin=PIPE
            proc.stdin.write(prefix)
        return _LocalSpawned(proc)

    async def open_connection(self, host, port):
        if self._becomer is None:
            return await asyncio.open_connection(host, port)
        # As root, like every command of a become connection (connection/relay.py).
        argv, prefix = await self._as_root(relay.relay_argv(host, port))
        return await relay.open_local(argv, prefix, f"{self.name} as root", host, port)

    async def close(self):
        return None


class _LocalSpawned(Spawned):
    def __init__(self, proc):
        self._proc = proc

    async def readline(self) -> str:
        return (await self._proc.stdout.readline()).decode(errors="replace").rstrip("\n")

    async def close(self) -> None:
        if self._proc.stdin is not None and not self._proc.stdin.is_closing():
            self._proc.stdin.close()
        try:
            await asyncio.wait_for(self._proc.wait(), 5)
        except TimeoutError:
            self._proc.kill()
            await self._proc.wait()
