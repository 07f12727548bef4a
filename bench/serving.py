"""Serving throughput (issue 14; docs/serving.md "Batching and throughput"): halformer.serve under
Triton's own load generator (perf_analyzer: C++, asynchronous gRPC) against the Python API
called directly in one process at its best batch size, in the same run.

    bench/serving.py [--quick] [--threads 2] [--concurrency 32] [--out DIR] [--only minilm|decode]
                     [--settings 1:0,64:2000] [--batches 16,32] [--rounds 3]

Two workloads:
  minilm    all-minilm-l6-v2, kind embed_text: one sentence per request (3-15 words),
            sentences/s;
  decode    transformer-base (seeded random weights, bench/halbench/make_weights), kind
            generate: one source of 32 ids per request, greedy, max_new_tokens 32,
            sequences/s.
For each: the API alone at each batch size, then in each of --rounds rounds the server with
batching off and with dynamic batching, saturated (--concurrency outstanding requests, at
least twice the max batch size), and the API again; a server row's 100% is the mean of the
API's best rates just before and just after it (the machine drifts by 10-20% within
minutes), and the table gives medians over the rounds. During each saturated row the CPU
of the model's process, of Triton's processes (tritonserver, backend stubs, pytriton's
helpers) and of the load generator is read from /proc, as fractions of all cores' time.
Last, p50/p99 latency at half the median saturated rate of the best batching setting.
Server logs stay in a temp directory when a step fails.

Run with the project's venv (tritonclient, perf_analyzer; halformer's Python package is
taken from build/python):
    .venv/bin/python bench/serving.py
perf_analyzer (the `tritonclient` wheel's binary) needs libb64 (Debian libb64-0d) and
libcudart.so.12 (PyPI nvidia-cuda-runtime-cu12): tools/bootstrap.sh installs both.
"""
from __future__ import annotations

import argparse
import csv
import importlib.util
import json
import os
import random
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, os.path.join(ROOT, "tests", "serving"))
sys.path.insert(0, os.path.join(ROOT, "bench"))
# The package as built (build/python), for this process and the servers it starts.
BUILD = os.environ.get("HALFORMER_BUILD_DIR", os.path.join(ROOT, "build"))
sys.path.insert(0, os.path.join(BUILD, "python"))
os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (os.path.join(BUILD, "python"), os.environ.get("PYTHONPATH")) if p)

import halformer  # noqa: E402
from conftest import MINILM_DIR, Server, minilm_files  # noqa: E402  (the tests' server helper)
from test_load import sentence  # noqa: E402  (the load test's sentences)


def log(msg):
    print(f"[bench/serving] {msg}", file=sys.stderr, flush=True)


def perf_analyzer_env():
    """perf_analyzer from the venv's tritonclient, with libcudart.so.12 on the library path."""
    exe = os.path.join(os.path.dirname(sys.executable), "perf_analyzer")
    spec = importlib.util.find_spec("nvidia.cuda_runtime")
    if not os.path.exists(exe) or spec is None:
        raise SystemExit("bench/serving: perf_analyzer or nvidia-cuda-runtime-cu12 missing from this venv; "
                         "run tools/bootstrap.sh and use .venv/bin/python")
    env = dict(os.environ)
    lib = os.path.join(list(spec.submodule_search_locations)[0], "lib")
    env["LD_LIBRARY_PATH"] = lib + (":" + env["LD_LIBRARY_PATH"] if env.get("LD_LIBRARY_PATH") else "")
    check = subprocess.run([exe, "--version"], env=env, capture_output=True, text=True)
    if check.returncode != 0:
        raise SystemExit(f"bench/serving: {exe} does not start: {check.stderr.strip()} "
                         "(libb64-0d missing? run tools/bootstrap.sh)")
    return exe, env


def perf(exe, env, server, model, data, work, load, params=(), interval_ms=4000):
    """One perf_analyzer measurement; load = ('concurrency', n) or ('rate', r).
    Returns throughput (requests/s) and p50/p99 latency (ms) from its CSV."""
    out = os.path.join(work, "pa.csv")
    cmd = [exe, "-m", model, "-u", server.grpc, "-i", "grpc", "--async", "--input-data", data,
           "--measurement-interval", str(interval_ms), "--stability-percentage", "15", "--max-trials", "8",
           "-f", out]
    if load[0] == "concurrency":
        cmd += ["--concurrency-range", str(load[1])]
    else:
        cmd += ["--request-rate-range", f"{load[1]:.1f}"]
    for p in params:
        cmd += ["--request-parameter", p]
    r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    if r.returncode != 0:
        raise RuntimeError(f"perf_analyzer failed ({r.returncode}):\n{r.stdout[-3000:]}\n{r.stderr[-2000:]}"
                           f"\nserver log:\n{server.tail()}")
    with open(out) as f:
        row = next(csv.DictReader(f))
    return {"rps": float(row["Inferences/Second"]), "p50_ms": float(row["p50 latency"]) / 1000,
            "p99_ms": float(row["p99 latency"]) / 1000}


def write_config(path, entry, settings):
    mb, delay = settings
    with open(path, "w") as f:
        f.write("models:\n  - " + "\n    ".join(f"{k}: {v}" for k, v in entry.items()) +
                f"\n    max_batch_size: {mb}\n    max_queue_delay_microseconds: {delay}\n")


def cpu_seconds(session):
    """CPU seconds so far of the server's processes (its session: the model's process first,
    then tritonserver, the backend stubs and pytriton's helpers), and of the whole machine
    (busy, idle)."""
    tick = os.sysconf("SC_CLK_TCK")
    model, triton = 0.0, 0.0
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue  # exited meanwhile
        if int(fields[3]) != session:  # fields[3] is the session id (stat field 6)
            continue
        used = (int(fields[11]) + int(fields[12])) / tick
        if int(pid) == session:
            model += used
        else:
            triton += used
    with open("/proc/stat") as f:
        total = [int(x) / tick for x in f.readline().split()[1:]]
    return model, triton, sum(total) - total[3], total[3]


def measure(exe, env, work, name, entry, data, settings, load, params, interval_ms):
    """A fresh server for one batching setting (max_batch_size, delay), one perf_analyzer run,
    with where the machine's CPU went during it: the model's process, Triton's processes,
    the load generator, idle (fractions of all cores' time)."""
    d = tempfile.mkdtemp(dir=work)
    cfg = os.path.join(d, "serve.yaml")
    write_config(cfg, entry, settings)
    server = Server(cfg, d)
    try:
        server.wait_ready([name])
        before = cpu_seconds(server.proc.pid), resource.getrusage(resource.RUSAGE_CHILDREN)
        r = perf(exe, env, server, name, data, d, load, params, interval_ms)
        after = cpu_seconds(server.proc.pid), resource.getrusage(resource.RUSAGE_CHILDREN)
    finally:
        server.kill()
    (m0, t0, busy0, idle0), ru0 = before
    (m1, t1, busy1, idle1), ru1 = after
    machine = (busy1 - busy0) + (idle1 - idle0)
    client = (ru1.ru_utime + ru1.ru_stime) - (ru0.ru_utime + ru0.ru_stime)  # perf_analyzer, reaped
    r.update(max_batch_size=settings[0], delay_us=settings[1],
             cpu={"model": (m1 - m0) / machine, "triton": (t1 - t0) / machine, "client": client / machine,
                  "idle": (idle1 - idle0) / machine})
    return r


def serve_rows(exe, env, name, entry, data, settings, concurrency, params, work, interval_ms, rounds, api):
    """Saturated throughput for each batching setting, `rounds` times, with the API measured
    (api()) before the first round and after each: each row is compared with the API's best
    rate just before and just after it, as the machine's speed drifts by 10-20% within
    minutes. Then p50/p99 at half the best setting's median rate. Returns (API rates in
    order, saturated rows, half-load row)."""
    apis, rows = [api()], []
    for k in range(rounds):
        for mb, delay in settings:
            # Saturation: while one batch runs, the next one queues
            outstanding = max(concurrency, 2 * mb)
            r = measure(exe, env, work, name, entry, data, (mb, delay), ("concurrency", outstanding), params,
                        interval_ms)
            r.update(load=f"{outstanding} outstanding", round=k)
            log(f"{name}: round {k + 1}/{rounds}, max_batch_size {mb}, delay {delay} us: {r['rps']:.1f} req/s, "
                f"p50 {r['p50_ms']:.1f} ms, p99 {r['p99_ms']:.1f} ms; CPU " +
                ", ".join(f"{key} {100 * v:.0f}%" for key, v in r["cpu"].items()))
            rows.append(r)
        apis.append(api())
    for r in rows:
        r["api_best"] = (max(apis[r["round"]].values()) + max(apis[r["round"] + 1].values())) / 2
        r["of_api"] = r["rps"] / r["api_best"]
    batched = [s for s in settings if s[0] > 1]
    if not batched:
        return apis, rows, None
    median_rps = lambda s: statistics.median(r["rps"] for r in rows if (r["max_batch_size"], r["delay_us"]) == s)
    best = max(batched, key=median_rps)
    half = median_rps(best) / 2
    r = measure(exe, env, work, name, entry, data, best, ("rate", half), params, interval_ms)
    r["load"] = f"{half:.0f} req/s (half)"
    log(f"{name}: at half load ({half:.0f} req/s): p50 {r['p50_ms']:.1f} ms, p99 {r['p99_ms']:.1f} ms")
    return apis, rows, r


def api_rates(run, batches, min_s):
    """Items per second of run(batch) (one pass over the workload's items at that batch
    size), each repeated for at least min_s seconds."""
    rates = {}
    for b in batches:
        run(b)  # warm-up
        done, t0 = 0, time.perf_counter()
        while True:
            done += run(b)
            if time.perf_counter() - t0 >= min_s:
                break
        rates[b] = done / (time.perf_counter() - t0)
    return rates


def log_rates(what, rates):
    log(f"{what}: " + ", ".join(f"b{b} {r:.1f}/s" for b, r in rates.items()))
    return rates


def table(title, apis, rows, half, unit):
    """One line per batching setting: medians over the rounds of req/s, of its ratio to the
    API's best rate measured just before and after it (and the ratios' range), of latency
    and of where the CPU went."""
    fmt = lambda api: ", ".join(f"batch {b} {v:.1f}" for b, v in api.items())
    med = statistics.median
    lines = [f"### {title}", "",
             f"Python API alone ({unit}/s), before round 1 and after each round: " +
             "; ".join(fmt(a) for a in apis), "",
             "| max_batch_size | max_queue_delay_us | load | req/s | of API best (range) | p50 ms | p99 ms | "
             "CPU: model / Triton / load generator / idle |",
             "|---|---|---|---|---|---|---|---|"]
    settings = list(dict.fromkeys((r["max_batch_size"], r["delay_us"]) for r in rows))
    for s in settings:
        rs = [r for r in rows if (r["max_batch_size"], r["delay_us"]) == s]
        ratios = [r["of_api"] for r in rs]
        cpu = " / ".join(f"{100 * med(r['cpu'][k] for r in rs):.0f}%" for k in ("model", "triton", "client", "idle"))
        lines.append(f"| {s[0]} | {s[1]} | {rs[0]['load']} | {med(r['rps'] for r in rs):.1f} | "
                     f"{100 * med(ratios):.0f}% ({100 * min(ratios):.0f}-{100 * max(ratios):.0f}%) | "
                     f"{med(r['p50_ms'] for r in rs):.1f} | {med(r['p99_ms'] for r in rs):.1f} | {cpu} |")
    if half:
        lines.append(f"| {half['max_batch_size']} | {half['delay_us']} | {half['load']} | {half['rps']:.1f} | | "
                     f"{half['p50_ms']:.1f} | {half['p99_ms']:.1f} | |")
    lines.append(f"\n(medians of {max(r['round'] for r in rows) + 1} rounds)")
    return "\n".join(lines) + "\n"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="fewer settings, shorter windows (a smoke run)")
    ap.add_argument("--threads", type=int, default=2, help="threads of the model (server and API)")
    ap.add_argument("--concurrency", type=int, default=32,
                    help="outstanding requests at saturation (at least twice the max batch size)")
    ap.add_argument("--only", choices=["minilm", "decode"], help="one workload")
    ap.add_argument("--settings", help="the server's batching settings to measure, as max_batch_size:delay_us "
                                       "pairs (e.g. 1:0,64:2000; default: the workload's list)")
    ap.add_argument("--batches", help="the API's batch sizes to measure (e.g. 16,32; default: the workload's list)")
    ap.add_argument("--rounds", type=int, default=3,
                    help="measure each setting this many times, the API before and after each round (medians "
                         "reported; default 3, --quick 1)")
    ap.add_argument("--check-tools", action="store_true",
                    help="only check that perf_analyzer starts (the ctest serving_bench_tools)")
    ap.add_argument("--out", default=os.path.join(ROOT, "bench", "results", time.strftime("serving_%Y-%m-%d_%H%M%S")))
    a = ap.parse_args()
    try:
        chosen = [tuple(int(x) for x in s.split(":")) for s in a.settings.split(",")] if a.settings else None
        api_batches = tuple(int(b) for b in a.batches.split(",")) if a.batches else None
        if chosen and not all(len(s) == 2 and s[0] >= 1 and s[1] >= 0 for s in chosen):
            raise ValueError
        if api_batches and not all(b >= 1 for b in api_batches):
            raise ValueError
        if a.rounds < 1:
            raise ValueError
    except ValueError:
        ap.error(f"--settings wants max_batch_size:delay_us pairs (e.g. 1:0,64:2000), --batches sizes >= 1 "
                 f"(e.g. 16,32), --rounds >= 1; got {a.settings!r} / {a.batches!r} / {a.rounds}")
    exe, env = perf_analyzer_env()
    if a.check_tools:
        print(f"bench/serving: {exe} starts")
        return
    os.makedirs(a.out, exist_ok=True)
    work = tempfile.mkdtemp(prefix="halformer-serving-")
    min_s = 3 if a.quick else 10
    rounds = 1 if a.quick else a.rounds
    report, results = [f"# bench/serving.py, {time.strftime('%Y-%m-%d %H:%M')}, threads {a.threads}, "
                       f"perf_analyzer async gRPC, {os.cpu_count()} cores shared by server and client\n"], {}

    if a.only in (None, "minilm"):
        w, v = minilm_files()
        texts = [sentence(k) for k in range(256)]
        emb = halformer.SentenceEmbedder(MINILM_DIR, w, v, threads=a.threads)
        # What an API user calls: the whole list at once (sorted by length into batches)
        run = lambda b: len(emb.encode(texts, batch_size=b))
        batches = api_batches or ((16,) if a.quick else (8, 16, 32, 64))
        api = lambda: log_rates("minilm API", api_rates(run, batches, min_s))
        data = os.path.join(work, "minilm.json")
        with open(data, "w") as f:
            json.dump({"data": [{"TEXT": {"content": [t], "shape": [1]}} for t in texts[:64]]}, f)
        entry = {"name": "minilm", "kind": "embed_text", "model_dir": MINILM_DIR, "weights": w, "vocab": v,
                 "threads": a.threads}
        settings = chosen or ([(1, 0), (16, 1000)] if a.quick else [(1, 0), (16, 1000), (32, 1000), (64, 2000)])
        apis, rows, half = serve_rows(exe, env, "minilm", entry, data, settings, a.concurrency, (), work, 10000,
                                      rounds, api)
        del emb
        results["minilm"] = {"api": apis, "server": rows, "half_load": half}
        report.append(table("all-MiniLM-L6-v2, embed_text, one sentence per request", apis, rows, half,
                            "sentences"))

    if a.only in (None, "decode"):
        spec = os.path.join(ROOT, "models", "transformer-base.yaml")
        model_dir = os.path.join(BUILD, "models", "transformer-base")
        weights = os.path.join(ROOT, "bench", ".cache", "transformer-base", "weights-serving-seed0.safetensors")
        if not os.path.exists(weights):
            os.makedirs(os.path.dirname(weights), exist_ok=True)
            subprocess.run([sys.executable, "-m", "halbench.make_weights", spec, weights],
                           check=True, env=dict(os.environ, PYTHONPATH=os.path.join(ROOT, "bench")))
        model = halformer.Model(model_dir, weights, threads=a.threads)
        rng = random.Random(7)
        srcs = [[rng.randrange(4, 1000) for _ in range(32)] for _ in range(64)]
        new = 8 if a.quick else 32
        run = lambda b: sum(len(model.generate(srcs[i:i + b], max_new_tokens=new)) for i in range(0, len(srcs), b))
        batches = api_batches or ((1, 8) if a.quick else (1, 4, 8, 16))
        api = lambda: log_rates("decode API", api_rates(run, batches, min_s))
        data = os.path.join(work, "decode.json")
        with open(data, "w") as f:
            json.dump({"data": [{"INPUT_IDS": {"content": s, "shape": [len(s)]}} for s in srcs[:16]]}, f)
        entry = {"name": "decode", "kind": "generate", "model_dir": model_dir, "weights": weights,
                 "threads": a.threads}
        settings = chosen or ([(1, 0), (8, 1000)] if a.quick else [(1, 0), (8, 1000), (16, 2000)])
        # Batches of a second or more: windows long enough to hold several
        apis, rows, half = serve_rows(exe, env, "decode", entry, data, settings, 16, (f"max_new_tokens:{new}:int",),
                                      work, 15000, rounds, api)
        del model
        results["decode"] = {"api": apis, "server": rows, "half_load": half, "max_new_tokens": new}
        report.append(table(f"transformer-base, generate (greedy, {new} new tokens), one source of 32 ids per "
                            f"request", apis, rows, half, "sequences"))

    text = "\n".join(report)
    print(text)
    with open(os.path.join(a.out, "table.md"), "w") as f:
        f.write(text)
    with open(os.path.join(a.out, "results.json"), "w") as f:
        json.dump(results, f, indent=1)
    shutil.rmtree(work, ignore_errors=True)
    log(f"results in {os.path.relpath(a.out, ROOT)}")


if __name__ == "__main__":
    main()
