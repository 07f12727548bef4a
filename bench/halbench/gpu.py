"""halformer's CUDA build against PyTorch on the same NVIDIA GPU, same weights.

    python3 -m halbench.gpu --spec SPEC --model-bench [NAME=]BIN [--model-bench ...] --out DIR [--quick]

Runs on a machine with a GPU (tools/gpu/run.sh calls it there); SPEC lists `cuda` in
its targets and BIN is bench/cpp/model_bench.cpp linked against that build's library.

* weights: seeded random weights made here (halbench.make_weights), so the 356 MB file
  never travels;
* peaks: a device-to-device copy (bytes read + written) and an fp32 matmul with TF32 off
  (and on), through PyTorch: the denominators of every percentage;
* encoder, batch 1/8/32, length 128: halformer (Model::encode, output downloaded)
  against halformer_torch.Seq2Seq.encode (stock nn.TransformerEncoder) with TF32
  off, then on; medians of CUDA-event (PyTorch) or wall (halformer: every call ends with
  its result on the host) times;
* greedy decode per step with the KV cache, batch 1 and 8, 64 steps: halformer's
  Model::greedy against kv_model.KVSeq2Seq.step in eager mode;
* correctness: halformer's encoder output against PyTorch's fp32 (TF32 off) output,
  relative to the output scale, and the greedy tokens.

Prints a table last; writes gpu_bench.json under --out.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

from .common import REFERENCE_DIR

SRC_LEN = 128


def log(msg: str) -> None:
    print(f"[gpu-bench] {msg}", file=sys.stderr, flush=True)


def cuda_median_ms(fn, warmup: int, repeat: int, on_gpu: bool = True) -> float:
    """Median of CUDA-event times (host wall times with on_gpu false: --device cpu)."""
    import time

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


def halformer_run(bench: str, device: str, weights: str, src_file: str, *args: str) -> dict:
    cmd = [bench, "--weights", weights, "--src-file", src_file, "--device", device, "--threads", "4", *args]
    log(" ".join(cmd))
    out = subprocess.run(cmd, check=True, stdout=subprocess.PIPE, text=True).stdout
    return json.loads(out)


def parse_build(arg: str) -> tuple[str, str]:
    name, sep, path = arg.partition("=")
    return (name, path) if sep else ("halformer", arg)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--spec", required=True)
    ap.add_argument("--model-bench", required=True, action="append",
                    help="halformer_model_bench of a build: BIN, or NAME=BIN; repeat to compare builds "
                         "(schedule variants) side by side in one run")
    ap.add_argument("--out", required=True)
    ap.add_argument("--quick", action="store_true", help="fewer repeats, batch 1 and 8 only")
    ap.add_argument("--device", choices=["cuda", "cpu"], default="cuda",
                    help="cpu: a dry run of this script on a machine without a GPU (halformer's host "
                         "build and PyTorch on the CPU, small peaks, batch 1 only, few steps)")
    a = ap.parse_args()
    dev = a.device
    os.makedirs(a.out, exist_ok=True)
    sys.path.insert(0, REFERENCE_DIR)
    import torch
    from halformer_torch import load_spec
    from safetensors.torch import load_file

    from .kv_model import KVSeq2Seq, greedy_kv
    from .make_weights import make_weights
    from .peer_torch import decode_samples

    res = {"gpu": torch.cuda.get_device_name(0) if dev == "cuda" else "cpu (dry run)", "torch": torch.__version__,
           "cuda": torch.version.cuda, "driver": None}
    try:
        res["driver"] = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                                       stdout=subprocess.PIPE, text=True).stdout.strip()
    except OSError:
        pass
    spec = load_spec(a.spec)
    vocab = int(spec["sizes"]["src_vocab"])
    bos = int(spec["tokens"]["bos"])
    weights = os.path.join(a.out, "weights.safetensors")
    ref = make_weights(a.spec, weights, seed=0)
    state = load_file(weights)
    ref = ref.to(dev)
    kv = KVSeq2Seq(spec, state).eval().to(dev)

    log("peaks")
    dry = dev == "cpu"
    res["peaks"] = measure_peaks(torch, dev, small=dry)
    batches = [1] if dry else [1, 8] if a.quick else [1, 8, 32]
    reps = 2 if dry else 5 if a.quick else 20
    res["encoder"], res["decode"], res["checks"] = {}, {}, {}
    gen = torch.Generator().manual_seed(1)
    new_tokens = 4 if dry else 64
    builds = dict(parse_build(x) for x in a.model_bench)
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
        for name, bench in builds.items():
            dump = os.path.join(a.out, f"{name}_b{b}.safetensors")
            h = halformer_run(bench, dev, weights, src_file, "--skip-decode", "--warmup", "3", "--repeat", str(reps),
                              "--new-tokens", str(new_tokens), "--dump", dump)
            got[name] = load_file(dump)
            enc_ms[name] = statistics.median(h["encoder_ms"])
        with torch.inference_mode():
            for tf32 in (False, True):
                torch.backends.cuda.matmul.allow_tf32 = tf32
                torch.backends.cudnn.allow_tf32 = tf32
                key = "torch_tf32" if tf32 else "torch_fp32"
                enc_ms[key] = cuda_median_ms(lambda: ref.encode(src_cuda), 3, reps, on_gpu=not dry)
                if not tf32:
                    # The same work as a halformer call (Model::encode takes the ids from the
                    # host and returns the output there): ids uploaded, output downloaded.
                    enc_ms["torch_fp32_host"] = cuda_median_ms(lambda: ref.encode(src.to(dev)).cpu(), 3, reps,
                                                               on_gpu=not dry)
                    want = ref.encode(src_cuda).float().cpu()
                    scale = max(1.0, want.abs().max().item())
                    for name in builds:
                        err = (got[name]["encoder_output"] - want).abs().max().item()
                        res["checks"][f"{name}_encoder_b{b}"] = {"max_abs": err, "rel": err / scale,
                                                                "ok": err <= 1e-4 * scale}
            torch.backends.cuda.matmul.allow_tf32 = False
            torch.backends.cudnn.allow_tf32 = False
        flops = encoder_flops(spec, b, SRC_LEN)
        res["encoder"][str(b)] = {k: {"ms": v, "tflops": flops / v / 1e9} for k, v in enc_ms.items()}
        log(f"encoder b{b}: " + ", ".join(f"{k} {v:.3f} ms" for k, v in enc_ms.items()))
        if b > 8:
            continue
        # greedy decode per step, KV cache
        with torch.inference_mode():
            want_tokens, _ = greedy_kv(kv, src_cuda, new_tokens, bos)
            step_t = statistics.median(decode_samples(kv, src_cuda, new_tokens, bos, 1, 3 if a.quick else 5))
        want_tokens = torch.tensor(want_tokens)
        row = {"torch_eager": {"ms": step_t, "GBps": step_bytes / step_t / 1e6},
               "weight_bytes_per_step": step_bytes}
        for name, bench in builds.items():
            h = halformer_run(bench, dev, weights, src_file, "--skip-encoder", "--warmup", "2",
                              "--repeat", "3" if a.quick else "5", "--new-tokens", str(new_tokens))
            step_h = statistics.median(sum(r["step_ms"]) / len(r["step_ms"]) for r in h["decode"])
            steps_run = h["decode"][0]["steps"]
            got_tokens = got[name]["greedy"]
            same = bool((got_tokens[:, :steps_run] == want_tokens[:, :steps_run].to(got_tokens.dtype)).all())
            res["checks"][f"{name}_greedy_b{b}"] = {"identical": same, "steps": steps_run}
            row[name] = {"ms": step_h, "GBps": step_bytes / step_h / 1e6, "steps": steps_run}
        res["decode"][str(b)] = row
        log(f"decode b{b}: " + ", ".join(f"{k} {v['ms']:.3f} ms/step" for k, v in row.items() if isinstance(v, dict)))

    with open(os.path.join(a.out, "gpu_bench.json"), "w") as f:
        json.dump(res, f, indent=1)
    p = res["peaks"]
    print(f"\n{res['gpu']}, driver {res['driver']}, torch {res['torch']} (CUDA {res['cuda']})")
    print(f"measured: copy {p['copy_GBps']:.0f} GB/s, fp32 matmul {p['matmul_tflops_fp32']:.1f} TFLOP/s, "
          f"tf32 {p['matmul_tflops_tf32']:.1f} TFLOP/s")
    # halformer's times include the ids' upload and the output's download (its API returns
    # host tensors); "torch fp32" keeps both on the device, "+ host" does the same copies.
    print("| encoder s128 | build | halformer ms (TFLOP/s, % fp32 peak) | torch fp32 ms | ratio "
          "| torch fp32 + host copies ms | ratio | torch tf32 ms | ratio |")
    for b, r in res["encoder"].items():
        t, th, t32 = r["torch_fp32"], r["torch_fp32_host"], r["torch_tf32"]
        for name in builds:
            h = r[name]
            print(f"| b{b} | {name} | {h['ms']:.3f} ({h['tflops']:.2f}, {100 * h['tflops'] / p['matmul_tflops_fp32']:.0f}%) | "
                  f"{t['ms']:.3f} | {t['ms'] / h['ms']:.2f}x | {th['ms']:.3f} | {th['ms'] / h['ms']:.2f}x | "
                  f"{t32['ms']:.3f} | {t32['ms'] / h['ms']:.2f}x |")
    print("| decode step | build | halformer ms (GB/s, % copy) | torch eager ms (GB/s) | ratio |")
    for b, r in res["decode"].items():
        t = r["torch_eager"]
        for name in builds:
            h = r[name]
            print(f"| b{b} | {name} | {h['ms']:.3f} ({h['GBps']:.0f}, {100 * h['GBps'] / p['copy_GBps']:.0f}%) | "
                  f"{t['ms']:.3f} ({t['GBps']:.0f}) | {t['ms'] / h['ms']:.2f}x |")
    for k, v in res["checks"].items():
        print(f"check {k}: {v}")


if __name__ == "__main__":
    main()
