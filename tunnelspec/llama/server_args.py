"""The llama-server command line, built from the cluster, the build's own `--help` and the RPC device
map discovered on the main host. Pure: no I/O, so every choice is unit-testable.

Order matters to llama.cpp: arguments are applied in order and RPC devices only exist once `--rpc`
registered them, so `--rpc` comes first, before `-dev` and the draft device ("invalid device: RPC0").
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from tunnelspec.constants import LOOPBACK
from tunnelspec.errors import TaskFailed
from tunnelspec.llama.flags import ServerHelp, DRAFT_SIMPLE
from tunnelspec.llama.preflight import check_settings
from tunnelspec.llama.speculative import SpecError, spec_type_argv

# llama-server's unit name, shared by the tasks, the verify step, status and teardown.
UNIT = "tunnelspec-llama-server.service"


def tunnel_unit(node: str) -> str:
    return f"tunnelspec-tunnel-{node}.service"


@dataclass(frozen=True)
class ServerPlan:
    argv: list[str]  # the full command, binary first
    draft_node: str
    draft_devices: list[str]  # e.g. ["RPC0"]
    draft_port: int  # tunnel port of the draft node on main
    target_devices: str  # the -dev value
    endpoints: list[str]  # --rpc items, in node order
    spec_type: str = DRAFT_SIMPLE  # what the inventory asked for (draft-simple by default)
    tensor_split: list[tuple[str, float]] | None = None  # (-dev device, weight) in -dev order

    def as_fact(self) -> dict:
        return {"argv": self.argv, "exec_start": systemd_exec(self.argv), "draft_node": self.draft_node,
                "draft_devices": self.draft_devices, "draft_port": self.draft_port,
                "target_devices": self.target_devices, "endpoints": self.endpoints,
                "spec_type": self.spec_type,
                "tensor_split": [list(p) for p in self.tensor_split] if self.tensor_split else None}


def devices_by_node(cluster, by_port: dict[int, list[str]]) -> dict[str, list[str]]:
    """Node name → its RPC device names, from the `--list-devices` map keyed by tunnel port."""
    out = {}
    for node in cluster.rpc:
        names = by_port.get(node.tunnel_port)
        if not names:
            raise TaskFailed(
                f"llama-server --list-devices shows no RPC device on {LOOPBACK}:{node.tunnel_port} "
                f"(the tunnel to {node.name}); is its tunnel up and its rpc-server serving?")
        out[node.name] = list(names)
    return out


def target_device_list(local: str, rpc_targets: list[str]) -> str:
    """The -dev value: the main host's own devices plus target-role RPC devices. `none` (CPU only)
    is only meaningful alone: llama.cpp rejects it inside a list."""
    local_devs = [] if local in ("", "none") else [d for d in local.split(",") if d]
    devs = local_devs + list(rpc_targets)
    return ",".join(devs) if devs else "none"


def tensor_split(cluster, nodes: dict[str, list[str]]) -> list[tuple[str, float]] | None:
    """(device, weight) for every -dev device, in -dev order: the main host's own devices, then each
    target node's RPC devices in --rpc order, a node's weight shared equally by its devices."""
    p = cluster.placement
    if p.weights is None:
        return None
    local = [] if cluster.main.target_devices in ("", "none") else cluster.main.target_devices.split(",")
    out = [(d, p.weight_of(d) or 0.0) for d in local]
    for n in cluster.target_nodes:
        devs = nodes[n.name]
        out += [(d, (p.weight_of(n.name) or 0.0) / len(devs)) for d in devs]
    return out


def _weight(w: float) -> str:
    return f"{w:g}"


def build_server_argv(cluster, help_: ServerHelp, by_port: dict[int, list[str]], binary: str,
                      model: str, draft_model: str) -> ServerPlan:
    main = cluster.main
    draft = cluster.draft_node
    if draft is None:
        raise TaskFailed("no rpc node has rpc_role=draft: the draft model needs a remote device; "
                         "set rpc_role=draft on one rpc node")
    nodes = devices_by_node(cluster, by_port)
    endpoints = cluster.rpc_endpoints
    rpc_targets = [d for n in cluster.target_nodes for d in nodes[n.name]]
    dev = target_device_list(main.target_devices, rpc_targets)
    draft_devices = nodes[draft.name]
    try:
        check_settings(cluster, help_)
        # Where the build has --spec-type it is mandatory (the default `none` loads the draft and
        # silently frees it); where the draft model alone speculates it is [] (and draft-simple is
        # then rejected by the build).
        spec = spec_type_argv(help_, main.spec_type)
    except SpecError as e:
        raise TaskFailed(str(e)) from None

    argv = [binary, help_.require("--rpc"), ",".join(endpoints)]
    argv += [help_.require("-dev", "--device"), dev]
    argv += [help_.require("-m", "--model"), model]
    placement = cluster.placement
    if placement.split_mode is not None:
        argv += [help_.require("-sm", "--split-mode"), placement.split_mode]
    split = tensor_split(cluster, nodes)
    if split is not None:
        if dev == "none":
            raise TaskFailed(f"{placement.source} gives proportions but the target has no offload device")
        argv += [help_.require("-ts", "--tensor-split"), ",".join(_weight(w) for _, w in split)]
    argv += spec
    ngl_flag = help_.require("--spec-draft-ngl", "-ngld", "--gpu-layers-draft", "--n-gpu-layers-draft")
    ngl_opt = help_.option(ngl_flag)
    ngl_all = "all" if ngl_opt and "'all'" in ngl_opt.help else "999"
    ngl = ngl_all if main.spec_draft_ngl == "all" else main.spec_draft_ngl
    argv += [help_.require("--spec-draft-model", "-md", "--model-draft"), draft_model,
             help_.require("--spec-draft-device", "-devd", "--device-draft"), ",".join(draft_devices),
             ngl_flag, ngl]
    if main.spec_draft_n_max is not None:
        # Unset: the build's own default (16 on b9093, 3 later), which some builds need to stay
        # within the draft context's outputs (llama.cpp issue 25719).
        argv += [help_.require("--spec-draft-n-max", "--draft-max", "--draft-n", "--draft"), str(main.spec_draft_n_max)]
    if main.spec_draft_p_min is not None:
        argv += [help_.require("--spec-draft-p-min", "--draft-p-min"), f"{main.spec_draft_p_min:g}"]
    argv += [help_.require("--host"), main.server_host, help_.require("--port"), str(main.server_port)]
    if main.api_key_file:
        argv += [help_.require("--api-key-file"), main.api_key_file]
    if main.tls is not None:
        # llama_server_public_bind=true: TLS terminates in llama-server itself (docs/tls.md). Every
        # build lists both flags; whether it can serve them is the binary's (tls/build.py, plan task).
        argv += [help_.require("--ssl-key-file"), main.tls.key_path,
                 help_.require("--ssl-cert-file"), main.tls.cert_path]
    if help_.supports("--metrics"):
        # Loopback-only like the rest of the server; gives status the spec-decode counters.
        argv.append("--metrics")
    extra = list(main.extra_args)
    argv += _log_level(help_, extra)
    argv += extra
    return ServerPlan(argv, draft.name, draft_devices, draft.tunnel_port, dev, endpoints,
                      spec_type=main.spec_type or DRAFT_SIMPLE, tensor_split=split)


# Recent builds print the `load_tensors: RPC0[…] model buffer size` lines (the proof of where the
# draft's weights are) only from verbosity 4 ("trace"); it adds startup lines, not per-token ones.
TRACE_VERBOSITY = "4"
_VERBOSITY_FLAGS = ("-lv", "--verbosity", "--log-verbosity", "-v", "--verbose", "--log-verbose")


def _log_level(help_: ServerHelp, extra: list[str]) -> list[str]:
    flag = help_.pick("-lv", "--verbosity", "--log-verbosity")
    if flag is None or any(a.split("=", 1)[0] in _VERBOSITY_FLAGS for a in extra):
        return []  # older builds log buffer placement by default; a user's own level wins
    return [flag, TRACE_VERBOSITY]


def list_devices_argv(binary: str, endpoints: list[str]) -> list[str]:
    # --rpc before --list-devices: arguments are applied in order.
    return [binary, "--rpc", ",".join(endpoints), "--list-devices"]


# ---- systemd quoting ------------------------------------------------------------------------
_SAFE = re.compile(r"^[A-Za-z0-9_@%+=:,./-]+$")


def systemd_quote(arg: str) -> str:
    """One argument for ExecStart=: systemd expands `%` specifiers and `$` variables itself, so
    both are doubled; anything else unusual goes in double quotes with C-style escapes."""
    arg = arg.replace("%", "%%").replace("$", "$$")
    if arg and _SAFE.match(arg):
        return arg
    escaped = arg.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
    return f'"{escaped}"'


def systemd_exec(argv: list[str]) -> str:
    return " ".join(systemd_quote(a) for a in argv)


# ---- journal evidence ---------------------------------------------------------------------------
# `load_tensors: RPC0[127.0.0.1:15052] model buffer size = 0.38 MiB` (proto >= 3), or the older
# `RPC[127.0.0.1:15052] model buffer size`.
_MODEL_BUFFER = re.compile(r"\b(RPC\d*)\[([0-9.]+):(\d+)\]\s+model buffer size\s*=\s*([0-9.]+\s*\w+)")
_ACCEPTANCE = re.compile(r"draft acceptance(?: rate)?\s*=\s*([0-9.]+)\s*\(\s*(\d+)\s+accepted\s*/\s*(\d+)\s+generated\)")


@dataclass(frozen=True)
class BufferLine:
    device: str
    host: str
    port: int
    size: str
    line: str


def rpc_model_buffers(journal: str) -> list[BufferLine]:
    out = []
    for line in journal.splitlines():
        m = _MODEL_BUFFER.search(line)
        if m:
            out.append(BufferLine(m.group(1), m.group(2), int(m.group(3)), m.group(4).strip(), line.strip()))
    return out


def draft_placement(journal: str, plan: dict) -> BufferLine:
    """The log line proving the draft's weights are on the draft node's RPC device, else TaskFailed
    saying where buffers went. `plan` is ServerPlan.as_fact()."""
    buffers = rpc_model_buffers(journal)
    want = set(plan["draft_devices"])
    for b in buffers:
        if b.port == plan["draft_port"] and (b.device in want or b.device == "RPC"):
            return b
    seen = "; ".join(b.line for b in buffers) or "no RPC model buffer at all"
    raise TaskFailed(
        f"the draft model is not on the remote device {','.join(sorted(want))} "
        f"({LOOPBACK}:{plan['draft_port']}, node {plan['draft_node']}): the llama-server journal shows {seen}. "
        f"Without --spec-type {DRAFT_SIMPLE} the draft is loaded and freed; check the unit's ExecStart")


def last_acceptance(journal: str) -> dict | None:
    """The most recent `draft acceptance = 1.00000 (24 accepted / 24 generated)` line."""
    found = None
    for m in _ACCEPTANCE.finditer(journal):
        found = {"rate": float(m.group(1)), "accepted": int(m.group(2)), "generated": int(m.group(3))}
    return found
