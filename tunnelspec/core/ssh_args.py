"""The ssh arguments Ansible users write in `ansible_ssh_common_args` / `ansible_ssh_extra_args`,
read into what tunnelspec's own SSH client does with them.

tunnelspec does not run OpenSSH's `ssh` to reach a host, so an argument is either carried out the
same way by the client (connection/ssh.py) or refused with the reason; none is accepted and then
ignored. Carried out:

- `-J HOPS`, `-o ProxyJump=HOPS`: the connection goes through each jump host in turn (an SSH
  connection to the hop, then a direct-tcpip channel to the next one), host keys checked for every
  hop against the same known_hosts as the host itself. `ProxyJump=none` means no jump.
- `-o ProxyCommand="ssh -W %h:%p [-q] [-p PORT] [-l USER] [USER@]HOST"`: the classic way of writing
  a jump host before ProxyJump existed; read as that jump host. Any other ProxyCommand is refused.
- `-o ConnectTimeout=N`: seconds for each TCP connect, as `ansible_ssh_timeout`.
- `-o ServerAliveInterval=N`, `-o ServerAliveCountMax=N`: the keepalive of the connection.
- `-o StrictHostKeyChecking=yes`: what tunnelspec always does.
- `-C`, `-o Compression=…`, `-o ControlMaster=…`, `-o ControlPersist=…`, `-o ControlPath=…`: no
  effect needed: tunnelspec keeps one connection per host for a whole run (what a control master
  gives OpenSSH) and never compresses (the traffic is commands and small files).

Refused, each with its reason: anything that weakens host-key checking
(`StrictHostKeyChecking=no|accept-new|off`, `UserKnownHostsFile`), any other option or flag.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass

from tunnelspec.core.errors import UsageError


class SshArgsError(UsageError, ValueError):
    """Arguments tunnelspec cannot carry out; the text is the reason alone."""


@dataclass(frozen=True)
class Hop:
    host: str
    port: int | None = None  # None: 22, or the ssh_config's Port for that host
    user: str | None = None  # None: the ssh_config's User for that host, else the controller's user

    def __str__(self) -> str:
        user = f"{self.user}@" if self.user else ""
        host = f"[{self.host}]" if ":" in self.host and self.port is not None else self.host
        return f"{user}{host}" + (f":{self.port}" if self.port is not None else "")


@dataclass(frozen=True)
class SshArgs:
    jump: tuple[Hop, ...] = ()
    connect_timeout: float | None = None
    keepalive_interval: float | None = None
    keepalive_count_max: int | None = None


_NO_EFFECT = {"compression", "controlmaster", "controlpersist", "controlpath"}
_WEAKENS = (
    "tunnelspec always checks host keys strictly against tunnelspec_known_hosts "
    "(first contact: `tunnelspec hostkeys scan`, or --accept-new-host-keys)"
)
_HOST = re.compile(r"^[A-Za-z0-9_.\-:%\[\]]+$")


def _hop(text: str) -> Hop:
    t = text.strip()
    if t.startswith("ssh://"):
        t = t[len("ssh://") :].rstrip("/")
    user = None
    if "@" in t:
        user, t = t.rsplit("@", 1)
        if not user or not re.fullmatch(r"[A-Za-z0-9_.\-]+", user):
            raise SshArgsError(f"jump host {text!r}: bad user name")
    port = None
    m = re.fullmatch(r"\[([^\]]+)\](?::(\d+))?", t)
    if m:
        t, port_text = m.group(1), m.group(2)
    elif t.count(":") == 1:
        t, port_text = t.split(":")
    else:
        port_text = None
    if port_text is not None:
        if not port_text.isdigit() or not 1 <= int(port_text) <= 65535:
            raise SshArgsError(f"jump host {text!r}: the port must be 1..65535")
        port = int(port_text)
    if not t or t.startswith("-") or not _HOST.match(t):
        raise SshArgsError(f"jump host {text!r}: not a host name or address")
    return Hop(t, port, user)


def _hops(value: str) -> tuple[Hop, ...]:
    if value.strip().lower() == "none":
        return ()
    return tuple(_hop(part) for part in value.split(","))


def _proxy_command(value: str) -> tuple[Hop, ...]:
    """`ssh -W %h:%p … [USER@]HOST` as its jump host; anything else is refused."""
    try:
        argv = shlex.split(value)
    except ValueError as err:
        raise SshArgsError(f"ProxyCommand: {err}") from None
    refuse = SshArgsError(
        f"ProxyCommand {value!r}: tunnelspec runs no local command to connect; only "
        "`ssh -W %h:%p [USER@]JUMPHOST` is read (as that jump host): write -o ProxyJump=[USER@]JUMPHOST[:PORT]"
    )
    if not argv or argv[0].rsplit("/", 1)[-1] != "ssh":
        raise refuse
    port = user = host = None
    seen_w = False
    i = 1
    while i < len(argv):
        a = argv[i]
        if a == "-W" and i + 1 < len(argv) and argv[i + 1] in ("%h:%p", "[%h]:%p"):
            seen_w, i = True, i + 2
        elif a == "-q":
            i += 1
        elif a in ("-p", "-l") and i + 1 < len(argv):
            if a == "-p":
                port = argv[i + 1]
            else:
                user = argv[i + 1]
            i += 2
        elif not a.startswith("-") and host is None:
            host, i = a, i + 1
        else:
            raise refuse
    if not seen_w or host is None:
        raise refuse
    hop = _hop(host)
    if port is not None:
        if not port.isdigit() or not 1 <= int(port) <= 65535:
            raise refuse
        hop = Hop(hop.host, int(port), hop.user)
    if user is not None:
        hop = Hop(hop.host, hop.port, user)
    return (hop,)


def _number(key: str, value: str, whole: bool = False) -> float:
    try:
        n = float(value)
        if n < 0 or (whole and n != int(n)):
            raise ValueError
    except ValueError:
        kind = "a whole number" if whole else "a number of seconds"
        raise SshArgsError(f"-o {key}={value}: must be {kind}") from None
    return n


def parse(text: object) -> SshArgs:
    """The arguments of one variable, read; SshArgsError with the reason when one cannot be carried out."""
    if text is None:
        return SshArgs()
    if not isinstance(text, str):
        raise SshArgsError(f"must be text (ssh arguments), got {text!r}")
    try:
        argv = shlex.split(text)
    except ValueError as err:
        raise SshArgsError(f"cannot split into arguments: {err}") from None
    options: list[tuple[str, str, str]] = []
    i = 0
    while i < len(argv):
        a = argv[i]
        if a == "-C":
            i += 1
            continue
        if a in ("-o", "-J"):
            if i + 1 >= len(argv):
                raise SshArgsError(f"{a} needs a value")
            value, i = argv[i + 1], i + 2
        elif a.startswith("-o") or a.startswith("-J"):
            value, i = a[2:], i + 1
        else:
            raise SshArgsError(
                f"{a!r}: not an ssh argument tunnelspec carries out (it reads -J, -C and -o with ProxyJump, "
                "ProxyCommand 'ssh -W', ConnectTimeout, ServerAlive*, StrictHostKeyChecking=yes, Control*, "
                "Compression)"
            )
        if a.startswith("-J"):
            options.append(("proxyjump", value, f"-J {value}"))
            continue
        m = re.fullmatch(r"\s*([A-Za-z]+)\s*(?:=|\s)\s*(.*?)\s*", value)
        if not m:
            raise SshArgsError(f"-o {value!r}: not an option=value")
        options.append((m.group(1).lower(), m.group(2), f"-o {m.group(1)}={m.group(2)}"))
    jump: tuple[Hop, ...] | None = None
    out: dict = {}
    for key, value, raw in options:
        if key in ("proxyjump", "proxycommand"):
            hops = _hops(value) if key == "proxyjump" else _proxy_command(value)
            if jump is None:  # OpenSSH: the first value given for an option wins
                jump = hops
        elif key == "connecttimeout":
            out.setdefault("connect_timeout", _number("ConnectTimeout", value))
        elif key == "serveraliveinterval":
            out.setdefault("keepalive_interval", _number("ServerAliveInterval", value))
        elif key == "serveralivecountmax":
            out.setdefault("keepalive_count_max", int(_number("ServerAliveCountMax", value, whole=True)))
        elif key == "stricthostkeychecking":
            if value.lower() != "yes":
                raise SshArgsError(f"-o StrictHostKeyChecking={value}: refused: {_WEAKENS}")
        elif key in ("userknownhostsfile", "globalknownhostsfile"):
            raise SshArgsError(f"{raw}: refused: write tunnelspec_known_hosts instead; {_WEAKENS}")
        elif key in _NO_EFFECT:
            continue
        else:
            raise SshArgsError(
                f"{raw}: not an option tunnelspec carries out "
                "(ProxyJump, ProxyCommand 'ssh -W', ConnectTimeout, ServerAliveInterval, ServerAliveCountMax, "
                "StrictHostKeyChecking=yes, Control*, Compression); set it in ~/.ssh/config for the host, "
                "or remove it"
            )
    return SshArgs(jump=jump or (), **out)


def combined(common: object, extra: object) -> SshArgs:
    """Both variables read as OpenSSH reads one command line: common args first, so their values win.
    Each is the variable's text, or already read (an SshArgs: the declared type's value)."""
    a, b = (x if isinstance(x, SshArgs) else parse(x) for x in (common, extra))
    return SshArgs(
        jump=a.jump or b.jump,
        connect_timeout=a.connect_timeout if a.connect_timeout is not None else b.connect_timeout,
        keepalive_interval=a.keepalive_interval if a.keepalive_interval is not None else b.keepalive_interval,
        keepalive_count_max=a.keepalive_count_max if a.keepalive_count_max is not None else b.keepalive_count_max,
    )
