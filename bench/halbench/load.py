"""Load generator for generation serving (issue 42): the continuous-batching engine against
whole-request batching, on one model, in this process, through the Python API.

    PYTHONPATH=build/python python -m halbench.load --model-dir DIR --weights W
        [--rates 0.5,2,8] [--requests 64] [--seed 0] [--max-batch 8] [--threads 2]
        [--prompt 16:1024] [--output 8:512] [--out results.json]

A fixed-seed trace per rate: Poisson arrivals (exponential gaps, mean 1/rate s), prompt
and output lengths log-uniform in the given ranges (capped by the model's max_len), token
ids uniform over the vocabulary past the special ids, greedy decoding with eos ignored
(`min_length` = the output length, so every request makes exactly its tokens). Two
servers replay the same trace:
  engine  halformer.Engine(model, max_sequences=--max-batch): each request submitted at
          its arrival, tokens taken as they come;
  batch   whole-request batching as Triton's dynamic batcher does for `kind: generate`:
          when the model is free, every waiting request (up to --max-batch) goes into one
          Model.generate_iter call, which runs until its longest request ends.
Per server and rate: output tokens/s (all tokens / the time from the first arrival to the
last token), time to first token p50/p99, time per output token p50/p99 (a request's
(last - first token time) / (tokens - 1)), and the process's peak RSS.
"""
import argparse
import json
import math
import os
import random
import resource
import sys
import time

from .common import log, median, write_json


def percentile(values, p):
    if not values:
        return float("nan")
    v = sorted(values)
    return v[min(len(v) - 1, int(math.ceil(p / 100 * len(v))) - 1)]


def trace(rate, n, seed, prompt_range, output_range, vocab, low, max_len):
    """[(arrival s, prompt ids, output tokens)], the same for both servers."""
    rng = random.Random(f"{seed}:{rate}")
    t, out = 0.0, []

    def log_uniform(lo, hi):
        return int(round(math.exp(rng.uniform(math.log(lo), math.log(hi)))))

    for _ in range(n):
        t += rng.expovariate(rate)
        p = min(log_uniform(*prompt_range), max_len - 2)
        o = max(1, min(log_uniform(*output_range), max_len - p))
        out.append((t, [rng.randrange(low, vocab) for _ in range(p)], o))
    return out


def summarize(name, rate, requests, t0, first, times):
    """first[i]: time of request i's first token; times[i]: its token times."""
    ttft = [first[i] - (t0 + a) for i, (a, _, _) in enumerate(requests)]
    tpot = [(ts[-1] - ts[0]) / (len(ts) - 1) for ts in times if len(ts) > 1]
    tokens = sum(len(ts) for ts in times)
    end = max(ts[-1] for ts in times)
    return {"server": name, "rate": rate, "requests": len(requests), "tokens": tokens,
            "tokens_per_s": tokens / (end - (t0 + requests[0][0])),
            "ttft_p50_ms": 1e3 * percentile(ttft, 50), "ttft_p99_ms": 1e3 * percentile(ttft, 99),
            "tpot_p50_ms": 1e3 * percentile(tpot, 50), "tpot_p99_ms": 1e3 * percentile(tpot, 99),
            "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}


def run_engine(model, requests, max_batch):
    import halformer
    with halformer.Engine(model, max_sequences=max_batch) as engine:
        streams = []
        t0 = time.perf_counter()
        for arrival, prompt, n in requests:
            delay = t0 + arrival - time.perf_counter()
            if delay > 0:
                time.sleep(delay)
            streams.append(engine.submit(prompt, max_new_tokens=n, min_length=n))
        for s in streams:  # each token's time is taken by the engine as it is chosen
            for _ in s:
                pass
    return t0, [s.token_times[0] for s in streams], [s.token_times for s in streams]


def run_batching(model, requests, max_batch):
    first, times = [None] * len(requests), [[] for _ in requests]
    t0 = time.perf_counter()
    done = 0
    while done < len(requests):
        now = time.perf_counter() - t0
        if requests[done][0] > now:
            time.sleep(requests[done][0] - now)
            now = time.perf_counter() - t0
        batch = [i for i in range(done, len(requests)) if requests[i][0] <= now][:max_batch]
        n = max(requests[i][2] for i in batch)
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
    return t0, first, times


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m halbench.load", description=__doc__.split("\n\n")[0])
    ap.add_argument("--model-dir", required=True)
    ap.add_argument("--weights", required=True)
    ap.add_argument("--rates", default="0.5,2,8", help="arrivals per second, comma-separated")
    ap.add_argument("--requests", type=int, default=64)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--max-batch", type=int, default=8)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--prompt", default="16:1024", help="prompt length range LO:HI (log-uniform)")
    ap.add_argument("--output", default="8:512", help="output length range LO:HI (log-uniform)")
    ap.add_argument("--servers", default="engine,batch")
    ap.add_argument("--out", default="")
    a = ap.parse_args(argv)
    import halformer
    model = halformer.Model(a.model_dir, weights=a.weights, threads=a.threads)
    cfg = model.config
    if cfg["arch"] != "decoder":
        raise SystemExit(f"halbench.load: {cfg['name']} is {cfg['arch']}: the engine serves decoder-only models")
    pr = tuple(int(x) for x in a.prompt.split(":"))
    orange = tuple(int(x) for x in a.output.split(":"))
    low = max(cfg["pad_id"], cfg["bos_id"], cfg["eos_id"]) + 1
    rows = []
    for rate in (float(r) for r in a.rates.split(",")):
        reqs = trace(rate, a.requests, a.seed, pr, orange, cfg["tgt_vocab"], low, cfg["max_len"])
        for server in a.servers.split(","):
            log(f"{cfg['name']}: {server}, {rate} requests/s, {len(reqs)} requests")
            run = run_engine if server == "engine" else run_batching
            row = summarize(server, rate, reqs, *run(model, reqs, a.max_batch))
            log("  " + ", ".join(f"{k} {v:.1f}" if isinstance(v, float) else f"{k} {v}" for k, v in row.items()))
            rows.append(row)
    print(f"| rate /s | server | tokens/s | TTFT p50 ms | TTFT p99 ms | TPOT p50 ms | TPOT p99 ms | peak RSS MB |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['rate']} | {r['server']} | {r['tokens_per_s']:.1f} | {r['ttft_p50_ms']:.0f} | {r['ttft_p99_ms']:.0f} "
              f"| {r['tpot_p50_ms']:.1f} | {r['tpot_p99_ms']:.1f} | {r['peak_rss_mb']:.0f} |")
    if a.out:
        write_json(a.out, {"model": cfg["name"], "args": vars(a), "rows": rows})
    return 0


if __name__ == "__main__":
    sys.exit(main())
