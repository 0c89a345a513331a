"""Checks whose every read is named in their probes (docs/internals.md, "Probes"), run on this machine:
the task's `probes()` (or `cluster_probes(cluster)`) fetched in one batch as the executor does for a
play, then its check — and no command reaches the host but that one batch. Each task is built with
the arguments its playbook gives it; the reads are real (a git checkout, a build directory, a GGUF,
a stand-in llama-server that prints its version on stderr as the real one does). Checks that read
systemd or the journal (not running here) are run against answers for those commands instead:
every command they send is one their task names, but what only an earlier answer names."""

from __future__ import annotations

import asyncio
import json
import subprocess
import threading
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from tunnelspec.cluster.model import Cluster
from tunnelspec.components.build.build import LlamaBuild
from tunnelspec.components.build.upgrade import LlamaServerQuiesce
from tunnelspec.components.generation import live
from tunnelspec.components.generation.store import RECORDS_ARGV, STATUS_ARGV
from tunnelspec.components.generation.tasks import GenerationRecord
from tunnelspec.components.rpc import RPC_UNIT, RpcServedDevices, RpcServerBinary, RpcUnit, start_of_run_argv
from tunnelspec.components.front import model as front
from tunnelspec.components.front.serving import STATE_CAP
from tunnelspec.components.server import death as server_death
from tunnelspec.components.server.args import UNIT as SERVER_UNIT
from tunnelspec.components.server.fit import ModelFit
from tunnelspec.components.server.llama_verify import LlamaVerify
from tunnelspec.components.server.server import LlamaServerPlan
from tunnelspec.components.server.verify import journal_argv
from tunnelspec.components.source.checkout import LlamaSource
from tunnelspec.components.tunnel.sshd import TunnelSshdPolicy
from tunnelspec.components.tunnel.trust import TunnelAuthorizedKey
from tunnelspec.components.tunnel.tunnels import _INSTALLED_TUNNELS, TunnelProbe, TunnelUnits
from tunnelspec.components.tunnel.units import AES_NI_PROBE
from tunnelspec.connection.local import LocalConnection
from tunnelspec.connection.probes import _BATCH
from tunnelspec.engine.context import HostContext, RunOptions
from tunnelspec.facts import safe_read
from tunnelspec.facts import units as unit_facts
from tunnelspec.facts.files import file_state
from tunnelspec.facts.sockets import established
from tunnelspec.inventory.loader import load_inventory
from tunnelspec.lab import gguf_tiny
from tunnelspec.llama.served_plan import ServedPlan
from tunnelspec.llama.nvidia_smi import NVIDIA_SMI_PROBE

from support.recording import RecordingConnection

DATA = Path(__file__).resolve().parents[1] / "server" / "data"
RPC_HEADER = ("#define RPC_PROTO_MAJOR_VERSION    3\n#define RPC_PROTO_MINOR_VERSION    0\n"
              "#define RPC_PROTO_PATCH_VERSION    0\n")


def cluster_of(tmp_path: Path, main_vars: str = "", shares: tuple[str, str] = ("", "")) -> Cluster:
    path = tmp_path / "inv.ini"
    path.write_text("[main]\nmain ansible_host=192.0.2.10 " + main_vars + "\n\n[rpc]\n"
                    f"rpc-a ansible_host=192.0.2.11 rpc_role=draft {shares[0]}\n"
                    f"rpc-b ansible_host=192.0.2.12 rpc_role=target {shares[1]}\n\n[all:vars]\n"
                    'llama_repo=/srv/llama.cpp\nllama_commit="' + "a" * 40 + '"\n')
    return Cluster.from_inventory(load_inventory(path))


def ctx_of(conn, host: str = "main", cluster=None, tmp_path: Path | None = None, **vars) -> HostContext:
    return HostContext(host=host, conn=conn, vars=vars, facts={}, options=RunOptions(), emit=lambda e: None,
                       cluster=cluster, inventory_dir=tmp_path or Path.cwd())


def batched_check(task, ctx, cluster=None):
    """The task's probes in one batch (with one probe of another task: a batch needs two), then its
    check; returns (its change, every command the host ran)."""
    conn = ctx.conn
    named = task.cluster_probes(cluster) if task.reads_cluster else task.probes()
    assert named, f"{task.module} names no probe"

    async def go():
        assert await conn.prefetch([*named, ["true"]]) == len({tuple(a) for a in named}) + 1, \
            "a named probe failed in the batch: its check would run it again"
        return await task.check(ctx)

    ch = asyncio.run(go())
    assert len(conn.ran) == 1 and conn.ran[0][2] == _BATCH, [a[:3] for a in conn.ran]
    assert conn.changes_started == 0
    return ch, conn.ran


def git(d: Path, *args: str) -> str:
    return subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", "-C", str(d), *args],
                          check=True, capture_output=True, text=True, timeout=60).stdout.strip()


@pytest.fixture
def checkout(tmp_path) -> Path:
    """`<root>/src/llama.cpp`: a git checkout with the files the build's state script reads."""
    src = tmp_path / "root" / "src" / "llama.cpp"
    (src / "ggml").mkdir(parents=True)
    (src / "ggml" / "CMakeLists.txt").write_text('option(GGML_RPC "rpc" OFF)\noption(GGML_NATIVE "n" ON)\n')
    (src / "tools" / "rpc").mkdir(parents=True)
    (src / "tools" / "rpc" / "CMakeLists.txt").write_text("set(TARGET rpc-server)\nadd_executable(${TARGET})\n")
    git(src, "init", "-q")
    git(src, "add", "-A")
    git(src, "commit", "-qm", "base")
    return src


def test_llama_source_reads_the_checkout_in_the_batch(tmp_path, checkout):
    commit = git(checkout, "rev-parse", "HEAD")
    task = LlamaSource.build({"repo": "https://github.com/ggml-org/llama.cpp", "commit": commit.upper(),
                              "root": str(tmp_path / "root")})
    ch, _ = batched_check(task, ctx_of(RecordingConnection(), tmp_path=tmp_path))
    assert ch.changed and "check out" in ch.msg  # no stack record yet; what matters: read from the batch


def test_llama_build_reads_its_build_state_in_the_batch(tmp_path, checkout):
    tree = git(checkout, "rev-parse", "HEAD^{tree}")
    task = LlamaBuild.build({"root": str(tmp_path / "root"), "role": "main", "tree": tree, "commit": "a" * 40,
                             "build_number": 11434, "cmake_args": ["-DGGML_NATIVE=OFF"]})
    ch, _ = batched_check(task, ctx_of(RecordingConnection()))
    assert ch.changed and ch.msg.startswith("build llama-server in build/")
    # backend cuda: the key holds what nvidia-smi reports, so only nvidia-smi is named.
    cuda = LlamaBuild.build({"root": "/opt/t", "role": "rpc", "tree": tree, "commit": "a" * 40, "backend": "cuda"})
    assert cuda.probes() == [NVIDIA_SMI_PROBE]


def test_llama_server_quiesce_reads_in_the_batch(tmp_path):
    task = LlamaServerQuiesce.build({"binary": str(tmp_path / "current" / "bin" / "llama-server")})
    ch, _ = batched_check(task, ctx_of(RecordingConnection()))
    assert not ch.changed and ch.msg == "llama-server not running"  # no systemd here: no MainPID


def test_tunnel_authorized_key_reads_the_node_in_the_batch(tmp_path):
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    (home / ".ssh" / "authorized_keys").write_text("old line\n")
    key = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIEj4F0b5h9bmH0Vh1xWmDbVNpgXsUeO0NPQvEvP2aE6A"
    task = TunnelAuthorizedKey.build({"user": "tunnelspec-tunnel", "pubkey": key, "rpc_port": 50052,
                                      "from_address": "192.0.2.10", "home": str(home)})
    ch, _ = batched_check(task, ctx_of(RecordingConnection(), host="rpc-a"), cluster=None)
    assert ch.changed and ch.msg == "install restricted tunnel key"


def test_tunnel_sshd_policy_reads_the_node_in_the_batch(tmp_path):
    config = tmp_path / "sshd_config"
    config.write_text(f"Include {tmp_path}/sshd_config.d/*.conf\nPasswordAuthentication no\n")
    task = TunnelSshdPolicy.build({"user": "tunnelspec-tunnel", "config": str(config),
                                   "path": str(tmp_path / "sshd_config.d" / "tunnelspec-tunnel.conf")})
    ch, _ = batched_check(task, ctx_of(RecordingConnection(), host="rpc-a", tmp_path=tmp_path))
    assert ch.changed and ch.msg.startswith("install ")


def test_rpc_server_binary_reads_the_candidates_in_the_batch(tmp_path):
    bin_dir = tmp_path / "build" / "k" / "bin"
    bin_dir.mkdir(parents=True)
    exe = bin_dir / "ggml-rpc-server"
    exe.write_text("#!/bin/sh\n")
    exe.chmod(0o755)
    task = RpcServerBinary.build({"root": str(tmp_path), "build_bin": {"ggml-rpc-server": str(exe)}})
    ctx = ctx_of(RecordingConnection(), host="rpc-a")
    ch, _ = batched_check(task, ctx)
    assert ch.msg == str(exe) and ctx.facts["rpc_server_bin"] == str(exe)
    # Without the argument: this run's llama_build, as before (read by the check itself).
    assert RpcServerBinary.build({"root": str(tmp_path)}).probes() == []


def test_rpc_unit_reads_its_unit_file_in_the_batch(tmp_path):
    cluster = cluster_of(tmp_path)
    task = RpcUnit.build({"binary": "/opt/tunnelspec/current/bin/ggml-rpc-server"})
    batched_check(task, ctx_of(RecordingConnection(), host="rpc-a", cluster=cluster, tmp_path=tmp_path), cluster)


def served(mib: int) -> list[dict]:
    return [{"name": "CPU", "description": "x", "kind": "cpu", "total_mib": mib, "free_mib": mib}]


def test_model_fit_reads_the_headers_in_the_batch(tmp_path):
    model = tmp_path / "tiny.gguf"
    gguf_tiny.write_tiny_llama(model)
    cluster = cluster_of(tmp_path, shares=("rpc_target_share=1", "rpc_target_share=3"))
    task = ModelFit.build({"draft_model": str(model), "target_model": str(model)})
    assert len(task.cluster_probes(cluster)) == 2  # the target's too: its shares are given
    hostvars = {"rpc-a": {"rpc_served": served(24000)}, "rpc-b": {"rpc_served": served(24000)}}
    ch, _ = batched_check(task, ctx_of(RecordingConnection(), cluster=cluster, hostvars=hostvars), cluster)
    assert not ch.changed and "rpc-a: the draft and 25% of the target fits" in ch.msg, ch.msg


def stand_in_main(tmp_path: Path, shares: tuple[str, str]) -> tuple[Cluster, str, Path]:
    """main's root with a stand-in llama-server (b11434's own --help on stdout, its --version on
    stderr) and the source's RPC header, a tiny model, the cluster."""
    root = tmp_path / "root"
    (root / "current" / "bin").mkdir(parents=True)
    binary = root / "current" / "bin" / "llama-server"
    binary.write_text('#!/bin/sh\ncase "$1" in\n'
                      f'  --version) cat "{DATA}/llama-server-version-b11434.txt" >&2 ;;\n'
                      f'  --help) cat "{DATA}/llama-server-help-b11434.txt" ;;\nesac\n')
    binary.chmod(0o755)
    header = root / "src" / "llama.cpp" / "ggml" / "include" / "ggml-rpc.h"
    header.parent.mkdir(parents=True)
    header.write_text(RPC_HEADER)
    model = tmp_path / "tiny.gguf"
    gguf_tiny.write_tiny_llama(model)
    return cluster_of(tmp_path, f"tunnelspec_root={root}", shares), str(binary), model


def planned(cluster, binary: str, model: Path, conn, tmp_path: Path, batch: bool = False):
    """llama_server_plan's check (its probes batched first, or not): (its change, the fact it registers)."""
    args = {"binary": binary, "model": str(model), "draft_model": str(model)}
    devices = {str(n.tunnel_port): [f"RPC{i}"] for i, n in enumerate(cluster.rpc)}
    task = LlamaServerPlan.build(args)
    ctx = ctx_of(conn, cluster=cluster, tmp_path=tmp_path, rpc_devices=devices)
    ch = batched_check(task, ctx, cluster)[0] if batch else asyncio.run(task.check(ctx))
    return ch, ctx.facts["llama_server"]


def test_llama_server_plan_reads_the_build_in_the_batch_and_plans_the_same(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    # Target shares given: the target's header is read too.
    cluster, binary, model = stand_in_main(tmp_path, ("rpc_target_share=1", "rpc_target_share=3"))
    alone, fact = planned(cluster, binary, model, RecordingConnection(), tmp_path)
    ch, from_batch = planned(cluster, binary, model, RecordingConnection(), tmp_path, batch=True)
    assert ch.msg == alone.msg and from_batch == fact
    assert "version unknown" not in fact["build"], fact["build"]  # llama-server prints it on stderr


# ---- checks that read systemd or the journal (not running here): what they probe is what they name --
class Host(LocalConnection):
    """This machine, except for the commands `table` answers ({argv: stdout}: systemd's and the
    journal's, which do not run here). Keeps every command a check sent; a `run` fails the test."""

    def __init__(self, table: dict[tuple[str, ...], str]) -> None:
        super().__init__("main")
        self.table, self.probed = table, []

    async def _exec(self, argv, input, timeout):
        self.probed.append(tuple(argv))
        if tuple(argv) in self.table:
            return 0, self.table[tuple(argv)].encode(), b""
        return await super()._exec(argv, input, timeout)

    async def run(self, argv, **_):
        raise AssertionError(f"a check ran {argv}")


def probed_as_named(task, ctx, cluster, unnamed: tuple = ()) -> Counter:
    """Runs the check (no batch: every read reaches `Host`); every command it sent is one its task
    names, as many times as named, but `unnamed` (named by an earlier answer). Returns what was named
    and not read (reads an answer made unnecessary)."""
    named = Counter(tuple(a) for a in (task.cluster_probes(cluster) if task.reads_cluster else task.probes()))
    asyncio.run(task.check(ctx))
    probed = Counter(a for a in ctx.conn.probed if a not in unnamed)
    assert probed <= named, f"read and not named: {list(probed - named)}"
    return named - probed


def test_tunnel_units_name_every_unit_and_service_they_read(tmp_path):
    cluster = cluster_of(tmp_path)
    task = TunnelUnits.build({"nodes": "all"})
    units = [f"tunnelspec-tunnel-{n}.service" for n in ("rpc-a", "rpc-b")]
    table = {tuple(AES_NI_PROBE): "aes\n", tuple(unit_facts.stale(units).argv): "",
             tuple(_INSTALLED_TUNNELS): "\n".join(units) + "\n",
             **{tuple(unit_facts.service(u).argv): "active\nenabled\n" for u in units}}
    for u in units:  # not installed yet
        table[tuple(file_state(f"/etc/systemd/system/{u}").argv)] = "absent\n"
    ctx = ctx_of(Host(table), cluster=cluster, tmp_path=tmp_path, tunnel_pubkey="ssh-ed25519 AAAA x")
    assert probed_as_named(task, ctx, cluster) == Counter()
    assert task.cluster_probes(None) == task.probes()  # no cluster: what probes() names


def test_tunnel_probe_reads_the_header_and_the_tunnels_clients(tmp_path):
    cluster = cluster_of(tmp_path)
    header = tmp_path / "ggml" / "include" / "ggml-rpc.h"
    header.parent.mkdir(parents=True)
    header.write_text(RPC_HEADER)
    task = TunnelProbe.build({"source_dir": str(tmp_path)})
    table = {tuple(established(n.tunnel_port).argv): f"0 0 127.0.0.1:{n.tunnel_port} 127.0.0.1:4{i}000\n"
             for i, n in enumerate(cluster.rpc)}
    ctx = ctx_of(Host(table), cluster=cluster)
    assert probed_as_named(task, ctx, cluster) == Counter()
    assert not TunnelProbe.build({"source_dir": "/s", "allow_busy": False}).cluster_probes(cluster)[1:]


def test_rpc_served_devices_read_the_banner_they_name(tmp_path):
    cluster = cluster_of(tmp_path)
    task = RpcServedDevices.build({"binary": "/opt/tunnelspec/current/bin/ggml-rpc-server"})
    banner = (Path(__file__).resolve().parents[1] / "accel" / "data" / "rpc-banner-cpu.txt").read_text()
    ctx = ctx_of(Host({tuple(start_of_run_argv(RPC_UNIT)): banner}), host="rpc-a", cluster=cluster)
    assert probed_as_named(task, ctx, cluster) == Counter()
    assert ctx.facts["rpc_served"]


def test_generation_record_reads_mains_state_as_named(tmp_path):
    cluster = cluster_of(tmp_path)

    def state(argv) -> str:  # a deployed host: a current build, no managed file
        root, files = argv[4], argv[5:]
        return f"build {root}/build/0123456789abcdef\n" + "".join(f"file - - {f}\n" for f in files)

    mine = live.main_state_probes(cluster)[0]
    conn = Host({tuple(RECORDS_ARGV): "--- current \n", tuple(mine): state(mine)})
    nodes = {n.name: Host({tuple(a): state(a) for a in [live.host_state_argv("rpc", n.root)]}) for n in cluster.rpc}

    async def connect(name):
        return nodes[name]

    ctx = ctx_of(conn, cluster=cluster)
    ctx.connect = connect
    task = GenerationRecord.build({"models": []})
    # Named and not read: the metrics' status, read only when the state is the current generation's.
    assert probed_as_named(task, ctx, cluster) == Counter([tuple(STATUS_ARGV)])


def llama_server_standin(draft_n: int, fail_first: bool = False):
    """llama-server's HTTP side: healthy, a completion with `draft_n` draft tokens (`fail_first`: the
    first one fails, as when llama-server lost an RPC connection), its /props and /slots."""
    completions = []

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *a):
            pass

        def _send(self, payload, status=200):
            data = json.dumps(payload).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self):
            self._send([] if self.path == "/slots" else {"status": "ok"})

        def do_POST(self):
            self.rfile.read(int(self.headers.get("Content-Length", 0)))
            completions.append(1)
            if fail_first and len(completions) == 1:
                return self._send({"error": {"code": 500, "message": "Invalid input batch."}}, 500)
            self._send({"content": " upon a time", "timings": {"draft_n": draft_n, "draft_n_accepted": draft_n // 2,
                                                               "predicted_n": 32, "predicted_per_second": 40.0}})

    srv = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return srv


def test_llama_verify_reads_what_it_names_but_the_journal_its_invocation_names(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    # rpc-a holds the draft only: a plan with a degraded mode (the serving mode and the watch are read).
    cluster, binary, model = stand_in_main(tmp_path, ("", ""))
    _, plan = planned(cluster, binary, model, RecordingConnection(), tmp_path)
    assert ServedPlan.from_fact(plan).has_degraded_mode
    journal = journal_argv(SERVER_UNIT)  # the InvocationID and the journal of that run, in one command
    table = {
        tuple(safe_read.file_text(front.STATE_PATH, STATE_CAP).argv): '{"mode": "speculative"}',
        ("systemctl", "is-active", front.WATCH_UNIT): "active\n",
        tuple(unit_facts.properties(SERVER_UNIT, list(server_death.PROPS)).argv): "ActiveState=active\nNRestarts=0\n",
        tuple(journal): f"load_tensors: RPC0[127.0.0.1:{plan['draft_port']}] model buffer size = 1.00 MiB\n",
    }
    srv = llama_server_standin(draft_n=8)
    try:
        task = LlamaVerify.build({"port": srv.server_port, "plan": plan})
        ctx = ctx_of(Host(table), cluster=cluster)
        assert probed_as_named(task, ctx, cluster) == Counter()
    finally:
        srv.shutdown()
    assert ctx.facts["llama_verify"]["draft_n"] == 8
    assert tuple(journal) in ctx.conn.probed


def test_verify_reads_the_invocation_again_after_llama_server_restarted(tmp_path, monkeypatch):
    """A first completion that fails (llama-server lost an RPC connection and restarts): what the
    play's batch read of llama-server, its journal above all, is from before the restart and is
    dropped before the journal of the current run is looked for."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    cluster, binary, model = stand_in_main(tmp_path, ("", ""))
    _, plan = planned(cluster, binary, model, RecordingConnection(), tmp_path)
    srv = llama_server_standin(draft_n=8, fail_first=True)

    class Dropping(Host):
        def drop_probes(self):
            self.probed.append(("dropped",))
            super().drop_probes()

    journal = journal_argv(SERVER_UNIT)
    table = {tuple(journal): f"load_tensors: RPC0[127.0.0.1:{plan['draft_port']}] model buffer size = 1.00 MiB\n"}
    try:
        ctx = ctx_of(Dropping(table), cluster=cluster)
        ch = asyncio.run(LlamaVerify.build({"port": srv.server_port, "plan": plan, "health_timeout": 30}).check(ctx))
    finally:
        srv.shutdown()
    assert "llama-server restarted, ok after" in ch.msg, ch.msg
    probed = ctx.conn.probed
    assert probed.index(("dropped",)) < probed.index(tuple(journal))
