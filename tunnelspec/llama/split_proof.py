"""Where the target's layers went, from llama-server's own load lines, against the proportions the
inventory asked for. Pure: the bytes of a GGUF's header and a journal in, figures out.

llama.cpp's layer split (src/llama-model.cpp, load_tensors): a model has `block_count + 1` layer
slots (its blocks and the output layer; the input layer always stays on the CPU). With
`-ngl N`, the first `slots - N` slots stay on the CPU; the other N go to the `-dev` devices in
order, consecutive runs sized by `-ts`. At load it prints, per model:
    load_tensors: offloaded 10/12 layers to GPU
    load_tensors:   CPU_Mapped model buffer size =     0.02 MiB
    load_tensors: RPC0[127.0.0.1:15052] model buffer size =     0.34 MiB
So the CPU's slots are `slots - offloaded`, and each offload device's slot count is read from its
buffer's size: the GGUF's tensor table gives the bytes of each slot (its tensors' data, aligned as
in the file), and the device's slots are the run of consecutive slots whose bytes best match its
buffer. (The CPU's own buffer is a window of the memory-mapped file, not the sum of its tensors:
its line proves nothing about layers, the "offloaded" line does.) An RPC buffer is named by the
server's own device index and the endpoint (`RPC0[127.0.0.1:15053]` is the first device of the
server behind port 15053), local ones by the device name (`CUDA0`).
"""

from __future__ import annotations

import re
import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from tunnelspec.llama.gguf_header import read_kv
from tunnelspec.llama.served_plan import ServedPlan

MIB = 2**20
# The relative error allowed when a buffer's size is matched with slot bytes (the log rounds to
# 0.01 MiB and buffers add alignment).
_BLK = re.compile(r"^blk\.(\d+)\.")
_OUTPUT = ("output.", "output_norm.")
_OFFLOADED = re.compile(r"load_tensors: offloaded (\d+)/(\d+) layers")
_BUFFER = re.compile(r"load_tensors:\s+(\S+?)\s+model buffer size\s*=\s*([0-9.]+)\s*MiB")
_RPC_NAME = re.compile(r"^RPC(\d*)\[[0-9.]+:(\d+)\]$")


# ---- the GGUF's layer slots ------------------------------------------------------------------------
def slot_bytes(header: bytes, file_size: int) -> list[int] | None:
    """Bytes of each layer slot (blocks 0..n-1, then the output layer) from a GGUF's first bytes and
    its size; None when the bytes end before the tensor table does, or the file has no block count.
    A tensor's bytes are the distance to the next tensor's data (the file's own alignment included)."""
    found, pos = read_kv(header)
    arch = found.get("general.architecture")
    n_layer = found.get(f"{arch}.block_count") if isinstance(arch, str) else None
    if pos is None or not isinstance(n_layer, int) or n_layer <= 0:
        return None
    n_tensors = struct.unpack_from("<Q", header, 8)[0]  # after the magic and the version
    align = found.get("general.alignment")
    align = align if isinstance(align, int) and align > 0 else 32
    infos = []
    try:
        for _ in range(n_tensors):
            (n,) = struct.unpack_from("<Q", header, pos)
            name = header[pos + 8 : pos + 8 + n].decode("utf-8", "replace")
            pos += 8 + n
            (dims,) = struct.unpack_from("<I", header, pos)
            pos += 4 + 8 * dims + 4  # the dimensions, then the type
            (offset,) = struct.unpack_from("<Q", header, pos)
            pos += 8
            infos.append((offset, name))
    except struct.error:
        return None
    data_start = (pos + align - 1) // align * align
    ends = sorted(o for o, _ in infos)[1:] + [file_size - data_start]
    size_at = dict(zip(sorted(o for o, _ in infos), ends, strict=True))
    out = [0] * (n_layer + 1)
    for offset, name in infos:
        nbytes = size_at[offset] - offset
        m = _BLK.match(name)
        if m and int(m.group(1)) < n_layer:
            out[int(m.group(1))] += nbytes
        elif name.startswith(_OUTPUT):
            out[n_layer] += nbytes
    return out


# ---- the load lines --------------------------------------------------------------------------------
@dataclass(frozen=True)
class TargetLoad:
    offloaded: int | None  # "offloaded N/M layers": N
    slots: int | None  # M
    buffers: dict[str, float]  # -dev device name → its model buffer (MiB); CPU buffers left out
    lines: tuple[str, ...]  # the lines read, for messages


def target_load(journal: str, nodes: Mapping[str, Sequence[str]], ports: dict[str, int]) -> TargetLoad | None:
    """The target's load lines: the first model loaded (a draft, when there is one, loads after it).
    `nodes`: node → its RPC device names in -dev (global) naming; `ports`: node → tunnel port. None
    when the journal has no "offloaded" line yet."""
    lines = journal.splitlines()
    start = next((i for i, row in enumerate(lines) if _OFFLOADED.search(row)), None)
    if start is None:
        return None
    m = _OFFLOADED.search(lines[start])
    assert m is not None  # the line `start` names matched it
    by_port = {ports[n]: devs for n, devs in nodes.items() if n in ports}
    buffers: dict[str, float] = {}
    seen = [lines[start].strip()]
    for line in lines[start + 1 :]:
        if "load_tensors:" not in line:
            break  # the next stage (context, KV cache) or the draft's own lines
        b = _BUFFER.search(line)
        if not b:
            continue
        seen.append(line.strip())
        name, mib = b.group(1), float(b.group(2))
        r = _RPC_NAME.match(name)
        if r:
            devs = by_port.get(int(r.group(2)), [])
            index = int(r.group(1)) if r.group(1) else 0
            if index < len(devs):
                buffers[devs[index]] = buffers.get(devs[index], 0.0) + mib
        elif not name.upper().startswith("CPU"):
            buffers[name] = buffers.get(name, 0.0) + mib
    return TargetLoad(int(m.group(1)), int(m.group(2)), buffers, tuple(seen))


def observed_layers(
    load: TargetLoad, devices_in_order: list[str], slots: Sequence[int] | None
) -> list[tuple[str, int | None]]:
    """Slots per device as the load lines show them: ("CPU", slots - offloaded), then each -dev device
    in order, the run of consecutive slots whose bytes are nearest its buffer (0 without a buffer).
    Without the slot bytes only the CPU's count is known: the others are None."""
    total = load.slots or (len(slots) if slots else 0)
    cpu = total - (load.offloaded or 0)
    out: list[tuple[str, int | None]] = [("CPU", cpu)]
    i = cpu
    for d in devices_in_order:
        mib = load.buffers.get(d, 0.0)
        if slots is None:
            out.append((d, None if mib else 0))  # a buffer: some layers, how many unknown
            continue
        best, acc, n = 0, 0, 0
        err = abs(mib * MIB)
        while i + n < len(slots):
            acc += slots[i + n]
            n += 1
            if abs(acc - mib * MIB) < err:
                best, err = n, abs(acc - mib * MIB)
            if acc > mib * MIB:
                break
        out.append((d, best))
        i += best
    return out


def asked_layers(plan: ServedPlan, slots: int) -> list[tuple[str, float]]:
    """What the inventory asked, in layer slots: ("CPU", …) and each -dev device, from the plan's
    proportions (a node's weight shared by its devices)."""
    split = list(plan.tensor_split)
    cpu = plan.cpu_weight
    total = sum(w for _, w in split) + cpu
    if total <= 0:
        return []
    return [("CPU", slots * cpu / total)] + [(d, slots * w / total) for d, w in split]


@dataclass(frozen=True)
class SplitCheck:
    ok: bool
    asked: list[tuple[str, float]]
    seen: list[tuple[str, int | None]]
    message: str


def check_split(journal: str, plan: ServedPlan, tolerance: float = 1.0) -> SplitCheck | None:
    """The target's layers per device against the asked proportions: each within `tolerance` slots
    (llama.cpp rounds to whole layers). None when the load lines are not in the journal yet."""
    # A plan handed by a playbook may pair them badly; the check then reads the nodes it can.
    ports = {n: int(ep.rsplit(":", 1)[1]) for n, ep in zip(plan.nodes, plan.endpoints, strict=False)}
    load = target_load(journal, plan.nodes, ports)
    if load is None:
        return None
    devs = [d for d in plan.target_devices.split(",") if d and d != "none"]
    slots: tuple[int, ...] | None = plan.slot_bytes
    if slots and load.slots and len(slots) != load.slots:
        slots = None  # another model than the plan's: counts from the lines only
    seen = observed_layers(load, devs, slots)
    asked = asked_layers(plan, load.slots or 0)
    figures = ", ".join(f"{d} {n if n is not None else '?'}" for d, n in seen)
    if not asked:
        return SplitCheck(True, [], seen, f"layers {figures} of {load.slots} (no proportions asked)")
    want = ", ".join(f"{d} {x:.1f}" for d, x in asked)
    # asked comes from the plan's proportions, seen from its device list and the journal: compared
    # as far as both go.
    bad = [d for (d, x), (_, n) in zip(asked, seen, strict=False) if n is not None and abs(n - x) > tolerance + 1e-9]
    if bad:
        return SplitCheck(
            False,
            asked,
            seen,
            f"the target's layers are not where the proportions say: asked {want} of {load.slots} "
            f"layer slots, the load lines show {figures} ({'; '.join(load.lines)})",
        )
    exact = "" if slots else " (offload devices: buffer present, slot bytes unknown)"
    return SplitCheck(True, asked, seen, f"layers {figures} of {load.slots} as asked ({want}){exact}")


# The current run's load lines, up to "model loaded" (sed quits there: a server that ran for days at
# -lv 4 has a long journal after it). $1: the unit.
LOAD_LINES_SCRIPT = r"""inv=$(systemctl show -p InvocationID --value -- "$1")
[ -n "$inv" ] || exit 0
journalctl --no-pager -o cat -u "$1" "_SYSTEMD_INVOCATION_ID=$inv" \
  | sed -n -e '/load_tensors:/p' -e '/model loaded/q'
"""


def load_summary(load: TargetLoad | None) -> dict | None:
    """What status shows of a split from the load lines alone: the CPU's slots and each device's buffer."""
    if load is None:
        return None
    cpu = (load.slots - load.offloaded) if load.slots is not None and load.offloaded is not None else None
    return {"slots": load.slots, "cpu_slots": cpu, "buffers_mib": dict(load.buffers)}


def describe_summary(s: dict | None) -> str:
    if not s:
        return "load lines not in this run's journal"
    bufs = ", ".join(f"{d} {m:.2f} MiB" for d, m in s["buffers_mib"].items()) or "no offload buffer"
    return f"main's CPU keeps {s['cpu_slots']} of {s['slots']} layers; {bufs}"
