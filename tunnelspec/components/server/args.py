"""The llama-server command line, built from the cluster, the build's own `--help` and the RPC device
map discovered on the main host. Pure: no I/O, so every choice is unit-testable.

Order matters to llama.cpp: arguments are applied in order and RPC devices only exist once `--rpc`
registered them, so `--rpc` comes first, before `-dev` and the draft device ("invalid device: RPC0").
"""

from __future__ import annotations

import bisect
import re
from dataclasses import dataclass, field

from tunnelspec.core.constants import LOOPBACK
from tunnelspec.core.errors import TaskFailed
from tunnelspec.llama.flags import ServerHelp, DRAFT_SIMPLE
from tunnelspec.llama.served_plan import ServedPlan
from tunnelspec.components.server.preflight import check_settings
from tunnelspec.components.tunnel.units import unit_name
from tunnelspec.llama.speculative import SpecError, spec_type_argv

# llama-server's unit name, shared by the tasks, the verify step, status and teardown.
UNIT = "tunnelspec-llama-server.service"


# A node's tunnel unit on main: defined once, with the tunnel (components/tunnel/units.py).
tunnel_unit = unit_name


@dataclass(frozen=True)
class ServerPlan:
    argv: list[str]  # the full command, binary first
    draft_node: str | None  # None: no draft (a target split with no draft, or the draft node left out)
    draft_devices: list[str]  # e.g. ["RPC0"]; [] without a draft
    draft_port: int | None  # tunnel port of the draft node on main; None without a draft
    target_devices: str  # the -dev value
    endpoints: list[str]  # --rpc items, in node order ([] when every node is left out)
    spec_type: str | None = DRAFT_SIMPLE  # what the inventory asked for; None without a draft
    tensor_split: list[tuple[str, float]] | None = None  # (-dev device, weight) in -dev order
    gpu_layers: int | None = None  # -ngl: the layer slots that leave main's CPU (a CPU share given)
    cpu_weight: float = 0.0  # main's CPU share in the proportions (llama_tensor_split CPU=W)
    # Layer slots (blocks + the output layer) each device should hold by llama.cpp's rule, "CPU"
    # (main's) first when it keeps a share; None when no proportions are given or the block count
    # is unknown. What verify compares the load lines with.
    layers: list[tuple[str, int]] | None = None
    nodes: dict[str, list[str]] = field(default_factory=dict)  # node in --rpc → its RPC device names
    absent: tuple[str, ...] = ()  # nodes left out (build_server_argv's `absent`)

    @property
    def kind(self) -> str:
        """ "speculative" (a draft), "split" (no draft, target layers on RPC devices) or "local"."""
        if self.draft_node is not None:
            return "speculative"
        return "split" if self.endpoints else "local"

    def as_fact(self) -> dict:
        return {
            "argv": self.argv,
            "exec_start": systemd_exec(self.argv),
            "kind": self.kind,
            "draft_node": self.draft_node,
            "draft_devices": self.draft_devices,
            "draft_port": self.draft_port,
            "target_devices": self.target_devices,
            "endpoints": self.endpoints,
            "spec_type": self.spec_type,
            "tensor_split": [list(p) for p in self.tensor_split] if self.tensor_split else None,
            "gpu_layers": self.gpu_layers,
            "cpu_weight": self.cpu_weight,
            "layers": [list(p) for p in self.layers] if self.layers else None,
            "nodes": dict(self.nodes),
            "absent": list(self.absent),
        }


_MODERN_RPC = re.compile(r"^RPC\d+$")


def devices_by_node(
    cluster, by_port: dict[int, list[str]], absent: frozenset[str] = frozenset()
) -> dict[str, list[str]]:
    """Node name → its RPC device names as llama-server will call them, for the nodes not in
    `absent`, in --rpc order. `by_port` is the `--list-devices` map (keyed by tunnel port) of every
    node: with some left out of --rpc, the modern names (RPC0, RPC1, … numbered globally in --rpc
    order, RPC protocol >= 3) are renumbered over what remains; the older RPC[host:port] names
    name the endpoint and stay as they are."""
    out = {}
    for node in cluster.rpc:
        if node.name in absent:
            continue
        names = by_port.get(node.tunnel_port)
        if not names:
            raise TaskFailed(
                f"llama-server --list-devices shows no RPC device on {LOOPBACK}:{node.tunnel_port} "
                f"(the tunnel to {node.name}); is its tunnel up and its rpc-server serving?"
            )
        out[node.name] = list(names)
    if absent and all(_MODERN_RPC.match(d) for names in out.values() for d in names):
        i = 0
        for name, names in out.items():
            out[name] = [f"RPC{i + k}" for k in range(len(names))]
            i += len(names)
    return out


def target_device_list(local: str, rpc_targets: list[str]) -> str:
    """The -dev value: the main host's own devices plus target-role RPC devices. `none` (CPU only)
    is only meaningful alone: llama.cpp rejects it inside a list."""
    local_devs = [] if local in ("", "none") else [d for d in local.split(",") if d]
    devs = local_devs + list(rpc_targets)
    return ",".join(devs) if devs else "none"


def tensor_split(cluster, nodes: dict[str, list[str]]) -> list[tuple[str, float]] | None:
    """(device, weight) for every -dev device, in -dev order: the main host's own devices, then each
    target node's RPC devices in --rpc order, a node's weight shared equally by its devices.
    `nodes`: the nodes in --rpc (devices_by_node); a target node not in it is left out."""
    p = cluster.placement
    if p.weights is None:
        return None
    local = [] if cluster.main.target_devices in ("", "none") else cluster.main.target_devices.split(",")
    out = [(d, p.weight_of(d) or 0.0) for d in local]
    for n in cluster.target_nodes:
        devs = nodes.get(n.name)
        if devs:
            out += [(d, (p.weight_of(n.name) or 0.0) / len(devs)) for d in devs]
    return out


def layer_counts(weights: list[float], slots: int) -> list[int]:
    """llama.cpp's layer rule (src/llama-model.cpp, load_tensors): the weights normalized into
    cumulative split points; layer slot i of `slots` goes to the first device whose point is above
    i / slots."""
    total = sum(weights)
    if slots <= 0 or total <= 0:
        return [0] * len(weights)
    acc, points = 0.0, []
    for w in weights:
        acc += w
        points.append(acc / total)
    counts = [0] * len(weights)
    for i in range(slots):
        counts[min(bisect.bisect_right(points, i / slots), len(weights) - 1)] += 1
    return counts


def cpu_layers(cpu_weight: float, total_weight: float, slots: int) -> int:
    """Layer slots main's CPU keeps for its share: llama.cpp gives the CPU the first
    `slots - n_gpu_layers` slots (i_gpu_start), so the share becomes -ngl; rounded to the nearest
    whole slot (half up)."""
    if cpu_weight <= 0 or total_weight <= 0:
        return 0
    return min(slots, int(slots * cpu_weight / total_weight + 0.5))


def _weight(w: float) -> str:
    return f"{w:g}"


def build_server_argv(
    cluster,
    help_: ServerHelp,
    by_port: dict[int, list[str]],
    binary: str,
    model: str,
    draft_model: str | None,
    *,
    absent: frozenset[str] = frozenset(),
    n_layer: int | None = None,
    unknown_layers: str | None = None,
) -> ServerPlan:
    """The command line. `absent`: node names left out as if they were not in the inventory (their
    endpoints dropped, the remaining RPC devices renumbered; the draft node absent means no draft
    arguments at all). `n_layer`: the target GGUF's block count, needed when main's CPU keeps a
    share (-ngl) and used for the expected layers per device; without it, `unknown_layers` stands
    in for -ngl's value (the offline plan of `tunnelspec check`), else that is an error."""
    main = cluster.main
    absent = frozenset(absent)
    unknown = sorted(absent - {n.name for n in cluster.rpc})
    if unknown:
        raise TaskFailed(f"absent node(s) {', '.join(unknown)} are not rpc nodes of the inventory")
    draft = cluster.draft_node
    if draft is None and draft_model:
        raise TaskFailed(
            "a draft model was given but no rpc node has rpc_role=draft: the draft runs on a remote "
            "device; set rpc_role=draft on one rpc node, or remove llama_draft_model for a split "
            "with no draft"
        )
    if draft is not None and draft.name in absent:
        draft = None
    if draft is not None and not draft_model:
        raise TaskFailed(
            f"{draft.name} is the draft node (rpc_role=draft) but no draft model was given; set "
            "llama_draft_model, or rpc_role=target on every node for a split with no draft"
        )
    nodes = devices_by_node(cluster, by_port, absent)
    present = [n for n in cluster.rpc if n.name not in absent]
    endpoints = [n.endpoint for n in present]
    rpc_targets = [d for n in cluster.target_nodes if n.name in nodes for d in nodes[n.name]]
    dev = target_device_list(main.target_devices, rpc_targets)
    try:
        check_settings(cluster, help_)
        # Where the build has --spec-type it is mandatory (the default `none` loads the draft and
        # silently frees it); where the draft model alone speculates it is [] (and draft-simple is
        # then rejected by the build).
        spec = spec_type_argv(help_, main.spec_type) if draft is not None else []
    except SpecError as e:
        raise TaskFailed(str(e)) from None

    argv = [binary]
    if endpoints:
        argv += [help_.require("--rpc"), ",".join(endpoints)]
    argv += [help_.require("-dev", "--device"), dev]
    argv += [help_.require("-m", "--model"), model]
    placement = cluster.placement
    if placement.split_mode is not None:
        argv += [help_.require("-sm", "--split-mode"), placement.split_mode]
    split = tensor_split(cluster, nodes)
    ngl, layers, cpu_w = None, None, 0.0
    if split is not None:
        cpu_w = placement.weight_of("CPU") or 0.0
        total = sum(w for _, w in split) + cpu_w
        if total <= 0:
            raise TaskFailed(
                f"{placement.source}: every device left has a proportion of 0 (nodes left out: "
                f"{', '.join(sorted(absent)) or 'none'}); give one a positive share"
            )
        if n_layer is not None:
            slots = n_layer + 1  # the blocks and the output layer (the input layer stays on the CPU)
            keep = cpu_layers(cpu_w, total, slots)
            counts = layer_counts([w for _, w in split], slots - keep) if split else []
            layers = ([("CPU", keep)] if cpu_w > 0 else []) + [(d, c) for (d, _), c in zip(split, counts, strict=True)]
            if cpu_w > 0:
                ngl = slots - keep
        elif cpu_w > 0 and unknown_layers is None:
            raise TaskFailed(
                f"{placement.source} gives main's CPU a share, which becomes -ngl (the layers that "
                f"leave the CPU), and the target's block count is unknown: the header of {model} on "
                "main could not be read; check the file is a GGUF"
            )
        if dev == "none" and cpu_w <= 0:
            raise TaskFailed(f"{placement.source} gives proportions but the target has no offload device")
        if dev != "none" and any(w > 0 for _, w in split):
            argv += [help_.require("-ts", "--tensor-split"), ",".join(_weight(w) for _, w in split)]
        if ngl is not None or (cpu_w > 0 and unknown_layers is not None):
            argv += [
                help_.require("-ngl", "--gpu-layers", "--n-gpu-layers"),
                str(ngl if ngl is not None else unknown_layers),
            ]
    argv += spec
    if draft is not None:
        assert draft_model  # refused above: a draft node needs llama_draft_model
        ngl_flag = help_.require("--spec-draft-ngl", "-ngld", "--gpu-layers-draft", "--n-gpu-layers-draft")
        ngl_opt = help_.option(ngl_flag)
        ngl_all = "all" if ngl_opt and "'all'" in ngl_opt.help else "999"
        ngld = ngl_all if main.spec_draft_ngl == "all" else main.spec_draft_ngl
        argv += [
            help_.require("--spec-draft-model", "-md", "--model-draft"),
            draft_model,
            help_.require("--spec-draft-device", "-devd", "--device-draft"),
            ",".join(nodes[draft.name]),
            ngl_flag,
            ngld,
        ]
        if main.spec_draft_n_max is not None:
            # Unset: the build's own default (16 on b9093, 3 later), which some builds need to stay
            # within the draft context's outputs (llama.cpp issue 25719).
            argv += [
                help_.require("--spec-draft-n-max", "--draft-max", "--draft-n", "--draft"),
                str(main.spec_draft_n_max),
            ]
        if main.spec_draft_p_min is not None:
            argv += [help_.require("--spec-draft-p-min", "--draft-p-min"), f"{main.spec_draft_p_min:g}"]
    # Behind the front (tunnelspec/components/front/model.py): loopback only, on its own port. The front listens where
    # users talk (llama_server_host:llama_server_port) and, with public bind, terminates TLS there.
    argv += [help_.require("--host"), LOOPBACK, help_.require("--port"), str(main.front.internal_port)]
    if main.api_key_file:
        argv += [help_.require("--api-key-file"), main.api_key_file]
    if help_.supports("--metrics"):
        # Loopback-only like the rest of the server; gives status the spec-decode counters.
        argv.append("--metrics")
    extra = list(main.extra_args)
    argv += _log_level(help_, extra)
    argv += extra
    return ServerPlan(
        argv,
        draft.name if draft else None,
        list(nodes[draft.name]) if draft else [],
        draft.tunnel_port if draft else None,
        dev,
        endpoints,
        spec_type=(main.spec_type or DRAFT_SIMPLE) if draft else None,
        tensor_split=split,
        gpu_layers=ngl,
        cpu_weight=cpu_w,
        layers=layers,
        nodes=nodes,
        absent=tuple(sorted(absent)),
    )


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
_ACCEPTANCE = re.compile(
    r"draft acceptance(?: rate)?\s*=\s*([0-9.]+)\s*\(\s*(\d+)\s+accepted\s*/\s*(\d+)\s+generated\)"
)


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


def draft_placement(journal: str, plan: ServedPlan) -> BufferLine:
    """The log line proving the draft's weights are on the draft node's RPC device, else TaskFailed
    saying where buffers went."""
    buffers = rpc_model_buffers(journal)
    want = set(plan.draft_devices)
    for b in buffers:
        if b.port == plan.draft_port and (b.device in want or b.device == "RPC"):
            return b
    seen = "; ".join(b.line for b in buffers) or "no RPC model buffer at all"
    raise TaskFailed(
        f"the draft model is not on the remote device {','.join(sorted(want))} "
        f"({LOOPBACK}:{plan.draft_port}, node {plan.draft_node}): the llama-server journal shows {seen}. "
        f"Without --spec-type {DRAFT_SIMPLE} the draft is loaded and freed; check the unit's ExecStart"
    )


def last_acceptance(journal: str) -> dict | None:
    """The most recent `draft acceptance = 1.00000 (24 accepted / 24 generated)` line."""
    found = None
    for m in _ACCEPTANCE.finditer(journal):
        found = {"rate": float(m.group(1)), "accepted": int(m.group(2)), "generated": int(m.group(3))}
    return found
