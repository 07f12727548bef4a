"""Hugging Face Gemma and GPT-2 checkpoints (config.json fields and a numpy state dict under
transformers' names) written as GGUF files the way llama.cpp's convert_hf_to_gguf.py writes
them (GemmaModel, GPT2Model), with PyPI's `gguf` package: its tensor names
(gguf.TensorNameMap, as the converter's map_tensor_name), its per-architecture keys in the
order it writes them, and its tensor changes -- Gemma's `*norm.weight` + 1 and no lm_head
(llama.cpp reads token_embd as the output), GPT-2's Conv1D weights transposed to [out, in]
and its attention mask buffers dropped. Quantized tensors (the converter writes F32 / F16 /
BF16 / Q8_0; llama-quantize makes Q4_0 from them) come from `types`. Used by
tests/import/check_gguf_archs.py; nothing is downloaded.
"""
from __future__ import annotations

from typing import Callable, Dict, List, Optional, Tuple

import numpy as np

# The keys each architecture's set_gguf_parameters writes, in its order: (GGUFWriter method,
# the value from the HF config `hp`).
GEMMA_KEYS = [
    ("add_context_length", lambda hp: hp["max_position_embeddings"]),
    ("add_embedding_length", lambda hp: hp["hidden_size"]),
    ("add_block_count", lambda hp: hp["num_hidden_layers"]),
    ("add_feed_forward_length", lambda hp: hp["intermediate_size"]),
    ("add_head_count", lambda hp: hp["num_attention_heads"]),
    ("add_head_count_kv", lambda hp: hp.get("num_key_value_heads", hp["num_attention_heads"])),
    ("add_layer_norm_rms_eps", lambda hp: hp["rms_norm_eps"]),
    ("add_key_length", lambda hp: hp["head_dim"]),
    ("add_value_length", lambda hp: hp["head_dim"]),
]
GPT2_KEYS = [
    ("add_block_count", lambda hp: hp["n_layer"]),
    ("add_context_length", lambda hp: hp["n_ctx"]),
    ("add_embedding_length", lambda hp: hp["n_embd"]),
    ("add_feed_forward_length", lambda hp: 4 * hp["n_embd"]),  # the converter's, whatever n_inner says
    ("add_head_count", lambda hp: hp["n_head"]),
    ("add_layer_norm_eps", lambda hp: hp["layer_norm_epsilon"]),
]
ARCHS = {"gemma": GEMMA_KEYS, "gpt2": GPT2_KEYS}


def convert_tensors(arch: str, hp: dict, state: Dict[str, np.ndarray]) -> Dict[str, Tuple[str, np.ndarray]]:
    """GGUF name -> (the HF name it came from, float32 array), as modify_tensors makes them."""
    import gguf

    layers = hp["num_hidden_layers"] if arch == "gemma" else hp["n_layer"]
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.GEMMA if arch == "gemma" else gguf.MODEL_ARCH.GPT2, layers)
    out = {}
    for hf, x in state.items():
        x = np.asarray(x, dtype=np.float32)
        if arch == "gemma":
            if hf == "lm_head.weight":  # GemmaModel skips it: llama.cpp's gemma reads token_embd
                continue
            if hf.endswith("norm.weight"):
                x = x + np.float32(1.0)
        else:
            if hf.endswith((".attn.bias", ".attn.masked_bias")):  # GPT-2's mask buffers
                continue
            if hf.endswith((".c_attn.weight", ".c_proj.weight", ".c_fc.weight")):  # Conv1D [in, out]
                x = x.T
        name = names.get_name(hf, try_suffixes=(".weight", ".bias"))
        if name is None:
            raise ValueError(f"{arch}: no GGUF name for {hf}")
        out[name] = (hf, np.ascontiguousarray(x))
    return out


def write_gguf(path: str, arch: str, metadata: List[Tuple[str, object]],
               tensors: Dict[str, Tuple[np.ndarray, Optional[object]]]) -> None:
    """metadata: (GGUFWriter method, value) in order; tensors: name -> (data, raw_dtype
    or None for float32 data)."""
    import gguf

    w = gguf.GGUFWriter(path, arch=arch)
    for method, value in metadata:
        getattr(w, method)(value)
    for name, (data, raw_dtype) in tensors.items():
        w.add_tensor(name, data, raw_dtype=raw_dtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def metadata(arch: str, hp: dict, tokenizer: List[Tuple[str, object]], file_type: int = 0,
             name: str = "halformer random model") -> List[Tuple[str, object]]:
    """general.name, the architecture's keys, general.file_type, then the tokenizer's."""
    m = [("add_name", name)] + [(method, value(hp)) for method, value in ARCHS[arch]]
    return m + [("add_file_type", file_type)] + tokenizer + [("add_quantization_version", 2)]


def sentencepiece_tokenizer(vocab: int, bos: int, eos: int, pad: int, unk: int) -> List[Tuple[str, object]]:
    """Gemma's (_set_vocab_sentencepiece, SpecialVocab, add_space_prefix False): placeholder
    pieces, the special ids control tokens."""
    names = {pad: "<pad>", eos: "<eos>", bos: "<bos>", unk: "<unk>"}
    tokens = [names.get(i, f"\u2581w{i}") for i in range(vocab)]
    types = [2 if i == unk else 3 if i in names else 1 for i in range(vocab)]
    return [("add_tokenizer_model", "llama"), ("add_tokenizer_pre", "default"), ("add_token_list", tokens),
            ("add_token_scores", [0.0] * vocab), ("add_token_types", types), ("add_bos_token_id", bos),
            ("add_eos_token_id", eos), ("add_unk_token_id", unk), ("add_pad_token_id", pad),
            ("add_add_bos_token", True), ("add_add_eos_token", False), ("add_add_space_prefix", False)]


def bpe_tokenizer(vocab: int, endoftext: int) -> List[Tuple[str, object]]:
    """GPT-2's (_set_vocab_gpt2): the 256 byte-level symbols, tokens merged from pairs of
    them (each with its merge), <|endoftext|> (a control token) as bos and eos."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("\xa1"), ord("\xac") + 1)) + \
        list(range(ord("\xae"), ord("\xff") + 1))
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    symbols = [chr(c) for c in cs]
    letters = [chr(c) for c in range(ord("a"), ord("z") + 1)]
    assert 257 <= vocab <= 257 + 26 * 26 and endoftext == vocab - 1
    pairs = [(a, b) for a in letters for b in letters][:vocab - 257]
    tokens = symbols + [a + b for a, b in pairs] + ["<|endoftext|>"]
    types = [1] * (vocab - 1) + [3]
    return [("add_tokenizer_model", "gpt2"), ("add_tokenizer_pre", "gpt-2"), ("add_token_list", tokens),
            ("add_token_types", types), ("add_token_merges", [f"{a} {b}" for a, b in pairs]),
            ("add_bos_token_id", endoftext), ("add_eos_token_id", endoftext)]


def convert(path: str, arch: str, hp: dict, state: Dict[str, np.ndarray], tokenizer: List[Tuple[str, object]],
            types: Callable[[str, np.ndarray], Optional[object]] = lambda name, x: None,
            name: str = "halformer random model") -> Dict[str, Tuple[str, np.ndarray]]:
    """Writes `state` as convert_hf_to_gguf.py would (F32), with the tensors `types` names
    quantized (gguf.quants.quantize; file_type 2, MOSTLY_Q4_0, when any is Q4_0).
    Returns convert_tensors' map, the values as the file holds them (quantized ones
    dequantized again, gguf.quants.dequantize)."""
    import gguf

    converted = convert_tensors(arch, hp, state)
    tensors, held = {}, {}
    for gname, (hf, x) in converted.items():
        qtype = types(gname, x)
        if qtype is None:
            tensors[gname], held[gname] = (x, None), (hf, x)
        else:
            blocks = gguf.quants.quantize(x, qtype)
            tensors[gname] = (blocks, qtype)
            held[gname] = (hf, gguf.quants.dequantize(blocks, qtype).astype(np.float32).reshape(x.shape))
    q4 = any(t == gguf.GGMLQuantizationType.Q4_0 for _, t in tensors.values())
    write_gguf(path, arch, metadata(arch, hp, tokenizer, 2 if q4 else 0, name), tensors)
    return held
