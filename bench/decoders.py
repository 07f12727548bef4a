"""Decoder-only models imported from Hugging Face directories: halformer vs PyTorch
(transformers' GPT2LMHeadModel / LlamaForCausalLM, KV cache) on the same random weights
(issue 15's speed section; docs/bench.md).

    bench/.venv/bin/python bench/decoders.py [--quick] [--rounds 3] [--repeat 3] [--threads 2] [--out results.json]

(the bench venv, `bench/run --setup`: PyPI torch with MKL; Debian's torch in .venv has a
generic BLAS, 5-10x slower, and would flatter halformer)

Two models (random weights made once with transformers from a config, cached in
bench/.cache/decoders/): "gpt2-small" (GPT-2 small: 12 layers, d 768, 12 heads, vocab
50257) and "llama-style" (the same width and depth with RMSNorm, rotary positions,
SwiGLU d_ff 2048, 4 key/value heads for 12 query heads, vocab 32000). Each is imported
(`halformer import`), built (`halformer build`), and timed:

  prompt   a 128-token prompt through the model (the KV cache filled), median ms
  decode   per generated token over 64 greedy tokens with the KV cache, median ms

at batch 1 and 8; every system runs the 8 prompts as one batch (halformer's prefill takes
prompts of one length together, 8 x 128 rows per matmul here, then decodes every row in
each step). The decode bound is the bytes a step reads -- the fp32 weights once per batch,
plus the key/value cache (its average over the 64 steps: 1-2% of the weights at batch 1, 8%
(Llama-style) and 19% (GPT-2) at batch 8) -- over the machine's measured streaming-read
bandwidth (build/bin/halformer_peak, same run). CTranslate2
runs the model its own Transformers converter made from the same weights
(`generate_batch`; per token: (time for 64 tokens - time for 1) / 63; prompt: the time
for 1 token). ONNX Runtime runs PyTorch's model exported as one step graph with the KV
cache in and out (ort_model; the prompt is that graph with an empty cache). All use the
same thread count. Every system is timed in rounds (--rounds, default 3), the systems
in a rotating order within each, so that the shared machine's drifts in speed (15-20%
within minutes) fall on all of them; in a round each runs once to warm up, then --repeat
times (default 3) timed, the round's figure their median; a figure is the median over the
rounds (single runs of a batch-8 prompt on this machine spread 15-30%: 5-10% leads did not
show in one-run rounds). Tokens are checked: halformer's,
CTranslate2's and ONNX Runtime's greedy tokens equal PyTorch's for every row. transformers 4.30's Llama has no grouped
key/value heads: PyTorch and ONNX Runtime run the checkpoint's 4 key/value heads repeated
to 12 (the same function, 3x the key/value projection and cache).
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
           str(new_tokens), "--repeat", str(repeat + 1)]
    for p in prompts:
        cmd += ["--src", " ".join(map(str, p))]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode:
        raise SystemExit(f"{binary}: {r.stderr}")
    t = json.loads(r.stdout)
    # encoder: the prompts and the first token; step: median step of the whole batch; the
    # first run warms up, as the peers' do.
    return (statistics.median(t["timing"]["runs_encoder_ms"][1:]), statistics.median(t["timing"]["runs_step_ms"][1:]),
            [s["tokens"] for s in t["sequences"]])


class _Vocab:
    """The tokenizer CTranslate2's converter asks for: these random models have none, so
    token i is the string "t<i>" (ids are what the benchmark compares)."""

    def __init__(self, n, bos, eos):
        self.n, self.bos_token, self.eos_token, self.unk_token = n, f"t{bos}", f"t{eos}", f"t{eos}"

    def get_vocab(self):
        return {f"t{i}": i for i in range(self.n)}


def ct2_model(name, hf):
    """CTranslate2's own Transformers converter on the same model (offline: the model and a
    stand-in vocabulary are handed to it, as its loader classes read them; cached)."""
    import ctranslate2
    import torch

    out = CACHE / name / "ct2"
    if (out / "model.bin").exists():
        return out
    spec = MODELS[name]
    ref = reference(name, hf)
    if spec["kind"] == "llama":  # give it the checkpoint's grouped key/value heads, not the repeated ones
        from safetensors.torch import load_file

        checkpoint = load_file(hf / "model.safetensors")
        with torch.no_grad():
            for i, layer in enumerate(ref.model.layers):
                for proj in ("k_proj", "v_proj"):
                    w = checkpoint[f"model.layers.{i}.self_attn.{proj}.weight"]
                    new = torch.nn.Linear(w.shape[1], w.shape[0], bias=False)
                    new.weight.copy_(w)
                    setattr(layer.self_attn, proj, new)
        ref.config.num_key_value_heads = spec["num_key_value_heads"]
    bos, eos = ref.config.bos_token_id, ref.config.eos_token_id

    class Converter(ctranslate2.converters.TransformersConverter):
        def load_model(self, *args, **kwargs):
            return ref

        def load_tokenizer(self, *args, **kwargs):
            return _Vocab(spec["vocab_size"], bos, eos)

    log(f"{name}: CTranslate2 {ctranslate2.__version__} conversion")
    Converter(str(hf)).convert(str(out), force=True)
    return out


def ct2_times(model_dir, prompts, new_tokens, repeat, threads):
    """(prompt ms, per-token decode ms, tokens) medians: generate_batch with 1 new token
    (the prompt) and with `new_tokens`; decode = the difference / (new_tokens - 1)."""
    import ctranslate2

    gen = ctranslate2.Generator(str(model_dir), device="cpu", compute_type="float32", intra_threads=threads,
                                inter_threads=1)
    start = [[f"t{i}" for i in p] for p in prompts]

    def run(n):
        t0 = time.perf_counter()
        res = gen.generate_batch(start, max_length=n, sampling_topk=1, include_prompt_in_result=False)
        return (time.perf_counter() - t0) * 1e3, [r.sequences_ids[0] for r in res]

    one, full, tokens = [], [], None
    for k in range(repeat + 1):  # the first run warms up
        t1, _ = run(1)
        tn, tokens = run(new_tokens)
        if k:
            one.append(t1)
            full.append(tn)
    p, f = statistics.median(one), statistics.median(full)
    return p, (f - p) / (new_tokens - 1), tokens


def ort_model(name, hf):
    """ONNX Runtime: the PyTorch reference exported (TorchScript exporter, opset 17) as one
    step graph with the KV cache as inputs and outputs -- input_ids [B, T], attention_mask
    [B, past + T], position_ids [B, T], past K/V [B, H, past, hd] x 2L -> last position's
    logits [B, V], present K/V -- used for the prompt (past length 0) and every decode
    step, as Optimum's decoder exports are. Cached."""
    import torch

    out = CACHE / name / "onnx" / "decoder.onnx"
    if out.exists():
        return out
    ref = reference(name, hf)  # its own copy: exporting changed the model it traced (GPT-2's tokens)
    c = ref.config  # GPT2Config maps these names to n_layer, n_head, n_embd
    L, H, hd = c.num_hidden_layers, c.num_attention_heads, c.hidden_size // c.num_attention_heads

    class Step(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.m = ref  # a submodule: its weights export as initializers

        def forward(self, input_ids, attention_mask, position_ids, *past):
            pkv = tuple((past[2 * i], past[2 * i + 1]) for i in range(L))
            o = self.m(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                    past_key_values=pkv, use_cache=True)
            return (o.logits[:, -1],) + tuple(t for kv in o.past_key_values for t in kv)

    log(f"{name}: ONNX export (torch {torch.__version__})")
    out.parent.mkdir(parents=True, exist_ok=True)
    b, t, past = 2, 3, 4
    args = (torch.randint(3, 100, (b, t)), torch.ones(b, past + t, dtype=torch.int64),
            torch.arange(past, past + t).repeat(b, 1), *[torch.randn(b, H, past, hd) for _ in range(2 * L)])
    kvn = [f"{kv}{i}" for i in range(L) for kv in ("k", "v")]
    dyn = {"input_ids": {0: "B", 1: "T"}, "attention_mask": {0: "B", 1: "PT"}, "position_ids": {0: "B", 1: "T"},
           "logits": {0: "B"}}
    dyn.update({"past_" + n: {0: "B", 2: "P"} for n in kvn})
    dyn.update({"present_" + n: {0: "B", 2: "PT"} for n in kvn})
    kw = {"opset_version": 17, "do_constant_folding": True}
    import inspect

    if "dynamo" in inspect.signature(torch.onnx.export).parameters:
        kw["dynamo"] = False
    import warnings

    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the tracer's notes on transformers' shape arithmetic
        torch.onnx.export(Step(), args, str(out), input_names=["input_ids", "attention_mask", "position_ids"] +
                          ["past_" + n for n in kvn], output_names=["logits"] + ["present_" + n for n in kvn],
                          dynamic_axes=dyn, **kw)
    return out


def ort_times(path, prompts, new_tokens, repeat, threads):
    """(prompt ms, per-token decode ms, tokens) medians: the step graph on the prompts (an
    empty cache), then greedy steps feeding each step's present K/V back."""
    import numpy as np
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads, so.inter_op_num_threads = threads, 1
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    sess = ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
    pasts = [i for i in sess.get_inputs() if i.name.startswith("past_")]
    ids = np.asarray(prompts, np.int64)
    B, P = ids.shape
    p_ms, s_ms, tokens = [], [], None
    for _ in range(repeat + 1):  # the first run warms up
        feed = {"input_ids": ids, "attention_mask": np.ones((B, P), np.int64),
                "position_ids": np.tile(np.arange(P, dtype=np.int64), (B, 1))}
        feed.update({i.name: np.zeros((B, i.shape[1], 0, i.shape[3]), np.float32) for i in pasts})
        t0 = time.perf_counter()
        out = sess.run(None, feed)
        t1 = time.perf_counter()
        nxt, steps, toks = out[0].argmax(-1), [], []
        for step in range(new_tokens):
            toks.append(nxt)
            n = P + step
            feed = {"input_ids": nxt[:, None].astype(np.int64), "attention_mask": np.ones((B, n + 1), np.int64),
                    "position_ids": np.full((B, 1), n, np.int64)}
            feed.update({i.name: o for i, o in zip(pasts, out[1:])})
            ts = time.perf_counter()
            out = sess.run(None, feed)
            steps.append(time.perf_counter() - ts)
            nxt = out[0].argmax(-1)
        p_ms.append((t1 - t0) * 1e3)
        s_ms.append(statistics.median(steps[:-1]) * 1e3)  # the last step's token is not used
        tokens = np.stack(toks, 1).tolist()
    return statistics.median(p_ms[1:]), statistics.median(s_ms[1:]), tokens


def cache_bytes(name, batch, prompt, new_tokens):
    """fp32 key/value cache bytes a decode step reads, averaged over the steps: every row's
    keys and values so far, in every layer (GPT-2 small at batch 8 and ~160 positions: 94 MB,
    a fifth of its weights)."""
    spec = MODELS[name]
    if spec["kind"] == "gpt2":
        layers, width = spec["n_layer"], spec["n_embd"]
    else:
        heads = spec["num_attention_heads"]
        layers = spec["num_hidden_layers"]
        width = spec["num_key_value_heads"] * spec["hidden_size"] // heads
    positions = sum(prompt + t + 1 for t in range(new_tokens)) / new_tokens
    return 4 * 2 * width * layers * batch * positions


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
    ap.add_argument("--quick", action="store_true", help="1 round, 16 new tokens, batch 1 only")
    ap.add_argument("--rounds", type=int, default=3, help="timing rounds, systems in a rotating order in each")
    ap.add_argument("--repeat", type=int, default=3,
                    help="timed runs of each system per round, after its warm-up run (their median is the round's)")
    ap.add_argument("--out", default=None, help="write the results as JSON here too")
    ap.add_argument("--no-ct2", action="store_true", help="leave CTranslate2 out")
    ap.add_argument("--no-ort", action="store_true", help="leave ONNX Runtime out")
    a = ap.parse_args()
    import numpy as np
    import torch

    torch.set_num_threads(a.threads)
    rounds, new_tokens, batches = (1, 16, [1]) if a.quick else (a.rounds, 64, [1, 8])
    repeat = 1 if a.quick else a.repeat
    if rounds < 1 or repeat < 1:
        raise SystemExit(f"--rounds {rounds} --repeat {repeat}: need at least 1 of each")
    peak = json.loads(subprocess.run([str(PEAK), "--threads", str(a.threads)], capture_output=True, text=True,
                                     check=True).stdout)
    gbs = peak["read_gbs"][str(a.threads)]["best"]
    log(f"measured streaming read: {gbs:.1f} GB/s at {a.threads} threads")
    rows = []
    for name, spec in MODELS.items():
        hf, binary = make(name, spec)
        ref = reference(name, hf)
        ct2 = ct2_model(name, hf) if not a.no_ct2 else None
        onnx = ort_model(name, hf) if not a.no_ort else None
        for b in batches:
            bound_ms = (weight_bytes(name) + cache_bytes(name, b, 128, new_tokens)) / (gbs * 1e9) * 1e3
            rng = np.random.default_rng(b)
            prompts = rng.integers(3, spec["vocab_size"] - 1, (b, 128)).tolist()
            systems = {"PyTorch": lambda: torch_times(ref, prompts, new_tokens, repeat),
                       "halformer": lambda: halformer_times(binary, hf / "model.safetensors", prompts, new_tokens,
                                                            repeat, a.threads)}
            if ct2:
                systems["CTranslate2"] = lambda: ct2_times(ct2, prompts, new_tokens, repeat, a.threads)
            if onnx:
                systems["ONNX Runtime"] = lambda: ort_times(onnx, prompts, new_tokens, repeat, a.threads)
            runs = {s: [] for s in systems}
            order = list(systems)
            for k in range(rounds):
                for s in order[k % len(order):] + order[:k % len(order)]:
                    log(f"{name} b{b} round {k + 1}/{rounds}: {s}")
                    runs[s].append(systems[s]())

            def result(s):  # (prompt ms, step ms, tokens of the first round)
                return (statistics.median(r[0] for r in runs[s]), statistics.median(r[1] for r in runs[s]),
                        runs[s][0][2])

            tp, ts, ttok = result("PyTorch")
            hp, hs, htok = result("halformer")
            same = sum(h[:len(t)] == t for h, t in zip(htok, ttok))
            row = dict(model=name, batch=b, torch_prompt_ms=tp, torch_step_ms=ts, halformer_prompt_ms=hp,
                       halformer_step_ms=hs, bound_ms=bound_ms, tokens_identical=f"{same}/{b}",
                       rounds_ms={s: [[r[0], r[1]] for r in runs[s]] for s in runs})  # (prompt, step) per round
            if ct2:
                cp, cs, ctok = result("CTranslate2")
                row.update(ct2_prompt_ms=cp, ct2_step_ms=cs,
                           ct2_tokens_identical=f"{sum(c[:len(t)] == t[:len(c)] for c, t in zip(ctok, ttok))}/{b}")
            if onnx:
                op, os_, otok = result("ONNX Runtime")
                row.update(ort_prompt_ms=op, ort_step_ms=os_,
                           ort_tokens_identical=f"{sum(o[:len(t)] == t for o, t in zip(otok, ttok))}/{b}")
            rows.append(row)
    print(f"decoder-only models, {a.threads} threads, prompt 128 + {new_tokens} greedy tokens, fp32, "
          f"medians of {rounds} interleaved rounds of {repeat} timed runs each; "
          f"read bandwidth {gbs:.1f} GB/s (halformer_peak); torch {torch.__version__}")
    print(f"{'model':12} {'batch':>5} {'prompt ms (hf / torch / ct2 / ort)':>38} "
          f"{'decode ms/token (hf / torch / ct2 / ort)':>44} {'bound ms':>9} {'hf / bound':>10} "
          f"{'tokens torch, ct2, ort':>22}")
    na = float("nan")
    for r in rows:
        print(f"{r['model']:12} {r['batch']:>5} {r['halformer_prompt_ms']:>9.1f} / {r['torch_prompt_ms']:<7.1f}/ "
              f"{r.get('ct2_prompt_ms', na):<7.1f}/ {r.get('ort_prompt_ms', na):<7.1f} "
              f"{r['halformer_step_ms']:>11.2f} / {r['torch_step_ms']:<7.2f}/ {r.get('ct2_step_ms', na):<7.2f}/ "
              f"{r.get('ort_step_ms', na):<7.2f} {r['bound_ms']:>9.2f} {r['halformer_step_ms'] / r['bound_ms']:>10.2f} "
              f"{r['tokens_identical']:>9}, {r.get('ct2_tokens_identical', '-')}, {r.get('ort_tokens_identical', '-')}")
    if a.out:
        json.dump(dict(threads=a.threads, rounds=rounds, repeat=repeat, read_gbs=gbs, rows=rows), open(a.out, "w"),
                  indent=2)


if __name__ == "__main__":
    main()
