"""The network-wait sampler on real processes of this machine: a client blocked in recv() on a socket
to a "tunnel" port is counted, one blocked on another socket is not; the controller side starts and
stops it through a real connection (local, and over a real sshd) and reads its result. And the CLI
refuses --same-placement without --yes before contacting anything."""

from __future__ import annotations

import asyncio
import socket
import subprocess
import sys
import textwrap
import time

import pytest
from click.testing import CliRunner

from tunnelspec.commands.bench import netwait
from tunnelspec.cli.main import main as cli_main
from tunnelspec.connection.local import LocalConnection

# Two threads, each blocked in recv() on its own connection: the first to the "tunnel", the second
# to another port (llama-server's HTTP side, say). The servers never answer.
CLIENT = textwrap.dedent("""
    import socket, sys, threading
    a = socket.create_connection(("127.0.0.1", int(sys.argv[1])))
    b = socket.create_connection(("127.0.0.1", int(sys.argv[2])))
    threading.Thread(target=b.recv, args=(1,), daemon=True).start()
    print("connected", flush=True)
    a.recv(1)
""")


@pytest.fixture
def blocked_client():
    servers = []
    for _ in range(2):
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        s.listen()
        servers.append(s)
    tunnel, other = (s.getsockname()[1] for s in servers)
    proc = subprocess.Popen([sys.executable, "-c", CLIENT, str(tunnel), str(other)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "connected"
    held = [s.accept()[0] for s in servers]
    yield proc, tunnel, other
    proc.kill()
    proc.wait()
    for s in held + servers:
        s.close()


def _sample(pid: int, ports: list[int], seconds: float) -> str:
    p = subprocess.Popen(netwait.sampler_argv(pid, ports, 30), stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert p.stdout.readline().strip() == "ready"
    time.sleep(seconds)  # the measured work: here, the client's blocked recv()
    out, _ = p.communicate("", timeout=30)  # EOF on stdin ends the sampler
    return "ready\n" + out


def test_a_thread_blocked_on_the_tunnel_counts_one_on_another_socket_does_not(blocked_client):
    proc, tunnel, other = blocked_client
    pid = proc.pid
    w = netwait.summarize(_sample(pid, [tunnel], 0.6), {tunnel: "rpc-a"}, 0.6)
    assert w["stopped"] == "eof" and w["samples"] > 100
    assert 0.4 < w["seconds"] <= 1.0 and w["share"] > 0.6, w
    assert list(w["by_node"]) == ["rpc-a"]
    none = netwait.summarize(_sample(pid, [tunnel + 1 if tunnel + 1 != other else tunnel + 2], 0.3), {}, 0.3)
    assert none["seconds"] == 0.0 and none["samples"] > 50, none


# Two endpoints as llama-server's RPC dispatchers see them (one thread each): a "target node" whose
# every request waits long, and a "draft node" answering at once, its thread blocked a small share
# of the time between spells of work. A node's answers are its own work, not the test's pacing.
TWO_NODES = textwrap.dedent("""
    import socket, sys, threading, time
    def node(srv, delay):
        c, _ = srv.accept()
        while c.recv(1):
            time.sleep(delay)
            c.sendall(b"x")
    def dispatcher(port, work):
        s = socket.create_connection(("127.0.0.1", port))
        while True:
            s.sendall(b"q")
            s.recv(1)
            end = time.perf_counter() + work
            while time.perf_counter() < end:
                pass
    servers = []
    for delay in (0.2, 0.0002):
        srv = socket.socket(); srv.bind(("127.0.0.1", 0)); srv.listen()
        threading.Thread(target=node, args=(srv, delay), daemon=True).start()
        servers.append(srv)
    ports = [srv.getsockname()[1] for srv in servers]
    threading.Thread(target=dispatcher, args=(ports[0], 0.0), daemon=True).start()
    threading.Thread(target=dispatcher, args=(ports[1], 0.005), daemon=True).start()
    print(ports[0], ports[1], flush=True)
    sys.stdin.read()
""")


def test_a_short_waiting_thread_is_found_beside_a_long_waiting_one():
    """The lab's miss (a remote draft beside remote target layers): the target node's thread is found
    at the first sample; the draft node's, blocked a few percent of the time, must be found too
    within a bench-sized window — every thread is read until each tunnel port has one."""
    proc = subprocess.Popen([sys.executable, "-c", TWO_NODES], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            text=True)
    try:
        target, draft = (int(p) for p in proc.stdout.readline().split())
        for _ in range(3):  # three bench-sized windows, each must see both
            w = netwait.summarize(_sample(proc.pid, [target, draft], 0.15), {target: "rpc-b", draft: "rpc-a"}, 0.15)
            assert set(w["by_node"]) == {"rpc-a", "rpc-b"}, w
            assert w["by_node"]["rpc-b"] > w["by_node"]["rpc-a"] > 0, w
    finally:
        proc.kill()
        proc.wait()


def test_sampler_stops_by_itself_when_the_process_is_gone(blocked_client):
    proc, tunnel, _ = blocked_client
    pid = proc.pid
    p = subprocess.Popen(netwait.sampler_argv(pid, [tunnel], 30), stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert p.stdout.readline().strip() == "ready"
    proc.kill()  # not reaped yet: a zombie is gone too
    out = p.stdout.read()  # stdin still open: only the process's end stops it
    p.stdin.close()
    p.wait(timeout=30)
    assert netwait.summarize(out, {}, 1.0)["stopped"] == "process gone"


def test_sampler_says_why_when_it_cannot_read_the_process():
    out = subprocess.run(netwait.sampler_argv(2**22 + 12345, [15052], 5), input="", capture_output=True, text=True,
                         timeout=30).stdout
    w = netwait.summarize(out, {}, 1.0)
    assert w["seconds"] is None and "cannot read llama-server's threads" in w["why"]


def test_sampling_through_a_local_connection(blocked_client):
    proc, tunnel, _ = blocked_client
    pid = proc.pid

    async def go():
        conn = LocalConnection("main")
        s = await netwait.Sampling.start(conn, pid, [tunnel], 30)
        assert s.first == "ready"
        await asyncio.sleep(0.4)
        return await s.stop()

    w = netwait.summarize(asyncio.run(go()), {tunnel: "rpc-a"}, 0.4)
    assert w["stopped"] == "eof" and w["seconds"] > 0.2, w


def test_sampling_over_a_real_sshd(blocked_client, sshd_cluster):
    from tunnelspec.connection import connect
    from tunnelspec.inventory import load_inventory
    from tunnelspec.commands.runner import connect_options_from_env

    proc, tunnel, _ = blocked_client
    pid = proc.pid
    cluster = sshd_cluster(1)
    inv = load_inventory(str(cluster.inventory()))
    name = cluster.hosts[0].name

    async def go():
        conn = await connect(name, inv.host_vars(name), connect_options_from_env(), inv.path.parent)
        try:
            s = await netwait.Sampling.start(conn, pid, [tunnel], 30)
            assert s.first == "ready", s.first
            await asyncio.sleep(0.4)
            return await s.stop()
        finally:
            await conn.close()

    w = netwait.summarize(asyncio.run(go()), {tunnel: "rpc-a"}, 0.4)
    assert w["stopped"] == "eof" and w["seconds"] > 0.2, w


def test_same_placement_without_yes_is_refused_before_any_host_is_contacted(tmp_path):
    inv = tmp_path / "inventory.ini"
    # A main nothing listens for: reaching it would fail with exit 4, not 2.
    inv.write_text("[main]\nm ansible_host=127.0.0.1 ansible_port=1\n[rpc]\nr ansible_host=127.0.0.1 ansible_port=1 "
                   "rpc_role=draft\n[all:vars]\nllama_repo=/srv/llama.cpp\n"
                   "llama_commit=0123456789abcdef0123456789abcdef01234567\n")
    r = CliRunner().invoke(cli_main, ["bench", str(inv), "--same-placement"])
    assert r.exit_code == 2, r.output
    assert "stops the deployed llama-server" in r.output and "--yes" in r.output
    help_text = CliRunner().invoke(cli_main, ["bench", "--help"]).output
    for opt in ("--n-predict", "--runs", "--prompt", "--same-placement", "--yes", "--format", "-e"):
        assert opt in help_text
    assert "INTERRUPTS SERVING" in help_text
