"""`halformer import MODEL.gguf` of the gemma and gpt2 architectures against transformers
(tests/import/CMakeLists.txt runs each step; the llama / qwen2 ones: check_gguf_import.py).

  make DIR                     small random Hugging Face checkpoints (DIR/CASE-hf: config.json +
                               model.safetensors, what convert_hf_to_gguf.py reads) written as GGUF
                               files the way it writes them (DIR/CASE.gguf;
                               tests/reference/halformer_torch/gguf_archs.py); gpt2_q4: its layer
                               linears Q4_0 (the checkpoint holds the dequantized values) and
                               DIR/gpt2_q4_f32.gguf, the same values as F32
  compare CASE DIR BIN WEIGHTS [F32_WEIGHTS]
                               the imported model's binary BIN (the imported WEIGHTS) against
                               transformers: --dump logits and greedy tokens; gpt2_q4 also the same
                               build on F32_WEIGHTS (gpt2_q4_f32.gguf imported), bit for bit
  spec CASE HALFORMER DIR      the GGUF's spec has the values of `halformer import DIR/CASE-hf`'s,
                               field by field (only the comments differ, and GPT-2's dropout, an
                               identity at inference, which the GGUF file does not record)
  refuse CASE HALFORMER DIR    a file with one thing wrong fails, naming the key or tensor, and
                               writes nothing

Cases (hidden 64, 4 heads of 16, 2 layers, vocabulary 300, every parameter random): "gemma"
(1 key/value head, intermediate 100, rms_norm_eps 1e-6, tied; the reference is transformers
4.30's Llama, which predates Gemma, as tests/import/hf_models.py makes it: norms holding
1 + w, sqrt(hidden) * E as its input table, E as an untied lm_head, the key/value head
repeated); "gpt2" (GPT2LMHeadModel, intermediate 4 * 64, tied, 128 positions); "gpt2_q4" (its
layer linears Q4_0 -- attn_qkv split into q, k and v by rows --, token table Q8_0, untied
output, 5000 positions: max_len capped at 4096, the position table's first 4096 rows read).
Tolerances as the Hugging Face import tests: max abs error <= 1e-4 of the reference's max abs
value and identical greedy tokens; gpt2_q4 (activations quantized per block at run time) as
check_gguf_import.py's q4: logits within 0.1 of the output scale, top-1 agreement >= 80%.
"""

import json
import os
import subprocess
import sys

import numpy as np

import gguf
from gguf import GGMLQuantizationType as Q

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "reference"))
from halformer_torch.gguf_archs import bpe_tokenizer, convert, sentencepiece_tokenizer, write_gguf  # noqa: E402

VOCAB, HIDDEN, HEADS, LAYERS = 300, 64, 4, 2
GEMMA_IDS = dict(pad=0, eos=1, bos=2, unk=3)
ENDOFTEXT = VOCAB - 1  # GPT-2's bos and eos
CASES = {
    "gemma": dict(arch="gemma", kv_heads=1, ff=100, positions=256, seed=41),
    "gpt2": dict(arch="gpt2", positions=128, tied=True, seed=42),
    "gpt2_q4": dict(arch="gpt2", positions=5000, tied=False, seed=43, layers=Q.Q4_0, table=Q.Q8_0),
}
LAYER_LINEARS = ("attn_qkv", "attn_output", "ffn_up", "ffn_down")
TOLERANCE = 1e-4


def tokenizer(arch):
    if arch == "gemma":
        return sentencepiece_tokenizer(VOCAB, **GEMMA_IDS)
    return bpe_tokenizer(VOCAB, ENDOFTEXT)


def types_of(v):
    """The Q4_0 file's types (llama-quantize's place): layer linears, then the token table."""
    def types(name, x):
        if v.get("layers") and x.ndim == 2 and name.split(".")[-2] in LAYER_LINEARS:
            return v["layers"]
        if v.get("table") and name == "token_embd.weight":
            return v["table"]
        return None
    return types


# ---------------------------------------------------------------- make
def gemma_checkpoint(case):
    """config.json (GemmaForCausalLM's fields) and a random state under its names."""
    v = CASES[case]
    hp = dict(architectures=["GemmaForCausalLM"], model_type="gemma", vocab_size=VOCAB, hidden_size=HIDDEN,
              num_attention_heads=HEADS, num_key_value_heads=v["kv_heads"], head_dim=HIDDEN // HEADS,
              intermediate_size=v["ff"], num_hidden_layers=LAYERS, max_position_embeddings=v["positions"],
              rms_norm_eps=1e-6, rope_theta=10000.0, hidden_act="gelu", hidden_activation="gelu_pytorch_tanh",
              attention_bias=False, attention_dropout=0.0, initializer_range=0.1, tie_word_embeddings=True,
              bos_token_id=GEMMA_IDS["bos"], eos_token_id=GEMMA_IDS["eos"], pad_token_id=GEMMA_IDS["pad"],
              torch_dtype="float32")
    rng = np.random.default_rng(v["seed"])
    r = lambda *shape: (0.1 * rng.standard_normal(shape)).astype(np.float32)  # noqa: E731
    kvd = v["kv_heads"] * HIDDEN // HEADS
    state = {"model.embed_tokens.weight": r(VOCAB, HIDDEN), "model.norm.weight": r(HIDDEN)}
    for i in range(LAYERS):
        p = f"model.layers.{i}."
        state.update({p + "input_layernorm.weight": r(HIDDEN), p + "post_attention_layernorm.weight": r(HIDDEN),
                      p + "self_attn.q_proj.weight": r(HIDDEN, HIDDEN), p + "self_attn.k_proj.weight": r(kvd, HIDDEN),
                      p + "self_attn.v_proj.weight": r(kvd, HIDDEN), p + "self_attn.o_proj.weight": r(HIDDEN, HIDDEN),
                      p + "mlp.gate_proj.weight": r(v["ff"], HIDDEN), p + "mlp.up_proj.weight": r(v["ff"], HIDDEN),
                      p + "mlp.down_proj.weight": r(HIDDEN, v["ff"])})
    return hp, state


def gpt2_model(case):
    import torch
    import transformers

    v = CASES[case]
    torch.manual_seed(v["seed"])
    config = transformers.GPT2Config(vocab_size=VOCAB, n_embd=HIDDEN, n_head=HEADS, n_layer=LAYERS,
                                     n_positions=v["positions"], bos_token_id=ENDOFTEXT, eos_token_id=ENDOFTEXT,
                                     initializer_range=0.1, tie_word_embeddings=v["tied"])
    model = transformers.GPT2LMHeadModel(config)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 1:  # LayerNorm scales around 1, every bias and shift around 0
                p.copy_((1.0 if name.endswith("weight") else 0.0) + 0.1 * torch.randn_like(p))
    return model.eval()


def save_gpt2(model, hf):
    """save_pretrained, then n_ctx (the converter's context_length; GPT-2's own configs have it)."""
    from safetensors.numpy import load_file

    model.save_pretrained(hf, safe_serialization=True)
    cfg = json.load(open(os.path.join(hf, "config.json")))
    cfg["n_ctx"] = cfg["n_positions"]
    with open(os.path.join(hf, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
    return cfg, load_file(os.path.join(hf, "model.safetensors"))


def make(out):
    import torch
    from safetensors.numpy import save_file

    os.makedirs(out, exist_ok=True)
    for case, v in CASES.items():
        hf, path = os.path.join(out, f"{case}-hf"), os.path.join(out, f"{case}.gguf")
        os.makedirs(hf, exist_ok=True)
        name = f"halformer test {case}"
        if v["arch"] == "gemma":
            hp, state = gemma_checkpoint(case)
            save_file(state, os.path.join(hf, "model.safetensors"), metadata={"format": "pt"})
            with open(os.path.join(hf, "config.json"), "w") as f:
                json.dump(hp, f, indent=2)
            convert(path, "gemma", hp, state, tokenizer("gemma"), name=name)
        else:
            model = gpt2_model(case)
            hp, state = save_gpt2(model, hf)
            held = convert(path, "gpt2", hp, state, tokenizer("gpt2"), types_of(v), name=name)
            if v.get("layers"):  # the checkpoint (the reference) holds the file's values, dequantized
                params = dict(model.named_parameters())
                with torch.no_grad():
                    for gname, (hfname, x) in held.items():
                        conv1d = hfname.endswith((".c_attn.weight", ".c_proj.weight", ".c_fc.weight"))
                        params[hfname].copy_(torch.from_numpy(x.T.copy() if conv1d else x))
                hp, state = save_gpt2(model, hf)
                convert(os.path.join(out, f"{case}_f32.gguf"), "gpt2", hp, state, tokenizer("gpt2"), name=name)
        print(f"{case}: {v['arch']} GGUF ({HEADS} heads, layers {v.get('layers', Q.F32).name}, table "
              f"{v.get('table', Q.F32).name}) -> {path}; its checkpoint {hf}")


# ---------------------------------------------------------------- compare
def gemma_reference(hf):
    """transformers 4.30's Llama computing Gemma (tests/import/hf_models.py's recipe)."""
    import torch
    import transformers
    from safetensors.torch import load_file

    hp = json.load(open(os.path.join(hf, "config.json")))
    kvh, hd = hp["num_key_value_heads"], hp["head_dim"]
    config = transformers.LlamaConfig(vocab_size=VOCAB, hidden_size=HIDDEN, num_attention_heads=HEADS,
                                      intermediate_size=hp["intermediate_size"], num_hidden_layers=LAYERS,
                                      max_position_embeddings=hp["max_position_embeddings"],
                                      rms_norm_eps=hp["rms_norm_eps"], hidden_act="gelu_pytorch_tanh",
                                      bos_token_id=hp["bos_token_id"], eos_token_id=hp["eos_token_id"],
                                      pad_token_id=hp["pad_token_id"], tie_word_embeddings=False)
    model = transformers.LlamaForCausalLM(config)
    state = load_file(os.path.join(hf, "model.safetensors"))
    table = state["model.embed_tokens.weight"]
    for k in list(state):
        if k.endswith("norm.weight"):
            state[k] = state[k] + 1.0
        if k.endswith(("k_proj.weight", "v_proj.weight")):  # query head h reads key/value head h // group
            state[k] = state[k].view(kvh, 1, hd, HIDDEN).expand(kvh, HEADS // kvh, hd, HIDDEN).reshape(HIDDEN, HIDDEN)
    state["model.embed_tokens.weight"] = table * torch.tensor(HIDDEN ** 0.5, dtype=torch.float32)
    state["lm_head.weight"] = table
    missing, unexpected = model.load_state_dict(state, strict=False)
    assert not unexpected and all("rotary_emb" in k for k in missing), (missing, unexpected)
    return model.eval()


def reference(case, out):
    import transformers

    hf = os.path.join(out, f"{case}-hf")
    if CASES[case]["arch"] == "gemma":
        return gemma_reference(hf)
    return transformers.GPT2LMHeadModel.from_pretrained(hf).eval()


def compare(case, out, binary, weights, f32_weights=None):
    sys.path.insert(0, HERE)
    from compare import compare_gguf_decoder

    v = CASES[case]
    model = reference(case, out)
    rng = np.random.default_rng(v["seed"])
    if v["arch"] == "gemma":  # bos first, as llama.cpp adds it; no special ids inside
        first, low, high = [GEMMA_IDS["bos"]], 4, VOCAB
    else:
        first, low, high = [], 0, ENDOFTEXT
    seq = lambda n: first + rng.integers(low, high, n - len(first)).tolist()  # noqa: E731
    prompts = {"length 1": [seq(1)], "length 7": [seq(7)], "padded batch": [seq(n) for n in (7, 3, 12, 1, 40)]}
    int4 = bool(v.get("layers"))
    errors = compare_gguf_decoder(case, model, binary, weights, prompts, model.config.eos_token_id, int4, f32_weights)
    if int4:
        return
    err = errors.worst["logits (dump logits vs .logits)"]
    ok = err <= TOLERANCE
    print(f"{case} logits: max error {err:.2e} of the output scale ({'ok' if ok else 'FAIL'}, limit {TOLERANCE:g})")
    if not ok:
        raise SystemExit(f"{case}: outputs differ from transformers")


# ---------------------------------------------------------------- spec
def spec(case, halformer, out):
    """`halformer import` of the checkpoint the GGUF was converted from: the same spec values."""
    import yaml

    hf_spec = os.path.join(out, f"{case}-hf-spec", f"hf-{case}.yaml")
    r = subprocess.run([halformer, "import", os.path.join(out, f"{case}-hf"), "-o", hf_spec, "--force"],
                       capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit(f"halformer import {case}-hf failed:\n{r.stdout}{r.stderr}")
    a = yaml.safe_load(open(os.path.join(out, case, f"gguf-{case}.yaml")))
    b = yaml.safe_load(open(hf_spec))
    a.pop("name"), b.pop("name")
    b.get("layer", {}).pop("dropout", None)  # resid_pdrop: an identity at inference, not in the GGUF file
    if a != b:
        diff = {s: {k: (a.get(s, {}).get(k), b.get(s, {}).get(k)) for k in set(a.get(s, {})) | set(b.get(s, {}))
                    if a.get(s, {}).get(k) != b.get(s, {}).get(k)}
                for s in set(a) | set(b) if a.get(s) != b.get(s)}
        raise SystemExit(f"{case}: the GGUF's spec differs from the checkpoint's (gguf, hf): {diff}")
    print(f"{case}: the GGUF's spec has the values of the Hugging Face import's "
          f"({sum(len(x) if isinstance(x, dict) else 1 for x in a.values())} fields; comments aside)")


# ---------------------------------------------------------------- refuse
# case: (source case, config change, tensor change, regex)
REFUSALS = {
    "gemma_key_length": ("gemma", {"head_dim": 32}, None,
                         r"key 'gemma.attention.key_length': found uint32 32; differs from the head size 16"),
    "gemma_output": ("gemma", {}, ("copy", "token_embd.weight", "output.weight"),
                     r"tensor 'output.weight': llama.cpp's gemma reads token_embd as its output projection"),
    "gpt2_qkv_shape": ("gpt2", {}, ("rows", "blk.0.attn_qkv.weight", 2 * HIDDEN),
                       r"tensor 'blk.0.attn_qkv.weight': dims \[64, 128\] disagree with the metadata: "
                       r"expected \[64, 192\]"),
}


def refuse(case, halformer, out):
    from halformer_torch.gguf_archs import metadata

    src, changes, change, regex = REFUSALS[case]
    arch = CASES[src]["arch"]
    work = os.path.join(out, "refuse", case)
    os.makedirs(work, exist_ok=True)
    for name in os.listdir(work):
        os.remove(os.path.join(work, name))
    gpath, spec_path, weights = (os.path.join(work, n) for n in ("model.gguf", "model.yaml", "model.safetensors"))
    hp = dict(json.load(open(os.path.join(out, f"{src}-hf", "config.json"))), **changes)
    reader = gguf.GGUFReader(os.path.join(out, f"{src}.gguf"))
    tensors = {t.name: (np.asarray(t.data).reshape([int(d) for d in reversed(t.shape)]).copy(), None)
               for t in reader.tensors}
    if change and change[0] == "copy":
        tensors[change[2]] = tensors[change[1]]
    elif change and change[0] == "rows":
        tensors[change[1]] = (tensors[change[1]][0][:change[2]].copy(), None)
    write_gguf(gpath, arch, metadata(arch, hp, tokenizer(arch)), tensors)
    size = os.path.getsize(gpath)
    r = subprocess.run([halformer, "import", gpath, "-o", spec_path], capture_output=True, text=True)
    sys.path.insert(0, HERE)
    from compare import expect_refused

    expect_refused(case, r, regex, (spec_path, weights), work, source=(gpath, size))


def main(argv):
    cmd = argv[1] if len(argv) > 1 else ""
    if cmd == "make" and len(argv) == 3:
        make(argv[2])
    elif cmd == "compare" and len(argv) in (6, 7):
        compare(*argv[2:])
    elif cmd == "spec" and len(argv) == 5:
        spec(*argv[2:5])
    elif cmd == "refuse" and len(argv) == 5:
        refuse(*argv[2:5])
    else:
        raise SystemExit(__doc__)


if __name__ == "__main__":
    main(sys.argv)
