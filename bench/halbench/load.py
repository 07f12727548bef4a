"""Load generator for generation serving (issue 42): the continuous-batching engine against
whole-request batching, on one model, through the Python API, each run in a process of its
own (its peak memory its own).

    PYTHONPATH=build/python python -m halbench.load --model-dir DIR --weights W
        [--rates 0.1,0.5,2] [--requests 32] [--seed 0] [--max-batch 8] [--threads 2]
        [--prompt 16:1024] [--output 8:512] [--kv-cache-mb 0] [--out results.json]

A fixed-seed trace per rate: Poisson arrivals (exponential gaps, mean 1/rate s), prompt
and output lengths log-uniform in the given ranges (capped by the model's max_len), token
ids uniform over the vocabulary past the special ids, greedy decoding with eos ignored
(`min_length` = the output length, so every request makes exactly its tokens). Servers
replaying the same trace:
  engine  halformer.Engine(model, max_sequences=--max-batch, kv_cache_mb=--kv-cache-mb):
          each request submitted at its arrival, tokens taken as they come;
  batch   whole-request batching as Triton's dynamic batcher does for `kind: generate`:
          when the model is free, every waiting request (up to --max-batch) goes into one
          Model.generate_iter call, which runs until its longest request ends;
  alone   each request by itself, one after another, starting at its arrival or when the
          one before it ends: its time to first token is its prefill alone (the yardstick
          of the engine's TTFT at a low rate), timed from its start; like the engine's
          requests at a low rate it meets a machine idle since the last request (a first
          token after 0.2 s idle took 1.7 ms against 0.8 ms back to back on reverse-tiny,
          docs/engine.md).
Per server and rate: output tokens/s (all tokens / the time from the first arrival to the
last token), time to first token p50/p99, time per output token p50/p99 (a request's
(last - first token time) / (tokens - 1)), the process's peak RSS and its RSS once the
model was loaded (weights included), for the engine its cache budget, and for batching
its rows_per_step (tokens / decode steps: an engine that keeps all --max-batch rows busy
makes at most --max-batch / rows_per_step times its tokens per step at equal step cost).
"""
import argparse
import json
import math
import os
import random
import resource
import subprocess
import sys
import time

from .common import log, median, write_json


def percentile(values, p):
    if not values:
        return float("nan")
    v = sorted(values)
    return v[min(len(v) - 1, int(math.ceil(p / 100 * len(v))) - 1)]


def trace(rate, n, seed, prompt_range, output_range, ids, max_len, enc_dec=False):
    """[(arrival s, prompt ids, output tokens)], the same for both servers: prompts drawn
    from `ids`; a decoder-only model's prompt and output share max_len, an encoder-
    decoder's source and output each have it."""
    rng = random.Random(f"{seed}:{rate}")
    t, out = 0.0, []

    def log_uniform(lo, hi):
        return int(round(math.exp(rng.uniform(math.log(lo), math.log(hi)))))

    for _ in range(n):
        t += rng.expovariate(rate)
        p = min(log_uniform(*prompt_range), max_len - 2)
        o = max(1, min(log_uniform(*output_range), max_len if enc_dec else max_len - p))
        out.append((t, [rng.choice(ids) for _ in range(p)], o))
    return out


def summarize(name, rate, requests, t0, first, times, extra):
    """first[i]: time of request i's first token; times[i]: its token times."""
    ttft = [first[i] - (t0 + a) for i, (a, _, _) in enumerate(requests)]
    tpot = [(ts[-1] - ts[0]) / (len(ts) - 1) for ts in times if len(ts) > 1]
    tokens = sum(len(ts) for ts in times)
    end = max(ts[-1] for ts in times)
    return {"server": name, "rate": rate, "requests": len(requests), "tokens": tokens,
            "tokens_per_s": tokens / (end - (t0 + requests[0][0])),
            "ttft_p50_ms": 1e3 * percentile(ttft, 50), "ttft_p99_ms": 1e3 * percentile(ttft, 99),
            "tpot_p50_ms": 1e3 * percentile(tpot, 50), "tpot_p99_ms": 1e3 * percentile(tpot, 99),
            "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, **extra}


def run_alone(model, requests, max_batch, kv_cache_mb):
    first, times, busy = [], [], 0.0
    t0 = time.perf_counter()
    for arrival, prompt, n in requests:
        delay = t0 + arrival - time.perf_counter()
        if delay > 0:
            time.sleep(delay)
        start = time.perf_counter()
        stamps = []
        for _row, _token in model.generate_iter([prompt], max_new_tokens=n, min_length=n):
            stamps.append(time.perf_counter())
        busy += stamps[-1] - start
        # As if it started at its arrival (it waited for nobody: a late start is not its wait).
        shift = t0 + arrival - start
        first.append(stamps[0] + shift)
        times.append([t + shift for t in stamps])
    return t0, first, times, {"tokens_per_s": sum(len(t) for t in times) / busy}


def run_engine(model, requests, max_batch, kv_cache_mb):
    import halformer
    with halformer.Engine(model, max_sequences=max_batch, kv_cache_mb=kv_cache_mb or None) as engine:
        streams, late = [], []
        t0 = time.perf_counter()
        for arrival, prompt, n in requests:
            delay = t0 + arrival - time.perf_counter()
            if delay > 0:
                time.sleep(delay)
            start = time.perf_counter()
            streams.append(engine.submit(prompt, max_new_tokens=n, min_length=n))
            late.append(start - (t0 + arrival))  # the load generator's own lateness (its sleep)
        for s in streams:  # each token's time is taken by the engine as it is chosen
            for _ in s:
                pass
        stats = engine.stats()
    cache = {"cache_budget_mb": stats["blocks"] * stats["block_bytes"] / 2**20, "preemptions": stats["preemptions"]}
    # Timed from the submit() call, as alone's from its call: as if each was submitted at its arrival.
    times = [[t - d for t in s.token_times] for s, d in zip(streams, late)]
    return t0, [ts[0] for ts in times], times, cache


def run_batching(model, requests, max_batch, kv_cache_mb):
    max_len, enc_dec = model.config["max_len"], model.config["arch"] == "encoder_decoder"
    first, times = [None] * len(requests), [[] for _ in requests]
    t0 = time.perf_counter()
    done = steps = 0
    while done < len(requests):
        now = time.perf_counter() - t0
        if requests[done][0] > now:
            time.sleep(requests[done][0] - now)
            now = time.perf_counter() - t0
        # The waiting requests in order, up to max_batch, that fit one call: every row gets
        # the batch's longest output, so its longest prompt + that must fit max_len (+ 1).
        batch, p_max, n = [], 0, 0
        for i in range(done, len(requests)):
            if requests[i][0] > now or len(batch) == max_batch:
                break
            p, o = len(requests[i][1]), requests[i][2]
            if not enc_dec and max(p_max, p) + max(n, o) > max_len + 1:
                break
            batch.append(i)
            p_max, n = max(p_max, p), max(n, o)
        # One call for the batch: rows stop at their own length (min_length keeps eos away).
        src = [requests[i][1] for i in batch]
        counts = [0] * len(batch)
        it = model.generate_iter(src, max_new_tokens=n, min_length=n)
        for row, _token in it:
            i = batch[row]
            if counts[row] >= requests[i][2]:
                continue  # past its own length: the request has its answer already
            counts[row] += 1
            stamp = time.perf_counter()
            times[i].append(stamp)
            if first[i] is None:
                first[i] = stamp
        done = batch[-1] + 1
        steps += n
    # Rows with a token per decode step: an engine always full makes at most
    # max_batch / rows_per_step times batching's tokens per step (at equal step cost).
    return t0, first, times, {"rows_per_step": sum(len(t) for t in times) / steps}


RUNNERS = {"engine": run_engine, "batch": run_batching, "alone": run_alone}


def rss_mb():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def one_run(a, server, rate):
    """One server at one rate, in this process: its row."""
    import halformer
    model = halformer.Model(a.model_dir, weights=a.weights, threads=a.threads)
    cfg = model.config
    if cfg["arch"] not in ("decoder", "encoder_decoder"):
        raise SystemExit(f"halbench.load: {cfg['name']} is {cfg['arch']}: the engine serves decoders")
    enc_dec = cfg["arch"] == "encoder_decoder"
    vocab = cfg["src_vocab"] if enc_dec else cfg["tgt_vocab"]
    ids = [i for i in range(vocab) if i not in (cfg["pad_id"], cfg["bos_id"], cfg["eos_id"])]  # no special token
    model.generate([ids[:4]], max_new_tokens=2)  # warm up
    loaded = rss_mb()
    pr = tuple(int(x) for x in a.prompt.split(":"))
    orange = tuple(int(x) for x in a.output.split(":"))
    reqs = trace(rate, a.requests, a.seed, pr, orange, ids, cfg["max_len"], enc_dec)
    row = summarize(server, rate, reqs, *RUNNERS[server](model, reqs, a.max_batch, a.kv_cache_mb))
    row["loaded_rss_mb"] = loaded
    return row


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m halbench.load", description=__doc__.split("\n\n")[0])
    ap.add_argument("--model-dir", required=True)
    ap.add_argument("--weights", required=True)
    ap.add_argument("--rates", default="0.1,0.5,2", help="arrivals per second, comma-separated")
    ap.add_argument("--requests", type=int, default=32)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--max-batch", type=int, default=8)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--prompt", default="16:1024", help="prompt length range LO:HI (log-uniform)")
    ap.add_argument("--output", default="8:512", help="output length range LO:HI (log-uniform)")
    ap.add_argument("--kv-cache-mb", type=float, default=0, help="the engine's cache budget (0: its default)")
    ap.add_argument("--servers", default="engine,batch,alone")
    ap.add_argument("--one", default="", help=argparse.SUPPRESS)  # SERVER:RATE, in this process
    ap.add_argument("--out", default="")
    a = ap.parse_args(argv)
    if a.one:
        server, rate = a.one.split(":")
        print(json.dumps(one_run(a, server, float(rate))))
        return 0
    for server in a.servers.split(","):
        if server not in RUNNERS:
            raise SystemExit(f"halbench.load: unknown server {server!r} (known: {', '.join(RUNNERS)})")
    rows = []
    rates = [float(r) for r in a.rates.split(",")]
    for rate in rates:
        for server in a.servers.split(","):
            if server == "alone" and rate != rates[0]:
                continue  # arrivals do not matter to it
            log(f"{os.path.basename(a.model_dir)}: {server}, {rate} requests/s, {a.requests} requests")
            cmd = [sys.executable, "-m", "halbench.load", "--one", f"{server}:{rate}"] + (argv if argv is not None else sys.argv[1:])
            out = subprocess.run(cmd, check=True, stdout=subprocess.PIPE, text=True).stdout
            row = json.loads(out.strip().splitlines()[-1])
            log("  " + ", ".join(f"{k} {v:.1f}" if isinstance(v, float) else f"{k} {v}" for k, v in row.items()))
            rows.append(row)
    print("| rate /s | server | tokens/s | TTFT p50 ms | TTFT p99 ms | TPOT p50 ms | TPOT p99 ms | peak RSS MB "
          "| loaded RSS MB | cache MB |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    def ms(v):  # a millisecond or two (reverse-tiny) keeps its decimals
        return f"{v:.2f}" if v < 10 else f"{v:.0f}"

    for r in rows:
        print(f"| {r['rate'] if r['server'] != 'alone' else '-'} | {r['server']} | {r['tokens_per_s']:.1f} "
              f"| {ms(r['ttft_p50_ms'])} | {ms(r['ttft_p99_ms'])} | {r['tpot_p50_ms']:.1f} | {r['tpot_p99_ms']:.1f} "
              f"| {r['peak_rss_mb']:.0f} | {r['loaded_rss_mb']:.0f} | {r.get('cache_budget_mb', 0):.0f} |")
    if a.out:
        write_json(a.out, {"model_dir": a.model_dir, "args": vars(a), "rows": rows})
    return 0


if __name__ == "__main__":
    sys.exit(main())
