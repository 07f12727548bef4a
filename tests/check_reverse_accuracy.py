"""Greedy and beam-search exact match of the trained reverse-tiny on its 1000 held-out
sequences, per build.

usage: check_reverse_accuracy.py WEIGHTS FP32_BIN [NAME=BIN MAX_DROP_POINTS ...]

The held-out set is tools/train_reverse.py's own (same generator and seed, never trained
on). The fp32 build must reach 99% (what training guarantees); every other build (e.g.
int8) must stay within MAX_DROP_POINTS percentage points of the fp32 build, greedy and with
beam size 4. Beam search's step reorders the KV cache rows (bf16 ones in reduced-precision
builds), which the best hypothesis rarely exercises: every build's beam scores of all
hypotheses are also checked against teacher forcing (beam_score_mismatches).
"""
import json
import os
import subprocess
import sys
import tempfile

import torch
from safetensors.torch import load_file

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tools"))
from train_reverse import make_batch  # noqa: E402


def heldout(seed=0, pad=0, bos=14, eos=15):  # models/reverse-tiny.yaml's tokens
    # train_reverse.main: heldout_gen = Generator().manual_seed(seed + 2), 1000 sequences
    src, _, _, lengths = make_batch(1000, torch.Generator().manual_seed(seed + 2), pad, bos, eos)
    return [src[i, : int(lengths[i])].tolist() for i in range(len(lengths))]


BEAM = 4


def exact_match(binary, weights, seqs, beam=1, eos=15):
    with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as f:
        f.write("".join(" ".join(map(str, s)) + "\n" for s in seqs))
    try:
        out = subprocess.run([binary, "--weights", weights, "--src-file", f.name, "--beam", str(beam)], check=True,
                             capture_output=True, text=True).stdout.splitlines()
    finally:
        os.unlink(f.name)
    assert len(out) == len(seqs), f"{binary}: {len(out)} output lines for {len(seqs)} inputs"
    return sum(list(map(int, o.split())) == s[::-1] + [eos] for o, s in zip(out, seqs)) / len(seqs)


def beam_score_mismatches(binary, weights, seqs, bos=14, tol=0.05):
    """Beam search's own scores against the model's teacher-forced scores of the same
    hypotheses: every hypothesis (all BEAM of each source, not only the best) must score,
    recomputed over the whole target at once (no cache), what the search reported for it
    (sum of log-probabilities / length, length_penalty 1). A search that continued a row
    from the wrong cache rows (a broken beam reorder) reports scores of another prefix.
    Returns (mismatches, hypotheses, largest difference)."""
    with tempfile.TemporaryDirectory() as tmp:
        src = os.path.join(tmp, "src.txt")
        with open(src, "w") as f:
            f.write("".join(" ".join(map(str, s)) + "\n" for s in seqs))
        out = subprocess.run([binary, "--weights", weights, "--src-file", src, "--beam", str(BEAM), "--json"],
                             check=True, capture_output=True, text=True).stdout
        hyps = [(s, h["tokens"], h["score"]) for s, r in zip(seqs, json.loads(out)["sequences"])
                for h in r["hypotheses"]]
        with open(src, "w") as f:
            f.write("".join(" ".join(map(str, s)) + "\n" for s, _, _ in hyps))
        tgt = os.path.join(tmp, "tgt.txt")
        with open(tgt, "w") as f:
            f.write("".join(" ".join(map(str, [bos] + t[:-1])) + "\n" for _, t, _ in hyps))
        dump = os.path.join(tmp, "dump.safetensors")
        subprocess.run([binary, "--weights", weights, "--src-file", src, "--tgt-file", tgt, "--dump", dump],
                       check=True, capture_output=True)
        head = torch.log_softmax(load_file(dump)["logits"].double(), dim=-1)  # [N, T, V]
    worst, bad = 0.0, 0
    for n, (_, tokens, score) in enumerate(hyps):
        forced = sum(float(head[n, t, tok]) for t, tok in enumerate(tokens)) / len(tokens)
        worst = max(worst, abs(forced - score))
        bad += abs(forced - score) > tol
    return bad, len(hyps), worst


def main(argv):
    weights, fp32_bin, rest = argv[0], argv[1], argv[2:]
    seqs = heldout()
    ok = True
    for beam, what in ((1, "greedy"), (BEAM, f"beam-{BEAM}")):
        base = exact_match(fp32_bin, weights, seqs, beam)
        print(f"fp32: {what} exact match {100 * base:.1f}% on {len(seqs)} held-out sequences")
        ok &= base >= 0.99
        for i in range(0, len(rest), 2):
            name, binary = rest[i].split("=", 1)
            max_drop = float(rest[i + 1])
            acc = exact_match(binary, weights, seqs, beam)
            good = 100 * (base - acc) <= max_drop
            ok &= good
            print(f"{name}: {what} exact match {100 * acc:.1f}% ({100 * (acc - base):+.1f} points vs fp32; "
                  f"allowed -{max_drop}){'' if good else '  FAIL'}")
    for name, binary in [("fp32", fp32_bin)] + [tuple(rest[i].split("=", 1)) for i in range(0, len(rest), 2)]:
        bad, n, worst = beam_score_mismatches(binary, weights, seqs[:100])
        ok &= bad == 0
        print(f"{name}: beam-{BEAM} scores of all {n} hypotheses vs teacher forcing: largest difference "
              f"{worst:.2e}, {bad} over 0.05{'' if bad == 0 else '  FAIL'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
