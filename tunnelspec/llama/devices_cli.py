"""The command line of tunnelspec.llama.devices for scripts (scripts/gpu-check.sh): run as
`python -m tunnelspec.llama.devices cuda-arch|served ...`, which hands its arguments to main()."""

from __future__ import annotations

import sys

from tunnelspec.llama.device_error import DeviceError
from tunnelspec.llama.devices import check_served, parse_node_log
from tunnelspec.llama.nvidia_smi import cuda_architectures, describe_gpus, parse_nvidia_smi


def main(argv: list[str]) -> int:
    usage = (
        "usage: python -m tunnelspec.llama.devices cuda-arch        (nvidia-smi output on stdin)\n"
        "       python -m tunnelspec.llama.devices served BACKEND   (rpc-server output on stdin)"
    )
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
