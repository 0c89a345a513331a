"""The GPUs `nvidia-smi` reports, for a CUDA build: the probe's argv, its output parsed, the CMake
CUDA architectures they need. Pure: the caller runs `NVIDIA_SMI_PROBE` (docs/accelerators.md) and
passes the text; `python -m tunnelspec.llama.devices cuda-arch` is its command line
(scripts/gpu-check.sh). A GPU-less answer is a `DeviceError` naming the host and what nvidia-smi said.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from tunnelspec.llama.device_error import DeviceError

NVIDIA_SMI_FIELDS = ("compute_cap", "name", "driver_version", "memory.total")
NVIDIA_SMI_ARGV = ["nvidia-smi", f"--query-gpu={','.join(NVIDIA_SMI_FIELDS)}", "--format=csv,noheader"]
# The probe: nvidia-smi's own messages (some go to stderr) in its output, "not found" made explicit.
NVIDIA_SMI_SCRIPT = (
    'command -v nvidia-smi >/dev/null 2>&1 || { echo "tunnelspec: nvidia-smi: command not found"; '
    "exit 127; }; exec " + " ".join(NVIDIA_SMI_ARGV) + " 2>&1"
)
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
        why = (
            "this driver's nvidia-smi cannot report compute_cap (older than R510): set "
            "llama_cuda_architectures (e.g. 86) in the inventory"
        )
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
