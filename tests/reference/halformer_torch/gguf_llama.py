"""A Llama checkpoint (transformers' names, numpy arrays) written as a GGUF file the way
llama.cpp's convert_hf_to_gguf.py writes one, with PyPI's `gguf` package: the tensors
renamed (token_embd, blk.N.attn_q, ...), the query and key rows of each head permuted from
rotate_half's order (c, c + d/2) to adjacent pairs (2c, 2c + 1) -- ggml's "normal" rope --
and the hyperparameters under llama.*. Used by the import tests and bench/halbench/llama_cpu.py
(the same file for halformer and llama.cpp); nothing is downloaded.
"""
from __future__ import annotations

from typing import Dict, Optional

import numpy as np

# transformers' module names -> GGUF's, per layer.
LINEARS = {"attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
           "attn_output": "self_attn.o_proj", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
           "ffn_down": "mlp.down_proj"}


def permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """convert_hf_to_gguf.py's LlamaModel.permute, for a q (n_head = heads) or k (n_head =
    key/value heads) projection: each head's rows from rotate_half's order to pairs."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def llama_tensors(state: Dict[str, np.ndarray], heads: int, kv_heads: int, layers: int) -> Dict[str, np.ndarray]:
    """GGUF name -> fp32 array (q/k permuted), from a LlamaForCausalLM state dict whose k/v
    projections hold kv_heads heads."""
    f32 = lambda x: np.ascontiguousarray(np.asarray(x, dtype=np.float32))  # noqa: E731
    t = {"token_embd.weight": f32(state["model.embed_tokens.weight"])}
    for i in range(layers):
        p, b = f"model.layers.{i}.", f"blk.{i}."
        t[b + "attn_norm.weight"] = f32(state[p + "input_layernorm.weight"])
        for g, hf in LINEARS.items():
            w = f32(state[p + hf + ".weight"])
            if g in ("attn_q", "attn_k"):
                w = f32(permute(w, heads if g == "attn_q" else kv_heads))
            t[b + g + ".weight"] = w
        t[b + "ffn_norm.weight"] = f32(state[p + "post_attention_layernorm.weight"])
    t["output_norm.weight"] = f32(state["model.norm.weight"])
    if "lm_head.weight" in state:
        t["output.weight"] = f32(state["lm_head.weight"])
    return t


def write_llama_gguf(path: str, state: Dict[str, np.ndarray], *, heads: int, kv_heads: int, layers: int,
                     d_ff: int, context: int, theta: float = 10000.0, eps: float = 1e-5, bos: int = 1, eos: int = 2,
                     name: str = "halformer random llama", dtype: Optional[str] = "F16") -> None:
    """Writes `state` as a llama GGUF: 2-D tensors as `dtype` (F16 or F32; llama.cpp's own
    quantizer makes Q8_0 / Q4_0 from an F16 file), 1-D ones F32, a placeholder vocabulary
    (halformer and the bench pass token ids; llama.cpp needs a vocabulary to load)."""
    import gguf

    tensors = llama_tensors(state, heads, kv_heads, layers)
    vocab, d = tensors["token_embd.weight"].shape
    w = gguf.GGUFWriter(path, arch="llama")
    w.add_name(name)
    w.add_context_length(context)
    w.add_embedding_length(d)
    w.add_block_count(layers)
    w.add_feed_forward_length(d_ff)
    w.add_head_count(heads)
    w.add_head_count_kv(kv_heads)
    w.add_rope_freq_base(theta)
    w.add_layer_norm_rms_eps(eps)
    w.add_vocab_size(vocab)
    w.add_rope_dimension_count(d // heads)
    w.add_file_type(1 if dtype == "F16" else 0)
    w.add_tokenizer_model("llama")
    # Llama's vocabulary layout: unk, bos, eos (control), the 256 byte tokens, then words.
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{i:02X}>" for i in range(256)]
    tokens += [f"\u2581w{i}" for i in range(len(tokens), vocab)]
    w.add_token_list(tokens[:vocab])
    w.add_token_scores([0.0] * vocab)
    w.add_token_types(([2, 3, 3] + [6] * 256 + [1] * vocab)[:vocab])
    w.add_bos_token_id(bos)
    w.add_eos_token_id(eos)
    for tname, x in tensors.items():
        w.add_tensor(tname, x.astype(np.float16) if (dtype == "F16" and x.ndim == 2) else x)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
