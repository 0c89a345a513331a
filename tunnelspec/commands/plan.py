"""What systemd will run on each host, from the inventory alone: llama-server on main, the RPC
server on each node, and main's tunnel ssh to each node. The same builders the deploy's tasks use
(components/server/args.py, components/rpc.py rpc_argv, components/tunnel/units.py ssh_argv); nothing is contacted.

What only a host can say is planned, and the plan says so: the flags' spelling (the pinned build's
`--help`, known offline only from the controller's record of the last deploy of this source), the
RPC device names (llama-server's `--list-devices` through the tunnels), the tunnel cipher order
(main's CPU), the path a hf:// model is downloaded to, and -ngl when main's CPU keeps a share
(the target's block count, read from its GGUF header on main).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from tunnelspec.cluster import ports, schema
from tunnelspec.inventory.addresses import ssh_host
from tunnelspec.core.errors import TaskFailed
from tunnelspec.llama import flags
from tunnelspec.components.server.preflight import load_record
from tunnelspec.components.server.args import UNIT, build_server_argv
from tunnelspec.components.tunnel.units import KEY_PATH, KNOWN_HOSTS, node_ssh_target, ssh_argv, unit_name
from tunnelspec.components.models import hub
from tunnelspec.components.rpc import rpc_argv

RPC_UNIT = "tunnelspec-rpc.service"
# The planned spelling: the newest one of each flag tunnelspec sets (components/server/args.py lists it first),
# the value lists of the newest builds. Options not listed here are taken as written.
PLANNED_HELP = """\
--rpc SERVERS                           comma-separated list of RPC servers (host:port)
-dev,  --device <dev1,dev2,..>          comma-separated list of devices to use for offloading
-ngl,  --gpu-layers, --n-gpu-layers N   max. number of layers to store in VRAM, either an exact number,
                                        'auto', or 'all' (default: auto)
-sm,   --split-mode {none,layer,row,tensor}
-ts,   --tensor-split N0,N1,N2,...      fraction of the model to offload to each GPU
-m,    --model FNAME                    model path to load
-lv,   --verbosity, --log-verbosity N   Set the verbosity threshold.
--spec-draft-n-max N                    number of tokens to draft for speculative decoding
--spec-draft-p-min, --draft-p-min P     minimum speculative decoding probability (greedy)
--spec-draft-device, -devd, --device-draft <dev1,dev2,..>
--spec-draft-ngl, -ngld, --gpu-layers-draft, --n-gpu-layers-draft N
                                        max. number of draft model layers to store in VRAM, either an exact
                                        number, 'auto', or 'all' (default: auto)
--spec-draft-model, -md, --model-draft FNAME
--spec-type none,draft-simple,draft-eagle3,draft-mtp,draft-dflash,draft-dspark,ngram-simple
--host HOST                             IP addresses to listen on
--port PORT                             port to listen (default: 8080)
--api-key-file FNAME                    path to file containing API keys
--metrics                               enable prometheus compatible metrics endpoint
"""
PLANNED = "flags as planned; the build's spelling is checked on deploy"
NGL_UNKNOWN = "<n-gpu-layers>"


class PlannedHelp(flags.ServerHelp):
    """A `--help` that takes every option as written: the plan's stand-in for a build not known
    offline. Owned flags are still refused by the cluster model; the real check is the deploy's."""

    def option(self, name: str) -> flags.HelpOption | None:
        known = super().option(name)
        return known or flags.HelpOption((name,), "", "", False)


@dataclass(frozen=True)
class Command:
    host: str
    unit: str
    argv: list[str]
    what: str  # "llama-server", "rpc-server", "tunnel to <node>"

    def as_dict(self) -> dict:
        return {"host": self.host, "unit": self.unit, "what": self.what, "argv": list(self.argv)}


@dataclass
class Plan:
    commands: list[Command] = field(default_factory=list)
    spelling: str = PLANNED  # whose spelling the flags are in
    notes: list[str] = field(default_factory=list)
    # Per host, what the deploy sets up besides the units' command lines: the source and its patches,
    # the build, the users, the address clients use, the guarded ports (one line each).
    hosts: dict[str, list[str]] = field(default_factory=dict)


def server_help(cluster) -> tuple[flags.ServerHelp, str]:
    recorded = load_record(cluster)
    if recorded is not None:
        return recorded, f"flags as {recorded.build} spells them (the controller's record of the last deploy)"
    return PlannedHelp(build="as planned", options=flags.parse_help(PLANNED_HELP).options), PLANNED


def planned_devices(cluster) -> dict[int, list[str]]:
    """RPC device names by tunnel port as llama-server numbers them (RPC0, RPC1, … in --rpc order),
    one per device a node names in rpc_devices, else one (its default device)."""
    out, i = {}, 0
    for node in cluster.rpc:
        n = len(node.devices) or 1
        out[node.tunnel_port] = [f"RPC{i + k}" for k in range(n)]
        i += n
    return out


def _patch_line(p) -> str:
    if p.kind == "pr":
        what = f"GitHub PR #{p.pr}" + (f" whole, head {p.head}" if p.head else f", commit {p.commit}")
    elif p.kind == "remote":
        what = f"{p.remote} {p.ref}, commit {p.commit}"
    else:
        what = f"file {p.file}"
    return f"patch ({p.kind}): {what}"


def _host_lines(cluster, name: str, role: str, build, users: list[str], rpc_server_name: str | None) -> list[str]:
    source = cluster.source
    lines = [
        f"source: {source.repo} at {source.commit}" + (f" (b{source.build_number})" if source.build_number else "")
    ]
    lines += [f"  {_patch_line(p)}" for p in source.patches]
    target = "llama-server" if role == "main" else (rpc_server_name or "the RPC server")
    lines.append(
        f"build: {build.backend}, target {target}"
        + (f", cmake {' '.join(build.cmake_args)}" if build.cmake_args else "")
        + (" (clean)" if build.force_clean else "")
    )
    lines.append("users: " + ", ".join(users))
    guarded = [x for x in ports.on_host(cluster, name) if x.loopback and x.connect is not None]
    if not _isolated(cluster, name):
        lines.append("guarded ports: none (rpc_local_isolation=false: any local user may connect)")
    elif guarded:
        lines.append(
            "guarded ports: "
            + "; ".join(
                f"127.0.0.1:{x.port} {x.name} (root, {', '.join(x.connect or ()) or 'no one else'})" for x in guarded
            )
        )
    return lines


def _isolated(cluster, name: str) -> bool:
    try:
        return bool(schema.value("rpc_local_isolation", cluster.inventory.host_vars(name), default=True))
    except ValueError:
        return True  # a bad value is check's error; the plan shows the default


def _main_lines(cluster, rpc_server_name) -> list[str]:
    main = cluster.main
    users = [f"{main.users.llama} (llama-server)"]
    if main.front is not None:
        users.append(f"{main.front.user} (the front)")
    lines = _host_lines(cluster, main.name, "main", main.build, users, rpc_server_name)
    scheme = "https" if main.tls is not None else "http"
    where = f"{scheme}://{main.server_host}:{main.server_port}/"
    how = (
        "on the network (public bind" + (", API key" if main.api_key_file else "") + ")"
        if main.public_bind
        else (
            f"on main's loopback: clients use ssh -L {main.server_port}:127.0.0.1:{main.server_port} "
            f"{ssh_host(main.name, cluster.inventory.host_vars(main.name))}"
        )
    )
    front = f", the front before llama-server on 127.0.0.1:{main.front.internal_port}" if main.front else ""
    lines.insert(len(lines) - (1 if lines[-1].startswith("guarded") else 0), f"serves: {where} {how}{front}")
    return lines


def build_plan(cluster, rpc_server_name: str | None = None) -> Plan:
    """`rpc_server_name`: the pinned tree's RPC server binary, when known offline (else the current
    name, and a note)."""
    plan = Plan()
    plan.hosts[cluster.main.name] = _main_lines(cluster, rpc_server_name)
    for node in cluster.rpc:
        users = [f"{node.users.rpc} (the RPC server)", f"{node.users.tunnel} (main's tunnel login)"]
        plan.hosts[node.name] = _host_lines(cluster, node.name, "rpc", node.build, users, rpc_server_name)
    help_, plan.spelling = server_help(cluster)
    main = cluster.main
    binary = f"{main.root}/current/bin/llama-server"
    try:
        server = build_server_argv(
            cluster,
            help_,
            planned_devices(cluster),
            binary,
            main.model or "<llama_model>",
            main.draft_model if cluster.speculative else None,
            n_layer=None,
            unknown_layers=NGL_UNKNOWN,
        )
        plan.commands.append(Command(main.name, UNIT, server.argv, "llama-server"))
    except TaskFailed as err:
        plan.notes.append(f"llama-server: no command line: {err}")
    for node in cluster.rpc:
        plan.commands.append(
            Command(
                main.name,
                unit_name(node.name),
                ssh_argv(
                    node,
                    node_ssh_target(cluster.inventory, node.name),
                    node.users.tunnel,
                    KEY_PATH,
                    KNOWN_HOSTS,
                    session=True,
                ),
                f"tunnel to {node.name}",
            )
        )
    if rpc_server_name is None and cluster.rpc:
        plan.notes.append(
            "the RPC server is ggml-rpc-server in the pinned tree's build, or rpc-server in a tree "
            "from before its rename (≈b98xx): the deploy finds which"
        )
    for node in cluster.rpc:
        plan.commands.append(
            Command(
                node.name,
                RPC_UNIT,
                rpc_argv(
                    f"{node.root}/current/bin/{rpc_server_name or 'ggml-rpc-server'}",
                    node.rpc_port,
                    node.devices,
                    node.threads,
                    node.cache,
                ),
                "rpc-server",
            )
        )
    if cluster.rpc:
        plan.notes.append(
            "RPC device names as llama-server numbers them when each node serves "
            "the devices of its rpc_devices (else one); read with --list-devices on deploy"
        )
        plan.notes.append("the tunnels prefer AES-GCM (-o Ciphers=…) when main's CPU has AES-NI")
    if any(hub.is_hub_ref(m) for m in (main.model, main.draft_model) if m):
        plan.notes.append("an hf:// model runs from the path it is downloaded to on main")
    if server_uses_unknown_layers(plan):
        plan.notes.append(
            f"{NGL_UNKNOWN}: the layers that leave main's CPU, from the target's block count "
            "(its GGUF header, read on main)"
        )
    return plan


def server_uses_unknown_layers(plan: Plan) -> bool:
    return any(NGL_UNKNOWN in c.argv for c in plan.commands)


def mark_unknown(plan: Plan, stand_ins: dict[str, str]) -> None:
    """A plan read with erroneous values set aside: each value that stood in for one (cluster/collect.py)
    is shown as `<VAR: unknown>`, never as if it were the inventory's (`-m /set-aside/model.gguf`)."""
    if not stand_ins:
        return

    def fix(text: str) -> str:
        for value, var in stand_ins.items():
            text = text.replace(value, f"<{var}: unknown>")
        return text

    plan.commands = [Command(c.host, c.unit, [fix(a) for a in c.argv], c.what) for c in plan.commands]
    plan.hosts = {h: [fix(line) for line in lines] for h, lines in plan.hosts.items()}
    plan.notes.append("<VAR: unknown>: the value of a line with an error, left out of the plan")


def stand_ins(cluster, set_aside) -> dict[str, str]:
    """value -> variable for each value that stands in for one set aside (its error is reported)."""
    out: dict[str, str] = {}
    for host, var in set_aside:
        hv = cluster.inventory.host_vars(host or cluster.main.name)
        value = hv.get(var)
        if value is not None and str(value).strip() and len(str(value)) >= 4:
            out[str(value)] = var
    return out
