"""PortOwners: who holds each listening TCP port on a host — the socket's owner (uid and name) and the
processes holding it (pid, user, command line), in one probe.

`ss -Hltnpe` gives the listener, its processes and the socket's owner (`uid:N`, printed only when
not 0), e.g.
`LISTEN 0 0 127.0.0.1:50052 0.0.0.0:* users:(("python3",pid=812,fd=3)) uid:65534 ino:96841 sk:3 <->`;
`ps` gives each process's user and full command line, `getent passwd` each owner's name and comment.
The process names in `users:((…))` are the processes' own: any user names its process `uid:0`, so the
owner is read where ss prints it, right after that list (_OWNER), never found by a search of the line.
A guarded port held by another owner than its service's is a squatter (components/isolation.py refuses to
deploy through it; status names it) — unless the owner is one of tunnelspec's own service accounts
(marked by their comment): a deploy that gives a service another user (llama_user, front_user, …)
finds the service still running as the old one, and moves it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from tunnelspec.core.constants import SERVICE_USER_MARK
from tunnelspec.facts import sections
from tunnelspec.facts.fact import Fact
from tunnelspec.facts.sockets import _PROC, _split_endpoint

# The socket's owner: `uid:N ` (only when not root) then `ino:N`, right after the process list's end
# (`…",pid=N,fd=N)) `) or at the start when no process is visible. A name cannot forge that end: ss
# cuts a name at its first `)` (it reads /proc/PID/stat with `%[^)]`) and the kernel keeps 15 bytes.
# (ss pads its columns: newer iproute2, trixie's 6.x, puts several spaces after the process list.)
_OWNER = re.compile(r'(?:^|",pid=\d+,fd=\d+\)\)\s+)(?:uid:(\d+)\s+)?ino:\d+(?=\s|$)')

# One `ss`, kept in a variable: the shell reads the processes' pids and the owners' uids from it (no
# second listing), then one `ps` for every pid and one `getent` for every owner. The uids looked up
# are read where _OWNER reads an owner (the word after the process list's first "))", else the 6th
# field), so a uid written in a process name is not looked up; and a lookup only adds what the host's
# passwd says of that uid: which uid owns a listener is parse's reading of the line (_OWNER) alone.
SCRIPT = r"""
l=$(ss -Hltnpe)
echo "== ss"; [ -z "$l" ] || printf '%s\n' "$l"
nl='
'
pids=, uids=
set -f
IFS=$nl
for line in $l; do
  r=$line
  while :; do
    case $r in *pid=*) r=${r#*pid=} ;; *) break ;; esac
    p=${r%%[!0-9]*}
    [ -z "$p" ] || case $pids in *",$p,"*) ;; *) pids=$pids$p, ;; esac
  done
  case $line in *"users:(("*) line="${line%%"users:(("*} ${line#*"))"}" ;; esac
  unset IFS
  set -- $line
  IFS=$nl
  case $6 in
    uid: | uid:*[!0-9]*) ;;
    uid:*) case "$uids " in *" ${6#uid:} "*) ;; *) uids="$uids ${6#uid:}" ;; esac ;;
  esac
done
unset IFS
pids=${pids#,}
echo "== ps"; [ -z "$pids" ] || ps -ww -o pid=,user:32=,args= -p "${pids%,}"
echo "== users"
[ -z "$uids" ] || getent passwd $uids | while IFS=: read -r name pw uid gid comment rest; do echo "$uid $name:$comment"; done
echo "== end"
"""


@dataclass(frozen=True)
class Holder:
    pid: int
    user: str
    command: str


@dataclass(frozen=True)
class OwnedListener:
    address: str
    port: int
    uid: int
    owner: str  # the uid's name on the host ('' when it has none)
    ours: bool = False  # the owner is an account tunnelspec created (SERVICE_USER_MARK)
    holders: tuple[Holder, ...] = field(default=())

    def describe(self) -> str:
        who = f"user {self.owner or '?'} (uid {self.uid})"
        procs = "; ".join(f"pid {h.pid} {h.command!r}" for h in self.holders) or "no process visible"
        return f"{self.address}:{self.port} held by {who}: {procs}"


def parse(text: str) -> list[OwnedListener]:
    s = sections(text)
    if "end" not in s:
        raise ValueError("incomplete port owner probe output")
    procs: dict[int, Holder] = {}
    for line in s.get("ps", []):
        parts = line.split(None, 2)
        if len(parts) >= 2 and parts[0].isdigit():
            procs[int(parts[0])] = Holder(int(parts[0]), parts[1], parts[2] if len(parts) > 2 else "")
    names: dict[int, str] = {}
    marked: set[int] = set()
    for line in s.get("users", []):
        uid_text, _, entry = line.partition(" ")
        if uid_text.isdigit():
            name, _, comment = entry.partition(":")
            names[int(uid_text)] = name.strip()
            if comment.strip() == SERVICE_USER_MARK:
                marked.add(int(uid_text))
    names[0] = "root"
    out = []
    for line in s.get("ss", []):
        parts = line.split()
        if len(parts) < 5 or parts[0] != "LISTEN":
            continue
        try:
            address, port = _split_endpoint(parts[3])
        except ValueError:
            continue
        rest = line.split(None, 5)[5] if len(parts) > 5 else ""
        m = _OWNER.search(rest)
        if m is None:
            # Read as root it would never be a squatter: an owner not found is an error, not uid 0.
            raise ValueError(f"port owner probe: no socket owner (ino:) in the ss line {line.strip()!r}")
        uid = int(m.group(1) or 0)
        holders = tuple(procs.get(int(pid), Holder(int(pid), "?", name)) for name, pid in _PROC.findall(rest))
        out.append(OwnedListener(address, port, uid, names.get(uid, ""), uid in marked, tuple(dict.fromkeys(holders))))
    return out


def listeners() -> Fact[list[OwnedListener]]:
    """Every TCP listener with its socket's owner and the processes holding it."""
    return Fact(["sh", "-c", SCRIPT], parse)


def squatters(listeners: list[OwnedListener], allowed: dict[int, set[int]]) -> list[OwnedListener]:
    """The listeners on a guarded port (`allowed`: port → the uids that may listen there, root
    always) owned by anyone else, on any address — tunnelspec's own service accounts aside."""
    return [
        listener
        for listener in listeners
        if listener.port in allowed
        and listener.uid != 0
        and listener.uid not in allowed[listener.port]
        and not listener.ours
    ]


async def observe(conn) -> list[OwnedListener]:
    return await listeners().gather(conn, timeout=30)
