"""Greedy exact match of the trained reverse-tiny on its 1000 held-out sequences, per build.

usage: check_reverse_accuracy.py WEIGHTS FP32_BIN [NAME=BIN MAX_DROP_POINTS ...]

The held-out set is tools/train_reverse.py's own (same generator and seed, never trained
on). The fp32 build must reach 99% (what training guarantees); every other build (e.g.
int8) must stay within MAX_DROP_POINTS percentage points of the fp32 build.
"""
import os
import subprocess
import sys
import tempfile

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tools"))
from train_reverse import make_batch  # noqa: E402


def heldout(seed=0, pad=0, bos=14, eos=15):  # models/reverse-tiny.yaml's tokens
    # train_reverse.main: heldout_gen = Generator().manual_seed(seed + 2), 1000 sequences
    src, _, _, lengths = make_batch(1000, torch.Generator().manual_seed(seed + 2), pad, bos, eos)
    return [src[i, : int(lengths[i])].tolist() for i in range(len(lengths))]


def exact_match(binary, weights, seqs, eos=15):
    with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as f:
        f.write("".join(" ".join(map(str, s)) + "\n" for s in seqs))
    try:
        out = subprocess.run([binary, "--weights", weights, "--src-file", f.name], check=True,
                             capture_output=True, text=True).stdout.splitlines()
    finally:
        os.unlink(f.name)
    assert len(out) == len(seqs), f"{binary}: {len(out)} output lines for {len(seqs)} inputs"
    return sum(list(map(int, o.split())) == s[::-1] + [eos] for o, s in zip(out, seqs)) / len(seqs)


def main(argv):
    weights, fp32_bin, rest = argv[0], argv[1], argv[2:]
    seqs = heldout()
    base = exact_match(fp32_bin, weights, seqs)
    print(f"fp32: greedy exact match {100 * base:.1f}% on {len(seqs)} held-out sequences")
    ok = base >= 0.99
    for i in range(0, len(rest), 2):
        name, binary = rest[i].split("=", 1)
        max_drop = float(rest[i + 1])
        acc = exact_match(binary, weights, seqs)
        good = 100 * (base - acc) <= max_drop
        ok &= good
        print(f"{name}: greedy exact match {100 * acc:.1f}% ({100 * (acc - base):+.1f} points vs fp32; "
              f"allowed -{max_drop}){'' if good else '  FAIL'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
