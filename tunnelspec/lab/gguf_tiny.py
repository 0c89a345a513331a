"""A tiny llama-architecture GGUF model (~0.5 MB) for tests: no download, byte-for-byte reproducible.

Random weights give gibberish, but the same file used as target and draft makes every draft token
accepted, which proves the remote-draft path end to end. `gguf` and `numpy` are test/lab
dependencies, so they are imported only when a model is written.
"""

from __future__ import annotations

import hashlib
import math
import os
import tempfile
from pathlib import Path

CONTEXT = 512
EMBED = 64
HEADS = 4
HEADS_KV = 4
BLOCKS = 2
FEED_FORWARD = 128
ROPE_DIMS = 16
RMS_EPS = 1e-5
SEED = 20261001
OUTPUT_SCALE = 50.0

# The vocabulary: <unk>, <s>, </s>, the SentencePiece space `▁`, then one byte token per printable
# ASCII character (0x20-0x7E). Whatever the random weights pick decodes to valid UTF-8: some builds
# (b9093, b10001) run an output parser on /completion text and answer 500 on invalid UTF-8, so a
# byte vocabulary of all 256 values would make the lab's default model fail there. Prompt bytes
# outside it tokenize to <unk>.
PRINTABLE = range(0x20, 0x7F)
N_VOCAB = 4 + len(PRINTABLE)
UNK_ID, BOS_ID, EOS_ID = 0, 1, 2


def token_id(char: str) -> int:
    """The id of a printable ASCII character's byte token."""
    return 4 + PRINTABLE.index(ord(char))


def _vocab():
    import gguf  # lazy: optional test dependency

    tokens = ["<unk>", "<s>", "</s>", "\u2581"] + [f"<0x{b:02X}>" for b in PRINTABLE]
    types = [gguf.TokenType.UNKNOWN, gguf.TokenType.CONTROL, gguf.TokenType.CONTROL, gguf.TokenType.NORMAL]
    return tokens, [0.0] * len(tokens), types + [gguf.TokenType.BYTE] * len(PRINTABLE)


def _tensors(n_vocab: int = N_VOCAB):
    """(name, array) in a fixed order, from one seeded generator: the bytes never change."""
    import numpy as np  # lazy: optional test dependency

    rng = np.random.default_rng(SEED)

    def weight(*shape):
        # numpy shape is (rows, cols) = (out, in); gguf reverses it into ggml's ne order.
        return (rng.standard_normal(shape) * 0.02).astype(np.float32)

    def ones(n):
        return np.ones(n, dtype=np.float32)

    head_dim = EMBED // HEADS
    # A confident model: the output projection is scaled so the next-token distribution is peaked
    # (logits of standard deviation ~8 instead of ~0.16). Builds that draft only tokens the draft is
    # sure of (b9093: --spec-draft-p-min defaults to 0.75) then still draft with this model as its
    # own draft. The control tokens' rows are zero, so the model practically never ends a text early.
    embd = weight(n_vocab, EMBED)
    output = weight(n_vocab, EMBED) * OUTPUT_SCALE
    output[:3] = 0.0
    out = [("token_embd.weight", embd), ("output_norm.weight", ones(EMBED)), ("output.weight", output)]
    for i in range(BLOCKS):
        b = f"blk.{i}"
        out += [
            (f"{b}.attn_norm.weight", ones(EMBED)),
            (f"{b}.attn_q.weight", weight(EMBED, EMBED)),
            (f"{b}.attn_k.weight", weight(HEADS_KV * head_dim, EMBED)),
            (f"{b}.attn_v.weight", weight(HEADS_KV * head_dim, EMBED)),
            (f"{b}.attn_output.weight", weight(EMBED, EMBED)),
            (f"{b}.ffn_norm.weight", ones(EMBED)),
            (f"{b}.ffn_gate.weight", weight(FEED_FORWARD, EMBED)),
            (f"{b}.ffn_up.weight", weight(FEED_FORWARD, EMBED)),
            (f"{b}.ffn_down.weight", weight(EMBED, FEED_FORWARD)),
        ]
    return out


def write_tiny_llama(path: str | os.PathLike, blocks: int | None = None) -> str:
    """Write the model to `path` (atomically) and return its sha256. `blocks`: another block count
    than BLOCKS (a split needs more layer slots to place by proportion)."""
    global BLOCKS
    saved = BLOCKS
    BLOCKS = saved if blocks is None else blocks
    try:
        return _write_atomic(path)
    finally:
        BLOCKS = saved


def _write_atomic(path, vocab=None) -> str:
    """The model written to a temp name, renamed into place; its sha256."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    _write(str(tmp), vocab=vocab)
    digest = hashlib.sha256(tmp.read_bytes()).hexdigest()
    os.replace(tmp, path)
    return digest


def write_byte_vocab_llama(path: str | os.PathLike) -> str:
    """The same model with a vocabulary of all 256 byte values instead of the printable ones: its text
    is not valid UTF-8 — what builds that parse /completion output (b9093) answer 500 to. For the
    tests of that failure only; never a lab default."""
    return _write_atomic(path, vocab=_byte_vocab())


def write_sparse_llama(path: str | os.PathLike, logical_bytes: int) -> int:
    """A well-formed GGUF of the tiny model's architecture whose token embedding is so large that the
    file is `logical_bytes` long — written sparse (the tensor data is a hole), so it takes no disk.
    A model that fits no lab device, for the memory-fit refusal; never loaded. Returns its size."""
    import numpy as np  # lazy: optional test dependency

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    rows = max(1, logical_bytes // (EMBED * 4))
    w, _ = _writer(str(path), "tunnelspec-sparse-llama")
    w.add_tensor_info("token_embd.weight", (rows, EMBED), np.dtype(np.float32), rows * EMBED * 4)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    w.close()
    # The tensor data starts at the next multiple of the file's alignment (GGUF's default, 32): the
    # writer pads there only when it writes the data, which a sparse file never does.
    align = 32
    data_start = -(-path.stat().st_size // align) * align
    os.truncate(path, data_start + rows * EMBED * 4)
    return path.stat().st_size


def _byte_vocab():
    import gguf  # lazy: optional test dependency

    tokens = ["<unk>", "<s>", "</s>", "\u2581"] + [f"<0x{b:02X}>" for b in range(256)]
    types = [gguf.TokenType.UNKNOWN, gguf.TokenType.CONTROL, gguf.TokenType.CONTROL, gguf.TokenType.NORMAL]
    return tokens, [0.0] * len(tokens), types + [gguf.TokenType.BYTE] * 256


def write_tiny_llama_split(directory: str | os.PathLike, stem: str, parts: int = 2) -> list[Path]:
    """The same model as a split GGUF (`STEM-00001-of-0000N.gguf`, …, the format llama.cpp's
    gguf-split writes: every part a GGUF with split.* keys, tensors spread over the parts)."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    per_part = math.ceil(len(_tensors()) / parts)
    with tempfile.TemporaryDirectory(dir=directory, prefix=".split-") as tmp:
        _write(str(Path(tmp) / f"{stem}.gguf"), split_max_tensors=per_part)
        names = sorted(Path(tmp).glob(f"{stem}-*-of-*.gguf"))
        out = []
        for f in names:
            os.replace(f, directory / f.name)
            out.append(directory / f.name)
    return out


def _writer(path: str, name: str, vocab=None, split_max_tensors: int = 0):
    """A GGUFWriter with the tiny model's metadata and tokenizer (the default vocabulary unless
    `vocab` is given); the caller adds tensors. Returns (writer, number of tokens)."""
    import gguf  # lazy: optional test dependency

    w = gguf.GGUFWriter(path, "llama", split_max_tensors=split_max_tensors)
    w.add_name(name)
    w.add_context_length(CONTEXT)
    w.add_embedding_length(EMBED)
    w.add_block_count(BLOCKS)
    w.add_feed_forward_length(FEED_FORWARD)
    w.add_head_count(HEADS)
    w.add_head_count_kv(HEADS_KV)
    w.add_rope_dimension_count(ROPE_DIMS)
    w.add_layer_norm_rms_eps(RMS_EPS)
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    tokens, scores, types = vocab or _vocab()
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.add_token_scores(scores)
    w.add_token_types(types)
    w.add_bos_token_id(BOS_ID)
    w.add_eos_token_id(EOS_ID)
    w.add_unk_token_id(UNK_ID)
    return w, len(tokens)


def _write(path: str, split_max_tensors: int = 0, vocab=None) -> None:
    w, n_vocab = _writer(path, "tunnelspec-tiny-llama", vocab, split_max_tensors)
    for name, arr in _tensors(n_vocab):
        w.add_tensor(name, arr)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
