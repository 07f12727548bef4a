"""Decoder-only models imported from Hugging Face directories: halformer vs PyTorch
(transformers' GPT2LMHeadModel / LlamaForCausalLM, KV cache) on the same random weights
(issue 15's speed section; docs/bench.md).

    bench/.venv/bin/python bench/decoders.py [--quick] [--threads 2] [--out results.json]

(the bench venv, `bench/run --setup`: PyPI torch with MKL; Debian's torch in .venv has a
generic BLAS, 5-10x slower, and would flatter halformer)

Two models (random weights made once with transformers from a config, cached in
bench/.cache/decoders/): "gpt2-small" (GPT-2 small: 12 layers, d 768, 12 heads, vocab
50257) and "llama-style" (the same width and depth with RMSNorm, rotary positions,
SwiGLU d_ff 2048, 4 key/value heads for 12 query heads, vocab 32000). Each is imported
(`halformer import`), built (`halformer build`), and timed:

  prompt   a 128-token prompt through the model (the KV cache filled), median ms
  decode   per generated token over 64 greedy tokens with the KV cache, median ms

at batch 1 and 8. halformer continues decoder-only prompts one at a time (docs/api.md),
so its batch-8 figures are 8 rows' work; PyTorch runs the 8 equal-length prompts as one
batch. The decode bound is fp32 weight bytes read per step / the machine's measured
streaming-read bandwidth (build/bin/halformer_peak, same run); the KV cache (< 5% of the
weights at these lengths) is left out of the bound. Both use the same thread count.
Tokens are checked: halformer's greedy tokens equal PyTorch's for every row.
"""
import argparse
import json
import pathlib
import statistics
import subprocess
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
CACHE = ROOT / "bench" / ".cache" / "decoders"
TOOL = ROOT / "build" / "bin" / "halformer"
PEAK = ROOT / "build" / "bin" / "halformer_peak"

MODELS = {
    "gpt2-small": dict(kind="gpt2", n_embd=768, n_head=12, n_layer=12, vocab_size=50257, n_positions=1024),
    "llama-style": dict(kind="llama", hidden_size=768, num_attention_heads=12, num_key_value_heads=4,
                        num_hidden_layers=12, intermediate_size=2048, vocab_size=32000, max_position_embeddings=1024),
}


def log(msg):
    print(f"[decoders {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def make(name, spec):
    """The Hugging Face directory (random weights, seed 0) and its halformer build."""
    import torch
    import transformers as tf

    hf = CACHE / name / "hf"
    if not (hf / "model.safetensors").exists():
        log(f"{name}: random weights with transformers {tf.__version__}")
        torch.manual_seed(0)
        cfg = {k: v for k, v in spec.items() if k != "kind"}
        if spec["kind"] == "gpt2":
            model = tf.GPT2LMHeadModel(tf.GPT2Config(**cfg, bos_token_id=50256, eos_token_id=50256))
        else:
            kv = cfg.pop("num_key_value_heads")
            model = tf.LlamaForCausalLM(tf.LlamaConfig(**cfg, bos_token_id=1, eos_token_id=2))
            # The GQA checkpoint: one key/value head per group of 3 (the PyTorch reference,
            # transformers 4.30, runs the same function with the heads repeated).
            group, hd = cfg["num_attention_heads"] // kv, cfg["hidden_size"] // cfg["num_attention_heads"]
            with torch.no_grad():
                for layer in model.model.layers:
                    for proj in (layer.self_attn.k_proj, layer.self_attn.v_proj):
                        w = proj.weight.view(cfg["num_attention_heads"], hd, -1)
                        for h in range(cfg["num_attention_heads"]):
                            w[h] = w[(h // group) * group]
            model.save_pretrained(hf / "reference", safe_serialization=True)
            from safetensors.torch import save_file

            tensors = {}
            for n, t in model.state_dict().items():
                if n.endswith("inv_freq"):
                    continue
                if n.endswith(("k_proj.weight", "v_proj.weight")):
                    t = t.view(cfg["num_attention_heads"], hd, -1)[::group].reshape(kv * hd, -1)
                tensors[n] = t.clone().contiguous()
            hf.mkdir(parents=True, exist_ok=True)
            save_file(tensors, hf / "model.safetensors", metadata={"format": "pt"})
            c = json.load(open(hf / "reference" / "config.json"))
            c["num_key_value_heads"] = kv
            json.dump(c, open(hf / "config.json", "w"), indent=2)
        if spec["kind"] == "gpt2":
            model.save_pretrained(hf, safe_serialization=True)
    spec_path, out = CACHE / name / f"{name}.yaml", CACHE / name / "model"
    subprocess.run([str(TOOL), "import", str(hf), "-o", str(spec_path), "--name", name, "--force"], check=True,
                   stdout=subprocess.DEVNULL)
    log(f"{name}: halformer build (progress below)")
    subprocess.run([str(TOOL), "build", str(spec_path), "-o", str(out)], check=True)
    return hf, out / name


def reference(name, hf):
    import transformers as tf

    cls = tf.GPT2LMHeadModel if MODELS[name]["kind"] == "gpt2" else tf.LlamaForCausalLM
    model = cls.from_pretrained(hf if MODELS[name]["kind"] == "gpt2" else hf / "reference")
    model.eval()
    return model


def torch_times(model, prompts, new_tokens, repeat):
    """(prompt ms, per-token decode ms, tokens) medians over `repeat` runs: one batched
    forward of the prompts, then greedy steps with past_key_values."""
    import torch

    ids = torch.tensor(prompts)
    p_ms, s_ms, tokens = [], [], None
    with torch.no_grad():
        for _ in range(repeat + 1):  # the first run warms up
            t0 = time.perf_counter()
            out = model(ids, use_cache=True)
            t1 = time.perf_counter()
            past, nxt, steps, toks = out.past_key_values, out.logits[:, -1].argmax(-1), [], []
            for _ in range(new_tokens):
                toks.append(nxt)
                ts = time.perf_counter()
                out = model(nxt[:, None], past_key_values=past, use_cache=True)
                steps.append(time.perf_counter() - ts)
                past, nxt = out.past_key_values, out.logits[:, -1].argmax(-1)
            p_ms.append((t1 - t0) * 1e3)
            s_ms.append(statistics.median(steps[:-1]) * 1e3)  # the last step's token is not used
            tokens = torch.stack(toks, 1).tolist()
    return statistics.median(p_ms[1:]), statistics.median(s_ms[1:]), tokens


def halformer_times(binary, weights, prompts, new_tokens, repeat, threads):
    cmd = [str(binary), "--weights", str(weights), "--json", "--threads", str(threads), "--max-new-tokens",
           str(new_tokens), "--repeat", str(repeat)]
    for p in prompts:
        cmd += ["--src", " ".join(map(str, p))]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode:
        raise SystemExit(f"{binary}: {r.stderr}")
    j = json.loads(r.stdout)
    # encoder_ms: every prompt's first step (prompt + first token); step_ms: median row step.
    return j["timing"]["encoder_ms"], j["timing"]["step_ms"] * len(prompts), [s["tokens"] for s in j["sequences"]]


def weight_bytes(name):
    """fp32 bytes a decode step reads: every tensor once, but an untied input embedding
    table only by the rows looked up (nothing, against the bound)."""
    import numpy as np
    from safetensors import safe_open

    with safe_open(str(CACHE / name / "hf" / "model.safetensors"), "np") as f:
        sizes = {k: int(np.prod(f.get_slice(k).get_shape())) for k in f.keys()}
    tied = "lm_head.weight" not in sizes
    return 4 * sum(n for k, n in sizes.items() if tied or not k.endswith(("embed_tokens.weight", "wte.weight")))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--quick", action="store_true", help="2 repeats, 16 new tokens, batch 1 only")
    ap.add_argument("--out", default=None, help="write the results as JSON here too")
    a = ap.parse_args()
    import numpy as np
    import torch

    torch.set_num_threads(a.threads)
    repeat, new_tokens, batches = (2, 16, [1]) if a.quick else (3, 64, [1, 8])
    peak = json.loads(subprocess.run([str(PEAK), "--threads", str(a.threads)], capture_output=True, text=True,
                                     check=True).stdout)
    gbs = peak["read_gbs"][str(a.threads)]["best"]
    log(f"measured streaming read: {gbs:.1f} GB/s at {a.threads} threads")
    rows = []
    for name, spec in MODELS.items():
        hf, binary = make(name, spec)
        ref = reference(name, hf)
        bound_ms = weight_bytes(name) / (gbs * 1e9) * 1e3
        for b in batches:
            rng = np.random.default_rng(b)
            prompts = rng.integers(3, spec["vocab_size"] - 1, (b, 128)).tolist()
            log(f"{name} b{b}: PyTorch")
            tp, ts, ttok = torch_times(ref, prompts, new_tokens, repeat)
            log(f"{name} b{b}: halformer")
            hp, hs, htok = halformer_times(binary, hf / "model.safetensors", prompts, new_tokens, repeat, a.threads)
            same = sum(h[:len(t)] == t for h, t in zip(htok, ttok))
            rows.append(dict(model=name, batch=b, torch_prompt_ms=tp, torch_step_ms=ts, halformer_prompt_ms=hp,
                             halformer_step_ms=hs, bound_ms=bound_ms,
                             tokens_identical=f"{same}/{b}"))
    print(f"decoder-only models, {a.threads} threads, prompt 128 + {new_tokens} greedy tokens, fp32; "
          f"read bandwidth {gbs:.1f} GB/s (halformer_peak); torch {torch.__version__}")
    print(f"{'model':12} {'batch':>5} {'prompt ms (hf / torch)':>24} {'decode ms/token (hf / torch)':>30} "
          f"{'ratio':>6} {'bound ms':>9} {'hf / bound':>10} {'tokens':>7}")
    for r in rows:
        per_row = r["halformer_step_ms"] / r["batch"]
        print(f"{r['model']:12} {r['batch']:>5} {r['halformer_prompt_ms']:>11.1f} / {r['torch_prompt_ms']:<10.1f} "
              f"{r['halformer_step_ms']:>14.2f} / {r['torch_step_ms']:<13.2f} "
              f"{r['torch_step_ms'] / r['halformer_step_ms']:>6.2f} {r['bound_ms']:>9.2f} "
              f"{per_row / r['bound_ms']:>10.2f} {r['tokens_identical']:>7}")
    if a.out:
        json.dump(dict(threads=a.threads, read_gbs=gbs, rows=rows), open(a.out, "w"), indent=2)


if __name__ == "__main__":
    main()
