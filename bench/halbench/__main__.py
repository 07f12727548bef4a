"""bench/run's harness: halformer vs PyTorch, ONNX Runtime and CTranslate2 on the same
weights and inputs (issue 6). Run it through bench/run (which picks the Python and builds
the native pieces); `python -m halbench --help` lists every option.

Flow (each step prints a progress line):
  1. settings, machine info; the build's bench_config.json (tools made by bench/CMakeLists.txt)
  2. weights: --weights, else the spec's committed <spec>.safetensors, else seeded random
     weights (halbench.make_weights), cached in the work directory
  3. inputs: B x S random non-special token ids (seeded); batch 1 is row 0 of the largest batch
  4. `halformer build SPEC` into the work directory, then the model driver
     (cpp/model_bench.cpp) compiled against the model's library
  5. machine peak: halformer_peak (FMA GFLOP/s, read GB/s)
  6. halformer: per batch, the driver's timed encoder / decode runs + a dump of its
     outputs (encoder output, greedy tokens): the reference the peers are checked against
  7. peers, one process each (halbench.peer_torch, peer_ort, peer_ct2): check, then time
  8. matmul shapes in isolation: halformer_matmul_bench, then halbench.peer_matmul
  9. one table on stdout; results.json, results.png, table.txt in the output directory

Design decisions
* Everything is timed inside the process that runs it (C++ steady_clock /
  time.perf_counter around the call), never by wall-clocking a subprocess, so process
  start, weight loading and graph compilation are excluded for every system alike.
* Medians over repeated runs after warm-up; per-step decode time is the mean step of a
  fixed-length decode (total / steps) for every system; see docs/bench.md.
* Same threads everywhere (--threads, default 2): halformer via halide_set_num_threads,
  torch.set_num_threads, ORT intra_op_num_threads, CT2 intra_threads, and
  OMP/MKL/OPENBLAS_NUM_THREADS in every child's environment.
"""
from __future__ import annotations

import argparse
import datetime
import hashlib
import json
import os
import platform
import random
import subprocess
import sys
import time
from typing import Any, Dict, List, Optional

from . import report
from .common import (BENCH_DIR, ROOT, load_spec_light, log, median, model_descriptor_args, read_json, write_json)

PEERS = [("halformer-python", "halbench.peer_halformer_python", {}), ("pytorch", "halbench.peer_torch", {}),
         ("onnxruntime", "halbench.peer_ort", {}), ("ctranslate2", "halbench.peer_ct2", {})]
# Peers at a reduced precision (--precision), each a system of its own in the table.
REDUCED_PEERS = {"int8": [("ctranslate2-int8", "halbench.peer_ct2", {"ct2_compute_type": "int8_float32"}),
                          ("onnxruntime-int8", "halbench.peer_ort", {"ort_quantize": "int8"})],
                 "bf16": [("pytorch-bf16", "halbench.peer_torch", {"torch_dtype": "bfloat16"}),
                          ("ctranslate2-bf16", "halbench.peer_ct2", {"ct2_compute_type": "bfloat16"})]}


def parse_args(argv=None):
    ap = argparse.ArgumentParser(prog="bench/run", description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true",
                    help="tiny model (models/reverse-tiny.yaml), short inputs, few repetitions; "
                         "peers that are not installed are skipped (the smoke test's mode)")
    ap.add_argument("--spec", help="model spec (default models/transformer-base.yaml; --quick: models/reverse-tiny.yaml)")
    ap.add_argument("--weights", help="safetensors weights (default: <spec>.safetensors if committed, "
                                      "else seeded random weights)")
    ap.add_argument("--out", help="results directory (default bench/results/<date-time>/)")
    ap.add_argument("--work", help="cache: built model, weights, ONNX and CT2 models "
                                   "(default bench/.cache/<spec name>/)")
    ap.add_argument("--model-dir", help="an already built model directory (DIR/lib<name>.a from `halformer build "
                                        "SPEC -o DIR`) to benchmark instead of building the spec")
    ap.add_argument("--build-dir", default=os.path.join(ROOT, "build"), help="halformer's CMake build directory")
    ap.add_argument("--threads", type=int, default=2, help="threads for every system (default 2)")
    ap.add_argument("--batches", default="1,8", help="comma-separated batch sizes (default 1,8)")
    ap.add_argument("--src-len", type=int, help="source length (default 128; --quick 16)")
    ap.add_argument("--new-tokens", type=int, help="greedy decode length (default 64; --quick 8)")
    ap.add_argument("--warmup", type=int, help="warm-up runs per scenario (default 2; --quick 1)")
    ap.add_argument("--repeat", type=int, help="timed encoder runs (default 10; --quick 3); decode: half, >= 3")
    ap.add_argument("--rounds", type=int, help="run halformer and every peer this many times in turn, "
                    "splitting the repetitions between rounds, so that a burst of load from other processes "
                    "hits all systems alike (default 2; --quick 1)")
    ap.add_argument("--peers", default="halformer-python,pytorch,onnxruntime,ctranslate2",
                    help="comma-separated subset of halformer-python,pytorch,onnxruntime,ctranslate2 ('' for none)")
    ap.add_argument("--precision", default="fp32",
                    help="comma-separated precisions, fp32 first (the reference the others are checked against): "
                         "fp32,int8 adds halformer built with --precision int8 ('halformer-int8') and CTranslate2 "
                         "int8_float32 ('ctranslate2-int8') and ONNX Runtime with dynamic int8 quantization "
                         "('onnxruntime-int8') to the same run; bf16 adds 'halformer-bf16', PyTorch "
                         "bf16 ('pytorch-bf16') and CTranslate2 bfloat16 ('ctranslate2-bf16', where the CPU has "
                         "it) (default fp32)")
    ap.add_argument("--no-matmul", action="store_true", help="skip the matmul-in-isolation scenarios")
    ap.add_argument("--no-profile", action="store_true",
                    help="skip the HALFORMER_PROFILE=1 run that saves halformer's per-kernel table")
    ap.add_argument("--seed", type=int, default=0, help="seed of the random weights and inputs (default 0)")
    ap.add_argument("--wait-quiet", type=float, default=0, metavar="SECONDS",
                    help="before measuring, wait up to SECONDS for the 1-minute load average to drop below "
                         "0.5 (a shared machine); the run goes ahead anyway after that, with a note")
    ap.add_argument("--validate", action="store_true",
                    help="after the run, assert the results JSON is complete and sane (exit 1 if not)")
    ap.add_argument("--python-env", default="", help=argparse.SUPPRESS)  # set by bench/run: which venv
    return ap.parse_args(argv)


# --------------------------------------------------------------------------------------
# machine and provenance

def machine_info() -> Dict[str, Any]:
    info: Dict[str, Any] = {"hostname": platform.node(), "kernel": platform.release(),
                            "cores_online": os.cpu_count(), "python": platform.python_version()}
    try:
        with open("/proc/cpuinfo") as f:
            text = f.read()
        for line in text.splitlines():
            if line.startswith("model name") and "cpu" not in info:
                info["cpu"] = line.split(":", 1)[1].strip()
            if line.startswith("flags") and "flags" not in info:
                flags = set(line.split(":", 1)[1].split())
                info["flags"] = sorted(f for f in flags if f.startswith(("avx", "fma", "amx")))
    except OSError:
        pass
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemTotal"):
                    info["mem_gib"] = round(int(line.split()[1]) / 2**20, 1)
    except OSError:
        pass
    try:
        info["loadavg_start"] = list(os.getloadavg())
    except OSError:
        pass
    return info


def git_info() -> Dict[str, Any]:
    """Commit of the working tree, read from .git directly (no git binary needed)."""
    out: Dict[str, Any] = {"commit": None, "branch": None}
    git = os.path.join(ROOT, ".git")
    try:
        if os.path.isfile(git):  # worktree: "gitdir: PATH"
            with open(git) as f:
                git = f.read().split(":", 1)[1].strip()
        with open(os.path.join(git, "HEAD")) as f:
            head = f.read().strip()
        if head.startswith("ref:"):
            ref = head.split(None, 1)[1]
            out["branch"] = ref.rsplit("/", 1)[-1]
            path = os.path.join(git, ref)
            if os.path.exists(path):
                with open(path) as f:
                    out["commit"] = f.read().strip()
            else:
                with open(os.path.join(git, "packed-refs")) as f:
                    for line in f:
                        if line.strip().endswith(" " + ref):
                            out["commit"] = line.split()[0]
        else:
            out["commit"] = head
    except (OSError, IndexError):
        pass
    return out


def wait_quiet(limit_s: float) -> None:
    t0 = time.time()
    while os.getloadavg()[0] >= 0.5 and time.time() - t0 < limit_s:
        log(f"waiting for a quiet machine: load average {os.getloadavg()[0]:.2f} "
            f"({time.time() - t0:.0f} / {limit_s:.0f} s)")
        time.sleep(30)
    log(f"load average {os.getloadavg()[0]:.2f}: starting")


def child_env(threads: int) -> Dict[str, str]:
    env = dict(os.environ)
    for k in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        env[k] = str(threads)
    env["PYTHONPATH"] = BENCH_DIR + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env.pop("HALFORMER_PROFILE", None)
    return env


def run(cmd: List[str], env=None, timeout=None, capture=True) -> subprocess.CompletedProcess:
    p = subprocess.run(cmd, env=env, timeout=timeout, text=True,
                       stdout=subprocess.PIPE if capture else None, stderr=subprocess.PIPE if capture else None)
    if p.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd[:3])}... exited {p.returncode}:\n{(p.stdout or '')[-2000:]}"
                           f"{(p.stderr or '')[-2000:]}")
    return p


# --------------------------------------------------------------------------------------
# steps

def resolve_weights(args, spec_path: str, name: str, work: str, env) -> str:
    if args.weights:
        return os.path.abspath(args.weights)
    sibling = os.path.splitext(spec_path)[0] + ".safetensors"
    if os.path.exists(sibling):
        log(f"weights: {os.path.relpath(sibling, ROOT)} (committed with the spec)")
        return sibling
    with open(spec_path, "rb") as f:
        digest = hashlib.sha256(f.read()).hexdigest()[:12]
    path = os.path.join(work, f"weights-{digest}-seed{args.seed}.safetensors")
    if not os.path.exists(path):
        log(f"weights: generating seeded random weights for {name} (seed {args.seed})")
        run([sys.executable, "-m", "halbench.make_weights", spec_path, path, "--seed", str(args.seed)],
            env=env, capture=False)
    else:
        log(f"weights: {path} (cached)")
    return path


def make_inputs(work: str, spec: Dict, batches: List[int], src_len: int, seed: int) -> Dict[str, str]:
    rng = random.Random(seed + 1000)
    special = {spec["pad"], spec["bos"], spec["eos"]}
    allowed = [t for t in range(spec["sizes"]["src_vocab"]) if t not in special]
    rows = [[rng.choice(allowed) for _ in range(src_len)] for _ in range(max(batches))]
    out = {}
    os.makedirs(os.path.join(work, "inputs"), exist_ok=True)
    for b in batches:
        path = os.path.join(work, "inputs", f"src_b{b}_s{src_len}_seed{seed}.txt")
        with open(path, "w") as f:
            for r in rows[:b]:
                f.write(" ".join(map(str, r)) + "\n")
        out[str(b)] = path
    return out


def quantize_weights(cfg, spec_path: str, weights: str, work: str, precision: str) -> str:
    out = os.path.join(work, f"weights-{precision}.safetensors")
    t0 = time.time()
    run([cfg["halformer"], "quantize", spec_path, weights, "--precision", precision, "-o", out, "--force"])
    log(f"halformer quantize --precision {precision}: {os.path.getsize(out) / 1e6:.1f} MB "
        f"({os.path.getsize(out) / os.path.getsize(weights):.2f} x the fp32 file, {time.time() - t0:.1f} s)")
    return out


def build_model(cfg, spec_path: str, name: str, work: str, model_dir: Optional[str], precision: str = "fp32") -> str:
    suffix = "" if precision == "fp32" else "-" + precision
    if model_dir:
        log(f"model: {model_dir} (--model-dir: not rebuilt)")
    else:
        model_dir = os.path.join(work, "model" + suffix)
        t0 = time.time()
        log(f"halformer build {os.path.relpath(spec_path, ROOT)} --precision {precision} -> {model_dir}")
        run([cfg["halformer"], "build", spec_path, "--precision", precision, "-o", model_dir])
        log(f"model built ({time.time() - t0:.1f} s)")
    lib = os.path.join(model_dir, f"lib{name}.a")
    if not os.path.exists(lib):
        raise SystemExit(f"bench: {lib} was not produced by halformer build")
    driver = os.path.join(work, "halformer_model_bench" + suffix)
    lib = os.path.abspath(lib)
    src = os.path.join(BENCH_DIR, "cpp", "model_bench.cpp")
    if (not os.path.exists(driver) or os.path.getmtime(driver) < max(os.path.getmtime(lib), os.path.getmtime(src))):
        log("compiling the model driver (bench/cpp/model_bench.cpp)")
        run([cfg["cxx"], "-O2", "-std=c++17", src, "-I", os.path.join(ROOT, "runtime", "include"),
             *model_descriptor_args(os.path.abspath(model_dir), name), lib, "-lpthread", "-ldl", "-o", driver])
    return driver


def run_peak(cfg, quick: bool, threads: int) -> Dict[str, Any]:
    t_list = sorted({1, threads})
    args = [cfg["peak"], "--threads", ",".join(map(str, t_list))]
    args += ["--seconds", "0.05", "--samples", "2", "--bytes", str(64 << 20)] if quick else \
        ["--seconds", "0.3", "--samples", "7"]
    log("machine peak: FMA loop and streaming read (" + ", ".join(f"{t} thread(s)" for t in t_list) + ")")
    peak = json.loads(run(args).stdout)
    t = str(threads)
    peak["threads"] = threads
    # The denominators: best at `threads` threads, but never below the 1-thread best (more
    # threads cannot have less capability; a lower figure means another process took a core).
    peak["gflops"] = max(peak["fma_gflops"][t]["best"], peak["fma_gflops"]["1"]["best"])
    peak["gbs"] = max(peak["read_gbs"][t]["best"], peak["read_gbs"]["1"]["best"])
    if "int8_gops" in peak:  # the int8 kernels' instruction, the denominator of int8 rows
        peak["int8_peak_gops"] = max(peak["int8_gops"][t]["best"], peak["int8_gops"]["1"]["best"])
    if "bf16_gflops" in peak:  # vdpbf16ps (AVX-512 BF16 CPUs): the denominator of bf16 rows
        peak["bf16_peak_gflops"] = max(peak["bf16_gflops"][t]["best"], peak["bf16_gflops"]["1"]["best"])
    # AMX CPUs: tdpbusd / tdpbf16ps, the denominators of the int8 and bf16 encoder rows
    # (calls of more than 8 rows multiply in tiles; decode rows keep the vector peaks).
    for key in ("amx_int8_gops", "amx_bf16_gflops"):
        if key in peak:
            peak[key.replace("amx_", "amx_peak_")] = max(peak[key][t]["best"], peak[key]["1"]["best"])
    if peak["gflops"] > peak["fma_gflops"][t]["best"] or peak["gbs"] > peak["read_gbs"][t]["best"]:
        peak["note"] = (f"{threads}-thread measurement below the 1-thread one (machine busy): "
                        f"the 1-thread figure is used")
        log("peak: " + peak["note"])
    int8 = f", int8 {peak['int8_peak_gops']:.0f} GOP/s ({peak['int8_instruction']})" if "int8_peak_gops" in peak else ""
    if "bf16_peak_gflops" in peak:
        int8 += f", bf16 {peak['bf16_peak_gflops']:.0f} GFLOP/s ({peak['bf16_instruction']})"
    if "amx_peak_int8_gops" in peak:
        int8 += (f", AMX int8 {peak['amx_peak_int8_gops']:.0f} GOP/s (tdpbusd), "
                 f"bf16 {peak['amx_peak_bf16_gflops']:.0f} GFLOP/s (tdpbf16ps)")
    log(f"peak ({peak['isa']}): {peak['gflops']:.0f} GFLOP/s fp32{int8}, {peak['gbs']:.1f} GB/s read at {threads} threads "
        f"(1 thread: {peak['fma_gflops']['1']['best']:.0f} GFLOP/s, {peak['read_gbs']['1']['best']:.1f} GB/s)")
    return peak


def run_halformer(driver, weights, inputs, batches, st, out_dir, profile: bool, dump_outputs: bool = True,
                  system: str = "halformer") -> Dict[str, Any]:
    res: Dict[str, Any] = {"system": system, "status": "ok", "runs": {}, "dumps": {}, "profiles": {}}
    for b in batches:
        dump = os.path.join(st["work"], f"halformer_b{b}.safetensors")
        log(f"{system}: batch {b}: {st['warmup']} warm-up + {st['repeat_encoder']} encoder runs, "
            f"{st['warmup']} + {st['repeat_decode']} decodes of {st['new_tokens']} tokens")
        base = [driver, "--weights", weights, "--src-file", inputs[str(b)], "--threads", str(st["threads"]),
                "--warmup", str(st["warmup"]), "--repeat", str(st["repeat_encoder"]),
                "--new-tokens", str(st["new_tokens"])]
        if dump_outputs:
            # The outputs the peers are checked against, from a process of its own: a dump
            # also decodes while holding the encoder output, which would inflate the
            # encoder run's peak memory.
            run(base + ["--warmup", "1", "--repeat", "1", "--skip-encoder", "--skip-decode", "--dump", dump],
                env=child_env(st["threads"]))
        enc = json.loads(run(base + ["--skip-decode"], env=child_env(st["threads"])).stdout)
        base[base.index("--repeat") + 1] = str(st["repeat_decode"])
        dec = json.loads(run(base + ["--skip-encoder"], env=child_env(st["threads"])).stdout)
        enc["decode"] = dec["decode"]
        enc["max_rss_bytes_decode"] = dec["max_rss_bytes"]
        res["runs"][str(b)] = enc
        res["dumps"][str(b)] = dump
        steps = [len(r["step_ms"]) for r in dec["decode"]]
        log(f"{system}: b{b}: encoder median {median(enc['encoder_ms']):.3f} ms, decode step mean "
            f"{median([sum(r['step_ms']) / len(r['step_ms']) for r in dec['decode']]):.3f} ms ({steps[0]} steps)")
        if profile:
            # Per-kernel tables (HALFORMER_PROFILE=1), encoder and decode in separate processes
            # so that each table is about one scenario. Profiling adds a timer per kernel call.
            env = child_env(st["threads"])
            env["HALFORMER_PROFILE"] = "1"
            pe = run(base + ["--skip-decode", "--warmup", "1", "--repeat", "3"], env=env)
            pd = run(base + ["--skip-encoder", "--warmup", "1", "--repeat", "1"], env=env)
            path = os.path.join(out_dir, f"halformer_profile_b{b}.txt")
            with open(path, "w") as f:
                f.write(f"# HALFORMER_PROFILE=1, batch {b}, source length {st['src_len']}\n"
                        f"# encoder: 1 warm-up + 3 runs of Model::encode\n{pe.stderr}\n"
                        f"# decode: 1 warm-up + 1 greedy decode of {st['new_tokens']} tokens "
                        f"(includes its encoder + cross K/V, once per decode)\n{pd.stderr}")
            res["profiles"][str(b)] = os.path.basename(path)
    return res


def merge_halformer(into: Dict[str, Any], more: Dict[str, Any]) -> None:
    """Adds a later round's runs to the first round's."""
    for b, r in more["runs"].items():
        t = into["runs"][b]
        t["encoder_ms"] += r["encoder_ms"]
        t["decode"] += r["decode"]
        for k in ("max_rss_bytes", "max_rss_bytes_decode"):
            t[k] = max(t.get(k, 0), r.get(k, 0))


def merge_peer(a: Dict[str, Any], b: Dict[str, Any]) -> Dict[str, Any]:
    """One result from two rounds of a peer: samples pooled, a check passes only if it passed
    in every round, the worse status wins."""
    if b["status"] != "ok":
        return b
    checks = {(c["scenario"], c["batch"]): c for c in a["checks"]}
    for c in b["checks"]:
        k = (c["scenario"], c["batch"])
        if k not in checks or (checks[k]["ok"] and not c["ok"]):
            checks[k] = c
    timings = {(t["scenario"], t["batch"], t.get("system"), t.get("shape")): t for t in a["timings"]}
    for t in b["timings"]:
        k = (t["scenario"], t["batch"], t.get("system"), t.get("shape"))
        if k in timings:
            for key in ("samples_ms", "t1_ms", "tn_ms"):
                if key in t:
                    timings[k][key] = timings[k].get(key, []) + t[key]
        else:
            timings[k] = t
    out = dict(a)
    out["checks"] = list(checks.values())
    out["timings"] = list(timings.values())
    out["notes"] = a.get("notes", []) + [n for n in b.get("notes", []) if n not in a.get("notes", [])]
    return out


def run_peer(name: str, module: str, task: Dict, st: Dict, timeout: float) -> Dict[str, Any]:
    peer_dir = os.path.join(st["work"], "peers", name)
    os.makedirs(peer_dir, exist_ok=True)
    task = dict(task, peer_dir=peer_dir)
    task_path, result_path = os.path.join(peer_dir, "task.json"), os.path.join(peer_dir, "result.json")
    write_json(task_path, task)
    if os.path.exists(result_path):
        os.remove(result_path)
    log(f"{name}: starting (own process, {st['threads']} threads)")
    t0 = time.time()
    try:
        p = subprocess.run([sys.executable, "-m", module, task_path, result_path], env=child_env(st["threads"]),
                           timeout=timeout, text=True, stdout=subprocess.PIPE)
        if p.stdout.strip():
            sys.stderr.write(p.stdout)
    except subprocess.TimeoutExpired:
        return {"system": name, "status": "error", "reason": f"timed out after {timeout:.0f} s", "checks": [],
                "timings": [], "versions": {}, "notes": []}
    if not os.path.exists(result_path):
        return {"system": name, "status": "error", "reason": f"crashed (exit {p.returncode}) before writing a result",
                "checks": [], "timings": [], "versions": {}, "notes": []}
    r = read_json(result_path)
    log(f"{name}: {r['status']}{': ' + r['reason'] if r.get('reason') else ''} ({time.time() - t0:.0f} s)")
    return r


def matmul_shapes(sz: Dict[str, int], src_len: int, batches: List[int]) -> List[str]:
    d, f, v = sz["d_model"], sz["d_ff"], sz["tgt_vocab"]
    shapes = [f"{src_len}x{d}x{f}", f"{src_len}x{f}x{d}", f"{src_len}x{d}x{3 * d}"]
    for m in sorted(set(batches)):
        shapes += [f"{m}x{d}x{f}", f"{m}x{f}x{d}", f"{m}x{d}x{v}"]
    return list(dict.fromkeys(shapes))


def run_matmul(cfg, st, shapes: List[str]) -> Dict[str, Any]:
    avail = set(run([cfg["matmul_bench"], "--list"]).stdout.split())
    have = [s for s in shapes if s.split("x", 1)[1] in avail]
    missing = [s for s in shapes if s not in have]
    out: Dict[str, Any] = {"halformer": [], "missing": missing, "peers": None}
    if missing:
        log(f"matmul: no halformer kernel compiled for {', '.join(missing)} (bench/CMakeLists.txt lists the K x N pairs)")
    q = st["quick"]
    common = ["--threads", str(st["threads"]), "--samples", "3" if q else "15", "--min-ms", "2" if q else "20",
              "--cold-bytes", str(int(16e6 if q else 1e8))]
    if have:
        log(f"matmul: halformer linear kernels, {len(have)} shapes: {', '.join(have)}")
        p = subprocess.run([cfg["matmul_bench"], "--shapes", ",".join(have)] + common, text=True,
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=child_env(st["threads"]))
        out["halformer"] = [json.loads(line) for line in p.stdout.splitlines() if line.strip()]
        if p.returncode != 0:
            out["halformer_error"] = p.stderr.strip()[-2000:]
            log(f"matmul: halformer_matmul_bench failed: {out['halformer_error']}")
        for r in out["halformer"]:
            if "median_ms" in r:
                log(f"matmul: halformer {r['shape']}: {r['median_ms']:.4f} ms")
    task = {"shapes": shapes, "threads": st["threads"], "samples": 3 if q else 15, "min_ms": 2 if q else 20,
            "cold_bytes": 16e6 if q else 1e8}
    out["peers"] = run_peer("matmul-peers", "halbench.peer_matmul", task, st, timeout=900)
    return out


# --------------------------------------------------------------------------------------

def main(argv=None) -> int:
    args = parse_args(argv)
    cfg_path = os.path.join(args.build_dir, "bench", "bench_config.json")
    if not os.path.exists(cfg_path):
        raise SystemExit(f"bench: {cfg_path} not found: configure and build halformer first "
                         f"(cmake --preset default && cmake --build build)")
    cfg = read_json(cfg_path)
    spec_path = os.path.abspath(args.spec or os.path.join(
        ROOT, "models", "reverse-tiny.yaml" if args.quick else "transformer-base.yaml"))
    spec = load_spec_light(spec_path)
    sz, name = spec["sizes"], spec["name"]
    q = args.quick
    batches = sorted({int(b) for b in args.batches.split(",") if b.strip()})
    src_len = args.src_len or min(16 if q else 128, sz["max_len"])
    new_tokens = args.new_tokens or min(8 if q else 64, sz["max_len"])
    if src_len > sz["max_len"] or new_tokens > sz["max_len"]:
        raise SystemExit(f"bench: source length {src_len} / new tokens {new_tokens} exceed sizes.max_len {sz['max_len']}")
    warmup = args.warmup if args.warmup is not None else (1 if q else 2)
    rep_enc = args.repeat or (3 if q else 10)
    rep_dec = max(3, rep_enc // 2)
    stamp = datetime.datetime.now().strftime("%Y-%m-%d_%H%M%S")
    out_dir = os.path.abspath(args.out or os.path.join(BENCH_DIR, "results", stamp))
    work = os.path.abspath(args.work or os.path.join(BENCH_DIR, ".cache", name))
    os.makedirs(out_dir, exist_ok=True)
    os.makedirs(work, exist_ok=True)
    st = {"quick": q, "threads": args.threads, "batches": batches, "src_len": src_len, "new_tokens": new_tokens,
          "warmup": warmup, "repeat_encoder": rep_enc, "repeat_decode": rep_dec, "work": work, "seed": args.seed}
    if args.wait_quiet > 0:
        wait_quiet(args.wait_quiet)
    machine = machine_info()
    log(f"{'quick' if q else 'full'} run: {name} ({os.path.relpath(spec_path, ROOT)}), batches {batches}, "
        f"source length {src_len}, {new_tokens} new tokens, {args.threads} threads, warm-up {warmup}, "
        f"repeats {rep_enc} (encoder) / {rep_dec} (decode)")
    log(f"machine: {machine.get('cpu')}, {machine.get('cores_online')} cores, load average "
        f"{machine.get('loadavg_start', ['?'])[0]:.2f} -> results in {out_dir}")
    if machine.get("loadavg_start", [0])[0] > 0.5:
        log("note: the machine is busy (load average > 0.5): timings will be noisy; ratios within this run "
            "remain comparable")
    if spec["schedule"]:
        log("note: the spec has schedule overrides; the matmul-in-isolation kernels use the generator defaults")
    env = child_env(args.threads)
    t_start = time.time()

    weights = resolve_weights(args, spec_path, name, work, env)
    inputs = make_inputs(work, spec, batches, src_len, args.seed)
    precisions = [p.strip() for p in args.precision.split(",") if p.strip()]
    if not precisions or precisions[0] != "fp32" or not set(precisions) <= {"fp32", "int8", "bf16"}:
        raise SystemExit(f"bench: --precision {args.precision!r}: give fp32 first, then int8 and/or bf16 "
                         f"(e.g. fp32,int8,bf16)")
    if len(precisions) > 1 and args.model_dir:
        raise SystemExit("bench: --precision with more than fp32 builds the model itself; drop --model-dir")
    driver = build_model(cfg, spec_path, name, work, args.model_dir and os.path.abspath(args.model_dir))
    reduced = {p: build_model(cfg, spec_path, name, work, None, p) for p in precisions[1:]}
    # Reduced-precision builds read their weights as deployed: `halformer quantize`'s file
    # (the same outputs as the fp32 file, docs/precision.md), rewritten every run.
    quantized = {p: quantize_weights(cfg, spec_path, weights, work, p) for p in precisions[1:]}
    peak = run_peak(cfg, q, args.threads)
    rounds = max(1, args.rounds or (1 if q else 2))
    if rounds > 1:
        st["repeat_encoder"] = max(2, -(-rep_enc // rounds))
        st["repeat_decode"] = max(2, -(-rep_dec // rounds))
        log(f"{rounds} rounds (halformer, then each peer, in turn): {st['repeat_encoder']} encoder runs and "
            f"{st['repeat_decode']} decodes per system per round")
    st["rounds"] = rounds
    hal = run_halformer(driver, weights, inputs, batches, st, out_dir, profile=not (q or args.no_profile))
    # The same model at reduced precision, as systems of their own (checked against fp32).
    variants = {p: run_halformer(d, quantized[p], inputs, batches, st, out_dir, profile=False, dump_outputs=False,
                                 system="halformer-" + p) for p, d in reduced.items()}

    task = {"spec": spec_path, "weights": weights, "work": work, "threads": args.threads, "batches": batches,
            "scenarios": ["encoder", "decode"], "new_tokens": new_tokens, "src_len": src_len,
            "warmup": warmup, "repeat_encoder": st["repeat_encoder"], "repeat_decode": st["repeat_decode"],
            "pad": spec["pad"], "bos": spec["bos"], "eos": spec["eos"], "sizes": sz,
            "inputs": {str(b): {"src": inputs[str(b)], "reference": hal["dumps"][str(b)]} for b in batches},
            # halformer-python: the same built model, through build/python's package.
            "model_dir": os.path.abspath(args.model_dir) if args.model_dir else os.path.join(work, "model"),
            "python_path": os.path.join(os.path.dirname(os.path.dirname(cfg["halformer"])), "python")}
    wanted = [p for p in args.peers.split(",") if p.strip()]
    peers: Dict[str, Dict[str, Any]] = {}
    for rnd in range(rounds):
        if rnd:
            log(f"round {rnd + 1}/{rounds}")
            merge_halformer(hal, run_halformer(driver, weights, inputs, batches, st, out_dir, profile=False,
                                               dump_outputs=False))
            for p, d in reduced.items():
                merge_halformer(variants[p], run_halformer(d, quantized[p], inputs, batches, st, out_dir,
                                                           profile=False, dump_outputs=False,
                                                           system="halformer-" + p))
        for pname, module, extra in PEERS + [v for p in precisions[1:] for v in REDUCED_PEERS[p]]:
            if pname not in wanted and pname.rsplit("-", 1)[0] not in wanted:
                continue
            if pname in peers and peers[pname]["status"] != "ok":
                continue
            r = run_peer(pname, module, dict(task, system=pname, **extra), st, timeout=600 if q else 3600)
            peers[pname] = merge_peer(peers[pname], r) if pname in peers else r
    peers = list(peers.values())

    matmul = None
    if not args.no_matmul:
        matmul = run_matmul(cfg, st, matmul_shapes(sz, src_len, batches))

    try:
        machine["loadavg_end"] = list(os.getloadavg())
    except OSError:
        pass
    weights_bytes = os.path.getsize(weights)
    results = report.assemble(
        spec=spec, spec_path=os.path.relpath(spec_path, ROOT), weights=weights, weights_bytes=weights_bytes,
        settings={k: v for k, v in st.items() if k != "work"}, machine=machine, git=git_info(), peak=peak,
        halformer=hal, halformer_variants=variants, peers=peers, matmul=matmul, cfg=cfg, python_env=args.python_env,
        elapsed_s=time.time() - t_start)
    write_json(os.path.join(out_dir, "results.json"), results)
    table = report.table(results)
    with open(os.path.join(out_dir, "table.txt"), "w") as f:
        f.write(table + "\n")
    chart = report.chart(results, os.path.join(out_dir, "results.png"))
    if chart:
        results["chart"] = os.path.basename(chart)
        write_json(os.path.join(out_dir, "results.json"), results)
    print(table)
    log(f"done in {time.time() - t_start:.0f} s: {out_dir}/results.json" + (", results.png" if chart else
                                                                            " (no chart: matplotlib not installed)"))
    if args.validate:
        from .validate import validate

        problems = validate(os.path.join(out_dir, "results.json"))
        if problems:
            for p in problems:
                log(f"validate: FAIL: {p}")
            return 1
        log("validate: results.json is complete and sane")
    return 0


if __name__ == "__main__":
    sys.exit(main())
