"""generation.h's token choice against transformers 4.30.2's own logits processors.

    check_generation.py GENERATION_TOOL

For several option sets and V = 37 and 1000, random logits (fixed numpy seed) and
histories with repeats go through generation_tool (tests/generation/generation_tool.cpp) and through
RepetitionPenaltyLogitsProcessor, NoRepeatNGramLogitsProcessor, MinLengthLogitsProcessor,
TemperatureLogitsWarper, TopKLogitsWarper and TopPLogitsWarper in torch, in generate()'s
order and under generate()'s conditions (a processor only when its option is not off).
Checked per row:
  - processed and warped logits: the same -inf positions, finite values to 1e-6 relative;
  - greedy options: the chosen id is torch.argmax of the processed logits (ties included);
  - logprob: log_softmax of the processed logits at the chosen id;
  - sampling options: 20000 draws never hit a filtered token, and their frequencies pass
    Pearson's chi-square against torch.softmax of transformers' warped logits (bins with
    an expected count < 5 merged; p-value from the regularised upper incomplete gamma
    function; fails below 1e-4 -- deterministic, since both seeds are fixed).
min_length is our "new tokens" count: MinLengthLogitsProcessor counts the whole history,
so it gets min_length + (history length - generated)."""
import json
import subprocess
import sys

import numpy as np
import torch
import transformers
from transformers.generation.logits_process import (
    MinLengthLogitsProcessor,
    NoRepeatNGramLogitsProcessor,
    RepetitionPenaltyLogitsProcessor,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

DRAWS = 20000
P_MIN = 1e-4
# (name, options): the GenerationOptions fields generation_tool reads.
CONFIGS = [
    ("sample_all_penalties", dict(sampling_topk=0, repetition_penalty=1.3, no_repeat_ngram_size=2, min_length=3)),
    ("topk_topp_temp_boost", dict(sampling_topk=10, sampling_topp=0.9, sampling_temperature=0.7,
                                  repetition_penalty=0.8, no_repeat_ngram_size=3)),
    ("topk_topp_hot_unigram", dict(sampling_topk=50, sampling_topp=0.5, sampling_temperature=1.5,
                                   no_repeat_ngram_size=1, min_length=2)),
    ("topp_only", dict(sampling_topk=0, sampling_topp=0.95, repetition_penalty=1.1)),
    ("topk_only", dict(sampling_topk=20, sampling_temperature=1.2, no_repeat_ngram_size=2)),
    ("greedy_penalties", dict(sampling_topk=1, repetition_penalty=1.2, no_repeat_ngram_size=2, min_length=5)),
    ("greedy_temperature0", dict(sampling_topk=0, sampling_temperature=0.0, no_repeat_ngram_size=4)),
]


def f32(x):
    """A Python float holding exactly the float32 the C++ side gets."""
    return float(np.float32(x))


def transformers_pipeline(opts, eos, logits, history, generated, greedy):
    """(processed, warped) logits of one row, as generate() would compute them (greedy
    search: no warpers)."""
    ids = torch.tensor([history], dtype=torch.long)
    scores = torch.tensor(logits, dtype=torch.float32)[None, :]
    processors = []
    if opts.get("repetition_penalty", 1.0) != 1.0:
        processors.append(RepetitionPenaltyLogitsProcessor(penalty=f32(opts["repetition_penalty"])))
    if opts.get("no_repeat_ngram_size", 0) > 0:
        processors.append(NoRepeatNGramLogitsProcessor(opts["no_repeat_ngram_size"]))
    if opts.get("min_length", 0) > 0:
        processors.append(MinLengthLogitsProcessor(opts["min_length"] + len(history) - generated, eos))
    for p in processors:
        scores = p(ids, scores)
    processed = scores.clone()
    if greedy:
        return processed[0], None
    warpers = []
    if f32(opts.get("sampling_temperature", 1.0)) != 1.0:
        warpers.append(TemperatureLogitsWarper(f32(opts["sampling_temperature"])))
    if opts.get("sampling_topk", 1) != 0:
        warpers.append(TopKLogitsWarper(top_k=opts["sampling_topk"], min_tokens_to_keep=1))
    if f32(opts.get("sampling_topp", 1.0)) < 1.0:
        warpers.append(TopPLogitsWarper(top_p=f32(opts["sampling_topp"]), min_tokens_to_keep=1))
    for w in warpers:
        scores = w(ids, scores)
    return processed[0], scores[0]


def from_json(values):
    return np.array([-np.inf if v is None else v for v in values], dtype=np.float32)


def compare(what, ours, theirs):
    theirs = theirs.numpy()
    inf_ours, inf_theirs = np.isneginf(ours), np.isneginf(theirs)
    if not np.array_equal(inf_ours, inf_theirs):
        return f"{what}: -inf at {np.flatnonzero(inf_ours).tolist()} vs transformers {np.flatnonzero(inf_theirs).tolist()}"
    a, b = ours[~inf_ours].astype(np.float64), theirs[~inf_theirs].astype(np.float64)
    err = np.abs(a - b) / np.maximum(np.abs(b), 1e-30)
    if err.size and err.max() > 1e-6:
        i = int(err.argmax())
        return f"{what}: relative error {err[i]:.3g} ({a[i]} vs {b[i]})"
    return None


def chi_square(counts, probs):
    """(statistic, df, p-value) of counts against probs (the nonzero ones)."""
    n = counts.sum()
    order = np.argsort(probs)  # least probable first: small bins merge into larger ones
    stat, bins, exp_acc, obs_acc = 0.0, 0, 0.0, 0.0
    for i in order:
        if probs[i] == 0:
            continue
        exp_acc += n * probs[i]
        obs_acc += counts[i]
        if exp_acc >= 5:
            stat += (obs_acc - exp_acc) ** 2 / exp_acc
            bins, exp_acc, obs_acc = bins + 1, 0.0, 0.0
    if exp_acc > 0:  # cannot happen (the most probable token comes last), kept for safety
        stat += (obs_acc - exp_acc) ** 2 / exp_acc
        bins += 1
    df = max(bins - 1, 1)
    p = float(torch.special.gammaincc(torch.tensor(df / 2.0, dtype=torch.float64),
                                      torch.tensor(stat / 2.0, dtype=torch.float64)))
    return stat, df, p


def make_rows(rng, V, eos):
    rows = []
    for r in range(6):
        logits = (rng.standard_normal(V) * 2.0).astype(np.float32)
        L = int(rng.integers(1, 25))
        small = min(V, 9)  # ids from a small set: many repeats and repeated n-grams
        history = [int(i) for i in rng.integers(0, small, size=L)]
        if r % 2:
            history += [int(i) for i in rng.integers(0, V, size=4)] + history[:3]
        if r == 3:
            history.append(eos)
        if r == 4:  # ties at the maximum: greedy must take the lowest id
            logits[[V // 3, V // 2, V - 1]] = logits.max() + 1.0
        generated = int(rng.integers(0, len(history) + 1))
        rows.append(dict(logits=[float(x) for x in logits], history=history, generated=generated))
    return rows


def main():
    tool = sys.argv[1]
    assert transformers.__version__ == "4.30.2", transformers.__version__
    rng = np.random.default_rng(20240601)
    failures, checked, chi_tests, min_p = [], 0, 0, 1.0
    for V in (37, 1000):
        eos = V - 2
        for name, opts in CONFIGS:
            opts = dict(opts, seed=int(rng.integers(0, 2**63)))
            rows = make_rows(rng, V, eos)
            job = dict(vocab=V, eos=eos, draws=DRAWS, options=opts, rows=rows)
            res = subprocess.run([tool], input=json.dumps(job), capture_output=True, text=True)
            if res.returncode != 0:
                sys.exit(f"{name}: generation_tool failed: {res.stderr}")
            out = json.loads(res.stdout)["rows"]
            greedy = opts.get("sampling_topk", 1) == 1 or opts.get("sampling_temperature", 1.0) == 0
            for r, (row, got) in enumerate(zip(rows, out)):
                where = f"V={V} {name} row {r}"
                processed, warped = transformers_pipeline(opts, eos, row["logits"], row["history"], row["generated"],
                                                           greedy)
                ours_processed, ours_warped = from_json(got["processed"]), from_json(got["warped"])
                problems = [compare("processed", ours_processed, processed)]
                if not greedy:
                    problems.append(compare("warped", ours_warped, warped))
                chosen = got["chosen"]
                if greedy and chosen != int(torch.argmax(processed)):
                    problems.append(f"greedy chose {chosen}, torch.argmax {int(torch.argmax(processed))}")
                if not greedy and np.isneginf(ours_warped[chosen]):
                    problems.append(f"sampled the filtered id {chosen}")
                lp = float(torch.log_softmax(processed.double(), -1)[chosen])
                got_lp = -np.inf if got["logprob"] is None else got["logprob"]
                if not abs(got_lp - lp) <= 1e-6 * max(1.0, abs(lp)):
                    problems.append(f"logprob {got_lp} vs log_softmax {lp}")
                if not greedy:
                    counts = np.array(got["counts"], dtype=np.int64)
                    probs = torch.softmax(warped.double(), -1).numpy()
                    if counts.sum() != DRAWS or counts[probs == 0].any():
                        problems.append(f"draws of filtered ids: {np.flatnonzero(counts * (probs == 0)).tolist()}")
                    stat, df, p = chi_square(counts, probs)
                    chi_tests += 1
                    min_p = min(min_p, p)
                    if p < P_MIN:
                        problems.append(f"chi-square {stat:.1f} (df {df}): p = {p:.2g} < {P_MIN}")
                problems = [p for p in problems if p]
                failures += [f"{where}: {p}" for p in problems]
                checked += 1
    for f in failures:
        print("FAIL", f)
    print(f"{checked} rows, {chi_tests} chi-square tests (smallest p {min_p:.3g}), {len(failures)} failures")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
