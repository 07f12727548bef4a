"""Batching: a padded batch of sequences of different lengths gives the same results as
running each sequence alone (encoder rows, head outputs and decoded tokens).

    check_batching.py BINARY WEIGHTS SEQ1 SEQ2 ...   (each SEQ: space-separated ids)

Encoder outputs and logits must agree to 1e-6 (padded keys get exactly zero attention
weight, so only the summation order of the batch could differ); tokens exactly.
HALFORMER_DEVICE (optional): run on that device (e.g. opencl)."""
import os
import subprocess
import sys
import tempfile

import numpy as np
from safetensors.numpy import load_file


def run(binary, weights, seqs, out):
    cmd = [binary, "--weights", weights, "--dump", out]
    if os.environ.get("HALFORMER_DEVICE"):
        cmd += ["--device", os.environ["HALFORMER_DEVICE"]]
    for s in seqs:
        cmd += ["--src", s]
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    return load_file(out)


def main():
    binary, weights, seqs = sys.argv[1], sys.argv[2], sys.argv[3:]
    with tempfile.TemporaryDirectory() as tmp:
        batch = run(binary, weights, seqs, f"{tmp}/batch.safetensors")
        worst = 0.0
        for b, s in enumerate(seqs):
            one = run(binary, weights, [s], f"{tmp}/one.safetensors")
            n = len(s.split())
            for name in ("encoder_output", "head_output"):
                if name in one:
                    got = batch[name][b, :n] if batch[name].ndim == 3 else batch[name][b]
                    want = one[name][0, :n] if one[name].ndim == 3 else one[name][0]
                    worst = max(worst, float(np.abs(got - want).max()))
            for name in ("greedy",):
                if name in one:
                    got = [t for t in batch[name][b] if t >= 0]
                    want = [t for t in one[name][0] if t >= 0]
                    if got != want:
                        sys.exit(f"sequence {b}: batched tokens {got} != alone {want}")
        print(f"{len(seqs)} sequences: max |batched - alone| = {worst:.3g}")
        if worst > 1e-6:
            sys.exit("batched results differ from one-by-one results")


if __name__ == "__main__":
    main()
