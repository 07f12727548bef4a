"""halformer's CUDA build against PyTorch on the same NVIDIA GPU, same weights.

    python3 -m halbench.gpu --spec SPEC --model-bench BUILD [--model-bench ...] --out DIR [--quick]
                            [--decoder-spec LLAMA_SPEC --decoder-bench BUILD [--decoder-bench ...]]
    BUILD = BIN | NAME=BIN | NAME=BIN@KEY=VAL[,KEY=VAL...]

Runs on a machine with a GPU (tools/gpu/run.sh calls it there); SPEC lists `cuda` in
its targets and BIN is bench/cpp/model_bench.cpp linked against that build's library.
`@KEY=VAL,...` sets environment variables for that build's process only, so one binary
can be timed under several run-time settings side by side (e.g.
`fp32-halide=/x/halformer_model_bench@HALFORMER_GPU_GEMM=halide`). A build whose NAME
contains "bf16" is held to bf16's tolerance (2e-2 of the output scale against PyTorch's
fp32 output, 1e-4 otherwise), and its greedy tokens are reported, not required, to match
(bf16 may flip a near-tie).

* weights: seeded random weights made here (halbench.make_weights), so the 356 MB file
  never travels;
* peaks: a device-to-device copy (bytes read + written) and matmuls in fp32 with TF32 off
  (and on) and in bf16, through PyTorch: the denominators of every percentage;
* encoder, batch 1/8/32, length 128: halformer (Model::encode, output downloaded)
  against halformer_torch.Seq2Seq.encode (stock nn.TransformerEncoder) with TF32
  off, then on; and against the same weights in bf16: kv_model.KVSeq2Seq(sdpa=True)
  (the same function as the reference, every attention through
  torch.nn.functional.scaled_dot_product_attention, with the padding mask as an additive
  bias, as halformer applies it) cast `.to(torch.bfloat16)`, eager and through
  torch.compile (default mode; compiled once per batch size at most, the first call
  timed apart; any failure is recorded in the JSON and shown as n/a); medians of
  CUDA-event (PyTorch) or wall (halformer: every call ends with its result on the host)
  times;
* greedy decode per step with the KV cache, batch 1 and 8, 64 steps: halformer's
  Model::greedy against kv_model.KVSeq2Seq.step in eager mode, fp32 and bf16 (SDPA);
* correctness: halformer's encoder output against PyTorch's fp32 (TF32 off) output,
  relative to the output scale, and the greedy tokens; PyTorch's bf16 output the same
  way, for scale;
* --decoder-spec (bench/gpu/tinyllama-1b.yaml): a Llama-style decoder-only model at
  batch 1, halformer against PyTorch bf16 eager with a KV cache (halbench.llama_gpu):
  median step of a greedy decode (prompt 32, 64 new tokens), weight bytes per step and
  GB/s, and the prefill of a 2048- and a 512-token prompt (--prefill-len; halformer's
  CUDA attention kernel launches with up to 635 keys at head size 64, so 2048 may be
  reported as an error: recorded, the other figures stand).

Ratios in the tables are PyTorch ms / halformer ms (above 1: halformer is faster).
Prints the tables last; writes gpu_bench.json under --out.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
import traceback
from typing import Dict, Tuple

from .common import REFERENCE_DIR

SRC_LEN = 128
FP32_REL_TOL = 1e-4  # of the output scale
BF16_REL_TOL = 2e-2
TF32_REL_TOL = 1e-3  # TF32 rounds each matmul input to 10 mantissa bits (spec `tf32: true`)


def log(msg: str) -> None:
    print(f"[gpu-bench] {msg}", file=sys.stderr, flush=True)


def cuda_median_ms(fn, warmup: int, repeat: int, on_gpu: bool = True) -> float:
    """Median of CUDA-event times (host wall times with on_gpu false: --device cpu)."""
    import torch

    for _ in range(warmup):
        fn()
    if on_gpu:
        torch.cuda.synchronize()
    times = []
    for _ in range(repeat):
        if not on_gpu:
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1e3)
            continue
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    return statistics.median(times)


def measure_peaks(torch, dev: str, small: bool) -> dict:
    n = 1 << (24 if small else 28)  # 1 GiB of fp32 on the GPU
    x = torch.empty(n, device=dev)
    y = torch.empty_like(x)
    copy_ms = cuda_median_ms(lambda: y.copy_(x), 3, 10, on_gpu=dev == "cuda")
    del x, y
    m = 1024 if small else 8192
    a = torch.randn(m, m, device=dev)
    b = torch.randn(m, m, device=dev)
    out = {"copy_GBps": 2 * 4 * n / copy_ms / 1e6}
    for tf32 in (False, True):
        torch.backends.cuda.matmul.allow_tf32 = tf32
        ms = cuda_median_ms(lambda: a @ b, 2, 5, on_gpu=dev == "cuda")
        out["matmul_tflops_tf32" if tf32 else "matmul_tflops_fp32"] = 2 * m**3 / ms / 1e9
    torch.backends.cuda.matmul.allow_tf32 = False
    mb = 256 if small else m  # bf16 matmuls are slow on a CPU without AMX
    a16, b16 = a[:mb, :mb].bfloat16(), b[:mb, :mb].bfloat16()
    ms = cuda_median_ms(lambda: a16 @ b16, 2, 5, on_gpu=dev == "cuda")
    out["matmul_tflops_bf16"] = 2 * mb**3 / ms / 1e9
    return out


def encoder_flops(spec, b: int, s: int) -> float:
    d, ff, layers = spec["sizes"]["d_model"], spec["sizes"]["d_ff"], spec["sizes"]["encoder_layers"]
    per_layer = 2 * b * s * (4 * d * d + 2 * d * ff) + 2 * 2 * b * s * s * d
    return layers * per_layer


def decode_step_bytes(state) -> int:
    """Weights a decoder step must read: every decoder layer's matrices and vectors, the
    output projection (the cross-attention K/V projections run once per source)."""
    total = 0
    for name, t in state.items():
        if name.startswith("transformer.decoder.") or name.startswith("generator."):
            total += t.numel() * t.element_size()
    for name, t in state.items():  # cross-attention K/V rows of in_proj: not per step
        if ".multihead_attn.in_proj_" in name and name.startswith("transformer.decoder."):
            total -= (t.numel() // 3) * 2 * t.element_size()
    return total


def halformer_run(bench: str, env: Dict[str, str], device: str, weights: str, src_file: str, *args: str) -> dict:
    cmd = [bench, "--weights", weights, "--src-file", src_file, "--device", device, "--threads", "4", *args]
    log(" ".join([f"{k}={v}" for k, v in env.items()] + cmd))
    out = subprocess.run(cmd, check=True, stdout=subprocess.PIPE, text=True, env={**os.environ, **env}).stdout
    return json.loads(out)


def parse_build(arg: str) -> Tuple[str, str, Dict[str, str]]:
    """BIN | NAME=BIN | NAME=BIN@KEY=VAL[,KEY=VAL...] -> (name, bin, extra environment).
    The name defaults to "halformer"; BIN may not contain '@'."""
    head, at, env_part = arg.partition("@")
    name, sep, path = head.partition("=")
    if not sep:
        name, path = "halformer", head
    if not name or not path:
        raise SystemExit(f"halbench.gpu: build {arg!r}: expected BIN, NAME=BIN or NAME=BIN@KEY=VAL[,KEY=VAL]")
    env = {}
    if at:
        for pair in filter(None, env_part.split(",")):
            key, eq, value = pair.partition("=")
            if not eq or not key:
                raise SystemExit(f"halbench.gpu: build {arg!r}: {pair!r} after '@' is not KEY=VAL")
            env[key] = value
    return name, path, env


def parse_builds(args) -> Dict[str, Tuple[str, Dict[str, str]]]:
    builds: Dict[str, Tuple[str, Dict[str, str]]] = {}
    for arg in args or []:
        name, path, env = parse_build(arg)
        if name in builds:
            raise SystemExit(f"halbench.gpu: two builds named {name!r}: give each its NAME=")
        builds[name] = (path, env)
    return builds


def is_bf16(name: str) -> bool:
    return "bf16" in name.lower()


def build_tolerance(name: str) -> float:
    """A build's bound against PyTorch fp32 (TF32 off), by its name."""
    return BF16_REL_TOL if is_bf16(name) else TF32_REL_TOL if "tf32" in name.lower() else FP32_REL_TOL


def first_difference(a, b):
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--spec", help="the encoder-decoder spec (transformer-base with a cuda target)")
    ap.add_argument("--model-bench", action="append",
                    help="halformer_model_bench of a build: BIN, NAME=BIN or NAME=BIN@KEY=VAL[,KEY=VAL] (extra "
                         "environment for its process); repeat to compare builds (schedule variants, run-time "
                         "settings) side by side in one run")
    ap.add_argument("--out", required=True)
    ap.add_argument("--quick", action="store_true", help="fewer repeats, batch 1 and 8 only")
    ap.add_argument("--device", choices=["cuda", "cpu"], default="cuda",
                    help="cpu: a dry run of this script on a machine without a GPU (halformer's host "
                         "build and PyTorch on the CPU, small peaks, batch 1 only, few steps)")
    ap.add_argument("--no-compile", action="store_true", help="no torch.compile rows (n/a)")
    ap.add_argument("--decoder-spec", help="a Llama-style decoder-only spec (bench/gpu/tinyllama-1b.yaml)")
    ap.add_argument("--decoder-bench", action="append",
                    help="halformer_model_bench of --decoder-spec's build (same syntax as --model-bench)")
    ap.add_argument("--decoder-prompt", type=int, default=32, help="prompt tokens of the timed decode")
    ap.add_argument("--decoder-new-tokens", type=int, default=64)
    ap.add_argument("--decoder-repeat", type=int, default=3, help="timed decodes (and prefills) per engine")
    ap.add_argument("--keep-weights", action="store_true",
                    help="keep --decoder-spec's random weights in --out (deleted after the run otherwise)")
    ap.add_argument("--prefill-len", default="2048,512",
                    help="prompt lengths of the timed prefills, comma-separated (each cut to max_len)")
    a = ap.parse_args()
    if bool(a.spec) != bool(a.model_bench):
        ap.error("--spec and --model-bench go together")
    if bool(a.decoder_spec) != bool(a.decoder_bench):
        ap.error("--decoder-spec and --decoder-bench go together")
    if not a.spec and not a.decoder_spec:
        ap.error("nothing to run: give --spec/--model-bench and/or --decoder-spec/--decoder-bench")
    builds = parse_builds(a.model_bench)
    dec_builds = parse_builds(a.decoder_bench)
    dev = a.device
    dry = dev == "cpu"
    os.makedirs(a.out, exist_ok=True)
    sys.path.insert(0, REFERENCE_DIR)
    import torch

    res = {"gpu": torch.cuda.get_device_name(0) if dev == "cuda" else "cpu (dry run)", "torch": torch.__version__,
           "cuda": torch.version.cuda, "driver": None,
           "builds": {k: {"bin": p, "env": e} for k, (p, e) in builds.items()},
           "decoder_builds": {k: {"bin": p, "env": e} for k, (p, e) in dec_builds.items()}}
    try:
        res["driver"] = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                                       stdout=subprocess.PIPE, text=True).stdout.strip()
    except OSError:
        pass
    log("peaks")
    res["peaks"] = measure_peaks(torch, dev, small=dry)
    res["checks"], res["errors"] = {}, {}
    # Each section on its own: one that fails is recorded (and makes the exit status 1),
    # the other still runs, and whatever was measured is written and printed.
    if a.spec:
        try:
            encoder_decoder(a, res, builds, torch)
        except Exception as e:  # noqa: BLE001
            traceback.print_exc()
            res["errors"]["encoder_decoder"] = f"{type(e).__name__}: {e}"
    if a.decoder_spec:
        from . import llama_gpu

        log(f"decoder: {a.decoder_spec}")
        try:
            res["decoder"] = llama_gpu.run(
                a.decoder_spec, dec_builds, a.out, dev, res["peaks"], halformer_run, prompt_len=a.decoder_prompt,
                new_tokens=4 if dry else a.decoder_new_tokens,
                prefill_lens=[int(x) for x in a.prefill_len.split(",") if x.strip()],
                repeat=2 if dry else a.decoder_repeat, keep_weights=a.keep_weights)
            for name in dec_builds:
                if "error" in res["decoder"].get(name, {}):
                    res["errors"][f"decoder build {name}"] = res["decoder"][name]["error"]
        except Exception as e:  # noqa: BLE001
            traceback.print_exc()
            res["errors"]["decoder"] = f"{type(e).__name__}: {e}"

    with open(os.path.join(a.out, "gpu_bench.json"), "w") as f:
        json.dump(res, f, indent=1)
    print_tables(res, builds, dec_builds)
    for k, v in res["errors"].items():
        print(f"error in the {k} section: {v}")
    if res["errors"]:
        sys.exit(1)


def encoder_decoder(a, res, builds, torch) -> None:
    """transformer-base: encoder rows per batch and precision, decode steps, checks."""
    from halformer_torch import load_spec
    from safetensors.torch import load_file

    from .kv_model import KVSeq2Seq, greedy_kv, sdpa_available
    from .make_weights import make_weights
    from .peer_torch import decode_samples

    dev = a.device
    dry = dev == "cpu"
    on_gpu = not dry
    spec = load_spec(a.spec)
    vocab = int(spec["sizes"]["src_vocab"])
    bos = int(spec["tokens"]["bos"])
    weights = os.path.join(a.out, "weights.safetensors")
    ref = make_weights(a.spec, weights, seed=0)
    state = load_file(weights)
    ref = ref.to(dev)
    kv = KVSeq2Seq(spec, state).eval().to(dev)
    # bf16: the same function with SDPA attention, cast whole (weights, positions table).
    ref16 = KVSeq2Seq(spec, state, sdpa=True).eval().to(dev).to(torch.bfloat16)
    res["torch_bf16"] = {"model": "kv_model.KVSeq2Seq(sdpa=True).to(torch.bfloat16)",
                         "sdpa": sdpa_available(),
                         "note": None if sdpa_available() else
                         f"torch {torch.__version__} has no scaled_dot_product_attention: matmul/softmax instead"}
    # torch.compile: the first call of each batch size compiles (timed apart, not in the median).
    compiled, tc = None, {"ok": False, "error": None, "first_call_s": {}, "mode": "default"}
    res["torch_compile"] = tc
    if a.no_compile:
        tc["error"] = "not run (--no-compile)"
    elif not hasattr(torch, "compile"):
        tc["error"] = f"torch {torch.__version__} has no torch.compile"
    else:
        try:
            compiled = torch.compile(ref16.encode)  # default mode; each new batch size may recompile once
            tc["ok"] = True
        except Exception as e:  # noqa: BLE001 - recorded, the row shows n/a
            tc["error"] = f"{type(e).__name__}: {e}"[:1000]

    batches = [1] if dry else [1, 8] if a.quick else [1, 8, 32]
    reps = 2 if dry else 5 if a.quick else 20
    res["encoder"], res["decode"] = {}, {}
    gen = torch.Generator().manual_seed(1)
    new_tokens = 4 if dry else 64
    step_bytes = decode_step_bytes(state)
    for b in batches:
        src = torch.randint(4, vocab, (b, SRC_LEN), generator=gen)
        src_file = os.path.join(a.out, f"src_b{b}.txt")
        with open(src_file, "w") as f:
            for row in src.tolist():
                f.write(" ".join(map(str, row)) + "\n")
        src_cuda = src.to(dev)
        # halformer: encoder (+ a dump of the first run's output and greedy tokens) per build
        enc_ms, got = {}, {}
        for name, (bench, env) in builds.items():
            dump = os.path.join(a.out, f"{name}_b{b}.safetensors")
            h = halformer_run(bench, env, dev, weights, src_file, "--skip-decode", "--warmup", "3", "--repeat",
                              str(reps), "--new-tokens", str(new_tokens), "--dump", dump)
            got[name] = load_file(dump)
            enc_ms[name] = statistics.median(h["encoder_ms"])
        with torch.inference_mode():
            for tf32 in (False, True):
                torch.backends.cuda.matmul.allow_tf32 = tf32
                torch.backends.cudnn.allow_tf32 = tf32
                key = "torch_tf32" if tf32 else "torch_fp32"
                enc_ms[key] = cuda_median_ms(lambda: ref.encode(src_cuda), 3, reps, on_gpu=on_gpu)
                if not tf32:
                    # The same work as a halformer call (Model::encode takes the ids from the
                    # host and returns the output there): ids uploaded, output downloaded.
                    enc_ms["torch_fp32_host"] = cuda_median_ms(lambda: ref.encode(src.to(dev)).cpu(), 3, reps,
                                                               on_gpu=on_gpu)
                    want = ref.encode(src_cuda).float().cpu()
                    scale = max(1.0, want.abs().max().item())

                    def check(key, out, tol, want=want, scale=scale):
                        err = (out - want).abs().max().item()
                        res["checks"][key] = {"max_abs": err, "rel": err / scale, "tol": tol, "ok": err <= tol * scale}
                        if key.startswith("torch_"):  # PyTorch's own bf16 error: for scale, never a failure
                            res["checks"][key]["informational"] = True

                    for name in builds:
                        check(f"{name}_encoder_b{b}", got[name]["encoder_output"],
                              build_tolerance(name))
            torch.backends.cuda.matmul.allow_tf32 = False
            torch.backends.cudnn.allow_tf32 = False
            # PyTorch bf16: eager, then compiled (its first call compiles: timed apart).
            enc_ms["torch_bf16"] = cuda_median_ms(lambda: ref16.encode(src_cuda), 3, reps, on_gpu=on_gpu)
            check(f"torch_bf16_encoder_b{b}", ref16.encode(src_cuda).float().cpu(), BF16_REL_TOL)
            if tc["ok"]:
                try:
                    t0 = time.perf_counter()
                    out16 = compiled(src_cuda)
                    if on_gpu:
                        torch.cuda.synchronize()
                    tc["first_call_s"][str(b)] = time.perf_counter() - t0
                    check(f"torch_bf16_compiled_encoder_b{b}", out16.float().cpu(), BF16_REL_TOL)
                    enc_ms["torch_bf16_compiled"] = cuda_median_ms(lambda: compiled(src_cuda), 3, reps, on_gpu=on_gpu)
                except Exception as e:  # noqa: BLE001 - recorded, this and later rows show n/a
                    tc["ok"], tc["error"] = False, f"{type(e).__name__} at batch {b}: {e}"[:1000]
                    log(f"torch.compile failed: {tc['error']}")
        flops = encoder_flops(spec, b, SRC_LEN)
        res["encoder"][str(b)] = {k: {"ms": v, "tflops": flops / v / 1e9} for k, v in enc_ms.items()}
        log(f"encoder b{b}: " + ", ".join(f"{k} {v:.3f} ms" for k, v in enc_ms.items()))
        if b > 8:
            continue
        # greedy decode per step, KV cache
        with torch.inference_mode():
            want_tokens, _ = greedy_kv(kv, src_cuda, new_tokens, bos)
            dec_reps = 3 if a.quick else 5
            step_t = statistics.median(decode_samples(kv, src_cuda, new_tokens, bos, 1, dec_reps))
            step_16 = statistics.median(decode_samples(ref16, src_cuda, new_tokens, bos, 1, dec_reps))
        want_tokens = torch.tensor(want_tokens)
        row = {"torch_eager": {"ms": step_t, "GBps": step_bytes / step_t / 1e6},
               "torch_bf16_eager": {"ms": step_16, "GBps": step_bytes / 2 / step_16 / 1e6},
               "weight_bytes_per_step": step_bytes}
        for name, (bench, env) in builds.items():
            h = halformer_run(bench, env, dev, weights, src_file, "--skip-encoder", "--warmup", "2",
                              "--repeat", str(dec_reps), "--new-tokens", str(new_tokens))
            step_h = statistics.median(sum(r["step_ms"]) / len(r["step_ms"]) for r in h["decode"])
            steps_run = h["decode"][0]["steps"]
            got_tokens = got[name]["greedy"]
            same = bool((got_tokens[:, :steps_run] == want_tokens[:, :steps_run].to(got_tokens.dtype)).all())
            check = {"identical": same, "steps": steps_run}
            if is_bf16(name):  # reported, not a failure: bf16 may flip a near-tie
                check["informational"] = True
                check["first_difference"] = [first_difference(g[:steps_run], w[:steps_run]) for g, w in
                                             zip(got_tokens.tolist(), want_tokens.tolist())]
            res["checks"][f"{name}_greedy_b{b}"] = check
            bytes_h = step_bytes / 2 if is_bf16(name) else step_bytes
            row[name] = {"ms": step_h, "GBps": bytes_h / step_h / 1e6, "steps": steps_run}
        res["decode"][str(b)] = row
        log(f"decode b{b}: " + ", ".join(f"{k} {v['ms']:.3f} ms/step" for k, v in row.items() if isinstance(v, dict)))


def _fmt(x, spec="{:.3f}"):
    return "n/a" if x is None else spec.format(x)


def print_tables(res, builds, dec_builds) -> None:
    p = res["peaks"]
    print(f"\n{res['gpu']}, driver {res['driver']}, torch {res['torch']} (CUDA {res['cuda']})")
    print(f"measured: copy {p['copy_GBps']:.0f} GB/s, fp32 matmul {p['matmul_tflops_fp32']:.1f} TFLOP/s, "
          f"tf32 {p['matmul_tflops_tf32']:.1f} TFLOP/s, bf16 {p['matmul_tflops_bf16']:.1f} TFLOP/s")
    if res.get("encoder"):
        tc = res.get("torch_compile") or {"ok": False, "error": "not reached", "first_call_s": {}}
        # halformer's times include the ids' upload and the output's download (its API returns
        # host tensors); "torch fp32" keeps both on the device, "+ host" does the same copies.
        print("| encoder s128 | PyTorch ms (TFLOP/s) | fp32 | fp32 + host copies | tf32 | bf16 eager (SDPA) "
              "| bf16 torch.compile |")
        for b, r in res["encoder"].items():
            cells = [f"{r[k]['ms']:.3f} ({r[k]['tflops']:.1f})" if k in r else "n/a"
                     for k in ("torch_fp32", "torch_fp32_host", "torch_tf32", "torch_bf16", "torch_bf16_compiled")]
            print(f"| b{b} | | " + " | ".join(cells) + " |")
        if tc["error"]:
            print(f"torch.compile: n/a ({tc['error']})")
        else:
            print("torch.compile first calls (s, compile included): " +
                  ", ".join(f"b{b} {s:.1f}" for b, s in tc["first_call_s"].items()))
        print("| encoder s128 | build | halformer ms (TFLOP/s, % of its precision's matmul peak) "
              "| vs torch fp32 | vs fp32 + host | vs tf32 | vs bf16 eager | vs bf16 compiled |")
        for b, r in res["encoder"].items():
            for name in builds:
                h = r[name]
                peak = p["matmul_tflops_bf16"] if is_bf16(name) else p["matmul_tflops_fp32"]
                ratios = [f"{r[k]['ms'] / h['ms']:.2f}x" if k in r else "n/a"
                          for k in ("torch_fp32", "torch_fp32_host", "torch_tf32", "torch_bf16", "torch_bf16_compiled")]
                print(f"| b{b} | {name} | {h['ms']:.3f} ({h['tflops']:.2f}, {100 * h['tflops'] / peak:.0f}% "
                      f"{'bf16' if is_bf16(name) else 'fp32'}) | " + " | ".join(ratios) + " |")
        print("| decode step | build | halformer ms (GB/s, % copy) | torch fp32 eager ms (GB/s) | ratio "
              "| torch bf16 eager ms (GB/s) | ratio |")
        for b, r in res["decode"].items():
            t, t16 = r["torch_eager"], r["torch_bf16_eager"]
            for name in builds:
                h = r[name]
                print(f"| b{b} | {name} | {h['ms']:.3f} ({h['GBps']:.0f}, {100 * h['GBps'] / p['copy_GBps']:.0f}%) | "
                      f"{t['ms']:.3f} ({t['GBps']:.0f}) | {t['ms'] / h['ms']:.2f}x | "
                      f"{t16['ms']:.3f} ({t16['GBps']:.0f}) | {t16['ms'] / h['ms']:.2f}x |")
    if res.get("decoder"):
        from .llama_gpu import print_table

        print_table(res["decoder"], dec_builds, p["copy_GBps"])
    failed = 0
    for k, v in res["checks"].items():
        bad = not v.get("informational") and (v.get("ok") is False or v.get("identical") is False)
        failed += bad
        print(f"check {k}: {'FAIL ' if bad else ''}{v}")
    dec = res.get("decoder") or {}
    for k, v in dec.get("checks", {}).items():  # torch_*: PyTorch bf16's own error, for scale
        bad = not k.startswith("torch_") and (v.get("ok") is False or v.get("last_logits", {}).get("ok") is False)
        failed += bad
        print(f"check {dec['spec']} {k}: {'FAIL ' if bad else ''}{v}")
    print(f"checks: {failed} failed")


if __name__ == "__main__":
    main()
