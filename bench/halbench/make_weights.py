"""python -m halbench.make_weights SPEC OUT.safetensors [--seed 0]

Seeded random weights for a spec, exactly as the golden tests make them
(tools/halformer_torch.randomize_: LeCun-normal matrices, small non-zero biases and
LayerNorm parameters, so every parameter matters), saved in the torch.nn.Transformer
naming preset with tools/export_torch.prepare_tensors. Random weights almost never emit
eos, so a greedy decode runs its full length (the harness reports it if one did not).
"""
from __future__ import annotations

import argparse
import os
import sys
import time

from .common import TOOLS_DIR, log, quiet_warnings


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("spec")
    ap.add_argument("out")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    quiet_warnings()
    sys.path.insert(0, TOOLS_DIR)
    import torch
    from export_torch import prepare_tensors
    from halformer_torch import Seq2Seq, load_spec, randomize_
    from safetensors.torch import save_file

    t0 = time.time()
    torch.manual_seed(a.seed)
    model = randomize_(Seq2Seq(load_spec(a.spec)), a.seed).eval()
    tensors, _ = prepare_tensors(model.state_dict())
    tmp = a.out + ".tmp"
    save_file(tensors, tmp)
    os.replace(tmp, a.out)
    log(f"random weights (seed {a.seed}) -> {a.out} ({os.path.getsize(a.out) / 1e6:.0f} MB, {time.time() - t0:.1f} s)")


if __name__ == "__main__":
    main()
