"""`halformer import MODEL.gguf` against transformers (tests/import/CMakeLists.txt runs each step).

  make DIR                     small random Llama models made now with transformers, written as
                               GGUF files the way llama.cpp's convert_hf_to_gguf.py writes them
                               (DIR/CASE.gguf; DIR/q4_f32.gguf: q4's values as F32), and each
                               one's transformers reference (DIR/CASE-ref)
  compare CASE DIR BIN WEIGHTS [F32_WEIGHTS]
                               the imported model's binary BIN (with the imported WEIGHTS) against
                               the reference: --dump logits and greedy tokens; q4: also the same
                               build on F32_WEIGHTS (DIR/q4_f32.gguf imported), bit for bit
  kept DIR                     the imported weights files hold the GGUF's values as they are (F32
                               bit for bit, Q4_0 blocks byte for byte, the scales as their fp16)
  mixed HALFORMER DIR          a file whose layers are not all Q4_0 imports as fp32, dequantized,
                               with one notice naming what was dequantized
  refuse CASE HALFORMER DIR    a GGUF file with one thing wrong (or an output that must not be
                               written) fails, naming the key or tensor, and writes nothing

Cases: "f32" (hidden 64, 4 heads of 16 over 2 key/value heads, intermediate 100, rope theta
500, untied output, context 8192 -> max_len capped at 4096), "q4" (hidden 64, 4 heads, ff
160, layer linears Q4_0, token table Q8_0 and tied output: precision int4), "qwen2" (the
f32 layout with random q/k/v biases, not permuted, NEOX rope, no rope/vocab keys: the
vocabulary from token_embd), "q8" (grouped-query, layer linears, token table and untied
output Q8_0: precision q8_0, the output's blocks kept too). transformers 4.30 predates num_key_value_heads: its reference
repeats each key/value head for its query group, as tests/import/hf_models.py does.
"""

import json
import os
import re
import subprocess
import sys

import numpy as np

import gguf
from gguf import GGMLQuantizationType as Q

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "reference"))
from halformer_torch.gguf_llama import LINEARS, permute  # noqa: E402  (the converter's layout, shared with bench)
from halformer_torch.gguf_archs import write_gguf as write_gguf_file  # noqa: E402

VOCAB, HIDDEN, LAYERS, BOS, EOS = 300, 64, 2, 1, 2
CASES = {
    "f32": dict(arch="llama", heads=4, kv_heads=2, ff=100, theta=500.0, tied=False, ctx=8192, seed=31),
    "q4": dict(arch="llama", heads=4, kv_heads=4, ff=160, theta=10000.0, tied=True, ctx=256, seed=32,
               layers=Q.Q4_0, table=Q.Q8_0),
    "qwen2": dict(arch="qwen2", heads=4, kv_heads=2, ff=100, theta=1e6, tied=False, ctx=256, seed=33, bias=True),
    "q8": dict(arch="llama", heads=4, kv_heads=2, ff=160, theta=10000.0, tied=False, ctx=256, seed=34,
               layers=Q.Q8_0, table=Q.Q8_0, output=Q.Q8_0),
}
PRECISION = {Q.Q4_0: "int4", Q.Q8_0: "q8_0"}  # the spec's precision of a file whose layer linears are all that type
CANONICAL = {"attn_q": "self_attn.q", "attn_k": "self_attn.k", "attn_v": "self_attn.v", "attn_output": "self_attn.o",
             "ffn_gate": "ff_gate", "ffn_up": "ff1", "ffn_down": "ff2"}


def roundtrip(w, qtype):
    return gguf.quants.dequantize(gguf.quants.quantize(w, qtype), qtype).astype(np.float32) if qtype else w


# ---------------------------------------------------------------- make
def make_reference(case):
    """The model as transformers 4.30 runs it (numpy state dict, HF names, key/value heads
    repeated), with the values the GGUF file will hold (quantized ones round-tripped)."""
    import torch
    import transformers

    v = CASES[case]
    torch.manual_seed(v["seed"])
    heads, kvh = v["heads"], v["kv_heads"]
    config = transformers.LlamaConfig(vocab_size=VOCAB, hidden_size=HIDDEN, num_attention_heads=heads,
                                      intermediate_size=v["ff"], num_hidden_layers=LAYERS, max_position_embeddings=256,
                                      rms_norm_eps=1e-5, initializer_range=0.1, bos_token_id=BOS, eos_token_id=EOS,
                                      pad_token_id=None, tie_word_embeddings=v["tied"])
    model = transformers.LlamaForCausalLM(config)
    state = {k: t.numpy().copy() for k, t in model.state_dict().items() if "rotary_emb" not in k}
    if v["tied"]:
        del state["lm_head.weight"]
    rng = np.random.default_rng(v["seed"])
    group, hd = heads // kvh, HIDDEN // heads
    for k in state:
        if state[k].ndim == 1:  # RMSNorm scales around 1
            state[k] = (1.0 + 0.1 * rng.standard_normal(state[k].shape)).astype(np.float32)
    for i in range(LAYERS):
        p = f"model.layers.{i}."
        for proj in ("k_proj", "v_proj"):  # query head h reads key/value head h // group
            w = state[p + f"self_attn.{proj}.weight"].reshape(heads, hd, HIDDEN)
            w[:] = np.repeat(w[::group], group, axis=0)
        if v.get("bias"):
            for proj in ("q_proj", "k_proj", "v_proj"):
                b = (0.5 * rng.standard_normal(HIDDEN)).astype(np.float32).reshape(heads, hd)
                if proj != "q_proj":
                    b[:] = np.repeat(b[::group], group, axis=0)
                state[p + f"self_attn.{proj}.bias"] = b.reshape(-1)
        for hf in LINEARS.values():
            state[p + hf + ".weight"] = roundtrip(state[p + hf + ".weight"], v.get("layers"))
    state["model.embed_tokens.weight"] = roundtrip(state["model.embed_tokens.weight"], v.get("table"))
    if not v["tied"]:
        state["lm_head.weight"] = roundtrip(state["lm_head.weight"], v.get("output"))
    return config, state


def gguf_tensors(case, state):
    """name -> (data, raw_dtype) as the converter writes them (q/k permuted for llama; qwen2 not)."""
    v = CASES[case]
    heads, kvh, group, hd = v["heads"], v["kv_heads"], v["heads"] // v["kv_heads"], HIDDEN // v["heads"]
    llama = v["arch"] == "llama"

    def put(x, qtype=None):
        x = np.ascontiguousarray(x, dtype=np.float32)
        return (gguf.quants.quantize(x, qtype), qtype) if qtype else (x, None)

    t = {"token_embd.weight": put(state["model.embed_tokens.weight"], v.get("table"))}
    for i in range(LAYERS):
        p, b = f"model.layers.{i}.", f"blk.{i}."
        t[b + "attn_norm.weight"] = put(state[p + "input_layernorm.weight"])
        for g, hf in LINEARS.items():
            w = state[p + hf + ".weight"]
            bias = state.get(p + hf + ".bias")
            if g in ("attn_k", "attn_v"):  # one key/value head per group
                w = w.reshape(heads, hd, HIDDEN)[::group].reshape(kvh * hd, HIDDEN)
                bias = None if bias is None else bias.reshape(heads, hd)[::group].reshape(-1)
            if llama and g in ("attn_q", "attn_k"):
                w = permute(w, heads if g == "attn_q" else kvh)
            t[b + g + ".weight"] = put(w, v.get("layers"))
            if bias is not None:
                t[b + g + ".bias"] = put(bias)
        t[b + "ffn_norm.weight"] = put(state[p + "post_attention_layernorm.weight"])
    t["output_norm.weight"] = put(state["model.norm.weight"])
    if not v["tied"]:
        t["output.weight"] = put(state["lm_head.weight"], v.get("output"))
    return t


def gguf_metadata(case, **changes):
    """key -> (GGUFWriter method, value): what convert_hf_to_gguf.py writes (LlamaModel adds
    vocab_size and rope.dimension_count; Qwen2Model neither)."""
    v = CASES[case]
    m = {"general.name": ("add_name", f"halformer test {case}"),
         "context_length": ("add_context_length", v["ctx"]), "embedding_length": ("add_embedding_length", HIDDEN),
         "block_count": ("add_block_count", LAYERS), "feed_forward_length": ("add_feed_forward_length", v["ff"]),
         "attention.head_count": ("add_head_count", v["heads"]),
         "attention.head_count_kv": ("add_head_count_kv", v["kv_heads"]),
         "rope.freq_base": ("add_rope_freq_base", v["theta"]),
         "attention.layer_norm_rms_epsilon": ("add_layer_norm_rms_eps", 1e-5),
         "general.file_type": ("add_file_type", {Q.Q4_0: 2, Q.Q8_0: 7}.get(v.get("layers"), 0)),
         "tokenizer.ggml.model": ("add_tokenizer_model", "llama"),
         "tokenizer.ggml.tokens": ("add_token_list", ["<unk>", "<s>", "</s>"] + [f"t{i}" for i in range(3, VOCAB)]),
         "tokenizer.ggml.scores": ("add_token_scores", [0.0] * VOCAB),
         "tokenizer.ggml.token_type": ("add_token_types", [2, 3, 3] + [1] * (VOCAB - 3)),
         "tokenizer.ggml.bos_token_id": ("add_bos_token_id", BOS),
         "tokenizer.ggml.eos_token_id": ("add_eos_token_id", EOS),
         "tokenizer.ggml.add_bos_token": ("add_add_bos_token", True),
         "general.quantization_version": ("add_quantization_version", 2)}
    if v["arch"] == "llama":
        m.update({"vocab_size": ("add_vocab_size", VOCAB), "rope.dimension_count": ("add_rope_dimension_count",
                                                                                      HIDDEN // v["heads"])})
    m.update(changes)
    return m


def write_gguf(path, arch, metadata, tensors):
    write_gguf_file(path, arch, list(metadata.values()), tensors)


def make(out):
    from safetensors.numpy import save_file

    os.makedirs(out, exist_ok=True)
    for case, v in CASES.items():
        config, state = make_reference(case)
        ref = os.path.join(out, f"{case}-ref")
        os.makedirs(ref, exist_ok=True)
        save_file(state, os.path.join(ref, "model.safetensors"))
        with open(os.path.join(ref, "config.json"), "w") as f:
            json.dump(dict(config.to_dict(), rope_theta=v["theta"]), f, indent=1)
        tensors = gguf_tensors(case, state)
        write_gguf(os.path.join(out, f"{case}.gguf"), v["arch"], gguf_metadata(case), tensors)
        if v.get("layers"):  # the same values as F32 (compare: an int4 build quantizes them into the same blocks)
            plain = {n: (gguf.quants.dequantize(d, t).astype(np.float32) if t else d, None) for n, (d, t) in tensors.items()}
            write_gguf(os.path.join(out, f"{case}_f32.gguf"), v["arch"],
                       gguf_metadata(case, **{"general.file_type": ("add_file_type", 0)}), plain)
        print(f"{case}: {v['arch']} GGUF ({v['heads']} heads over {v['kv_heads']} key/value heads, ff {v['ff']}, "
              f"layers {v.get('layers', Q.F32).name}, table {v.get('table', Q.F32).name}, tied {v['tied']}) "
              f"-> {out}/{case}.gguf")


# ---------------------------------------------------------------- compare
def reference_model(ref):
    import torch
    import transformers
    from safetensors.torch import load_file
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    cfg = json.load(open(os.path.join(ref, "config.json")))
    theta = cfg.pop("rope_theta")
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**cfg))
    state = load_file(os.path.join(ref, "model.safetensors"))
    for i, layer in enumerate(model.model.layers):
        attn = layer.self_attn
        attn.rotary_emb = LlamaRotaryEmbedding(attn.head_dim, max_position_embeddings=256, base=theta)
        for proj in ("q_proj", "k_proj", "v_proj"):
            if f"model.layers.{i}.self_attn.{proj}.bias" in state:
                old = getattr(attn, proj)
                setattr(attn, proj, torch.nn.Linear(old.in_features, old.out_features, bias=True))
    missing, unexpected = model.load_state_dict(state, strict=False)
    assert not unexpected and all("rotary_emb" in k or k == "lm_head.weight" for k in missing), (missing, unexpected)
    if "lm_head.weight" in missing:
        model.tie_weights()
    model.eval()
    return model


def compare(case, out, binary, weights, f32_weights=None):
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from compare import compare_gguf_decoder

    model = reference_model(os.path.join(out, f"{case}-ref"))
    rng = np.random.default_rng(CASES[case]["seed"])
    prompts = {"length 1": [[BOS]], "length 7": [[BOS] + rng.integers(3, VOCAB, 6).tolist()],
               "padded batch": [[BOS] + rng.integers(3, VOCAB, n - 1).tolist() for n in (7, 3, 12, 1, 40)]}
    quantized = bool(CASES[case].get("layers"))
    errors = compare_gguf_decoder(case, model, binary, weights, prompts, EOS, quantized, f32_weights)
    if not quantized:
        errors.check(f"gguf {case}")


# ---------------------------------------------------------------- kept
def kept(out):
    """F32 tensors bit for bit, Q4_0 blocks byte for byte (scales: their fp16 widened),
    canonical names and metadata, the spec's precision and max_len."""
    from safetensors import safe_open

    for case in CASES:
        v = CASES[case]
        reader = gguf.GGUFReader(os.path.join(out, f"{case}.gguf"))
        raw = {t.name: t for t in reader.tensors}
        path = os.path.join(out, case, f"gguf-{case}.safetensors")
        with safe_open(path, "numpy") as f:
            meta, w = f.metadata(), {k: f.get_tensor(k) for k in f.keys()}
        assert meta["halformer.names"] == "canonical", meta
        precision = PRECISION.get(v.get("layers"), "fp32")
        assert meta["halformer.layers"] == precision, meta
        spec = open(os.path.join(out, case, f"gguf-{case}.yaml")).read()
        assert (f"precision: {precision}" in spec) == bool(v.get("layers")), spec
        assert f"rotary_layout: {'interleaved' if v['arch'] == 'llama' else 'half'}" in spec, spec
        if v["ctx"] > 4096:
            assert re.search(r"max_len: 4096 .*context_length 8192, capped", spec), spec
        n = 0
        for i in range(LAYERS):
            for g, c in CANONICAL.items():
                t, name = raw[f"blk.{i}.{g}.weight"], f"decoder.{i}.{c}.weight"
                rows = int(t.shape[1])
                if v.get("layers"):
                    check_blocks(t, w, name, rows)
                else:
                    assert w[name].dtype == np.float32 and np.array_equal(w[name], np.asarray(t.data)), name
                bias = raw.get(f"blk.{i}.{g}.bias")
                want = np.asarray(bias.data) if bias is not None else np.zeros(rows, np.float32)
                assert np.array_equal(w[f"decoder.{i}.{c}.bias"], want), (name, "bias")
                n += 1
        table = gguf.quants.dequantize(np.asarray(raw["token_embd.weight"].data), raw["token_embd.weight"].tensor_type)
        assert np.array_equal(w["tgt_embedding.weight"], table.astype(np.float32))
        assert ("generator.weight" in w) == (not v["tied"]) and not np.any(w["generator.bias"])
        if v.get("output") == Q.Q8_0:  # kept as blocks beside Q8_0 layers
            check_blocks(raw["output.weight"], w, "generator.weight", VOCAB)
        assert np.array_equal(w["decoder_norm.weight"], np.asarray(raw["output_norm.weight"].data))
        print(f"{case}: {n} layer linears kept as the file holds them "
              f"({v['layers'].name + ' blocks byte for byte, scales = fp16 d' if v.get('layers') else 'F32 bit for bit'}), "
              f"{len(w)} canonical tensors")


def check_blocks(t, w, name, rows):
    """The canonical tensor `name` holds GGUF tensor t's blocks byte for byte (Q4_0: U8
    [rows][blocks x 16]; Q8_0: I8 [rows][blocks][32]), its scales the fp16 d widened."""
    q8 = t.tensor_type == Q.Q8_0
    blocks = np.asarray(t.data).reshape(rows, -1, 34 if q8 else 18)
    values = blocks[:, :, 2:].copy()
    want = values.view(np.int8) if q8 else values.reshape(rows, -1)
    assert w[name].dtype == want.dtype and np.array_equal(w[name], want), name
    scales = blocks[:, :, :2].copy().view(np.float16)[:, :, 0].astype(np.float32)
    assert np.array_equal(w[name + "_scale"], scales), name


# ---------------------------------------------------------------- mixed
def mixed(halformer, out):
    """Attention linears and output Q8_0 but for one Q4_0 attn_q, the rest F32: an fp32 spec,
    every quantized tensor dequantized, one notice naming them."""
    from safetensors import safe_open

    work = os.path.join(out, "mixed")
    os.makedirs(work, exist_ok=True)
    src = gguf.GGUFReader(os.path.join(out, "f32.gguf"))
    tensors = {}
    for t in src.tensors:
        data = np.asarray(t.data).reshape([int(d) for d in reversed(t.shape)])
        qtype = Q.Q8_0 if t.name == "output.weight" or (".attn_" in t.name and data.ndim == 2) else None
        if t.name == "blk.1.attn_q.weight":
            qtype = Q.Q4_0
        tensors[t.name] = (gguf.quants.quantize(data, qtype), qtype) if qtype else (data, None)
    gpath, spec = os.path.join(work, "mixed.gguf"), os.path.join(work, "mixed.yaml")
    write_gguf(gpath, "llama", gguf_metadata("f32"), tensors)
    r = subprocess.run([halformer, "import", gpath, "-o", spec, "--force"], capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit(f"import failed:\n{r.stdout}{r.stderr}")
    notes = [line for line in r.stdout.splitlines() if "dequantized" in line]
    print("\n".join(notes))
    want = ("Q4_0 blk.1.attn_q.weight; Q8_0 output.weight, blk.0.attn_q.weight, "
            "blk.0-1.{attn_k.weight,attn_output.weight,attn_v.weight}")
    assert len(notes) == 1 and notes[0].endswith(want), (notes, want)
    text = open(spec).read()
    assert "precision:" not in text and "--precision int8" in text, text
    reader = gguf.GGUFReader(gpath)
    with safe_open(os.path.join(work, "mixed.safetensors"), "numpy") as f:
        for t in reader.tensors:
            if t.tensor_type == Q.F32:
                continue
            name = {"output.weight": "generator.weight"}.get(t.name) or \
                "decoder.{}.{}.weight".format(t.name.split(".")[1], CANONICAL[t.name.split(".")[2]])
            want = gguf.quants.dequantize(np.asarray(t.data), t.tensor_type).astype(np.float32)
            assert np.array_equal(f.get_tensor(name), want), name
    print(f"mixed: spec fp32, every quantized tensor dequantized as gguf.quants.dequantize does, one notice")


# ---------------------------------------------------------------- refuse
# case: (metadata changes, tensor change, regex); tensor change: None, ("drop", name),
# ("nan", name), ("type", name, qtype) or a special case run by refuse().
REFUSALS = {
    "architecture": ({}, ("arch", "falcon"), r"key 'general.architecture': found string 'falcon'; supported: llama"),
    "missing_tensor": ({}, ("drop", "blk.1.ffn_up.weight"), r"tensor 'blk.1.ffn_up.weight': missing"),
    "shape": ({"feed_forward_length": ("add_feed_forward_length", 96)}, None,
              r"tensor 'blk.0.ffn_gate.weight': dims \[64, 100\] disagree with the metadata: expected \[64, 96\]"),
    "rope_dims": ({"rope.dimension_count": ("add_rope_dimension_count", 8)}, None,
                  r"key 'llama.rope.dimension_count': found uint32 8; differs from the head size 16"),
    "rope_scaling": ({"rope.scaling.type": ("add_rope_scaling_type", gguf.RopeScalingType.YARN)}, None,
                     r"key 'llama.rope.scaling.type': found string 'yarn'; scaled rotary positions"),
    "experts": ({"expert_count": ("add_expert_count", 8)}, None, r"key 'llama.expert_count': found uint32 8; a mixture"),
    "unknown_key": ({"attention.sliding_window": ("add_sliding_window", 64)}, None,
                    r"key 'llama.attention.sliding_window': found uint32 64; this key is not known"),
    "unknown_tensor": ({}, ("extra", "rope_freqs.weight"), r"tensor 'rope_freqs.weight': scaled rotary frequencies"),
    "iq_type": ({}, ("type", "blk.0.attn_v.weight", Q.IQ4_NL),
                r"tensor 'blk.0.attn_v.weight': type IQ4_NL is not read by halformer import"),
    "nan": ({}, ("nan", "blk.1.ffn_norm.weight"), r"tensor 'blk.1.ffn_norm.weight': row 0 holds NaN or Inf"),
    "not_gguf": ({}, ("garbage",), r"not a GGUF file"),
    "output_exists": ({}, ("exists", "spec"), r"exists; add --force to replace it"),
    "weights_exist": ({}, ("exists", "weights"), r"exists; add --force to replace it"),
    "spec_is_input": ({}, ("output", "-o"), r"output .*model.gguf is the input .*model.gguf; refusing"),
    "weights_is_input": ({}, ("output", "--weights-out"), r"output .*model.gguf is the input .*model.gguf; refusing"),
    "weights_is_spec": ({}, ("output", "same"), r"the weights file .*model.yaml is the spec"),
    "weights_out_hf_dir": ({}, ("hfdir",), r"--weights-out applies to GGUF files"),
}


def refuse(case, halformer, out):
    changes, change, regex = REFUSALS[case]
    work = os.path.join(out, "refuse", case)
    os.makedirs(work, exist_ok=True)
    for name in os.listdir(work):
        os.remove(os.path.join(work, name))
    gpath, spec, weights = (os.path.join(work, n) for n in ("model.gguf", "model.yaml", "model.safetensors"))
    src = gguf.GGUFReader(os.path.join(out, "f32.gguf"))
    tensors = {t.name: (np.asarray(t.data).reshape([int(d) for d in reversed(t.shape)]).copy(), None)
               for t in src.tensors}
    kind = change[0] if change else None
    arch = change[1] if kind == "arch" else "llama"
    if kind == "drop":
        del tensors[change[1]]
    elif kind == "extra":
        tensors[change[1]] = (np.ones(8, np.float32), None)
    elif kind == "nan":
        tensors[change[1]][0][0] = np.nan
    elif kind == "type":
        rows, cols = tensors[change[1]][0].shape
        tensors[change[1]] = (np.zeros((rows, cols // 32 * 18), np.uint8), change[2])
    write_gguf(gpath, arch, gguf_metadata("f32", **changes), tensors)
    args = [halformer, "import", gpath, "-o", spec]
    before = {}
    if kind == "garbage":
        with open(gpath, "wb") as f:
            f.write(b"GGML" + bytes(60))
    elif kind == "exists":
        path = spec if change[1] == "spec" else weights
        with open(path, "w") as f:
            f.write("mine\n")
        before[path] = "mine\n"
    elif kind == "output":
        args = {"-o": [halformer, "import", gpath, "-o", gpath, "--force"],
                "--weights-out": [halformer, "import", gpath, "-o", spec, "--weights-out", gpath, "--force"],
                "same": [halformer, "import", gpath, "-o", spec, "--weights-out", spec]}[change[1]]
    elif kind == "hfdir":
        args = [halformer, "import", work, "-o", spec, "--weights-out", weights]
    size = os.path.getsize(gpath)
    r = subprocess.run(args, capture_output=True, text=True)
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from compare import expect_refused

    expect_refused(case, r, regex, (spec, weights), work, before, (gpath, size))


def main(argv):
    cmd = argv[1] if len(argv) > 1 else ""
    if cmd == "make" and len(argv) == 3:
        make(argv[2])
    elif cmd == "compare" and len(argv) in (6, 7):
        compare(*argv[2:])
    elif cmd == "kept" and len(argv) == 3:
        kept(argv[2])
    elif cmd == "mixed" and len(argv) == 4:
        mixed(argv[2], argv[3])
    elif cmd == "refuse" and len(argv) == 5:
        refuse(*argv[2:5])
    else:
        raise SystemExit(__doc__)


if __name__ == "__main__":
    main(sys.argv)
