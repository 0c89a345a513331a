"""The devices llama.cpp runs on, as pure data and decisions: what a node's RPC server serves (its
banner), which devices a node has (the rpc-server's own "unknown device" listing), what the main
host's `llama-server --list-devices` shows (the device line and `Device` of both: llama/flags.py
reads its RPC devices with them), and whether a node serves the device its build and inventory ask for.

No I/O here: callers run the commands (docs/accelerators.md says which, and when) and pass the text.
Every refusal is a `DeviceError` (a `TaskFailed`: a task may let it through as is) naming the host.

Device names (ggml's, docs/llama-facts.md): `CPU`; `CUDA<n>` (ggml-cuda), `ROCm<n>` (the same code
built with GGML_HIP: GGML_CUDA_NAME is "ROCm"), `MUSA<n>`; `Vulkan<n>`; `MTL<n>` (Metal); `RPC<n>`
for remote devices on the main host (`RPC[host:port]` before protocol 3.0). ggml matches a device
name case-insensitively (`ggml_backend_dev_by_name`), so every comparison here does too.

The GPUs nvidia-smi reports are llama/nvidia_smi.py's, whether the models fit the memory each device
reports llama/memory_fit.py's; this module's command line (`python -m tunnelspec.llama.devices
cuda-arch | served`, scripts/gpu-check.sh) covers both nvidia-smi and the served-device check.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Sequence
from dataclasses import dataclass

from tunnelspec.llama.device_error import DeviceError

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

    @property
    def is_rpc(self) -> bool:
        return self.name.startswith("RPC")

    @property
    def endpoint_port(self) -> int | None:
        """The port of the RPC endpoint as typed in `--rpc` (description, else the old name)."""
        if not self.is_rpc:
            return None
        for text in (self.description, self.name):
            m = re.search(r":(\d{1,5})\]?\s*$", text.strip())
            if m:
                return int(m.group(1))
        return None

    def describe(self) -> str:
        return f"{self.name} ({self.description}, {self.free_mib}/{self.total_mib} MiB free)"

    def as_fact(self) -> dict:
        return {
            "name": self.name,
            "description": self.description,
            "kind": self.kind,
            "total_mib": self.total_mib,
            "free_mib": self.free_mib,
        }


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
_HINTS = re.compile(
    r"failed to initialize (?:CUDA|ROCm|MUSA)|ggml_vulkan: No devices found|"
    r"CUDA driver version is insufficient|no CUDA-capable device|hipErrorNoDevice|"
    r"ERROR_INCOMPATIBLE_DRIVER|ErrorIncompatibleDriver|Permission denied.*/dev/|"
    r"error while loading shared libraries",
    re.I,
)


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
        at = next(
            (j for j in range(last_banner + 1, min(len(lines), last_banner + 8)) if lines[j].strip() == "Devices:"),
            None,
        )
        banner = Banner(version, tuple(_device_block(lines, at + 1)) if at is not None else ())
    if last_unknown is not None:
        i, name = last_unknown
        at = next(
            (j for j in range(i + 1, min(len(lines), i + 4)) if lines[j].strip().lower() == "available devices:"), None
        )
        unknown = UnknownDevice(name, tuple(_device_block(lines, at + 1)) if at is not None else ())
    end = last_banner if last_banner is not None else (last_unknown[0] if last_unknown else len(lines))
    hints = tuple(dict.fromkeys(line.strip() for line in lines[run_start : end + 1] if _HINTS.search(line)))
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
        raise DeviceError(
            "the RPC server did not list its devices (no 'available devices:' after its "
            f"'unknown device' error); its output:\n{_tail(output)}"
        )
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
    "cuda": (
        "the NVIDIA driver: does `nvidia-smi` on {node} list the GPU (a driver older than the CUDA "
        "toolkit's runtime is refused too)?",
        "device-node permissions: can the RPC server's user ({user}) open /dev/nvidia* "
        "(ls -l /dev/nvidia*; containers need the devices passed in)?",
    ),
    "hip": (
        "the ROCm driver: does `rocminfo` on {node} list the GPU (amdgpu loaded)?",
        "device-node permissions: /dev/kfd and /dev/dri/renderD* belong to the `render` and `video` "
        "groups: do they exist on {node} and may {user} use them?",
    ),
    "vulkan": (
        "the Vulkan driver (ICD): does `vulkaninfo --summary` on {node} list the GPU (Mesa's "
        "lavapipe: mesa-vulkan-drivers; NVIDIA: the driver's Vulkan ICD)?",
        "device-node permissions: /dev/dri/renderD* belong to the `render` (and `video`) group: "
        "do they exist on {node} and may {user} use them?",
        "a CPU implementation (Mesa's llvmpipe/lavapipe) is skipped by ggml-vulkan unless chosen: "
        "rpc_env=GGML_VK_VISIBLE_DEVICES=0 (its index in vulkaninfo's list)",
    ),
    "metal": ("Metal exists on macOS only, which tunnelspec does not deploy to",),
}


def check_served(
    node: str, backend: str, requested: tuple[str, ...] | list[str], log: NodeLog, user: str = "the rpc user"
) -> str:
    """The device check after a node's RPC server started: it serves what its build and inventory
    ask for. Returns a one-line summary; raises DeviceError naming the node, what it serves and the
    likely causes. `requested`: rpc_devices (empty: the server's default choice)."""
    if log.unknown is not None:
        raise requested_missing(node, requested or [log.unknown.requested], log.unknown.available)
    if log.banner is None:
        raise DeviceError(
            f"{node}: the RPC server printed no banner (no 'Starting RPC server' line in its "
            "journal): cannot tell which devices it serves; see journalctl -u tunnelspec-rpc"
        )
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
    causes.append(
        "rpc_devices: unset, the server picks every non-CPU device and falls back to the CPU "
        "when it finds none; set rpc_devices=CPU (or llama_backend=cpu) if the CPU is what "
        "you want"
        if not requested
        else f"rpc_devices={','.join(requested)}: does it name this node's {want} device?"
    )
    seen = "; the runtime said: " + " | ".join(log.hints) if log.hints else ""
    raise DeviceError(
        f"{node}: built for {backend} (llama_backend={backend}) but its RPC server serves {what}: "
        f"{_names(served)}{seen}. Check: " + "; ".join(f"({i}) {c}" for i, c in enumerate(causes, 1))
    )


def requested_missing(node: str, requested, available) -> DeviceError:
    """rpc_devices names a device the node does not have: the error, listing what it has."""
    have = {d.name.lower() for d in available}
    missing = [r for r in requested if r.lower() not in have] or list(requested)
    return DeviceError(
        f"{node}: rpc_devices={','.join(requested)} names {', '.join(missing)}, which this node "
        f"does not have; its devices: {_names(available)}. Set rpc_devices to some of "
        f"{', '.join(d.name for d in available) or 'them'} (or remove it: every non-CPU device, "
        "else the CPU)"
    )


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
    """`llama-server --list-devices`: the device lines after "Available devices:" (local and RPC),
    up to the first line that is not one (llama/flags.py's `parse_list_devices` takes every device
    line of the text instead)."""
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
        raise DeviceError(
            f"main is built for {backend} but llama-server --list-devices shows no {want} device "
            f"(it lists: {', '.join(d.name for d in listed) or 'nothing'}); check the driver "
            "and device permissions, or set llama_target_devices=none to run the target on the CPU"
        )
    return ",".join(local)


def static_target_default(backend: str) -> str:
    """The inventory-time default (no device list yet): the backend's first device, `none` for cpu."""
    prefix = BACKEND_PREFIX.get(backend)
    return f"{prefix}0" if prefix else "none"


def served_text(names: Sequence[str], served: list[dict] | None) -> str:
    """main's RPC<n> names of a node beside what the node serves, in order: `RPC0 = Vulkan0 (llvmpipe
    (LLVM 19.1.7, 256 bits), 17920/17920 MiB free)`."""
    if not names:
        return "?"
    if not served:
        return ",".join(names)
    return ", ".join(
        f"{n} = {d['name']} ({d['description']}, {d['free_mib']}/{d['total_mib']} MiB free)"
        if i < len(served) and (d := served[i])
        else n
        for i, n in enumerate(names)
    )


if __name__ == "__main__":  # `python -m tunnelspec.llama.devices ...` (scripts/gpu-check.sh): devices_cli.py
    from tunnelspec.llama.devices_cli import main

    raise SystemExit(main(sys.argv[1:]))
