"""SECURITY.md, invariant B: every TCP listener tunnelspec starts is in the registry
(cluster/ports.py `listeners(cluster)`), from which the nftables guards are made.

- In what the deploy renders (tests/support/deploy_render.py): each port a unit's command line listens
  on (rpc-server -p, ssh -L), each `--port` of llama-server's command lines (the launcher's modes
  file), the exporter's `listen`, and the front's `bind` lines are registered listeners of that host;
  so is every server the front connects to.
- In the code: every place that picks a port or opens a listener (a function like `_free_port`, a
  range of ports, a socket bind, an HTTP server, `--port`/ssh -L in an argv) is in the reviewed list
  below, with where its port comes from.
Each check is shown failing on a planted case."""

from __future__ import annotations

import pytest

from support.deploy_render import ROOT
from support.invariants import front_connects, listener_sites, listens, unregistered

# (module, scope) -> where its port comes from. `transient`: about to go, not required to be found.
LISTENER_SITES: dict[tuple[str, str], str] = {
    ("tunnelspec/components/server/args.py", "build_server_argv"):
        "llama-server --port main.front.internal_port: the registry's 'llama-server'",
    ("tunnelspec/components/tunnel/units.py", "ssh_argv"):
        "ssh -L 127.0.0.1:<node.tunnel_port>: the registry's 'tunnel to <node>'",
    ("tunnelspec/components/rpc.py", "rpc_argv"): "rpc-server -H 127.0.0.1 -p node.rpc_port: the registry's 'rpc-server'",
    ("tunnelspec/commands/bench/argv.py", "baseline_argv"):
        "bench's baseline llama-server --port <port given by its caller> (the registry's 'bench's baseline "
        "llama-server', bench_port, once the bench registry change lands)",
    ("tunnelspec/commands/bench/argv.py", "DRAFT_FLAGS"): "names --port to drop it from the deployed argv: starts nothing",
    ("tunnelspec/llama/speculative.py", "<module>"): "OWNED_FLAGS names --port (the inventory's llama_server_port): starts nothing",
    ("tunnelspec/lab/aptrepo.py", "serve"):
        "the lab's package mirror (python -m http.server) on the controller's lab bridge: `tunnelspec lab up` only, "
        "no cluster host",
    ("tunnelspec/hostprogs/metrics.py", "Server"):
        "binds the configuration's `listen` = metrics_document's [127.0.0.1, metrics_port]: the registry's "
        "'the metrics exporter' (serve() refuses another address)",
}
TRANSIENT = {
    # removed by the bench registry change (bench's baseline then listens on the registry's bench_port)
    ("tunnelspec/commands/bench/command.py", "_free_port"):
        "picks the first free port above llama_server_port for bench's baseline: not the registry's bench_port",
}


def sites() -> list:
    files = sorted((ROOT / "tunnelspec").rglob("*.py"))  # the host programs (tunnelspec/hostprogs) too
    return [r for p in files for r in listener_sites(str(p.relative_to(ROOT)), p.read_text())]


def unlisted(refs) -> list[str]:
    return [f"{r.module}:{r.line} in {r.scope}: {r.what}" for r in refs
            if (r.module, r.scope) not in LISTENER_SITES and (r.module, r.scope) not in TRANSIENT]


def rendered_findings(deploy) -> list[str]:
    out = []
    for f in deploy.files:
        out += unregistered(deploy.cluster, f.host, listens(f.dest, f.text))
        if f.dest.endswith("/front.cfg"):
            out += unregistered(deploy.cluster, f.host, front_connects(f.text))
    return out


@pytest.mark.parametrize("variant", ["lab", "lab-public", "lab-split", "example"])
def test_every_rendered_listener_is_registered(deploys, variant):
    assert rendered_findings(deploys[variant]) == []


def test_the_rendered_listeners_are_found(deploys):
    """Not vacuous: each kind of listener is seen where the deploy renders it."""
    d = deploys["lab"]
    seen = {(f.host, p) for f in d.files for p, _ in listens(f.dest, f.text)}
    main, c = d.cluster.main, d.cluster
    assert {("main", main.server_port), ("main", main.front.internal_port), ("main", main.front.metrics.port),
            *(("main", n.tunnel_port) for n in c.rpc), *((n.name, n.rpc_port) for n in c.rpc)} <= seen
    front = d.file("main", "/etc/tunnelspec/front.cfg").text
    assert {p for p, _ in front_connects(front)} == {main.front.internal_port, 1}
    public = deploys["lab-public"]
    front = public.file("main", "/etc/tunnelspec/front.cfg").text
    assert {p for p, _ in front_connects(front)} == {public.cluster.main.front.internal_port, 1,
                                                     public.cluster.main.front.metrics.port}


def test_every_listener_in_the_code_is_reviewed():
    found = sites()
    assert unlisted(found) == []
    where = {(r.module, r.scope) for r in found}
    assert sorted(set(LISTENER_SITES) - where) == []  # no stale entry (TRANSIENT ones may go at any time)


# ---- planted cases -----------------------------------------------------------------------------------
def test_planted_front_binding_an_unregistered_port_fails(deploys):
    d = deploys["lab"]
    f = d.file("main", "/etc/tunnelspec/front.cfg")
    planted = f.text.replace("default_backend", "bind 127.0.0.1:9999\n    default_backend", 1)
    found = unregistered(d.cluster, "main", listens(f.dest, planted))
    assert len(found) == 1 and found[0].startswith("main: port 9999 (bind 127.0.0.1:9999) is not in cluster/ports.py"), found
    planted = f.text.replace("server hold", "server side 127.0.0.1:7000 backup\n    server hold", 1)
    assert [x.split(" (")[0] for x in unregistered(d.cluster, "main", front_connects(planted))] == ["main: port 7000"]


@pytest.mark.parametrize("line, port", [
    ("ExecStartPost=/usr/bin/ssh -N -R 127.0.0.1:2222:127.0.0.1:22 node", 2222),
    ("ExecStart=/usr/bin/stdbuf -oL /opt/tunnelspec/current/bin/llama-server --port 8181", 8181),
    ("ExecStartPre=/usr/bin/ssh -D 1080 node", 1080),
])
def test_planted_unit_listening_outside_the_registry_fails(deploys, line, port):
    d = deploys["lab"]
    f = d.file("main", "/etc/systemd/system/tunnelspec-tunnel-rpc-a.service")
    planted = f.text.replace("Restart=always", line + "\nRestart=always", 1)
    assert [x.split(" (")[0] for x in unregistered(d.cluster, "main", listens(f.dest, planted))] == [f"main: port {port}"]


def test_planted_exporter_listen_outside_the_registry_fails(deploys):
    d = deploys["lab"]
    f = d.file("main", "/etc/tunnelspec/metrics.json")
    planted = f.text.replace(f"{d.cluster.main.front.metrics.port}\n", "9467\n", 1)
    assert [x.split(" (")[0] for x in unregistered(d.cluster, "main", listens(f.dest, planted))] == ["main: port 9467"]


PLANTED_MODULE = '''
import socket

async def _pick_port(conn, start):
    for port in range(start, start + 100):
        pass

def serve_here():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen(5)

def argv(port):
    return ["python3", "-m", "http.server", str(port)]
'''


def test_planted_module_picking_a_port_fails():
    found = unlisted(listener_sites("tunnelspec/commands/peek.py", PLANTED_MODULE))
    assert found == [
        "tunnelspec/commands/peek.py:4 in _pick_port: picks a port: def _pick_port",
        "tunnelspec/commands/peek.py:5 in _pick_port: hunts a port: for port in range(start, start + 100)",
        "tunnelspec/commands/peek.py:10 in serve_here: a listener: s.bind(('127.0.0.1', 0))",
        "tunnelspec/commands/peek.py:11 in serve_here: a listener: s.listen(5)",
        "tunnelspec/commands/peek.py:14 in argv: asks a program to listen: 'http.server'",
    ], found
