"""Whether the models fit the memory each device reports: the bytes a node must hold (weights, KV
cache, compute buffers) estimated from a GGUF's size and shape, against the free memory its devices
report. Pure: the GGUF's first bytes (read by llama/gguf_header.py) and the devices' figures in, a
verdict out; a refusal as a task outcome is a `DeviceError` naming the host.
"""

from __future__ import annotations

from dataclasses import dataclass

from tunnelspec.llama.device_error import DeviceError
from tunnelspec.llama.gguf_header import read_kv

MIB = 2**20

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


def target_share_need(
    target_bytes: int, share: float, total_weight: float, shape: ModelShape | None, n_ctx: int | None
) -> Need:
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
    return Need(
        sum(n.weights for n in needs),
        sum(n.kv for n in needs),
        sum(n.compute for n in needs),
        tuple(x for n in needs for x in n.notes),
    )


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
        return Fit(
            "refuse",
            f"{node}: {what} does not fit: {figures}. Use a smaller (more quantized) model, a "
            "smaller context, or a node with more memory",
        )
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
def gguf_shape(header: bytes) -> ModelShape:
    """The model's shape from the first bytes of a GGUF (`head -c 16M` is plenty: the key/value
    section comes before the tensors; the token list is its largest part). Unknown keys stay None;
    a header cut short yields what was read before the cut."""
    found, _ = read_kv(header)
    arch = found.get("general.architecture")

    def num(suffix: str) -> int | None:
        v = found.get(f"{arch}.{suffix}") if isinstance(arch, str) else None
        return int(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None

    vocab = found.get("tokenizer.ggml.tokens")
    return ModelShape(
        n_layer=num("block_count"),
        n_embd=num("embedding_length"),
        n_head=num("attention.head_count"),
        n_head_kv=num("attention.head_count_kv"),
        n_vocab=num("vocab_size") or (int(vocab) if isinstance(vocab, int) else None),
        n_ctx_train=num("context_length"),
    )


def ram_available(meminfo: str) -> tuple[int, int] | None:
    """(MemAvailable, MemTotal) in bytes from /proc/meminfo's text; None when either is missing."""
    kb = {}
    for line in (meminfo or "").splitlines():
        key, _, rest = line.partition(":")
        parts = rest.split()
        if parts and parts[0].isdigit():
            kb[key.strip()] = int(parts[0]) * 1024
    if "MemAvailable" not in kb or "MemTotal" not in kb:
        return None
    return kb["MemAvailable"], kb["MemTotal"]
