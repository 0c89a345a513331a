"""A llama GGUF as wide as asked: the lab target's vocabulary and about `mib` MiB of f32 weights in
blocks of width 2048, every weight tensor over the RPC cache's 10 MiB threshold. A draft that takes
seconds to reach its RPC node, for the things a tiny model is too quick to show: what a restart costs
(benchmarks/restart_cost.py) and the progress of the /health wait (tests/deploy/test_health_progress_lab.py).
Random weights: it drafts, the target accepts what it accepts. Written once (the file is kept)."""

from __future__ import annotations

from pathlib import Path


def write_wide_llama(path: Path, mib: int) -> int:
    """A llama GGUF with the lab target's vocabulary and ~`mib` MiB of f32 weights (written once)."""
    import gguf
    import numpy as np

    from tunnelspec.lab import gguf_tiny as t

    if path.exists():
        return path.stat().st_size
    embed, ff, heads = 2048, 8192, 16
    per_block = (4 * embed * embed + 3 * embed * ff) * 4
    blocks = max(1, round(mib * (1 << 20) / per_block))
    tmp = path.with_name(path.name + ".tmp")
    w = gguf.GGUFWriter(str(tmp), "llama")
    w.add_name("tunnelspec-bench-draft")
    w.add_context_length(t.CONTEXT)
    w.add_embedding_length(embed)
    w.add_block_count(blocks)
    w.add_feed_forward_length(ff)
    w.add_head_count(heads)
    w.add_head_count_kv(heads)
    w.add_rope_dimension_count(embed // heads)
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
    rng = np.random.default_rng(2026)

    def weight(*shape):
        return (rng.standard_normal(shape, dtype=np.float32) * 0.02)

    n = len(tokens)
    w.add_tensor("token_embd.weight", weight(n, embed))
    w.add_tensor("output_norm.weight", np.ones(embed, dtype=np.float32))
    w.add_tensor("output.weight", weight(n, embed))
    for i in range(blocks):
        b = f"blk.{i}"
        for name, arr in ((f"{b}.attn_norm.weight", np.ones(embed, dtype=np.float32)),
                          (f"{b}.attn_q.weight", weight(embed, embed)), (f"{b}.attn_k.weight", weight(embed, embed)),
                          (f"{b}.attn_v.weight", weight(embed, embed)),
                          (f"{b}.attn_output.weight", weight(embed, embed)),
                          (f"{b}.ffn_norm.weight", np.ones(embed, dtype=np.float32)),
                          (f"{b}.ffn_gate.weight", weight(ff, embed)), (f"{b}.ffn_up.weight", weight(ff, embed)),
                          (f"{b}.ffn_down.weight", weight(embed, ff))):
            w.add_tensor(name, arr)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    tmp.rename(path)
    return path.stat().st_size
