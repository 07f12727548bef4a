"""The inference binary's generation options (issue 13), end to end on a built model:
  - --sampling-topk 1 and --temperature 0 give plain greedy decoding, token for token;
  - a fixed --seed gives the same tokens on every run and at --threads 1 and 2, and a
    sequence's tokens do not depend on the rest of its batch; other seeds differ;
  - --stream prints exactly the tokens of the final result;
  - --scores: one log-probability per token, each <= 0, and under greedy decoding
    each equals log_softmax of the step's logits at the chosen id (the last step's
    logits come back with --logits);
  - --min-length N: no eos among the first N tokens; --no-repeat-ngram-size 2: no
    bigram twice; --repetition-penalty runs.
usage: check_generation_cli.py BINARY WEIGHTS "ids" ["ids" ...]
"""
import json
import math
import subprocess
import sys

binary, weights, prompts = sys.argv[1], sys.argv[2], sys.argv[3:]


def run(*args, src=prompts):
    cmd = [binary, "--weights", weights, *[a for s in src for a in ("--src", s)], *map(str, args)]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    if p.returncode != 0:
        sys.exit(f"FAIL: {' '.join(cmd)} exited {p.returncode}: {p.stderr.strip()}")
    return p.stdout


def tokens(*args, src=prompts):
    return [s["tokens"] for s in json.loads(run("--json", *args, src=src))["sequences"]]


failures = []


def check(ok, what):
    print(("ok   " if ok else "FAIL ") + what)
    if not ok:
        failures.append(what)


n = 12
greedy = tokens("-n", n)
check(tokens("-n", n, "--sampling-topk", 1, "--seed", 5) == greedy, "--sampling-topk 1 equals greedy")
check(tokens("-n", n, "--sampling-topk", 0, "--temperature", 0) == greedy, "--temperature 0 equals greedy")

# A high temperature: the trained reverse-tiny is too sure of itself to leave greedy at 1.
sample = ("-n", n, "--sampling-topk", 0, "--sampling-topp", 0.95, "--temperature", 8, "--seed", 1234)
a = tokens(*sample)
check(a == tokens(*sample), "the same seed gives the same tokens")
check(a == tokens(*sample, "--threads", 1) == tokens(*sample, "--threads", 2), "... at --threads 1 and 2")
check(tokens(*sample, src=prompts[:1]) == a[:1], "... whatever else is in the batch")
others = [tokens(*sample[:-1], seed) for seed in (1, 2, 3)]
check(any(o != a for o in others), "other seeds give other tokens")
check(a != greedy, "sampling at temperature 8 leaves the greedy path")

streamed = run(*sample, "--stream")
if len(prompts) == 1:
    got = [[int(t) for t in streamed.split()]]
else:
    got = [[] for _ in prompts]
    for line in streamed.splitlines():
        row, tok = map(int, line.split())
        got[row].append(tok)
check(got == a, "--stream prints the final tokens, in order")

out = json.loads(run("--json", "--scores", "--logits", "-n", n))["sequences"]
check(all(len(s["token_logprobs"]) == len(s["tokens"]) and all(lp <= 0 for lp in s["token_logprobs"])
          for s in out), "--scores: one log-probability <= 0 per token")
# The last token's score is log_softmax(last logits)[token] when the head outputs logits
# or log-probabilities (both give the same log_softmax).
for s in out:
    row, tok, lp = s["logits"], s["tokens"][-1], s["token_logprobs"][-1]
    mx = max(row)
    lse = mx + math.log(sum(math.exp(v - mx) for v in row))
    check(abs((row[tok] - lse) - lp) <= 1e-4 * max(1.0, abs(lp)), f"--scores: last token's log-prob {lp:.6f}")

# Decoding stops at eos, so a row shorter than n ended with eos: it must come after m tokens.
m = 6
mins = tokens("-n", n, "--min-length", m)
check(all(len(t) == n or len(t) - 1 >= m for t in mins), f"--min-length {m}: no eos among the first {m} tokens")
ng = tokens("-n", n, "--no-repeat-ngram-size", 2, "--sampling-topk", 0, "--seed", 3)
check(all(len({tuple(t[i:i + 2]) for i in range(len(t) - 1)}) == len(t) - 1 for t in ng),
      "--no-repeat-ngram-size 2: no bigram twice")
check(len(tokens("-n", n, "--repetition-penalty", 1.3)) == len(prompts), "--repetition-penalty runs")

if failures:
    sys.exit(f"{len(failures)} check(s) failed")
print("all generation CLI checks passed")
