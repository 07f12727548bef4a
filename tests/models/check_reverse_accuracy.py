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
sys.path.insert(0, os.path.join(HERE, "..", "..", "tools"))
from train_reverse import make_batch  # noqa: E402


def heldout(seed=0, pad=0, bos=14, eos=15):  # models/reverse-tiny.yaml's tokens
    # train_reverse.main: heldout_gen = Generator().manual_seed(seed + 2), 1000 sequences
    src, _, _, lengths = make_batch(1000, torch.Generator().manual_seed(seed + 2), pad, bos, eos)
    return [src[i, : int(lengths[i])].tolist() for i in range(len(lengths))]


BEAM = 4
SCORED = 100  # sources whose beam hypotheses are all re-scored by teacher forcing


def write_lines(path, rows):
    with open(path, "w") as f:
        f.write("".join(" ".join(map(str, r)) + "\n" for r in rows))
    return path


def decode(binary, weights, seqs, beam):
    """Each source's hypotheses [(tokens, score)], best first, from one --json run (greedy:
    its one sequence, no score)."""
    with tempfile.TemporaryDirectory() as tmp:
        src = write_lines(os.path.join(tmp, "src.txt"), seqs)
        out = subprocess.run([binary, "--weights", weights, "--src-file", src, "--beam", str(beam), "--json"],
                             check=True, capture_output=True, text=True).stdout
    rows = json.loads(out)["sequences"]
    assert len(rows) == len(seqs), f"{binary}: {len(rows)} outputs for {len(seqs)} inputs"
    if beam == 1:
        return [[(r["tokens"], None)] for r in rows]
    return [[(h["tokens"], h["score"]) for h in r["hypotheses"]] for r in rows]


def exact_match(hyps, seqs, eos=15):
    return sum(h[0][0] == s[::-1] + [eos] for h, s in zip(hyps, seqs)) / len(seqs)


def beam_score_mismatches(binary, weights, seqs, hyps, bos=14, tol=0.05):
    """Beam search's own scores against the model's teacher-forced scores of the same
    hypotheses: every hypothesis (all BEAM of each source, not only the best) must score,
    recomputed over the whole target at once (no cache), what the search reported for it
    (sum of log-probabilities / length, length_penalty 1). A search that continued a row
    from the wrong cache rows (a broken beam reorder) reports scores of another prefix.
    Returns (mismatches, hypotheses, largest difference)."""
    pairs = [(s, tokens, score) for s, h in zip(seqs, hyps) for tokens, score in h]
    with tempfile.TemporaryDirectory() as tmp:
        src = write_lines(os.path.join(tmp, "src.txt"), [s for s, _, _ in pairs])
        tgt = write_lines(os.path.join(tmp, "tgt.txt"), [[bos] + t[:-1] for _, t, _ in pairs])
        dump = os.path.join(tmp, "dump.safetensors")
        subprocess.run([binary, "--weights", weights, "--src-file", src, "--tgt-file", tgt, "--dump", dump],
                       check=True, capture_output=True)
        head = torch.log_softmax(load_file(dump)["logits"].double(), dim=-1)  # [N, T, V]
    worst, bad = 0.0, 0
    for n, (_, tokens, score) in enumerate(pairs):
        forced = sum(float(head[n, t, tok]) for t, tok in enumerate(tokens)) / len(tokens)
        worst = max(worst, abs(forced - score))
        bad += abs(forced - score) > tol
    return bad, len(pairs), worst


def main(argv):
    weights, fp32_bin, rest = argv[0], argv[1], argv[2:]
    builds = [(*rest[i].split("=", 1), float(rest[i + 1])) for i in range(0, len(rest), 2)]
    seqs = heldout()
    ok = True
    beams = {}  # build name -> (binary, its beam hypotheses), re-scored below
    for beam, what in ((1, "greedy"), (BEAM, f"beam-{BEAM}")):
        hyps = decode(fp32_bin, weights, seqs, beam)
        if beam > 1:
            beams["fp32"] = (fp32_bin, hyps)
        base = exact_match(hyps, seqs)
        print(f"fp32: {what} exact match {100 * base:.1f}% on {len(seqs)} held-out sequences")
        ok &= base >= 0.99
        for name, binary, max_drop in builds:
            hyps = decode(binary, weights, seqs, beam)
            if beam > 1:
                beams[name] = (binary, hyps)
            acc = exact_match(hyps, seqs)
            good = 100 * (base - acc) <= max_drop
            ok &= good
            print(f"{name}: {what} exact match {100 * acc:.1f}% ({100 * (acc - base):+.1f} points vs fp32; "
                  f"allowed -{max_drop}){'' if good else '  FAIL'}")
    for name, (binary, hyps) in beams.items():
        bad, n, worst = beam_score_mismatches(binary, weights, seqs[:SCORED], hyps[:SCORED])
        ok &= bad == 0
        print(f"{name}: beam-{BEAM} scores of all {n} hypotheses vs teacher forcing: largest difference "
              f"{worst:.2e}, {bad} over 0.05{'' if bad == 0 else '  FAIL'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
