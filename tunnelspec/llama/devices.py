"""The devices llama.cpp runs on, as pure data and decisions: what a node's RPC server serves (its
banner), which devices a node has (the rpc-server's own "unknown device" listing), what the main
host's `llama-server --list-devices` shows, the GPUs `nvidia-smi` reports, whether a node serves the
device its build and inventory ask for, and whether the models fit the memory each device reports.

No I/O here: callers run the commands (docs/accelerators.md says which, and when) and pass the text.
Every refusal is a `DeviceError` (a `TaskFailed`: a task may let it through as is) naming the host.

Device names (ggml's, docs/llama-facts.md): `CPU`; `CUDA<n>` (ggml-cuda), `ROCm<n>` (the same code
built with GGML_HIP: GGML_CUDA_NAME is "ROCm"), `MUSA<n>`; `Vulkan<n>`; `MTL<n>` (Metal); `RPC<n>`
for remote devices on the main host (`RPC[host:port]` before protocol 3.0). ggml matches a device
name case-insensitively (`ggml_backend_dev_by_name`), so every comparison here does too.
"""

from __future__ import annotations

import re
import struct
import sys
from dataclasses import dataclass

from tunnelspec.core.errors import TaskFailed

MIB = 2**20

# llama_backend → the prefix of the devices a build with that backend adds.
BACKEND_PREFIX = {"cuda": "CUDA", "hip": "ROCm", "vulkan": "Vulkan", "metal": "MTL"}
# Other ggml GPU backends tunnelspec does not build, recognised so a device is never called a CPU.
_OTHER_GPU_PREFIXES = ("MUSA", "SYCL", "OpenCL", "CANN", "WebGPU", "zDNN", "Hexagon")
_NAME = re.compile(r"^([A-Za-z]+?)(\d+)$")

# `  CUDA0: NVIDIA GeForce RTX 4090 (24080 MiB, 23600 MiB free)` — the rpc-server's banner, its
# unknown-device listing and llama-server's --list-devices share this line (printf "  %s: %s (%zu MiB,
# %zu MiB free)"). A description may itself hold parentheses (llvmpipe's "(LLVM 15.0.6, 256 bits)"),
# so the memory is matched at the end of the line.
_DEVICE_LINE = re.compile(r"^\s+(\S+?):\s+(.*?)\s+\((\d+) MiB,\s*(\d+) MiB free\)\s*$")
_BANNER = re.compile(r"Starting RPC server v(\d+)\.(\d+)\.(\d+)")
_UNKNOWN = re.compile(r"error: (?:unknown|invalid) device: (\S*)")


class DeviceError(TaskFailed):
    """A node or host does not serve what the inventory and its build ask for, or a model does not fit."""


@dataclass(frozen=True)
class Device:
    name: str  # CUDA0, Vulkan0, CPU, RPC0, ...
    description: str  # "NVIDIA GeForce RTX 4090", "llvmpipe (LLVM 15.0.6, 256 bits)", "AMD EPYC 7763 ..."
    total_mib: int
    free_mib: int

    @property
    def prefix(self) -> str:
        m = _NAME.match(self.name)
        return m.group(1) if m else self.name.split("[", 1)[0]

    @property
    def kind(self) -> str:
        """cpu, gpu, rpc or other (BLAS, an ACCEL device)."""
        if self.name.upper() == "CPU":
            return "cpu"
        prefix = self.prefix.lower()
        if prefix == "rpc":
            return "rpc"
        if prefix in {p.lower() for p in (*BACKEND_PREFIX.values(), *_OTHER_GPU_PREFIXES)}:
            return "gpu"
        return "other"

    @property
    def backend(self) -> str | None:
        """The llama_backend this device comes from (cpu for the CPU), None for others."""
        if self.kind == "cpu":
            return "cpu"
        return next((b for b, p in BACKEND_PREFIX.items() if p.lower() == self.prefix.lower()), None)

    def describe(self) -> str:
        return f"{self.name} ({self.description}, {self.free_mib}/{self.total_mib} MiB free)"

    def as_fact(self) -> dict:
        return {"name": self.name, "description": self.description, "kind": self.kind,
                "total_mib": self.total_mib, "free_mib": self.free_mib}


def parse_device_line(line: str) -> Device | None:
    m = _DEVICE_LINE.match(line)
    return Device(m.group(1), m.group(2), int(m.group(3)), int(m.group(4))) if m else None


def _device_block(lines: list[str], start: int) -> list[Device]:
    out = []
    for line in lines[start:]:
        dev = parse_device_line(line)
        if dev is None:
            break
        out.append(dev)
    return out


# ---- a node's RPC server ---------------------------------------------------------------------------
@dataclass(frozen=True)
class Banner:
    """One start of the RPC server: `Starting RPC server v7.0.0`, then `Devices:` and the devices it
    serves (only those: `-d` or, by default, every non-CPU device, else the CPU)."""

    version: tuple[int, int, int]
    devices: tuple[Device, ...]


@dataclass(frozen=True)
class UnknownDevice:
    """The server refused a `-d` name: `error: unknown device: CUDA0`, `available devices:` and every
    device of the node (then `No devices found`, exit 1: the unit restarts it forever)."""

    requested: str
    available: tuple[Device, ...]


@dataclass(frozen=True)
class NodeLog:
    """What the unit's journal (or one run's output) says about devices, the latest event last wins:
    `banner` (it serves) or `unknown` (it refused a device name), and the runtime's own complaints."""

    banner: Banner | None
    unknown: UnknownDevice | None
    hints: tuple[str, ...]


# Lines in which a GPU runtime says why it found nothing (ggml-cuda: `ggml_cuda_init: failed to
# initialize CUDA: no CUDA-capable device is detected`; ggml-vulkan: `ggml_vulkan: No devices found.`).
_HINTS = re.compile(r"failed to initialize (?:CUDA|ROCm|MUSA)|ggml_vulkan: No devices found|"
                    r"CUDA driver version is insufficient|no CUDA-capable device|hipErrorNoDevice|"
                    r"ERROR_INCOMPATIBLE_DRIVER|ErrorIncompatibleDriver|Permission denied.*/dev/|"
                    r"error while loading shared libraries",
                    re.I)


def parse_node_log(text: str) -> NodeLog:
    """The rpc-server's output (the unit's journal, `-o cat`): the last banner or unknown-device
    listing, whichever came last, and the runtime's own error lines of that run."""
    lines = (text or "").splitlines()
    last_banner = last_unknown = None
    run_start = 0
    for i, line in enumerate(lines):
        if _BANNER.search(line):
            last_banner, last_unknown, run_start = i, None, _run_start(lines, i)
        elif (m := _UNKNOWN.search(line)) is not None:
            last_unknown, last_banner, run_start = (i, m.group(1)), None, _run_start(lines, i)
    banner = unknown = None
    if last_banner is not None:
        m = _BANNER.search(lines[last_banner])
        assert m is not None  # the line was chosen by this very pattern
        version = (int(m.group(1)), int(m.group(2)), int(m.group(3)))
        at = next((j for j in range(last_banner + 1, min(len(lines), last_banner + 8))
                   if lines[j].strip() == "Devices:"), None)
        banner = Banner(version, tuple(_device_block(lines, at + 1)) if at is not None else ())
    if last_unknown is not None:
        i, name = last_unknown
        at = next((j for j in range(i + 1, min(len(lines), i + 4))
                   if lines[j].strip().lower() == "available devices:"), None)
        unknown = UnknownDevice(name, tuple(_device_block(lines, at + 1)) if at is not None else ())
    end = last_banner if last_banner is not None else (last_unknown[0] if last_unknown else len(lines))
    hints = tuple(dict.fromkeys(line.strip() for line in lines[run_start:end + 1] if _HINTS.search(line)))
    return NodeLog(banner, unknown, hints)


def _run_start(lines: list[str], i: int) -> int:
    """Where the run that printed line i began: after the previous banner or refusal (runtime
    messages come before the banner: the backends initialise first)."""
    for j in range(i - 1, -1, -1):
        if _BANNER.search(lines[j]) or _UNKNOWN.search(lines[j]) or lines[j].startswith("No devices found"):
            return j + 1
    return 0


# The argv that lists a node's devices without serving anything: `-d` with a name no device has
# makes the rpc-server print every device ("available devices:") and exit 1 before it binds.
LIST_PROBE_NAME = "tunnelspec-list-devices"


def list_devices_argv(rpc_server: str) -> list[str]:
    return [rpc_server, "-d", LIST_PROBE_NAME]


def merged_output_argv(argv: list[str]) -> list[str]:
    """argv with stdout line-buffered and stderr merged into it, in the order printed: the server
    prints the device lines to stdout and "available devices:" to stderr (as its unit does)."""
    return ["/bin/sh", "-c", 'exec /usr/bin/stdbuf -oL "$@" 2>&1', "sh", *argv]


def node_devices(output: str) -> list[Device]:
    """The devices a `list_devices_argv` run printed (every device of the node)."""
    log = parse_node_log(output)
    if log.unknown is None:
        raise DeviceError("the RPC server did not list its devices (no 'available devices:' after its "
                          f"'unknown device' error); its output:\n{_tail(output)}")
    return list(log.unknown.available)


def served_by_rule(listed: list[Device], requested) -> list[Device]:
    """What an RPC server serves, from the node's device list: the `-d` names when given, else every
    non-CPU device, else the CPU (the rule of ggml's rpc-server, b9093 to b11434)."""
    if requested:
        want = [r.lower() for r in requested]
        return [d for d in listed if d.name.lower() in want]
    accel = [d for d in listed if d.kind != "cpu"]
    return accel or [d for d in listed if d.kind == "cpu"]


def _tail(text: str, n: int = 8) -> str:
    return "\n".join((text or "").strip().splitlines()[-n:]) or "(nothing)"


def _names(devices) -> str:
    return ", ".join(d.describe() for d in devices) or "none"


_CAUSES = {
    "cuda": ("the NVIDIA driver: does `nvidia-smi` on {node} list the GPU (a driver older than the CUDA "
             "toolkit's runtime is refused too)?",
             "device-node permissions: can the RPC server's user ({user}) open /dev/nvidia* "
             "(ls -l /dev/nvidia*; containers need the devices passed in)?"),
    "hip": ("the ROCm driver: does `rocminfo` on {node} list the GPU (amdgpu loaded)?",
            "device-node permissions: /dev/kfd and /dev/dri/renderD* belong to the `render` and `video` "
            "groups: do they exist on {node} and may {user} use them?"),
    "vulkan": ("the Vulkan driver (ICD): does `vulkaninfo --summary` on {node} list the GPU (Mesa's "
               "lavapipe: mesa-vulkan-drivers; NVIDIA: the driver's Vulkan ICD)?",
               "device-node permissions: /dev/dri/renderD* belong to the `render` (and `video`) group: "
               "do they exist on {node} and may {user} use them?",
               "a CPU implementation (Mesa's llvmpipe/lavapipe) is skipped by ggml-vulkan unless chosen: "
               "rpc_env=GGML_VK_VISIBLE_DEVICES=0 (its index in vulkaninfo's list)"),
    "metal": ("Metal exists on macOS only, which tunnelspec does not deploy to",),
}


def check_served(node: str, backend: str, requested: tuple[str, ...] | list[str], log: NodeLog,
                 user: str = "the rpc user") -> str:
    """The device check after a node's RPC server started: it serves what its build and inventory
    ask for. Returns a one-line summary; raises DeviceError naming the node, what it serves and the
    likely causes. `requested`: rpc_devices (empty: the server's default choice)."""
    if log.unknown is not None:
        raise requested_missing(node, requested or [log.unknown.requested], log.unknown.available)
    if log.banner is None:
        raise DeviceError(f"{node}: the RPC server printed no banner (no 'Starting RPC server' line in its "
                          "journal): cannot tell which devices it serves; see journalctl -u tunnelspec-rpc")
    served = log.banner.devices
    if not served:
        raise DeviceError(f"{node}: the RPC server's banner lists no devices")
    summary = f"{node} serves {_names(served)}"
    if backend == "cpu":
        return summary
    requested = [r for r in requested if r]
    if requested and all(r.upper() == "CPU" for r in requested):
        return summary + " (rpc_devices asks for the CPU)"
    want = BACKEND_PREFIX.get(backend, "")
    if any(d.prefix.lower() == want.lower() for d in served):
        return summary
    what = "CPU only" if all(d.kind == "cpu" for d in served) else f"no {want} device"
    causes = [c.format(node=node, user=user) for c in _CAUSES.get(backend, ())]
    causes.append("rpc_devices: unset, the server picks every non-CPU device and falls back to the CPU "
                  "when it finds none; set rpc_devices=CPU (or llama_backend=cpu) if the CPU is what "
                  "you want" if not requested else
                  f"rpc_devices={','.join(requested)}: does it name this node's {want} device?")
    seen = "; the runtime said: " + " | ".join(log.hints) if log.hints else ""
    raise DeviceError(f"{node}: built for {backend} (llama_backend={backend}) but its RPC server serves {what}: "
                      f"{_names(served)}{seen}. Check: " + "; ".join(f"({i}) {c}" for i, c in enumerate(causes, 1)))


def requested_missing(node: str, requested, available) -> DeviceError:
    """rpc_devices names a device the node does not have: the error, listing what it has."""
    have = {d.name.lower() for d in available}
    missing = [r for r in requested if r.lower() not in have] or list(requested)
    return DeviceError(f"{node}: rpc_devices={','.join(requested)} names {', '.join(missing)}, which this node "
                       f"does not have; its devices: {_names(available)}. Set rpc_devices to some of "
                       f"{', '.join(d.name for d in available) or 'them'} (or remove it: every non-CPU device, "
                       "else the CPU)")


def check_requested(node: str, requested, available) -> str:
    """Before the RPC server starts: every rpc_devices name is a device of the node (`available`
    from `node_devices`). Returns a summary; raises DeviceError listing the node's devices."""
    if not requested:
        return f"{node} has {_names(available)}"
    have = {d.name.lower() for d in available}
    if any(r.lower() not in have for r in requested):
        raise requested_missing(node, requested, available)
    return f"{node} has {', '.join(requested)} ({_names(available)})"


# ---- the main host's own devices -------------------------------------------------------------------
def parse_list_devices(text: str) -> list[Device]:
    """`llama-server --list-devices`: the device lines after "Available devices:" (local and RPC)."""
    lines = (text or "").splitlines()
    at = next((i for i, line in enumerate(lines) if line.strip().lower() == "available devices:"), None)
    return _device_block(lines, at + 1) if at is not None else []


def default_target_devices(backend: str, listed: list[Device]) -> str:
    """The -dev value for main's target when llama_target_devices is not set: every local device of
    main's backend, from `llama-server --list-devices` (run without --rpc, or with it: RPC devices
    are left out), in listed order; "none" (the CPU) for the cpu backend. Naming the devices is what
    keeps the target off the RPC devices (without -dev llama.cpp puts the RPC devices first and
    spreads the target onto them). A GPU backend whose build lists none of its devices is an error."""
    if backend == "cpu":
        return "none"
    want = BACKEND_PREFIX.get(backend)
    local = [d.name for d in listed if want and d.prefix.lower() == want.lower()]
    if not local:
        raise DeviceError(f"main is built for {backend} but llama-server --list-devices shows no {want} device "
                          f"(it lists: {', '.join(d.name for d in listed) or 'nothing'}); check the driver "
                          "and device permissions, or set llama_target_devices=none to run the target on the CPU")
    return ",".join(local)


def static_target_default(backend: str) -> str:
    """The inventory-time default (no device list yet): the backend's first device, `none` for cpu."""
    prefix = BACKEND_PREFIX.get(backend)
    return f"{prefix}0" if prefix else "none"


# ---- nvidia-smi --------------------------------------------------------------------------------------
NVIDIA_SMI_FIELDS = ("compute_cap", "name", "driver_version", "memory.total")
NVIDIA_SMI_ARGV = ["nvidia-smi", f"--query-gpu={','.join(NVIDIA_SMI_FIELDS)}", "--format=csv,noheader"]
# The probe: nvidia-smi's own messages (some go to stderr) in its output, "not found" made explicit.
NVIDIA_SMI_SCRIPT = ('command -v nvidia-smi >/dev/null 2>&1 || { echo "tunnelspec: nvidia-smi: command not found"; '
                     'exit 127; }; exec ' + " ".join(NVIDIA_SMI_ARGV) + " 2>&1")
NVIDIA_SMI_PROBE = ["sh", "-c", NVIDIA_SMI_SCRIPT]


@dataclass(frozen=True)
class NvidiaGpu:
    compute_cap: str  # "8.9"
    name: str
    driver: str
    memory_mib: int | None

    @property
    def arch(self) -> str:
        """The CMake CUDA architecture: 8.9 → 89, 12.0 → 120 (ggml turns 12X into 12Xa itself)."""
        major, minor = self.compute_cap.split(".")
        return f"{int(major)}{int(minor)}"


_CC = re.compile(r"^\d{1,2}\.\d$")


def parse_nvidia_smi(text: str, rc: int = 0, host: str = "this host") -> list[NvidiaGpu]:
    """The GPUs of `NVIDIA_SMI_PROBE`'s output (one CSV line per GPU: compute_cap, name, driver,
    memory). Raises DeviceError naming the host and what nvidia-smi said when it lists none."""
    gpus, odd = [], []
    for line in (text or "").splitlines():
        if not line.strip():
            continue
        parts = [p.strip() for p in line.split(",")]
        if len(parts) >= 4 and _CC.match(parts[0]):
            mem = re.match(r"^(\d+)\s*MiB$", parts[-1])
            gpus.append(NvidiaGpu(parts[0], ", ".join(parts[1:-2]), parts[-2], int(mem.group(1)) if mem else None))
        else:
            odd.append(line.strip())
    if gpus and rc == 0:
        return gpus
    said = " | ".join(odd[:4]) or f"exit status {rc}, no output"
    if rc == 127 or "command not found" in said:
        why = "nvidia-smi is not installed: the NVIDIA driver is missing (install it, then reboot)"
    elif "couldn't communicate with the NVIDIA driver" in said or "NVML" in said or "libnvidia-ml" in said:
        why = "the NVIDIA driver is not loaded or does not match its tools (install it or reboot after an upgrade)"
    elif "No devices were found" in said:
        why = "the driver sees no GPU (a container without the GPU passed in?)"
    elif "not a valid field" in said:
        why = ("this driver's nvidia-smi cannot report compute_cap (older than R510): set "
               "llama_cuda_architectures (e.g. 86) in the inventory")
    else:
        why = "nvidia-smi listed no GPU"
    raise DeviceError(f"{host}: llama_backend=cuda but {why}; nvidia-smi said: {said}")


def cuda_architectures(gpus: list[NvidiaGpu]) -> list[str]:
    """The distinct architectures of these GPUs, lowest first (8.6 and 8.9 → 86, 89)."""
    return sorted({g.arch for g in gpus}, key=int)


def describe_gpus(gpus: list[NvidiaGpu]) -> str:
    counts: dict[tuple[str, str], int] = {}
    for g in gpus:
        counts[(g.name, g.compute_cap)] = counts.get((g.name, g.compute_cap), 0) + 1
    return ", ".join(f"{n}× {name} ({cc})" for (name, cc), n in counts.items())


# ---- does it fit? ----------------------------------------------------------------------------------
# A refusal when the need exceeds what the devices report free; a warning when less than TIGHT_SHARE
# of the free memory (and at least TIGHT_MIN_MIB) would be left: other processes, fragmentation and
# the runtime's own context (a CUDA context alone takes a few hundred MiB) eat into that headroom.
TIGHT_SHARE = 0.10
TIGHT_MIN_MIB = 256
# The batch llama-server computes at most at once (its default -ub), for the compute-buffer estimate.
UBATCH = 512


@dataclass(frozen=True)
class ModelShape:
    """What the memory estimate needs from a GGUF's header (any may be unknown)."""

    n_layer: int | None = None
    n_embd: int | None = None
    n_head: int | None = None
    n_head_kv: int | None = None
    n_vocab: int | None = None
    n_ctx_train: int | None = None


@dataclass(frozen=True)
class Need:
    """Bytes a node must hold: weights, the KV cache and the compute buffers, each with how it was
    estimated."""

    weights: int
    kv: int
    compute: int
    notes: tuple[str, ...] = ()

    @property
    def total(self) -> int:
        return self.weights + self.kv + self.compute

    def describe(self) -> str:
        parts = f"weights {_mib(self.weights)} + KV {_mib(self.kv)} + compute {_mib(self.compute)}"
        return parts + (f" ({'; '.join(self.notes)})" if self.notes else "")


def _mib(n: int) -> str:
    return f"{n / MIB:.0f} MiB" if n >= MIB else f"{n / MIB:.2f} MiB"


def kv_bytes(shape: ModelShape, n_ctx: int, bytes_per: int = 2) -> int | None:
    """K and V for n_ctx tokens, f16 (llama.cpp's default cache type): 2 × n_ctx × n_layer × n_embd ×
    n_head_kv / n_head × 2 bytes. None when the shape is unknown."""
    if not (shape.n_layer and shape.n_embd and shape.n_head):
        return None
    kv_heads = shape.n_head_kv or shape.n_head
    return 2 * n_ctx * shape.n_layer * shape.n_embd * kv_heads // shape.n_head * bytes_per


def compute_bytes(shape: ModelShape, weights: int) -> int:
    """The compute buffers: the logits of one micro-batch (n_vocab × UBATCH floats) and a few
    activation rows (4 × n_embd × UBATCH floats); without a shape, 5 % of the weights + 16 MiB."""
    if shape.n_vocab and shape.n_embd:
        return UBATCH * (shape.n_vocab + 4 * shape.n_embd) * 4
    return weights // 20 + 16 * MIB


def draft_need(draft_bytes: int, shape: ModelShape | None, n_ctx: int | None) -> Need:
    """The draft model on its node: the GGUF's size (its tensors are nearly all of it), its KV cache
    for the context the server gives it (n_ctx, else the model's training context) and compute."""
    shape = shape or ModelShape()
    notes = []
    ctx = n_ctx or shape.n_ctx_train
    kv = kv_bytes(shape, ctx) if ctx else None
    if kv is None:
        notes.append("KV cache not estimated: model shape or context unknown")
        kv = 0
    else:
        notes.append(f"KV for {ctx} tokens, f16")
    if not (shape.n_vocab and shape.n_embd):
        notes.append("compute buffers guessed from the size")
    return Need(draft_bytes, kv, compute_bytes(shape, draft_bytes), tuple(notes))


def target_share_need(target_bytes: int, share: float, total_weight: float, shape: ModelShape | None,
                      n_ctx: int | None) -> Need:
    """A target node's part: `share`/`total_weight` of the target's weights and of its KV cache
    (layers carry both), plus its compute buffers (without the logits: the output layer stays on
    the last device, which is main's)."""
    if total_weight <= 0 or share <= 0:
        return Need(0, 0, 0, ("no target layers",))
    frac = share / total_weight
    shape = shape or ModelShape()
    ctx = n_ctx or shape.n_ctx_train
    kv = kv_bytes(shape, ctx) if ctx else None
    notes = [f"{frac:.0%} of the target"]
    if kv is None:
        notes.append("KV cache not estimated")
    compute = UBATCH * 4 * shape.n_embd * 4 if shape.n_embd else int(target_bytes * frac) // 20 + 16 * MIB
    return Need(int(target_bytes * frac), int((kv or 0) * frac), compute, tuple(notes))


def combine(*needs: Need) -> Need:
    return Need(sum(n.weights for n in needs), sum(n.kv for n in needs), sum(n.compute for n in needs),
                tuple(x for n in needs for x in n.notes))


@dataclass(frozen=True)
class Fit:
    level: str  # "ok", "tight" or "refuse"
    message: str


def check_fit(node: str, devices: list[tuple[str, int, int]], need: Need, what: str = "the draft") -> Fit:
    """`devices`: (name, free bytes, total bytes) of the devices the node serves, as the device itself
    reports them (the RPC server's GET_DEVICE_MEMORY: llama/rpc.py `ProbeResult.devices`, in its
    order). llama.cpp spreads a model over a node's devices by their free memory, so the sum counts.
    Refuse when the need exceeds it, tight when less than max(TIGHT_SHARE of it, TIGHT_MIN_MIB) stays."""
    free = sum(f for _, f, _ in devices)
    total = sum(t for _, _, t in devices)
    per = ", ".join(f"{n} {_mib(f)} free of {_mib(t)}" for n, f, t in devices) or "no device"
    figures = f"{what} needs {_mib(need.total)} ({need.describe()}); {node} reports {_mib(free)} free ({per})"
    if need.total > free:
        return Fit("refuse", f"{node}: {what} does not fit: {figures}. Use a smaller (more quantized) model, a "
                   "smaller context, or a node with more memory")
    left = free - need.total
    if left < max(free * TIGHT_SHARE, TIGHT_MIN_MIB * MIB):
        return Fit("tight", f"{node}: {what} fits tightly, {_mib(left)} would be left: {figures}")
    return Fit("ok", f"{node}: {what} fits: {figures}, total {_mib(total)}")


def require_fit(fit: Fit) -> str:
    """The fit as a task outcome: the message (a tight fit prefixed WARNING), or a DeviceError."""
    if fit.level == "refuse":
        raise DeviceError(fit.message)
    return ("WARNING " if fit.level == "tight" else "") + fit.message


# ---- a GGUF's shape, from its header bytes ---------------------------------------------------------
_GGUF_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}


class _Short(Exception):
    pass


def gguf_kv(header: bytes) -> tuple[dict[str, object], int | None]:
    """A GGUF's key/value section from its first bytes: {key: value} (arrays: their length) and the
    offset where the tensor infos start, None when the bytes end before the section does (what was
    read before the cut is kept)."""
    if header[:4] != b"GGUF":
        raise ValueError("not a GGUF file (no GGUF magic)")
    pos = 4
    version = struct.unpack_from("<I", header, pos)[0]
    pos += 4
    if version < 2:
        raise ValueError(f"GGUF version {version} is too old")
    _, n_kv = struct.unpack_from("<QQ", header, pos)
    pos += 16
    found: dict[str, object] = {}

    def take(fmt: str):
        nonlocal pos
        if pos + struct.calcsize(fmt) > len(header):
            raise _Short
        out = struct.unpack_from(fmt, header, pos)[0]
        pos += struct.calcsize(fmt)
        return out

    def string() -> str:
        nonlocal pos
        n = take("<Q")
        if pos + n > len(header):
            raise _Short
        out = header[pos:pos + n].decode("utf-8", "replace")
        pos += n
        return out

    def value(vtype: int, keep: bool):
        nonlocal pos
        if vtype in _GGUF_SCALARS:
            return take(_GGUF_SCALARS[vtype])
        if vtype == 8:
            return string()
        if vtype == 9:
            itype, count = take("<I"), take("<Q")
            if itype in _GGUF_SCALARS and not keep:
                size = struct.calcsize(_GGUF_SCALARS[itype]) * count
                if pos + size > len(header):
                    raise _Short
                pos += size
            else:
                for _ in range(count):
                    value(itype, False)
            return count  # arrays: their length is what the shape needs (the token list's size)
        raise ValueError(f"unknown GGUF value type {vtype}")

    try:
        for _ in range(n_kv):
            key = string()
            vtype = take("<I")
            found[key] = value(vtype, False)
    except _Short:
        return found, None
    return found, pos


def gguf_shape(header: bytes) -> ModelShape:
    """The model's shape from the first bytes of a GGUF (`head -c 16M` is plenty: the key/value
    section comes before the tensors; the token list is its largest part). Unknown keys stay None;
    a header cut short yields what was read before the cut."""
    found, _ = gguf_kv(header)
    arch = found.get("general.architecture")

    def num(suffix: str) -> int | None:
        v = found.get(f"{arch}.{suffix}") if isinstance(arch, str) else None
        return int(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None

    vocab = found.get("tokenizer.ggml.tokens")
    return ModelShape(n_layer=num("block_count"), n_embd=num("embedding_length"), n_head=num("attention.head_count"),
                      n_head_kv=num("attention.head_count_kv"),
                      n_vocab=num("vocab_size") or (int(vocab) if isinstance(vocab, int) else None),
                      n_ctx_train=num("context_length"))


# ---- a command line for scripts (scripts/gpu-check.sh) ---------------------------------------------
def _main(argv: list[str]) -> int:
    usage = ("usage: python -m tunnelspec.llama.devices cuda-arch        (nvidia-smi output on stdin)\n"
             "       python -m tunnelspec.llama.devices served BACKEND   (rpc-server output on stdin)")
    if not argv or argv[0] not in ("cuda-arch", "served"):
        print(usage, file=sys.stderr)
        return 2
    text = sys.stdin.read()
    try:
        if argv[0] == "cuda-arch":
            gpus = parse_nvidia_smi(text)
            print(";".join(cuda_architectures(gpus)))
            print(describe_gpus(gpus), file=sys.stderr)
        else:
            backend = argv[1] if len(argv) > 1 else "cpu"
            print(check_served("this host", backend, tuple(argv[2:]), parse_node_log(text)))
    except DeviceError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    import sys

    raise SystemExit(_main(sys.argv[1:]))


def served_text(names: list[str], served: list[dict] | None) -> str:
    """main's RPC<n> names of a node beside what the node serves, in order: `RPC0 = Vulkan0 (llvmpipe
    (LLVM 19.1.7, 256 bits), 17920/17920 MiB free)`."""
    if not names:
        return "?"
    if not served:
        return ",".join(names)
    return ", ".join(f"{n} = {d['name']} ({d['description']}, {d['free_mib']}/{d['total_mib']} MiB free)"
                     if i < len(served) and (d := served[i]) else n for i, n in enumerate(names))
