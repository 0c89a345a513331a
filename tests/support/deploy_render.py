"""Every file a deploy renders for the hosts, rendered offline by tunnelspec's own code: the deploy
playbook (playbooks/deploy.yml and its imports) is read as the engine reads it, each task that renders
a unit, a template or a configuration is built from its arguments rendered with the host's variables
(its `when:` evaluated), and its own rendering method runs against a stand-in connection that answers
the few read-only probes they make (llama-server's --help and --version from tests/server/data, the
groups that exist, main's RPC header). Nothing is copied from the tasks: a new unit in a playbook, or a
new line in a template or in a task's variables, shows up here as the deploy would write it.

Used by tests/invariants/ (what root runs, which ports are listened on)."""

from __future__ import annotations

import asyncio
import os
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

from tunnelspec.cluster.model import Cluster
from tunnelspec.components.server.server import version_argv
from tunnelspec.components.tunnel.units import selected_nodes
from tunnelspec.core.templating import evaluate, render_value
from tunnelspec.engine.context import HostContext, RunOptions
from tunnelspec.engine.executor import Run
from tunnelspec.engine.playbook import builtin_playbook, load_playbook
from tunnelspec.facts import nft
from tunnelspec.inventory import load_inventory
from tunnelspec.lab.outputs import inventory_text
from tunnelspec.modules import TASKS

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "tests" / "server" / "data"
RPC_HEADER_TEXT = ("#define RPC_PROTO_MAJOR_VERSION    3\n#define RPC_PROTO_MINOR_VERSION    0\n"
                   "#define RPC_PROTO_PATCH_VERSION    0\n")
MEMINFO = "MemTotal:       65536000 kB\nMemAvailable:   60000000 kB\n"
# The modules that render something onto a host, and how each one's own code is asked for its text.
RENDERING = ("systemd_unit", "template", "copy", "rpc_unit", "tunnel_units", "local_isolation",
             "tunnel_sshd_policy", "llama_server_plan")


@dataclass(frozen=True)
class Rendered:
    host: str     # inventory name
    dest: str     # where it goes on the host
    src: str      # the template (or the task that made it)
    text: str

    @property
    def unit(self) -> bool:
        return self.dest.startswith("/etc/systemd/system/") and self.dest.endswith(".service")


@dataclass
class Deploy:
    name: str
    cluster: Cluster
    files: list[Rendered]
    facts: dict   # host -> the facts registered (llama_server on main)

    def on(self, host: str) -> list[Rendered]:
        return [f for f in self.files if f.host == host]

    def file(self, host: str, dest: str) -> Rendered:
        found = [f for f in self.files if f.host == host and f.dest == dest]
        assert len(found) == 1, (host, dest, [f.dest for f in self.on(host)])
        return found[0]


class StandIn:
    """The host's side of the probes the rendering tasks make; anything else is an error, named."""

    def __init__(self, host: str):
        self.host = host
        self.help = (DATA / "llama-server-help-b11434.txt").read_text()
        self.version = (DATA / "llama-server-version-b11434.txt").read_text()

    def _answer(self, argv) -> SimpleNamespace:
        argv = [str(a) for a in argv]
        out = None
        if argv[-1:] == ["--help"]:
            out = self.help
        elif argv[-1:] == ["--version"] or argv == version_argv(argv[-1]):
            out = self.version
        elif argv[:2] == ["getent", "group"]:
            out = "".join(f"{g}:x:{100 + i}:\n" for i, g in enumerate(argv[2:]))
        elif argv[:2] == ["grep", "-m1"] and argv[-1] == "/proc/cpuinfo":
            out = "aes\n"
        if out is None:
            # e.g. the target's GGUF header (read only for a split with proportions): unreadable here.
            return SimpleNamespace(rc=1, stdout="", stderr=f"stand-in: no answer for {argv[:3]}")
        return SimpleNamespace(rc=0, stdout=out, stderr="")

    async def probe(self, argv, timeout=None, input=None, **kw):
        return self._answer(argv)

    async def run(self, argv, check=False, timeout=None, input=None, **kw):
        return self._answer(argv)

    async def get(self, path: str):
        if path.endswith("/ggml/include/ggml-rpc.h"):
            return RPC_HEADER_TEXT.encode()
        if path == "/proc/meminfo":
            return MEMINFO.encode()
        return None


def lab_inventory(directory: Path, main_vars: str = "", all_vars: str = "") -> Path:
    """The lab's inventory (tunnelspec/lab/outputs.py writes it for `tunnelspec lab up`), at
    documentation addresses, with `main_vars` appended to main's variables."""
    fixtures = SimpleNamespace(repo="/srv/llama.cpp.git", commit="8c22f3ff082f60e8b97ed51afbf8e51e63208260",
                               build_number=None, model="/srv/models/tiny.gguf")
    text = inventory_text({"main": "192.0.2.10", "rpc-a": "192.0.2.11", "rpc-b": "192.0.2.12"},
                          directory / "id_ed25519", directory / "known_hosts", fixtures)
    path = directory / "inventory.ini"
    path.write_text(text + all_vars + ("\n[main:vars]\n" + main_vars if main_vars else ""))
    return path


def render_deploy(name: str, inventory: Path, cache_dir: Path) -> Deploy:
    """Everything the deploy playbook renders for the inventory's hosts. `cache_dir`: XDG_CACHE_HOME
    for the run (the plan task keeps the build's --help there)."""
    old = os.environ.get("XDG_CACHE_HOME")
    os.environ["XDG_CACHE_HOME"] = str(cache_dir)
    try:
        return asyncio.run(_render(name, inventory))
    finally:
        if old is None:
            os.environ.pop("XDG_CACHE_HOME", None)
        else:
            os.environ["XDG_CACHE_HOME"] = old


def _seed(cluster) -> dict[str, dict]:
    """The facts the tasks before the rendering ones register on a real run (uploads, the RPC binary,
    the device map through the tunnels)."""
    main = cluster.main
    facts: dict[str, dict] = {main.name: {
        "llama_model_path": f"/var/lib/tunnelspec/models/{Path(main.model).name}",
        "rpc_devices": {str(n.tunnel_port): [f"RPC{i}"] for i, n in enumerate(cluster.rpc)}}}
    if main.draft_model:
        facts[main.name]["llama_draft_model_path"] = f"/var/lib/tunnelspec/models/{Path(main.draft_model).name}"
    for n in cluster.rpc:
        facts[n.name] = {"rpc_server_bin": f"{n.root}/current/bin/rpc-server"}
    return facts


async def _render(name: str, path: Path) -> Deploy:
    inv = load_inventory(path)
    cluster = Cluster.from_inventory(inv)
    facts = _seed(cluster)
    hostvars = {h: {**inv.host_vars(h), **facts.get(h, {})} for h in inv.hosts}
    groups = {g: list(inv.match(g)) for g in inv.groups}
    groups.setdefault("all", list(inv.hosts))
    out: list[Rendered] = []
    run = Run(inv, RunOptions(), lambda e: None, cluster=cluster)  # the engine's template context
    for play in load_playbook(builtin_playbook("deploy.yml")).plays:
        for host in inv.match(play.hosts):
            for spec in play.tasks:
                if spec.module not in RENDERING:
                    continue
                hostvars[host].update(facts.setdefault(host, {}))
                v = {**run.template_vars(host, play), **facts[host], "hostvars": hostvars, "groups": groups,
                     "check_mode": False}
                if not all(evaluate(c, v) for c in spec.when):
                    continue
                task = TASKS[spec.module].build(render_value(spec.args, v))
                ctx = HostContext(host=host, conn=StandIn(host), vars=v, facts=facts[host],  # type: ignore[arg-type]
                                  options=RunOptions(), emit=lambda e: None, cluster=cluster,
                                  inventory_dir=path.parent, task_name=spec.name)
                out += await _files(spec.module, task, ctx, cluster, host)
    return Deploy(name, cluster, out, facts)


async def _files(module: str, task, ctx, cluster, host: str) -> list[Rendered]:
    if module == "llama_server_plan":
        await task.check(ctx)  # registers llama_server (the fact the units are rendered from)
        return []
    if module == "systemd_unit":
        inner = task._inner()
        return [Rendered(host, inner.p["dest"], task.p["src"] or "content", (await inner.desired(ctx)).decode())]
    if module in ("template", "copy"):
        return [Rendered(host, task.p["dest"], task.p.get("src") or "content", (await task.desired(ctx)).decode())]
    if module == "rpc_unit":
        unit = (await task._unit(ctx))._inner()
        return [Rendered(host, unit.p["dest"], unit.p["src"], (await unit.desired(ctx)).decode())]
    if module == "tunnel_units":
        out = []
        for node in selected_nodes(cluster, task.p["nodes"]):
            _, unit, _ = task._parts(ctx, node, aes_ni=True)
            inner = unit._inner()
            out.append(Rendered(host, inner.p["dest"], inner.p["src"], (await inner.desired(ctx)).decode()))
        return out
    if module == "local_isolation":
        seen = SimpleNamespace(uids={u: 990 - i for i, u in enumerate(task.all_users())})
        _, rules, unit = task._desired(seen)
        return [Rendered(host, nft.UNIT_PATH, "components/isolation.py", unit),
                Rendered(host, nft.RULES_PATH, "components/isolation.py", rules)]
    if module == "tunnel_sshd_policy":
        return [Rendered(host, task.p["path"], "tunnelspec-tunnel-sshd.conf.j2", task._render(ctx).decode())]
    raise AssertionError(f"{module}: no renderer")
