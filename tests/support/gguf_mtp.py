"""A tiny MTP-capable target and its separate MTP draft file (`--spec-type draft-mtp -md D`), written
with the `gguf` package like the other tiny models: no download, byte-for-byte reproducible.

An MTP head is not a model of its own: it reads the target's `h_nextn` hidden state (the target's
last hidden state, fed back one position later) together with the next token's embedding, so only
an architecture whose graph emits `h_nextn` *and* whose loader accepts a file holding the MTP block
alone (no trunk: llama.cpp's `mtp_only` path, the file `convert_hf_to_gguf.py --mtp` writes) can
serve as a separate draft. In the pinned b11434 tree that is 16 architectures (src/models/*.cpp
with `mtp_only`); the one with the fewest required tensors is **cohere2moe**:

- its block is parallel (attention and FFN both read one `attn_norm`): no `ffn_norm`, no
  post-attention norm, no Q/K norms;
- its output head is tied to `token_embd` (`output` is optional);
- Q, K and V load fused as one `attn_qkv`;
- the trunk's leading blocks are dense (`leading_dense_block_count`); the MTP block is one MoE block,
  here with a single expert (router, fused gate/up experts, down experts).

So the target is 8 tensors (token_embd, output_norm and one dense block of 6) and the MTP file 11
(token_embd, output_norm, attn_norm, attn_qkv, attn_output, ffn_gate_inp, ffn_gate_up_exps,
ffn_down_exps, nextn.eh_proj/enorm/hnorm). The runner-up, mimo2 (dense MTP block), needs its own
`output` and an `ffn_norm`: 10 and 13. qwen35 (the architecture of seed 000's Qwen3.6) needs
`attn_post_norm` and Q/K norms in every block: 13 and 16 at least. See docs/speculative.md.

Acceptance is made observable by construction, as in gguf_drafts.py: every token embedding is the
same positive constant except TOKEN's, which is twice as large; attention and FFN outputs are zero,
so the residual stream is the input embedding, its normalised form is the all-ones vector, and the
tied head scores TOKEN highest (64 against 32 for every other token) whatever the input. The MTP
block's `eh_proj` maps [enorm(embedding), hnorm(h_nextn)] through positive weights, its attention
and experts output zero, and it ends in the same tied head: it also proposes TOKEN at every step.
With greedy sampling the target emits TOKEN forever and every drafted token is accepted — only if
the MTP path ran: draft_n counts what the MTP head proposed.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from tunnelspec.lab import gguf_tiny as t

ARCH = "cohere2moe"
TOKEN = t.token_id("a")  # printable ASCII: any output parser accepts it
TRUNK_BLOCKS = 1  # blocks of the target; the MTP file declares TRUNK_BLOCKS + 1 and holds only the last
EXPERTS = 1
SLIDING_WINDOW = t.CONTEXT  # cohere2moe always has sliding-window layers; a window of the whole context
LOGIT_SCALE = 1.0


def _writer(path: Path, name: str, *, mtp: bool, embed: int = t.EMBED):
    import gguf

    w = gguf.GGUFWriter(str(path), ARCH)
    w.add_name(name)
    w.add_context_length(t.CONTEXT)
    w.add_embedding_length(embed)
    # The MTP file declares the target's blocks plus the MTP block (the last `nextn_predict_layers`
    # of `block_count`), as convert_hf_to_gguf.py --mtp writes it; the target declares none
    # (--no-mtp): the head is in the other file.
    w.add_block_count(TRUNK_BLOCKS + (1 if mtp else 0))
    if mtp:
        w.add_uint32(f"{ARCH}.nextn_predict_layers", 1)
    w.add_feed_forward_length(t.FEED_FORWARD)
    w.add_head_count(t.HEADS)
    w.add_head_count_kv(t.HEADS_KV)
    w.add_rope_dimension_count(embed // t.HEADS)  # cohere2moe ropes the whole head
    w.add_layer_norm_rms_eps(t.RMS_EPS)
    w.add_uint32(f"{ARCH}.attention.sliding_window", SLIDING_WINDOW)
    # 0: every trunk block is a sliding-window block (the MTP block never is), so the target needs one
    # block only.
    w.add_uint32(f"{ARCH}.attention.sliding_window_pattern", 0)
    w.add_float32(f"{ARCH}.logit_scale", LOGIT_SCALE)
    w.add_uint32(f"{ARCH}.leading_dense_block_count", TRUNK_BLOCKS)
    w.add_uint32(f"{ARCH}.expert_feed_forward_length", t.FEED_FORWARD)
    w.add_uint32(f"{ARCH}.expert_count", EXPERTS)
    w.add_uint32(f"{ARCH}.expert_used_count", EXPERTS)
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


def _embeddings(embed: int = t.EMBED):
    """The tied input/output table: every row 0.5, TOKEN's row 1.0 (see the module docstring)."""
    import numpy as np

    e = np.full((t.N_VOCAB, embed), 0.5, dtype=np.float32)
    e[TOKEN, :] = 1.0
    return e


def _write(path, name: str, tensors, *, mtp: bool, embed: int = t.EMBED) -> str:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    w = _writer(tmp, name, mtp=mtp, embed=embed)
    for tname, arr in tensors:
        w.add_tensor(tname, arr)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    digest = hashlib.sha256(tmp.read_bytes()).hexdigest()
    os.replace(tmp, path)
    return digest


def _attention(b: str, e: int = t.EMBED):
    """attn_norm, fused Q/K/V (non-zero, so attention really runs) and a zero output projection."""
    import numpy as np

    return [(f"{b}.attn_norm.weight", np.ones(e, dtype=np.float32)),
            (f"{b}.attn_qkv.weight", np.full((3 * e, e), 0.01, dtype=np.float32)),
            (f"{b}.attn_output.weight", np.zeros((e, e), dtype=np.float32))]


def target_tensors():
    """(name, array) of the target: the tied embeddings, output_norm, TRUNK_BLOCKS dense blocks."""
    import numpy as np

    e, f = t.EMBED, t.FEED_FORWARD
    out = [("token_embd.weight", _embeddings()), ("output_norm.weight", np.ones(e, dtype=np.float32))]
    for i in range(TRUNK_BLOCKS):
        b = f"blk.{i}"
        out += _attention(b) + [(f"{b}.ffn_gate.weight", np.full((f, e), 0.01, dtype=np.float32)),
                                (f"{b}.ffn_up.weight", np.full((f, e), 0.01, dtype=np.float32)),
                                (f"{b}.ffn_down.weight", np.zeros((e, f), dtype=np.float32))]
    return out


def mtp_tensors(embed: int = t.EMBED):
    """(name, array) of the MTP file: the tied embeddings, output_norm and the MTP block alone
    (block TRUNK_BLOCKS; no trunk block, which is how llama.cpp tells an MTP-only file)."""
    import numpy as np

    e, f = embed, t.FEED_FORWARD
    b = f"blk.{TRUNK_BLOCKS}"
    # numpy shapes are ggml's ne reversed: ffn_gate_up_exps {n_embd, 2 n_ff, n_expert}, ...
    return [("token_embd.weight", _embeddings(e)), ("output_norm.weight", np.ones(e, dtype=np.float32)),
            *_attention(b, e),
            (f"{b}.ffn_gate_inp.weight", np.zeros((EXPERTS, e), dtype=np.float32)),
            (f"{b}.ffn_gate_up_exps.weight", np.full((EXPERTS, 2 * f, e), 0.01, dtype=np.float32)),
            (f"{b}.ffn_down_exps.weight", np.zeros((EXPERTS, e, f), dtype=np.float32)),
            (f"{b}.nextn.eh_proj.weight", np.full((e, 2 * e), 0.01, dtype=np.float32)),
            (f"{b}.nextn.enorm.weight", np.ones(e, dtype=np.float32)),
            (f"{b}.nextn.hnorm.weight", np.ones(e, dtype=np.float32))]


def write_mtp_target(path: str | os.PathLike) -> str:
    """The target (cohere2moe, no MTP block of its own); its sha256."""
    return _write(path, "tunnelspec-mtp-target", target_tensors(), mtp=False)


def write_mtp_draft(path: str | os.PathLike, embed: int = t.EMBED) -> str:
    """The separate MTP draft for write_mtp_target's model; its sha256. Another `embed` makes a head
    of another width, which no target here can feed (for the refusal's tests)."""
    return _write(path, "tunnelspec-mtp-draft", mtp_tensors(embed), mtp=True, embed=embed)


def write_mtp_target_with_head(path: str | os.PathLike) -> str:
    """The target and its MTP block in one file (as `convert_hf_to_gguf.py` writes without --mtp or
    --no-mtp): what llama.cpp runs with `--spec-type draft-mtp` and no `-md`. Given as a separate
    draft it serves, with the whole model on the draft device; its sha256."""
    mtp = [(n, a) for n, a in mtp_tensors() if n.startswith(f"blk.{TRUNK_BLOCKS}.")]
    return _write(path, "tunnelspec-mtp-target-with-head", target_tensors() + mtp, mtp=True)
