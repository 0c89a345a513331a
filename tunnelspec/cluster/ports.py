"""The one registry of TCP listeners tunnelspec starts (SECURITY.md, invariant B).

Every port a tunnelspec service listens on, on any host, is one `Listener` here: its host, who may
listen there (the service's user; root always may), and who may connect (root always may; `None`
means anyone: the API itself). The loopback isolation rules (components/isolation.py), the squatter
checks (deploy's first play, verify, status), `tunnelspec status`'s isolation line and the inventory's
port collisions are all derived from `listeners(cluster)`; the live audit (components/isolation_checks.py) holds
every socket a tunnelspec account listens on to it, so a listener added to the code without an entry
here fails verify, rollback and the lab's hostile-user test instead of quietly listening unguarded.

Pure: no I/O. Users are names; uids are resolved on the host when the rules are made.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from tunnelspec.inventory.addresses import ssh_host

# The front's hold port (components/front/model.py HOLD_PORT): HAProxy's `backup` server for held
# requests, where nothing may listen (only root could bind a port this low).
HOLD_PORT = 1


@dataclass(frozen=True)
class Listener:
    name: str  # what it is, for messages: "rpc-server", "tunnel to rpc-a", …
    host: str  # inventory host name
    port: int
    listen: str | None  # who may listen besides root (None: nobody)
    connect: tuple[str, ...] | None  # who may connect besides root; None: anyone (the API)
    unit: str = ""  # the unit serving it; it must not start without the rules
    var: str = ""  # the inventory variable that sets the port (for errors)
    var_host: str = ""  # the host whose variable it is ('' : `host`; a tunnel's is its node's)
    # Guarded by the loopback rules: False only for a public API, which answers on the network (its
    # guard there is TLS and the API key, docs/tls.md).
    loopback: bool = True

    @property
    def owner(self) -> str:
        return self.var_host or self.host

    label: str = ""  # status's and verify's words for the guard

    @property
    def open(self) -> bool:
        """Anyone may connect (the API at the front): only its listen guard applies."""
        return self.connect is None


def listeners(cluster) -> list[Listener]:
    """Every listener of the cluster as the inventory asks for it, main's first, then each node's."""
    return listeners_of(cluster.main, cluster.rpc)


def listeners_of(main, nodes) -> list[Listener]:
    out: list[Listener] = []
    for n in nodes:
        out.append(
            Listener(
                f"tunnel to {n.name}",
                main.name,
                n.tunnel_port,
                listen=main.users.tunnel,
                connect=(main.users.llama,),
                unit=f"tunnelspec-tunnel-{n.name}.service",
                var="tunnel_port",
                var_host=n.name,
                label="tunnel ports: llama-server only",
            )
        )
    front = main.front
    if front is not None:
        out.append(
            Listener(
                "llama-server",
                main.name,
                front.internal_port,
                listen=main.users.llama,
                connect=(front.user,),
                unit="tunnelspec-llama-server.service",
                var="llama_server_internal_port",
                label="llama-server's port: the front only",
            )
        )
        out.append(Listener("the front's hold port", main.name, HOLD_PORT, listen=None, connect=None))
        out.append(
            Listener(
                "bench's baseline llama-server",
                main.name,
                front.bench_port,
                listen=main.users.llama,
                connect=(),
                var="bench_port",
                label="bench's port: root only",
            )
        )
        if front.metrics is not None:
            readers = front.metrics.readers
            out.append(
                Listener(
                    "the metrics exporter",
                    main.name,
                    front.metrics.port,
                    listen=front.user,
                    connect=(front.user, *readers),
                    unit="tunnelspec-metrics.service",
                    var="metrics_port",
                    label=f"metrics port: the front{''.join(', ' + r for r in readers)} only",
                )
            )
        # The API: anyone may connect (with the key); only the front's user may answer there. Only a
        # loopback API is listen-guarded by the loopback rules (a public bind answers on the network).
        out.append(
            Listener(
                "the front (API)",
                main.name,
                main.server_port,
                listen=front.user,
                connect=None,
                unit="tunnelspec-front.service",
                var="llama_server_port",
                loopback=not main.public_bind,
            )
        )
    for n in nodes:
        out.append(
            Listener(
                "rpc-server",
                n.name,
                n.rpc_port,
                listen=n.users.rpc,
                connect=(n.users.tunnel,),
                unit="tunnelspec-rpc.service",
                var="rpc_port",
                label="rpc port: tunnel user only",
            )
        )
    return out


def on_host(cluster, host: str) -> list[Listener]:
    return [x for x in listeners(cluster) if x.host == host]


def _groups(items: Iterable[tuple[tuple[str, ...], int]]) -> list[dict]:
    by: dict[tuple[str, ...], list[int]] = {}
    for users, port in items:
        by.setdefault(users, []).append(port)
    return [{"ports": sorted(set(ports)), "users": list(users)} for users, ports in by.items()]


def isolation_args(cluster, host: str) -> dict:
    """local_isolation's arguments on `host`, all derived from the registry: connect guards (`ports`,
    `users`, `more`), listen guards (`listeners`), the units that require the rules, and the label."""
    here = [x for x in on_host(cluster, host) if x.loopback]
    connect = _groups((x.connect, x.port) for x in here if x.connect is not None)
    listen = _groups(((x.listen,) if x.listen else (), x.port) for x in here)
    first = connect[0] if connect else {"ports": [], "users": []}
    units = [x.unit for x in here if x.unit and x.connect is not None]
    tunnels = [
        u.removeprefix("tunnelspec-tunnel-").removesuffix(".service")
        for u in units
        if u.startswith("tunnelspec-tunnel-")
    ]
    return {
        "ports": first["ports"],
        "users": first["users"],
        "more": connect[1:],
        "listeners": listen,
        "guarded": sorted({u for u in units if not u.startswith("tunnelspec-tunnel-")}),
        "guarded_tunnels": tunnels,
        "label": label(here),
    }


def label(here: list[Listener]) -> str:
    """What status and verify print when the rules are in place: each guard's words, once."""
    return "; ".join(dict.fromkeys(x.label for x in here if x.label and x.connect is not None))


# The order collisions are looked for in: the earlier listener keeps its port, the later is named.
_CLAIM_ORDER = (
    "llama_server_port",
    "llama_server_internal_port",
    "metrics_port",
    "bench_port",
    "",
    "tunnel_port",
    "rpc_port",
)


def collisions(inv, main, nodes) -> list[tuple[Listener, Listener, str]]:
    """(the listener that has the port, the one that wants it too, the machine's address) for each
    pair that would share a port on one machine: one host, or two nodes at one address. Main and a
    node at one address stay apart (tests run several sshds on 127.0.0.1; their services are the
    same machine's only in the lab's own hosts, which have addresses of their own)."""
    seen: dict[tuple[str, int], Listener] = {}
    out = []
    for x in sorted(listeners_of(main, nodes), key=lambda x: _CLAIM_ORDER.index(x.var)):
        address = ssh_host(x.host, inv.host_vars(x.host))
        other = seen.get((address, x.port))
        if other is not None and (other.host == x.host or main.name not in (other.host, x.host)):
            out.append((other, x, address))
        else:
            seen.setdefault((address, x.port), x)
    return out
