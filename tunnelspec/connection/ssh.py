"""Remote hosts over asyncssh: one connection per host, reused for every task."""

from __future__ import annotations

import asyncssh

from tunnelspec.connection import credentials, relay
from tunnelspec.connection.become import Become
from tunnelspec.connection.base import Connection, ConnectOptions, ConnectSession, Spawned, quote, reveal_argv
from tunnelspec.connection.hostkeys import HostKeyPolicy, load_known_hosts_text
from tunnelspec.connection.retry import connect_retrying
from tunnelspec.core.errors import HostKeyError, HostUnreachable
from tunnelspec.core.ssh_args import Hop
from collections import deque
import asyncio


# asyncssh's own default ciphers, AES-GCM moved ahead of chacha20-poly1305: both are AEAD with the
# same strength, but asyncssh builds a new ChaCha20 cipher object for every packet while AES-GCM keeps
# one per key (AES-NI); measured ≈ 30% less controller CPU per command. The list is only reordered,
# never extended; the server's preferences still decide nothing weaker than these. Key exchange stays
# asyncssh's default order (post-quantum hybrids first where the server has them): with OpenSSH 9.2
# it settles on curve25519-sha256 already, and the hybrid costs far less than a round trip elsewhere.
_CIPHERS = (
    "aes128-gcm@openssh.com",
    "aes256-gcm@openssh.com",
    "chacha20-poly1305@openssh.com",
    "aes256-ctr",
    "aes192-ctr",
    "aes128-ctr",
)


class _Client(asyncssh.SSHClient):
    def __init__(self, policy: HostKeyPolicy):
        self.policy = policy

    def validate_host_public_key(self, host, addr, port, key):
        return self.policy.validate(key)


class SSHConnection(Connection):
    def __init__(self, name: str, conn: asyncssh.SSHClientConnection, user: str, become: bool, become_password=None):
        self.name = name
        self._conn = conn
        self._hops: list[asyncssh.SSHClientConnection] = []  # jump hosts, first hop first
        self._target: tuple[str, ...] | None = None  # login, address, port, jump hosts (set by open)
        self.user = user
        self.is_root = user == "root"
        self._become = become and not self.is_root
        if self._become:
            self._becomer = Become(name, user, become_password)

    @classmethod
    async def open(
        cls,
        name: str,
        address: str,
        port: int,
        user: str,
        key_files: list[str],
        become: bool,
        opts: ConnectOptions,
        pin_path: str | None,
        session: ConnectSession,
        become_password=None,
        jump: tuple[Hop, ...] = (),
    ) -> SSHConnection:
        known_text = load_known_hosts_text(opts.known_hosts)
        client_keys = credentials.client_keys(name, key_files, opts.private_key)
        encrypted = client_keys[1]
        policy = HostKeyPolicy(name, address, port, known_text, opts.accept_new_host_keys, pin_path)
        kwargs = dict(_settings(policy, user, client_keys, opts), port=port)
        hops = await _open_jump(name, jump, known_text, client_keys, opts, pin_path, session)
        if hops:
            kwargs["tunnel"] = hops[-1]
        sock = None
        if session.preconnect is not None and not hops:
            sock = session.preconnect.take(address, port)
        try:
            async for attempt in connect_retrying():
                with attempt:
                    if sock is not None:  # first attempt only: a retry connects afresh
                        first, sock = sock, None
                        conn = await asyncssh.connect(address, sock=first, **kwargs)
                    else:
                        conn = await asyncssh.connect(address, **kwargs)
        except asyncssh.HostKeyNotVerifiable:
            _close_all(hops)
            raise policy.error() from None
        except asyncssh.PermissionDenied as e:
            _close_all(hops)
            raise HostUnreachable(
                f"{name} ({user}@{address}:{port}): authentication failed: {e.reason}. "
                "Check ansible_user, ansible_ssh_private_key_file, TUNNELSPEC_SSH_KEY or the agent."
                + (
                    f" Skipped encrypted key(s) {', '.join(encrypted)}: tunnelspec never asks for a "
                    "passphrase; load them into ssh-agent."
                    if encrypted
                    else ""
                )
            ) from None
        except HostKeyError:
            _close_all(hops)
            raise
        except (OSError, asyncssh.Error, TimeoutError) as e:
            _close_all(hops)
            via = f" through jump host {jump[-1]}" if jump else ""
            raise HostUnreachable(f"{name} ({address}:{port}){via}: cannot connect: {e}") from None
        if policy.pinned_line:
            session.new_host_keys.append((name, policy.pinned_line.strip()))
        out = cls(name, conn, user, become, become_password)
        out._hops = hops
        out._target = ("ssh", user, address, str(port), *map(str, jump))
        return out

    async def _exec(self, argv, input, timeout):
        try:
            proc = await self._conn.run(quote(argv), input=input, encoding=None, check=False)
        except (asyncssh.ConnectionLost, asyncssh.DisconnectError, OSError) as e:
            raise HostUnreachable(f"{self.name}: connection lost: {e}") from None
        rc = proc.exit_status if proc.exit_status is not None else 255
        return rc, proc.stdout or b"", proc.stderr or b""

    async def _stream(self, argv, on_line, timeout, stdin=None):
        tail: deque[str] = deque(maxlen=60)
        try:
            # stderr merged into stdout so progress and errors arrive in order.
            proc = await self._conn.create_process(
                quote(argv), stderr=asyncssh.STDOUT, encoding="utf-8", errors="replace"
            )
            if stdin is not None:
                proc.stdin.write(stdin.decode())
                proc.stdin.write_eof()
            async for line in proc.stdout:
                if not line:
                    break  # asyncssh's iterator yields "" once when EOF comes while it waits
                line = line.rstrip("\n")
                tail.append(line)
                on_line(line)
            await proc.wait()
        except (asyncssh.ConnectionLost, asyncssh.DisconnectError, OSError) as e:
            raise HostUnreachable(f"{self.name}: connection lost: {e}") from None
        rc = proc.exit_status if proc.exit_status is not None else 255
        return rc, "\n".join(tail)

    def cache_identity(self) -> tuple[str, ...] | None:
        return self._target

    def server_host_key(self) -> str | None:
        key = self._conn.get_server_host_key()
        return key.export_public_key().decode().strip() if key is not None else None

    async def open_connection(self, host, port):
        if self._becomer is None:
            return await self._conn.open_connection(host, port)
        # As root: a channel would be opened by the login's sshd session (connection/relay.py).
        argv, prefix = await self._as_root(relay.relay_argv(host, port))
        try:
            return await relay.open_ssh(self._conn, quote(argv), prefix, f"{self.name} as root", host, port)
        except (asyncssh.ConnectionLost, asyncssh.DisconnectError) as e:
            raise HostUnreachable(f"{self.name}: connection lost: {e}") from None

    async def spawn(self, argv):
        real, prefix = await self._as_root(reveal_argv(argv))
        try:
            proc = await self._conn.create_process(
                quote(real), stderr=asyncssh.STDOUT, encoding="utf-8", errors="replace"
            )
            if prefix:
                proc.stdin.write(prefix.decode())
        except (asyncssh.ConnectionLost, asyncssh.DisconnectError, OSError) as e:
            raise HostUnreachable(f"{self.name}: connection lost: {e}") from None
        return _SshSpawned(proc)

    async def close(self):
        for conn in [self._conn, *reversed(self._hops)]:
            conn.close()
            try:
                await conn.wait_closed()
            except Exception:  # noqa: BLE001 - closing a dead connection is not an error
                pass


def _settings(policy: HostKeyPolicy, username: str | None, client_keys: tuple, opts: ConnectOptions) -> dict:
    keys, encrypted = client_keys
    kwargs = dict(
        known_hosts=policy.asyncssh_known_hosts(),
        client_factory=lambda: _Client(policy),
        # Encrypted files stay in the list (asyncssh skips them, ignore_encrypted): an empty list would
        # fall back to ~/.ssh keys, None would disable the agent too.
        client_keys=(keys + encrypted) or (),
        connect_timeout=opts.connect_timeout,
        login_timeout=opts.login_timeout,
        keepalive_interval=opts.keepalive_interval,
        keepalive_count_max=opts.keepalive_count_max,
        compression_algs=None,
        encryption_algs=list(_CIPHERS),
        # Never prompt: no password or keyboard-interactive, and encrypted keys are skipped.
        password_auth=False,
        kbdint_auth=False,
        ignore_encrypted=True,
    )
    if username is not None:
        kwargs["username"] = username
    if not opts.use_ssh_config:
        kwargs["config"] = None
    return kwargs


async def _open_jump(
    name: str,
    jump: tuple[Hop, ...],
    known_text: str,
    client_keys: tuple,
    opts: ConnectOptions,
    pin_path: str | None,
    session: ConnectSession,
) -> list[asyncssh.SSHClientConnection]:
    """A jump host (ProxyJump): a connection to each hop in turn, the next one tunnelled through the
    one before, its host key checked like any host's (same known_hosts, same first-contact rule).
    The host's own connection then rides the last one. Raises HostKeyError / HostUnreachable naming
    the hop; nothing is left open then."""
    hops: list[asyncssh.SSHClientConnection] = []
    hop_policy: HostKeyPolicy | None = None
    try:
        for hop in jump:
            hop_policy = HostKeyPolicy(
                f"{name}'s jump host {hop}", hop.host, hop.port or 22, known_text, opts.accept_new_host_keys, pin_path
            )
            kwargs = _settings(hop_policy, hop.user, client_keys, opts)
            if hop.port is not None:
                kwargs["port"] = hop.port
            if hops:
                kwargs["tunnel"] = hops[-1]
            async for attempt in connect_retrying():
                with attempt:
                    hops.append(await asyncssh.connect(hop.host, **kwargs))
            if hop_policy.pinned_line:
                session.new_host_keys.append((f"{name} (jump host {hop})", hop_policy.pinned_line.strip()))
    except asyncssh.HostKeyNotVerifiable:
        _close_all(hops)
        assert hop_policy is not None
        raise hop_policy.error() from None
    except asyncssh.PermissionDenied as e:
        _close_all(hops)
        raise HostUnreachable(
            f"{name}: jump host {jump[len(hops)]}: authentication failed: {e.reason}. A jump host is logged "
            "into with the host's keys, ssh-agent, and ~/.ssh/config's User and IdentityFile for it."
        ) from None
    except (OSError, asyncssh.Error, TimeoutError) as e:
        _close_all(hops)
        raise HostUnreachable(f"{name}: jump host {jump[len(hops)]}: cannot connect: {e}") from None
    return hops


async def open_jump(name: str, jump: tuple[Hop, ...], opts: ConnectOptions, key_files: list[str], pin_path):
    """The jump chain alone (`hostkeys scan` reads a host's key through it); close with close_jump."""
    known_text = load_known_hosts_text(opts.known_hosts)
    keys = credentials.client_keys(name, key_files, opts.private_key)
    return await _open_jump(name, jump, known_text, keys, opts, pin_path, ConnectSession())


def close_jump(hops: list) -> None:
    _close_all(hops)


def _close_all(conns: list[asyncssh.SSHClientConnection]) -> None:
    for conn in reversed(conns):
        conn.close()


class _SshSpawned(Spawned):
    def __init__(self, proc):
        self._proc = proc

    async def readline(self) -> str:
        try:
            return (await self._proc.stdout.readline()).rstrip("\n")
        except (asyncssh.ConnectionLost, asyncssh.DisconnectError, OSError):
            return ""

    async def close(self) -> None:
        try:
            self._proc.stdin.write_eof()
            await asyncio.wait_for(self._proc.wait_closed(), 5)
        except Exception:  # noqa: BLE001 - a lost connection ended the process already
            pass
        self._proc.close()
