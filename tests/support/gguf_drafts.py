"""Tiny GGUF files for the draft kinds that load as their own model: an EAGLE-3 draft, and a target
it can agree with. Written with the `gguf` package (a test/lab dependency), no download.

Random weights would make an EAGLE-3 head propose tokens the target rejects, so both files are
built to predict one fixed token: the target's blocks have zero output projections and every
token shares one all-ones embedding, so its last hidden state — and its greedy next token — is the
same everywhere; the EAGLE-3 head's residual is its fused target features (zero attention and FFN
outputs) fed through positive weights, and its output row for that token is the only non-zero
one. The draft then proposes exactly what the target accepts: the EAGLE-3 path (feature
extraction from the target, the head on the remote device) runs end to end with every draft token
accepted. Tensors and keys follow llama.cpp's `src/models/eagle3.cpp` (arch "eagle3").
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from tunnelspec.lab import gguf_tiny as t

# The one token both models predict: printable ASCII ('a'), so any chat-output parser accepts it.
TOKEN = t.token_id("a")
EAGLE3_TARGET_LAYERS = (0, 1, 1)


def _writer(path: Path, arch: str, name: str, blocks: int):
    import gguf

    w = gguf.GGUFWriter(str(path), arch)
    w.add_name(name)
    w.add_context_length(t.CONTEXT)
    w.add_embedding_length(t.EMBED)
    w.add_block_count(blocks)
    w.add_feed_forward_length(t.FEED_FORWARD)
    w.add_head_count(t.HEADS)
    w.add_head_count_kv(t.HEADS_KV)
    w.add_rope_dimension_count(t.ROPE_DIMS)
    w.add_layer_norm_rms_eps(t.RMS_EPS)
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    tokens, scores, types = t._vocab()
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.add_token_scores(scores)
    w.add_token_types(types)
    w.add_bos_token_id(t.BOS_ID)
    w.add_eos_token_id(t.EOS_ID)
    w.add_unk_token_id(t.UNK_ID)
    return w


def _finish(w, tensors, tmp: Path, path: Path) -> str:
    for name, arr in tensors:
        w.add_tensor(name, arr)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    digest = hashlib.sha256(tmp.read_bytes()).hexdigest()
    os.replace(tmp, path)
    return digest


def _one_hot_output():
    import numpy as np

    out = np.zeros((t.N_VOCAB, t.EMBED), dtype=np.float32)
    out[TOKEN, :] = 1.0
    return out


def write_constant_target(path: str | os.PathLike) -> str:
    """A llama model (2 blocks) whose greedy next token is always TOKEN."""
    import numpy as np

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    w = _writer(tmp, "llama", "tunnelspec-constant-target", t.BLOCKS)
    e, f = t.EMBED, t.FEED_FORWARD
    z = lambda *s: np.zeros(s, dtype=np.float32)  # noqa: E731
    o = lambda n: np.ones(n, dtype=np.float32)  # noqa: E731
    small = lambda *s: np.full(s, 0.01, dtype=np.float32)  # noqa: E731 - non-zero inputs, zero outputs
    tensors = [("token_embd.weight", np.ones((t.N_VOCAB, e), dtype=np.float32)), ("output_norm.weight", o(e)),
               ("output.weight", _one_hot_output())]
    for i in range(t.BLOCKS):
        b = f"blk.{i}"
        tensors += [(f"{b}.attn_norm.weight", o(e)), (f"{b}.attn_q.weight", small(e, e)),
                    (f"{b}.attn_k.weight", small(e, e)), (f"{b}.attn_v.weight", small(e, e)),
                    (f"{b}.attn_output.weight", z(e, e)), (f"{b}.ffn_norm.weight", o(e)),
                    (f"{b}.ffn_gate.weight", small(f, e)), (f"{b}.ffn_up.weight", small(f, e)),
                    (f"{b}.ffn_down.weight", z(e, f))]
    return _finish(w, tensors, tmp, path)


def write_eagle3_draft(path: str | os.PathLike) -> str:
    """An EAGLE-3 head for the constant target: one decoder layer, fc over 3 target layers, its own
    output (so its weights sit on the draft device); token embeddings come from the target."""
    import numpy as np

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    w = _writer(tmp, "eagle3", "tunnelspec-eagle3-draft", 1)
    w.add_array("eagle3.target_layers", list(EAGLE3_TARGET_LAYERS))
    w.add_uint32("eagle3.target_hidden_size", t.EMBED)
    e, f = t.EMBED, t.FEED_FORWARD
    n_inp = len(EAGLE3_TARGET_LAYERS) * e
    z = lambda *s: np.zeros(s, dtype=np.float32)  # noqa: E731
    o = lambda n: np.ones(n, dtype=np.float32)  # noqa: E731
    small = lambda *s: np.full(s, 0.01, dtype=np.float32)  # noqa: E731
    tensors = [("fc.weight", np.full((e, n_inp), 0.01, dtype=np.float32)), ("output_norm.weight", o(e)),
               ("output.weight", _one_hot_output()),
               ("blk.0.attn_norm.weight", o(e)), ("blk.0.attn_norm_2.weight", o(e)),
               ("blk.0.attn_q.weight", small(e, 2 * e)), ("blk.0.attn_k.weight", small(e, 2 * e)),
               ("blk.0.attn_v.weight", small(e, 2 * e)), ("blk.0.attn_output.weight", z(e, e)),
               ("blk.0.ffn_norm.weight", o(e)), ("blk.0.ffn_gate.weight", small(f, e)),
               ("blk.0.ffn_up.weight", small(f, e)), ("blk.0.ffn_down.weight", z(e, f))]
    return _finish(w, tensors, tmp, path)


DFLASH_TARGET_LAYERS = (0, 1)
DFLASH_BLOCK_SIZE = 4


def write_dflash_draft(path: str | os.PathLike) -> str:
    """A DFlash draft (arch "dflash", llama.cpp `src/models/dflash.cpp`) for the constant target:
    one layer whose K/V come from the fused target features, zero attention and FFN outputs (the
    residual is the shared all-ones token embedding), its own output head. DFlash fills a block
    with a mask token, so the vocabulary names one (the unknown token: never a real input here)."""
    import numpy as np

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    w = _writer(tmp, "dflash", "tunnelspec-dflash-draft", 1)
    w.add_array("dflash.target_layers", list(DFLASH_TARGET_LAYERS))
    w.add_uint32("dflash.block_size", DFLASH_BLOCK_SIZE)
    w.add_mask_token_id(t.UNK_ID)
    e, f = t.EMBED, t.FEED_FORWARD
    hd = e // t.HEADS
    n_inp = len(DFLASH_TARGET_LAYERS) * e
    z = lambda *s: np.zeros(s, dtype=np.float32)  # noqa: E731
    o = lambda n: np.ones(n, dtype=np.float32)  # noqa: E731
    small = lambda *s: np.full(s, 0.01, dtype=np.float32)  # noqa: E731
    tensors = [("fc.weight", np.full((e, n_inp), 0.01, dtype=np.float32)), ("enc.output_norm.weight", o(e)),
               ("output_norm.weight", o(e)), ("output.weight", _one_hot_output()),
               ("blk.0.attn_norm.weight", o(e)), ("blk.0.attn_q.weight", small(e, e)),
               ("blk.0.attn_k.weight", small(e, e)), ("blk.0.attn_v.weight", small(e, e)),
               ("blk.0.attn_output.weight", z(e, e)), ("blk.0.attn_q_norm.weight", o(hd)),
               ("blk.0.attn_k_norm.weight", o(hd)), ("blk.0.ffn_norm.weight", o(e)),
               ("blk.0.ffn_gate.weight", small(f, e)), ("blk.0.ffn_up.weight", small(f, e)),
               ("blk.0.ffn_down.weight", z(e, f))]
    return _finish(w, tensors, tmp, path)


DSPARK_MARKOV_RANK = 4


def write_dspark_draft(path: str | os.PathLike) -> str:
    """A DSpark draft: the DFlash draft above plus the semi-autoregressive Markov head DSpark adds
    (`markov_w1`/`markov_w2`, zero here, so it keeps the DFlash proposal). No confidence head:
    it is only read with --spec-draft-p-min > 0."""
    import numpy as np

    path = Path(path)
    base = path.with_name(path.name + ".dflash")
    write_dflash_draft(base)
    import gguf

    reader = gguf.GGUFReader(str(base))
    tmp = path.with_name(path.name + ".tmp")
    w = _writer(tmp, "dflash", "tunnelspec-dspark-draft", 1)
    w.add_array("dflash.target_layers", list(DFLASH_TARGET_LAYERS))
    w.add_uint32("dflash.block_size", DFLASH_BLOCK_SIZE)
    w.add_mask_token_id(t.UNK_ID)
    tensors = [(rt.name, np.array(rt.data).reshape([int(d) for d in reversed(rt.shape)])) for rt in reader.tensors]
    del reader
    base.unlink()
    tensors += [("markov_w1.weight", np.zeros((t.N_VOCAB, DSPARK_MARKOV_RANK), dtype=np.float32)),
                ("markov_w2.weight", np.zeros((t.N_VOCAB, DSPARK_MARKOV_RANK), dtype=np.float32))]
    return _finish(w, tensors, tmp, path)
