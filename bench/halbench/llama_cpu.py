"""LLM decoders on the CPU, halformer against llama.cpp on the same GGUF files.

    bench/.venv/bin/python -m halbench.llama_cpu [--shape tinyllama|qwen05|tiny] [--out DIR]
        [--llama-python PY] [--threads 2] [--rounds 3] [--prompt-len 512] [--new-tokens 128]
        [--context 4096] [--build-dir build]

Random weights at a real model's shapes (seeded, LeCun-normal) are written once as an F16
GGUF file the way llama.cpp's converter writes one (tests/reference/halformer_torch/
gguf_llama.py), and quantized to Q8_0 and Q4_0 by llama.cpp's own quantizer. Each file is
given to both engines: llama.cpp through llama-cpp-python (halbench/peer_llamacpp.py, its
own process), halformer through `halformer import FILE.gguf` and `halformer build`
(the Q4_0 and Q8_0 files' blocks kept as they are: precisions int4 and q8_0; the F16 file
at fp32 and bf16, or int8, per-channel). Rows: prompt of
`--prompt-len` tokens (tokens/s), decode at batch 1 after a 16-token prompt (ms per
token, the mean of `--new-tokens` greedy steps; median over rounds), a `--context`-token
prompt (seconds, its prefill and first token) and the decode after it, peak RSS, the weight bytes a decode step reads and the time
that takes at the measured read bandwidth (halformer_peak: the bound; after the long
prompt the bound counts the key/value cache a step reads too), ratios against llama.cpp on
the same file (`--llama ""`: halformer's rows alone). Checks on the Q4_0 and Q8_0 files: 5 prompts, the last
position's logits (max difference over their scale) and 32 greedy tokens. A halformer
precision with `+kv8` (e.g. `int4+kv8:Q4_0`) builds the same spec with an int8 key/value
cache (precision_overrides.kv_cache: int8; docs/precision.md#int8-key-value-cache).
"""
from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from typing import Any, Dict, List

import numpy as np

from .common import REFERENCE_DIR, ROOT, log, median, write_json

SHAPES = {  # name: layers, d, heads, kv heads, d_ff, vocab, tied
    "tinyllama": dict(layers=22, d=2048, heads=32, kv_heads=4, d_ff=5632, vocab=32000, tied=False),
    # Qwen2-0.5B's shapes as a llama file (the q/k/v biases left out: the bytes are the same)
    "qwen05": dict(layers=24, d=896, heads=14, kv_heads=2, d_ff=4864, vocab=151936, tied=True),
    "tiny": dict(layers=2, d=256, heads=4, kv_heads=2, d_ff=704, vocab=1000, tied=False),
}
LLAMA_FTYPES = {"Q8_0": 7, "Q4_0": 2}  # llama_ftype: LLAMA_FTYPE_MOSTLY_*


def run(cmd: List[str], **kw) -> subprocess.CompletedProcess:
    r = subprocess.run(cmd, capture_output=True, text=True, **kw)
    if r.returncode != 0:
        raise SystemExit(f"llama_cpu: {' '.join(cmd)} failed ({r.returncode}):\n{r.stdout[-2000:]}{r.stderr[-4000:]}")
    return r


def random_state(s: Dict[str, Any], seed: int) -> Dict[str, np.ndarray]:
    """LlamaForCausalLM's names; matrices N(0, 1/fan_in), norms 1 + N(0, 0.1), table N(0, 1)."""
    rng = np.random.default_rng(seed)
    d, f, kvd, hd = s["d"], s["d_ff"], s["kv_heads"] * s["d"] // s["heads"], s["d"] // s["heads"]
    del hd
    mat = lambda o, i: (rng.standard_normal((o, i), dtype=np.float32) / np.sqrt(i)).astype(np.float32)  # noqa: E731
    norm = lambda: (1.0 + 0.1 * rng.standard_normal(d, dtype=np.float32)).astype(np.float32)  # noqa: E731
    st = {"model.embed_tokens.weight": rng.standard_normal((s["vocab"], d), dtype=np.float32)}
    for i in range(s["layers"]):
        p = f"model.layers.{i}."
        st.update({p + "input_layernorm.weight": norm(), p + "self_attn.q_proj.weight": mat(d, d),
                   p + "self_attn.k_proj.weight": mat(kvd, d), p + "self_attn.v_proj.weight": mat(kvd, d),
                   p + "self_attn.o_proj.weight": mat(d, d), p + "post_attention_layernorm.weight": norm(),
                   p + "mlp.gate_proj.weight": mat(f, d), p + "mlp.up_proj.weight": mat(f, d),
                   p + "mlp.down_proj.weight": mat(d, f)})
    st["model.norm.weight"] = norm()
    if not s["tied"]:
        st["lm_head.weight"] = mat(s["vocab"], d)
    return st


def make_files(a, s: Dict[str, Any], work: str) -> Dict[str, str]:
    """The F16 GGUF (ours) and its Q8_0 / Q4_0 quantizations (llama.cpp's quantizer)."""
    sys.path.insert(0, REFERENCE_DIR)
    from halformer_torch.gguf_llama import write_llama_gguf

    files = {"F16": os.path.join(work, f"{a.shape}-F16.gguf")}
    if a.write_f16:  # the child process below: the weights' memory never enters the harness
        st = random_state(s, a.seed)
        write_llama_gguf(a.write_f16, st, heads=s["heads"], kv_heads=s["kv_heads"], layers=s["layers"],
                         d_ff=s["d_ff"], context=a.context + 512, name=f"halformer bench {a.shape}")
        return files
    if not os.path.exists(files["F16"]):
        # In a child process: Linux carries a process's peak RSS over to the children it
        # starts, so a harness that had held the weights would report that peak for every engine.
        t0 = time.time()
        run([sys.executable, "-m", "halbench.llama_cpu", "--shape", a.shape, "--seed", str(a.seed), "--context",
             str(a.context), "--write-f16", files["F16"] + ".tmp"], cwd=os.path.dirname(os.path.dirname(__file__)))
        os.replace(files["F16"] + ".tmp", files["F16"])
        log(f"random {a.shape} weights -> {files['F16']} ({os.path.getsize(files['F16']) / 1e6:.0f} MB, "
            f"{time.time() - t0:.0f} s)")
    for q, ftype in LLAMA_FTYPES.items():  # every file, whichever --llama rows run: halformer reads them too
        files[q] = os.path.join(work, f"{a.shape}-{q}.gguf")
        if os.path.exists(files[q]):
            continue
        log(f"llama.cpp quantize -> {q}")
        code = ("import llama_cpp, sys; p = llama_cpp.llama_model_quantize_default_params(); "
                f"p.ftype = {ftype}; p.nthread = {a.threads}; "
                "sys.exit(llama_cpp.llama_model_quantize(sys.argv[1].encode(), sys.argv[2].encode(), p))")
        run([a.llama_python, "-c", code, files["F16"], files[q] + ".tmp"])
        os.replace(files[q] + ".tmp", files[q])
    return files


def gguf_step_bytes(path: str) -> int:
    """Bytes a llama.cpp decode step reads: every tensor but the token table (one row) --
    unless the output projection is tied to it (no output.weight: Qwen2-0.5B), when the
    table is that projection and every step reads it whole."""
    import gguf

    r = gguf.GGUFReader(path)
    tied = not any(t.name == "output.weight" for t in r.tensors)
    return sum(int(t.n_bytes) for t in r.tensors if tied or t.name != "token_embd.weight")


def halformer_step_bytes(s: Dict[str, Any], precision: str) -> int:
    """Weights a halformer decode step reads: the layers' linears at `precision` (int4:
    18 bytes per 32, q8_0 34), the output projection (q8_0 in int4 builds), norms in fp32."""
    d, f, kvd = s["d"], s["d_ff"], s["kv_heads"] * s["d"] // s["heads"]
    layer = 2 * d * d + 2 * kvd * d + 3 * d * f
    per = {"fp32": 4.0, "bf16": 2.0, "int8": 1.0, "q8_0": 34 / 32, "int4": 18 / 32}[precision]
    out = {"fp32": 4.0, "bf16": 2.0, "int8": 1.0, "q8_0": 34 / 32, "int4": 34 / 32}[precision]
    return int(s["layers"] * (layer * per + 2 * d * 4) + s["vocab"] * d * out + d * 4)


KV8 = "+kv8"  # a halformer precision's suffix: the int8 key/value cache


def cache_step_bytes(s: Dict[str, Any], precision: str, context: int) -> int:
    """Key/value cache bytes a decode step reads at `context` positions: every layer's keys
    and values, 2 bytes each (llama.cpp's default F16 cache; halformer's bf16 cache of its
    reduced-precision builds), 4 in halformer's fp32 builds; +kv8: 1 each and a 4-byte scale
    per head (halformer/kv_int8.h)."""
    hd, scale_bytes = s["d"] // s["heads"], 4  # halformer/kv_int8.h kKvInt8ScaleBytes
    row = hd + scale_bytes if precision.endswith(KV8) else hd * (4 if precision == "fp32" else 2)
    return s["layers"] * context * 2 * s["kv_heads"] * row


def halformer_row(a, cfg, files, s, source: str, precision: str, work: str, prompts: Dict[str, str]) -> Dict:
    from .__main__ import build_model

    name = f"{a.shape}-{source.lower()}"
    base = precision[: -len(KV8)] if precision.endswith(KV8) else precision
    spec = os.path.join(work, f"{name}.yaml")
    weights = os.path.join(work, f"{name}.safetensors")
    if not os.path.exists(spec):
        run([cfg["halformer"], "import", files[source], "-o", spec, "--weights-out", weights, "--force"])
    # The importer caps max_len at 4,096 and says to raise it for longer text: the
    # long-context rows need --context (checked on every run: an earlier run's spec may
    # have been made for a shorter one).
    with open(spec) as f:
        text = f.read()
    need = max(a.context, a.prompt_len) + max(a.new_tokens, 17) + 16
    m = re.search(r"^  max_len: (\d+)", text, re.M)
    if m and int(m.group(1)) < need:
        with open(spec, "w") as f:
            f.write(text[: m.start(1)] + str(need) + text[m.end(1):])
    model_work = os.path.join(work, name)
    if base != precision:  # the same spec with an int8 key/value cache, built apart
        spec_kv8, model_work = os.path.join(work, f"{name}-kv8.yaml"), model_work + "-kv8"
        with open(spec) as f, open(spec_kv8, "w") as g:
            g.write(f.read() + "\nprecision_overrides:\n  kv_cache: int8\n")
        spec = spec_kv8
    driver = build_model(cfg, spec, name, model_work, None, base)
    common = [driver, "--weights", weights, "--threads", str(a.threads)]
    r = json.loads(run(common + ["--src-file", prompts["short"], "--warmup", "1", "--repeat", str(a.rounds),
                                 "--new-tokens", str(a.new_tokens), "--prefill-len", str(a.prompt_len),
                                 "--prefill-repeat", str(a.rounds)]).stdout)
    row = {"engine": "halformer", "precision": precision, "file": source,
           "decode_ms": median([sum(d["step_ms"]) / len(d["step_ms"]) for d in r["decode"]]),
           "prompt_ms": median(r["prefill"].get("ms", [float("nan")])), "max_rss_bytes": r["max_rss_bytes"],
           "step_bytes": halformer_step_bytes(s, base)}
    if a.context > 0:
        # One warm-up: a cold first run (weights paged in, AMX state) once read 310 ms per step
        # where the warm binary takes 82 (int8, 2,048 positions).
        rc = json.loads(run(common + ["--src-file", prompts["long"], "--warmup", "1", "--repeat", "1",
                                      "--new-tokens", "17"]).stdout)
        row["context_decode_ms"] = median([sum(d["step_ms"]) / len(d["step_ms"]) for d in rc["decode"]])
        row["context_prompt_ms"] = median([d["prompt_ms"] for d in rc["decode"]])  # the prefill + first token
        row["max_rss_bytes"] = max(row["max_rss_bytes"], rc["max_rss_bytes"])
    from safetensors.numpy import load_file

    row["dump"] = {}
    for new, key in ((1, "last_logits"), (32, "greedy")):  # one new token: the prompt's last logits
        dump = os.path.join(work, f"{name}-{precision}-check{new}.safetensors")
        run(common + ["--src-file", prompts["check"], "--warmup", "0", "--repeat", "1", "--new-tokens", str(new),
                      "--dump", dump])
        row["dump"][key] = load_file(dump)[key].tolist()
    return row


def llama_row(a, files, source: str, work: str, prompt: List[int], checks: List[List[int]]) -> Dict:
    task = {"model": files[source], "threads": a.threads, "rounds": a.rounds, "prompt_len": a.prompt_len,
            "new_tokens": a.new_tokens, "context": a.context, "prompt": prompt,
            "check_prompts": checks, "check_new": 32,
            "no_extra_buffers": a.llama_no_extra_buffers}
    tp, rp = os.path.join(work, f"llama-{source}.task.json"), os.path.join(work, f"llama-{source}.result.json")
    write_json(tp, task)
    env = dict(os.environ, PYTHONPATH=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    run([a.llama_python, "-m", "halbench.peer_llamacpp", tp, rp], env=env)
    with open(rp) as f:
        res = json.load(f)
    if res["status"] != "ok":
        raise SystemExit(f"llama_cpu: llama.cpp on {source}: {res.get('reason')}")
    row = {"engine": "llama.cpp", "precision": source, "file": source, "decode_ms": median(res["decode_ms"]),
           "prompt_ms": median(res["prompt_ms"]), "max_rss_bytes": res["max_rss_bytes"],
           "step_bytes": gguf_step_bytes(files[source]), "checks": res.get("checks", []),
           "version": res.get("versions", {})}
    for key in ("context_decode_ms", "context_prompt_ms"):
        if res.get(key):
            row[key] = median(res[key])
    return row


def compare(h: Dict, l: Dict) -> str:
    """The last position's logits (max |diff| / max |llama.cpp's|) and greedy agreement."""
    worst, same, lens = 0.0, 0, []
    for i, c in enumerate(l["checks"]):
        ref = np.array(c["last_logits"], dtype=np.float64)
        got = np.array(h["dump"]["last_logits"][i], dtype=np.float64)
        worst = max(worst, float(np.max(np.abs(got - ref)) / max(1e-30, np.max(np.abs(ref)))))
        g = [t for t in h["dump"]["greedy"][i] if t >= 0]
        n = next((k for k, (x, y) in enumerate(zip(g, c["greedy"])) if x != y), min(len(g), len(c["greedy"])))
        lens.append(n)
        same += n == len(c["greedy"])
    return (f"{h['engine']} {h['precision']} vs llama.cpp {l['precision']}: last logits max diff {worst:.4f} of "
            f"their scale; greedy {same} of {len(l['checks'])} prompts identical for 32 tokens "
            f"(common prefixes {lens})")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="halbench.llama_cpu", description=__doc__.split("\n\n")[0])
    ap.add_argument("--shape", default="tinyllama", choices=sorted(SHAPES))
    ap.add_argument("--build-dir", default=os.path.join(ROOT, "build"))
    ap.add_argument("--work", default="")
    ap.add_argument("--out", default="")
    ap.add_argument("--llama-python", default=os.path.join(ROOT, "bench", ".venv", "bin", "python"))
    ap.add_argument("--llama-no-extra-buffers", action="store_true",
                    help="llama.cpp without its weight repacking (use_extra_bufts false): needed where its AMX "
                         "repacking dies of SIGILL (llama-cpp-python 0.3.36 built natively on Sapphire Rapids)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--prompt-len", type=int, default=512)
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--context", type=int, default=4096)
    ap.add_argument("--halformer", default="int4:Q4_0,q8_0:Q8_0,bf16:F16,fp32:F16",
                    help="PRECISION:FILE pairs (FILE one of F16, Q8_0, Q4_0)")
    ap.add_argument("--llama", default="F16,Q8_0,Q4_0", help="the files llama.cpp runs on")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--write-f16", default="", help=argparse.SUPPRESS)  # internal: the child that writes the F16 file
    a = ap.parse_args(argv)
    s = SHAPES[a.shape]
    if a.write_f16:
        make_files(a, s, "")
        return 0
    with open(os.path.join(a.build_dir, "bench", "bench_config.json")) as f:
        cfg = json.load(f)
    work = os.path.abspath(a.work or os.path.join(ROOT, "bench", ".cache", f"llama-{a.shape}"))
    out = os.path.abspath(a.out or os.path.join(ROOT, "bench", "results", time.strftime("%Y-%m-%d_%H%M%S-llama")))
    os.makedirs(work, exist_ok=True)
    os.makedirs(out, exist_ok=True)
    from .__main__ import run_peak

    peak = run_peak(cfg, False, a.threads)
    log(f"measured read bandwidth {peak['gbs']:.1f} GB/s ({a.threads} threads)")
    files = make_files(a, s, work)
    rng = np.random.default_rng(a.seed + 1)
    prompt = [int(t) for t in rng.integers(3, s["vocab"], max(a.prompt_len, 16))]
    checks = [[int(t) for t in rng.integers(3, s["vocab"], n)] for n in (5, 9, 16, 24, 40)]
    prompts = {}
    for key, rows in {"short": [prompt[:16]], "check": checks,
                      "long": [(prompt * (a.context // len(prompt) + 1))[: a.context]]}.items():
        prompts[key] = os.path.join(work, f"prompt-{key}.txt")
        with open(prompts[key], "w") as f:
            f.write("".join(" ".join(map(str, r)) + "\n" for r in rows))
    rows = []
    for source in filter(None, a.llama.split(",")):
        log(f"llama.cpp on {source}")
        rows.append(llama_row(a, files, source, work, prompt, checks))
    for pair in a.halformer.split(","):
        precision, source = pair.split(":")
        log(f"halformer {precision} on {source}")
        rows.append(halformer_row(a, cfg, files, s, source, precision, work, prompts))
    lines = [f"{a.shape}: {s}; {a.threads} threads; read bandwidth {peak['gbs']:.1f} GB/s (halformer_peak, best)",
             "| engine | precision (file) | prompt %d tok/s | decode ms/token | tok/s | vs llama.cpp same file | "
             "bytes/step MB | bound ms | x bound | prompt %d s | decode@%d ms | x bound@%d | peak RSS GB |"
             % (a.prompt_len, a.context, a.context, a.context),
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    llama = {r["file"]: r for r in rows if r["engine"] == "llama.cpp"}
    for r in rows:
        bound = r["step_bytes"] / (peak["gbs"] * 1e9) * 1e3
        # At the long context the bound counts the cache too (weights + keys and values).
        long_bound = (r["step_bytes"] + cache_step_bytes(s, r["precision"], a.context)) / (peak["gbs"] * 1e9) * 1e3
        peer = llama.get(r["file"]) if r["engine"] == "halformer" else None  # absent: no ratio
        ratio = (f"decode {peer['decode_ms'] / r['decode_ms']:.2f}x, prompt {peer['prompt_ms'] / r['prompt_ms']:.2f}x"
                 if peer else "")
        lines.append(f"| {r['engine']} | {r['precision']} ({r['file']}) | {a.prompt_len / r['prompt_ms'] * 1e3:.1f} | "
                     f"{r['decode_ms']:.2f} | {1e3 / r['decode_ms']:.1f} | {ratio} | {r['step_bytes'] / 1e6:.0f} | "
                     f"{bound:.1f} | {r['decode_ms'] / bound:.2f} | {r.get('context_prompt_ms', float('nan')) / 1e3:.2f} | "
                     f"{r.get('context_decode_ms', float('nan')):.2f} | "
                     f"{r.get('context_decode_ms', float('nan')) / long_bound:.2f} | "
                     f"{r['max_rss_bytes'] / 1e9:.2f} |")
    for r in rows:
        if r["engine"] == "halformer" and r["file"] in llama:
            lines.append(compare(r, llama[r["file"]]))
    text = "\n".join(lines)
    print(text)
    with open(os.path.join(out, "llama_cpu.md"), "w") as f:
        f.write(text + "\n")
    write_json(os.path.join(out, "llama_cpu.json"), {"shape": a.shape, "peak": peak, "rows": rows})
    return 0


if __name__ == "__main__":
    sys.exit(main())
