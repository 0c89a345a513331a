"""SECURITY.md, invariant A: the places a service user can write are declared once
(tunnelspec/core/writable.py), and the declaration is what the deploy renders: every directory a
unit gives its (non-root) user is declared, with that unit and directive, and every declared one is
made by its unit. The constants the code uses agree with it. A unit that hands its user a new
directory fails here until the directory is declared with its reason (shown on a planted unit)."""

from __future__ import annotations

from tunnelspec.components.front import model as front
from tunnelspec.components.tunnel.units import KEY_PATH
from tunnelspec.core import writable
from tunnelspec.core.constants import TLS_KEY

from support.invariants import service_writable_dirs


def undeclared(deploy) -> list[str]:
    """Each directory a rendered unit lets its user write that the declaration does not list with that
    unit, directive and user role."""
    c = deploy.cluster
    roles = {c.main.users.llama: "llama", c.main.front.user: "front", c.main.users.tunnel: "tunnel",
             **{n.users.rpc: "rpc" for n in c.rpc}, **{n.users.tunnel: "tunnel" for n in c.rpc}}
    out = []
    for f in deploy.files:
        if not f.unit:
            continue
        unit = f.dest.rsplit("/", 1)[-1]
        for user, directive, path in service_writable_dirs(f.text):
            p = writable.place_of(path)
            if p is None or p.path != path or p.unit != unit or p.directive != directive or p.user != roles.get(user):
                out.append(f"{f.host}:{unit}: {directive} {path} ({user}) is not declared in core/writable.py "
                           f"with this unit, directive and user")
    return out


def made(deploys) -> set[tuple[str, str, str]]:
    return {(f.dest.rsplit("/", 1)[-1], directive, path)
            for d in deploys.values() for f in d.files if f.unit for _, directive, path in service_writable_dirs(f.text)}


def test_every_directory_a_unit_gives_its_user_is_declared(deploys):
    for d in deploys.values():
        assert undeclared(d) == [], d.name


def test_every_declared_directory_is_made_by_its_unit(deploys):
    found = made(deploys)
    for p in writable.SERVICE_DIRS:
        assert (p.unit, p.directive, p.path) in found, p
        assert p.path.startswith("/") and not p.path.endswith("/") and p.why


def test_the_code_s_constants_are_the_declaration():
    assert front.FRONT_RUN_DIR == writable.FRONT_RUN.path
    assert front.STATE_DIR_NAME == writable.LLAMA_RUN.name
    assert writable.LLAMA_RUN.holds(front.STATE_PATH)
    assert writable.FRONT_RUN.holds(front.FRONT_STATS) and writable.FRONT_RUN.holds(front.METRICS_SOCKET)
    # The watcher's own directory is root's (its unit has no User=): not a service user's place.
    assert writable.place_of(front.REJOIN_FLAG) is None and writable.place_of(front.WATCH_HELLO) is None
    assert writable.TLS_PRIVATE_KEY.path == TLS_KEY and writable.TUNNEL_KEY.path == KEY_PATH


def test_place_of_reads_paths_as_text():
    assert writable.place_of("/run/tunnelspec-llama/mode.json") is writable.LLAMA_RUN
    assert writable.place_of("/run/tunnelspec-llama") is writable.LLAMA_RUN
    assert writable.place_of("/run/tunnelspec-llama-bench/x") is None
    assert writable.place_of("/var/cache/tunnelspec-rpc/x") is writable.RPC_CACHE


PLANTED = """[Service]
User=tunnelspec-llama
RuntimeDirectory=tunnelspec-llama tunnelspec-llama-extra
ReadWritePaths=/var/lib/tunnelspec/uploads
ExecStart=/bin/true
"""


def test_planted_an_undeclared_runtime_directory_fails(deploys):
    d = deploys["lab"]
    f = d.file("main", "/etc/systemd/system/tunnelspec-llama-server.service")
    planted = type(d)(d.name, d.cluster, [type(f)(f.host, f.dest, f.src, PLANTED)], d.facts)
    found = undeclared(planted)
    assert found == [
        "main:tunnelspec-llama-server.service: RuntimeDirectory /run/tunnelspec-llama-extra (tunnelspec-llama) is not "
        "declared in core/writable.py with this unit, directive and user",
        "main:tunnelspec-llama-server.service: ReadWritePaths /var/lib/tunnelspec/uploads (tunnelspec-llama) is not "
        "declared in core/writable.py with this unit, directive and user"], found

