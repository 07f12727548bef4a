"""python -m halbench.make_weights SPEC OUT.safetensors [--seed 0]

Seeded random weights for a spec, exactly as the golden tests make them
(halformer_torch.randomize_: LeCun-normal matrices, small non-zero biases and
LayerNorm parameters, so every parameter matters), saved in the torch.nn.Transformer
naming preset with tools/export_torch.prepare_tensors. Random weights almost never emit
eos, so a greedy decode runs its full length (the harness reports it if one did not).

A Llama-style decoder-only spec (weights.preset huggingface-llama, e.g.
bench/gpu/tinyllama-1b.yaml) has no model in halformer_torch: its weights come from
halbench.llama_gpu.make_llama_weights (bf16, LlamaForCausalLM's names) instead.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

from .common import REFERENCE_DIR, TOOLS_DIR, log, quiet_warnings


def _is_llama(spec_path: str) -> bool:
    import yaml

    with open(spec_path, "r", encoding="utf-8") as f:
        spec = yaml.safe_load(f) or {}
    return (spec.get("weights") or {}).get("preset") == "huggingface-llama"


def make_weights(spec_path: str, out: str, seed: int = 0):
    """Writes the weights to `out` (atomically) and returns the torch model they came from
    (for a Llama-style spec: its state dict, bf16)."""
    sys.path.insert(0, TOOLS_DIR)
    sys.path.insert(0, REFERENCE_DIR)
    import torch
    from export_torch import prepare_tensors
    from halformer_torch import build_model, load_spec, randomize_
    from safetensors.torch import save_file

    t0 = time.time()
    if _is_llama(spec_path):
        from .llama_gpu import make_llama_weights, read_llama_spec

        return make_llama_weights(read_llama_spec(spec_path), out, seed)
    torch.manual_seed(seed)
    model = randomize_(build_model(load_spec(spec_path)), seed).eval()  # the preset's module (any architecture)
    tensors, _ = prepare_tensors(model.state_dict())
    tmp = out + ".tmp"
    save_file(tensors, tmp)
    os.replace(tmp, out)
    log(f"random weights (seed {seed}) -> {out} ({os.path.getsize(out) / 1e6:.0f} MB, {time.time() - t0:.1f} s)")
    return model


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("spec")
    ap.add_argument("out")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    quiet_warnings()
    make_weights(a.spec, a.out, a.seed)


if __name__ == "__main__":
    main()
