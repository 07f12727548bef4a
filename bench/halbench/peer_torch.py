"""PyTorch peer: eager mode, `threads` intra-op threads, inference_mode.

* encoder: the reference model itself, halformer_torch.Seq2Seq.encode (stock
  torch.nn.TransformerEncoder, which takes PyTorch's fused "fast path" encoder-layer
  kernel in eval/inference mode) - what a PyTorch user runs.
* decode: nn.TransformerDecoder has no KV cache, so the decoder is kv_model.KVSeq2Seq.step
  (same weights, same function, K/V cached and concatenated per step) in eager mode; the
  encoder and cross-attention K/V projections run before the timed loop.
Its greedy top-1/top-2 margins are saved (greedy_b<B>.json) so that the other peers'
token checks can tell a near-tie from a bug.
"""
from __future__ import annotations

import contextlib
import json
import os
import sys
import time

from .common import (ENCODER_REL_TOL, REDUCED_ENCODER_REL_TOL, REFERENCE_DIR, Unavailable, check_encoder, check_tokens,
                     load_reference, peer_main, read_sources, reduced_precision_check, timed_runs)


def body(task, res):
    try:
        import torch
    except ImportError as e:
        raise Unavailable(f"torch is not installed ({e})")
    from .kv_model import KVSeq2Seq, greedy_kv, load_state

    sys.path.insert(0, REFERENCE_DIR)
    from halformer_torch import Seq2Seq, load_spec

    torch.set_num_threads(task["threads"])
    res.data["versions"] = {"torch": torch.__version__, "threads": torch.get_num_threads(),
                            "backend": "MKL" if torch.backends.mkl.is_available() else "no MKL",
                            "mkldnn": bool(torch.backends.mkldnn.is_available())}
    spec = load_spec(task["spec"])
    state = load_state(task["weights"])
    # task "torch_dtype": "bfloat16" ("pytorch-bf16"): every weight and activation in bf16
    # (PyTorch's CPU bf16 path); outputs checked against fp32 like the other reduced systems.
    dtype = getattr(torch, task.get("torch_dtype", "float32"))
    reduced = dtype != torch.float32
    state = {k: v.to(dtype) if v.is_floating_point() else v for k, v in state.items()}
    res.data["versions"]["dtype"] = str(dtype)
    model = Seq2Seq(spec).to(dtype)
    missing, unexpected = model.load_state_dict(state, strict=False)
    if missing or unexpected:
        raise RuntimeError(f"weights do not fit the spec: missing {missing}, unexpected {unexpected}")
    model.eval()
    kv = KVSeq2Seq(spec, state).eval()
    bos, eos, n = task["bos"], task["eos"], task["new_tokens"]
    out_dir = task["peer_dir"]
    os.makedirs(out_dir, exist_ok=True)

    for b in task["batches"]:
        info = task["inputs"][str(b)]
        src = torch.tensor(read_sources(info["src"]), dtype=torch.long)
        ref_enc, ref_greedy = load_reference(info["reference"])
        # bf16: weights stored in bf16, and autocast so that mixed fp32 inputs (the
        # reference model's fp32 sinusoid table) still reach every matmul as bf16.
        amp = torch.autocast("cpu", dtype=dtype) if reduced else contextlib.nullcontext()
        with torch.inference_mode(), amp:
            if "encoder" in task["scenarios"]:
                out = model.encode(src)
                tol = REDUCED_ENCODER_REL_TOL if reduced else ENCODER_REL_TOL
                if res.check("encoder", b, check_encoder(out.float().numpy(), ref_enc, tol)):
                    res.timing("encoder", b, timed_runs(lambda: model.encode(src), task["warmup"], task["repeat_encoder"]))
            if "decode" in task["scenarios"]:
                toks, margins = greedy_kv(kv, src, n, bos, with_margins=True)
                if not reduced:  # the margins the other peers' token checks use are fp32's
                    with open(os.path.join(out_dir, f"greedy_b{b}.json"), "w") as f:
                        json.dump({"tokens": toks, "margins": margins}, f)
                tok_check = check_tokens(toks, ref_greedy.tolist(), eos, margins)
                if res.check("decode", b, reduced_precision_check(tok_check) if reduced else tok_check):
                    res.timing("decode", b, decode_samples(kv, src, n, bos, task["warmup"], task["repeat_decode"]),
                               steps=n)


def decode_samples(kv, src, n, bos, warmup, repeat):
    """Mean step time (ms) of a fixed n-step greedy decode, one sample per decode. On a
    CUDA src (halbench.gpu) the device is synchronised around the timed steps."""
    import torch

    b = src.shape[0]
    sync = torch.cuda.synchronize if src.is_cuda else (lambda: None)
    positions = [torch.tensor([t], device=src.device) for t in range(n)]
    out = []
    for i in range(warmup + repeat):
        memory = kv.encode(src)
        cross = kv.cross_kv(memory)
        mask = kv.key_mask(src)
        past = kv.empty_past(b)
        tok = torch.full((b, 1), bos, dtype=torch.long, device=src.device)
        sync()
        t0 = time.perf_counter()
        for t in range(n):
            scores, past = kv.step(tok, positions[t], mask, past, cross)
            tok = torch.argmax(scores, dim=-1)[:, None]
        sync()
        ms = (time.perf_counter() - t0) * 1e3 / n
        if i >= warmup:
            out.append(ms)
    return out


if __name__ == "__main__":
    peer_main("pytorch", body)
