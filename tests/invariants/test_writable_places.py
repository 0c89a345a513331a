"""SECURITY.md, invariant A: the places a service user can write are declared once
(tunnelspec/core/writable.py), and the declaration is what the deploy renders: every directory a
unit gives its (non-root) user is declared, with that unit and directive, and every declared one is
made by its unit. The constants the code uses agree with it. A unit that hands its user a new
directory fails here until the directory is declared with its reason (shown on a planted unit)."""

from __future__ import annotations

import pytest

from tunnelspec.cluster.model import Cluster
from tunnelspec.components.front import model as front
from tunnelspec.components.tunnel.units import KEY_PATH
from tunnelspec.core import writable
from tunnelspec.core.constants import TLS_KEY
from tunnelspec.core.errors import ClusterError
from tunnelspec.inventory import load_inventory

from support.deploy_render import lab_inventory
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


def test_the_inventory_refuses_a_secret_file_in_a_service_writable_place(tmp_path):
    """Root reads the API key (systemd's LoadCredential=, verify, bench) and makes the key and the
    scrape token private: a path in a place a service user can write would let that user point it
    anywhere. Refused by name, with the place."""
    public = "llama_server_host=192.0.2.10\nllama_server_public_bind=true\nmetrics=true\n"
    cases = [
        ("llama_server_api_key_file=/run/tunnelspec-llama/key\n", "llama_server_api_key_file", "/run/tunnelspec-llama"),
        ("llama_server_api_key_file=/var/run/tunnelspec-front/../tunnelspec-front/key\n", "llama_server_api_key_file",
         "/run/tunnelspec-front"),
        ("llama_server_api_key_file=/dev/shm/key\n", "llama_server_api_key_file", "/dev/shm"),
        (public + "llama_server_api_key_file=/etc/tunnelspec/key\nmetrics_token_file=/run/tunnelspec-front/token\n",
         "metrics_token_file", "/run/tunnelspec-front"),
    ]
    for i, (main_vars, var, place) in enumerate(cases):
        d = tmp_path / str(i)
        d.mkdir()
        with pytest.raises(ClusterError) as e:
            Cluster.from_inventory(load_inventory(lab_inventory(d, main_vars)))
        assert e.value.var == var and f"is in {place}, which a service user can write" in str(e.value), str(e.value)
