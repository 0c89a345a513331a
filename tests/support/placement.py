"""The target's placement over two rpc nodes by share, as llama.cpp's own layer rule gives it, read
from llama-server's load lines: one rule for the lab test (tests/deploy/test_spec_placement.py) and
the local one (tests/server/test_placement_local.py).

rpc-a is the draft node and, with rpc_target_share=1, also carries target layers; rpc-b carries the
rest (rpc_target_share=3). The target is a tiny llama model with BLOCKS blocks (12 layer slots with
the output layer), so the rule puts exactly 3 on RPC0 and 9 on RPC1."""

from __future__ import annotations

import bisect
import re

from tunnelspec.lab import gguf_tiny

BLOCKS = 11
SHARES = {"rpc-a": 1, "rpc-b": 3}


def expected_layers(weights: list[float], n_layers: int) -> list[int]:
    """llama.cpp's layer assignment (src/llama-model.cpp, load_tensors): cumulative normalized
    splits; layer i goes to the first device whose split point is above i / n_layers."""
    total, acc, points = sum(weights), 0.0, []
    for w in weights:
        acc += w
        points.append(acc / total)
    counts = [0] * len(weights)
    for i in range(n_layers):
        counts[bisect.bisect_right(points, i / n_layers)] += 1
    return counts


MIB = 2**20
# Bytes of one block and of the output layer of the tiny model (f32): what a device's model buffer
# holds per layer it was given.
BLOCK_BYTES = 4 * (2 * gguf_tiny.EMBED * gguf_tiny.EMBED + 2 * gguf_tiny.HEADS_KV * (gguf_tiny.EMBED // gguf_tiny.HEADS)
                   * gguf_tiny.EMBED + 3 * gguf_tiny.EMBED * gguf_tiny.FEED_FORWARD + 2 * gguf_tiny.EMBED)
OUTPUT_BYTES = 4 * (gguf_tiny.N_VOCAB * gguf_tiny.EMBED + gguf_tiny.EMBED)


def target_placement(log: str, ports: list[int]) -> dict:
    """From the target's load lines (the first model loaded): per endpoint port, its model buffer
    (MiB) and the number of blocks whose KV cache it holds (KV is the same size per block).
    llama.cpp prints `RPC0[127.0.0.1:P]` per server, so the port names the node."""
    buffers = re.findall(r"load_tensors: RPC\d+\[127\.0\.0\.1:(\d+)\] model buffer size\s*=\s*([0-9.]+) MiB", log)
    kv = re.findall(r"llama_kv_cache: RPC\d+\[127\.0\.0\.1:(\d+)\] KV buffer size\s*=\s*([0-9.]+) MiB", log)
    total = re.search(r"llama_kv_cache: size =\s*([0-9.]+) MiB \(\s*\d+ cells,\s*(\d+) layers", log)
    assert total, log[-3000:]
    n_layers, kv_total = int(total.group(2)), float(total.group(1))
    out = {}
    for port in ports:
        buf = next(float(s) for p, s in buffers[:len(ports)] if int(p) == port)
        kv_mib = next(float(s) for p, s in kv[:len(ports)] if int(p) == port)
        out[port] = {"model_mib": buf, "blocks": round(kv_mib / kv_total * n_layers)}
    return out


def check_one_to_three(log: str, port_a: int, port_b: int) -> dict:
    """rpc-a share 1, rpc-b share 3 over BLOCKS blocks + the output layer: llama.cpp's rule gives
    rpc-a 3 layer slots (blocks 0-2), rpc-b 9 (8 blocks and the output layer)."""
    want = expected_layers([SHARES["rpc-a"], SHARES["rpc-b"]], BLOCKS + 1)
    assert want == [3, 9]
    got = target_placement(log, [port_a, port_b])
    assert got[port_a]["blocks"] == 3 and got[port_b]["blocks"] == 8, got
    assert abs(got[port_a]["model_mib"] - 3 * BLOCK_BYTES / MIB) < 0.01, got
    assert abs(got[port_b]["model_mib"] - (8 * BLOCK_BYTES + OUTPUT_BYTES) / MIB) < 0.01, got
    return got
