"""GGUF files written by PyPI's gguf package (the writer llama.cpp's own converters use), and
what halformer's reader (tools/import/gguf_file.h) must read back from them.

    make_gguf.py OUT_DIR [--seeds FUZZ_CORPUS_DIR]

OUT_DIR gets model.gguf (the default alignment, 32), model_align64.gguf (general.alignment
= 64; otherwise the same), expected.json (each file's version, alignment, data offset and
keys, as gguf.GGUFReader reads them; the metadata values; each tensor's type, dims in GGUF
order and tolerance) and <tensor>.f32: the floats gguf.quants.dequantize gives, little-endian.
Q8_0 to Q5_1 and BF16 are quantized by gguf.quants.quantize; the K-quants, which it cannot
quantize, are seeded random blocks with small positive scales. tests/import/CMakeLists.txt
(import_gguf_pypi_compat) compares, every tensor bit for bit (tolerance 0: the reader's
decoders do gguf's float operations in gguf's order); --seeds also writes the small files
of fuzz/corpus/gguf/pypi_*.gguf.
"""
import argparse
import json
import os
import sys

import numpy as np

import gguf
from gguf import GGMLQuantizationType as Q

rng = np.random.RandomState(1234)

# name -> (type, numpy element shape (rows first), tolerance relative to max(1, |x|); 0: bit for bit)
TENSORS = {
    "token_embd.weight": (Q.F32, (8, 32), 0),
    "output_norm.weight": (Q.F32, (32,), 0),
    "blk.0.attn_norm.weight": (Q.F32, (2, 3, 32), 0),
    "blk.0.attn_q.weight": (Q.F16, (4, 64), 0),
    "blk.0.attn_k.weight": (Q.BF16, (4, 32), 0),
    "blk.0.attn_v.weight": (Q.Q8_0, (4, 64), 0),
    "blk.0.attn_output.weight": (Q.Q4_0, (4, 64), 0),
    "blk.0.ffn_gate.weight": (Q.Q4_1, (2, 64), 0),
    "blk.0.ffn_up.weight": (Q.Q5_0, (2, 64), 0),
    "blk.0.ffn_down.weight": (Q.Q5_1, (2, 64), 0),
    "blk.1.attn_q.weight": (Q.Q4_K, (2, 512), 0),
    "blk.1.attn_k.weight": (Q.Q5_K, (2, 256), 0),
    "blk.1.attn_v.weight": (Q.Q6_K, (2, 256), 0),
    "blk.1.ffn_up.weight": (Q.Q2_K, (2, 256), 0),
    "blk.1.ffn_down.weight": (Q.Q3_K, (2, 256), 0),
}
# Where each K-quant block keeps its f16 super-block scales (d, dmin).
K_SCALES = {Q.Q2_K: (80, 82), Q.Q3_K: (108,), Q.Q4_K: (0, 2), Q.Q5_K: (0, 2), Q.Q6_K: (208,)}


def tensor_data(qtype, shape):
    """(what GGUFWriter.add_tensor takes, its raw_dtype or None, the expected floats)."""
    if qtype in (Q.F32, Q.F16):
        x = rng.randn(*shape).astype(np.float32 if qtype == Q.F32 else np.float16)
        return x, None, x.astype(np.float32)
    if qtype in K_SCALES:
        block, size = gguf.GGML_QUANT_SIZES[qtype]
        raw = rng.randint(0, 256, size=(shape[0], shape[1] // block, size)).astype(np.uint8)
        for at in K_SCALES[qtype]:
            d = rng.uniform(0.001, 0.05, size=raw.shape[:2]).astype(np.float16)
            raw[:, :, at:at + 2] = d.view(np.uint8).reshape(raw.shape[0], raw.shape[1], 2)
        raw = raw.reshape(shape[0], -1)
    else:
        raw = gguf.quants.quantize(rng.randn(*shape).astype(np.float32), qtype)
    return raw, qtype, gguf.quants.dequantize(raw, qtype).astype(np.float32)


# key -> (type as expected.json names it, value, the GGUFWriter call that writes it)
def metadata():
    tokens = ["<unk>", "<s>", "</s>", "\u2581h\u00e9llo", "\u2713"]
    scores = [0.0, -1.5, -2.25, -3.125, 0.5]
    m = {
        "general.name": ("string", "tiny llama", lambda w, v: w.add_name(v)),
        "llama.context_length": ("uint32", 128, lambda w, v: w.add_context_length(v)),
        "llama.embedding_length": ("uint32", 32, lambda w, v: w.add_embedding_length(v)),
        "llama.block_count": ("uint32", 2, lambda w, v: w.add_block_count(v)),
        "llama.feed_forward_length": ("uint32", 64, lambda w, v: w.add_feed_forward_length(v)),
        "llama.rope.dimension_count": ("uint32", 8, lambda w, v: w.add_rope_dimension_count(v)),
        "llama.attention.head_count": ("uint32", 4, lambda w, v: w.add_head_count(v)),
        "llama.attention.head_count_kv": ("uint32", 2, lambda w, v: w.add_head_count_kv(v)),
        "llama.attention.layer_norm_rms_epsilon": ("float32", 1e-5, lambda w, v: w.add_layer_norm_rms_eps(v)),
        "llama.rope.freq_base": ("float32", 10000.0, lambda w, v: w.add_rope_freq_base(v)),
        "tokenizer.ggml.model": ("string", "llama", lambda w, v: w.add_tokenizer_model(v)),
        "tokenizer.ggml.tokens": ("array:string", tokens, lambda w, v: w.add_token_list(v)),
        "tokenizer.ggml.scores": ("array:float32", scores, lambda w, v: w.add_token_scores(v)),
        "tokenizer.ggml.token_type": ("array:int32", [2, 3, 3, 1, 1], lambda w, v: w.add_token_types(v)),
        "tokenizer.ggml.bos_token_id": ("uint32", 1, lambda w, v: w.add_bos_token_id(v)),
        "tokenizer.ggml.eos_token_id": ("uint32", 2, lambda w, v: w.add_eos_token_id(v)),
        "test.uint8": ("uint8", 250, lambda w, v: w.add_uint8("test.uint8", v)),
        "test.int8": ("int8", -100, lambda w, v: w.add_int8("test.int8", v)),
        "test.uint16": ("uint16", 65000, lambda w, v: w.add_uint16("test.uint16", v)),
        "test.int16": ("int16", -30000, lambda w, v: w.add_int16("test.int16", v)),
        "test.int32": ("int32", -7, lambda w, v: w.add_int32("test.int32", v)),
        "test.uint64": ("uint64", 2**63 + 5, lambda w, v: w.add_uint64("test.uint64", v)),
        "test.int64": ("int64", -2**40, lambda w, v: w.add_int64("test.int64", v)),
        "test.float64": ("float64", 0.1, lambda w, v: w.add_float64("test.float64", v)),
        "test.bool": ("bool", True, lambda w, v: w.add_bool("test.bool", v)),
        "test.bools": ("array:bool", [True, False, True], lambda w, v: w.add_array("test.bools", v)),
    }
    # float32 values as the file holds them
    return {k: (t, float(np.float32(v)) if t == "float32" else
                [float(np.float32(x)) for x in v] if t == "array:float32" else v, f) for k, (t, v, f) in m.items()}


def write(path, meta, tensors, alignment=None):
    w = gguf.GGUFWriter(path, arch="llama")
    if alignment:
        w.add_custom_alignment(alignment)
    for _, (_, value, call) in meta.items():
        call(w, value)
    for name, (data, raw_dtype, _) in tensors.items():
        w.add_tensor(name, data, raw_dtype=raw_dtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    r = gguf.GGUFReader(path)
    return {"name": os.path.basename(path), "version": int(r.fields["GGUF.version"].parts[-1][0]),
            "alignment": alignment or 32, "data_offset": int(r.data_offset),
            "keys": [k for k in r.fields if not k.startswith("GGUF.")]}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out")
    ap.add_argument("--seeds", help="also write small seed files for the fuzzer here")
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    meta = metadata()
    tensors = {name: tensor_data(t, shape) for name, (t, shape, _) in TENSORS.items()}
    files = [write(os.path.join(a.out, "model.gguf"), meta, tensors),
             write(os.path.join(a.out, "model_align64.gguf"), meta, tensors, alignment=64)]
    expected = {"files": files, "metadata": {k: {"type": t, "value": v} for k, (t, v, _) in meta.items()},
                "tensors": {}}
    expected["metadata"]["general.architecture"] = {"type": "string", "value": "llama"}
    for name, (qtype, shape, tolerance) in TENSORS.items():
        floats = tensors[name][2]
        assert floats.shape == shape, (name, floats.shape, shape)
        out = name + ".f32"
        floats.astype("<f4").tofile(os.path.join(a.out, out))
        expected["tensors"][name] = {"type": qtype.name, "dims": list(reversed(shape)), "expected": out,
                                     "tolerance": tolerance}
    with open(os.path.join(a.out, "expected.json"), "w") as f:
        json.dump(expected, f, indent=1)
    if a.seeds:  # one tensor of each kind the reader decodes, a few metadata types
        os.makedirs(a.seeds, exist_ok=True)
        small = {k: meta[k] for k in ("general.name", "llama.block_count", "tokenizer.ggml.tokens",
                                      "tokenizer.ggml.scores", "test.float64", "test.bools", "test.int8")}
        for i, group in enumerate([["blk.0.attn_v.weight", "blk.0.attn_output.weight", "output_norm.weight"],
                                   ["blk.0.attn_q.weight", "blk.0.attn_k.weight", "blk.0.ffn_gate.weight"],
                                   ["blk.1.attn_k.weight", "blk.1.attn_v.weight"],
                                   ["blk.1.ffn_up.weight", "blk.1.ffn_down.weight", "blk.0.ffn_down.weight"]]):
            write(os.path.join(a.seeds, f"pypi_{i}.gguf"), small if i == 0 else {}, {n: tensors[n] for n in group},
                  alignment=64 if i == 1 else None)
    print(f"wrote {len(files)} GGUF files, {len(TENSORS)} tensors each, to {a.out}")


if __name__ == "__main__":
    sys.exit(main())
