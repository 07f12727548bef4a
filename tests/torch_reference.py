#!/usr/bin/env python3
"""Write PyTorch reference outputs for a spec, for the C++ whole-model tests.

    python tests/torch_reference.py SPEC OUTDIR [--seed 0] [--lengths 7,1,13]
        [--tgt-lengths 5,1,9] [--max-new-tokens 8] [--weights EXISTING.safetensors]

Builds tools/halformer_torch.Seq2Seq from SPEC with deterministic random weights
(randomize_(seed)) or the given --weights, and writes (eval mode, no grad):

  OUTDIR/weights.safetensors    the model's state_dict, names unchanged, i.e. the
                                "torch.nn.Transformer" naming preset (not with --weights)
  OUTDIR/reference.safetensors  B = number of --lengths, S / T = longest src / tgt:
    src             int32 [B, S]    random non-special tokens, right-padded with pad
    tgt             int32 [B, T]    teacher-forced decoder input: bos + random
                                    non-special tokens, right-padded with pad
    src_lengths     int32 [B]
    tgt_lengths     int32 [B]       including the bos
    encoder_output  float32 [B, S, d]   padded positions set to 0
    logits          float32 [B, T, V]   head output (log_softmax / softmax / logits as
                                        head.kind says) for tgt; padded positions set to 0
    greedy          int32 [B, max_new_tokens]  greedy tokens (no bos, eos included when
                                    produced), right-padded with -1
    greedy_margin   float32 [B, max_new_tokens]  top1 - top2 head output at each greedy
                                    step (+inf when V == 1), -1 where greedy is -1; a
                                    test may allow a different token where it is tiny

Design decisions: random tokens are drawn from the ids that are not pad/bos/eos, so the
padding masks are exactly the right-padding; the default batch includes a length-1
source (a 1-row encoder input) and a bos-only target. Outputs at padded positions mean
nothing (see halformer_torch's docstring) and are zeroed so files compare bit-stably.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tools"))

import torch  # noqa: E402
from safetensors.torch import load_file, save_file  # noqa: E402

from export_torch import prepare_tensors  # noqa: E402
from halformer_torch import Seq2Seq, greedy, load_spec, randomize_  # noqa: E402


def int_list(text: str):
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}")
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"lengths must be >= 1, got {text!r}")
    return values


def random_tokens(gen: torch.Generator, vocab: int, special, n: int) -> torch.Tensor:
    allowed = torch.tensor([t for t in range(vocab) if t not in special], dtype=torch.long)
    if len(allowed) == 0:
        raise SystemExit("torch_reference: error: the vocabulary has only special tokens")
    return allowed[torch.randint(0, len(allowed), (n,), generator=gen)]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("spec")
    ap.add_argument("outdir")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--lengths", type=int_list, default=[7, 1, 13], help="source lengths")
    ap.add_argument("--tgt-lengths", type=int_list, default=[5, 1, 9],
                    help="decoder input lengths, bos included")
    ap.add_argument("--max-new-tokens", type=int, default=8)
    ap.add_argument("--weights", help="use these weights instead of random ones")
    args = ap.parse_args(argv)
    if len(args.lengths) != len(args.tgt_lengths):
        ap.error("--lengths and --tgt-lengths must have the same number of entries")

    t0 = time.time()
    torch.set_num_threads(2)
    spec = load_spec(args.spec)
    model = Seq2Seq(spec)
    if args.weights:
        state = load_file(args.weights)
        missing, unexpected = model.load_state_dict(state, strict=False)
        if missing or unexpected:
            raise SystemExit(f"torch_reference: error: {args.weights}: missing {missing}, "
                             f"unexpected {unexpected}")
    else:
        randomize_(model, args.seed)
    model.eval()
    os.makedirs(args.outdir, exist_ok=True)

    sizes = spec["sizes"]
    special = {model.pad, model.bos, model.eos}
    limit = sizes["max_len"] if model.positions == "learned" else None
    if limit and max(max(args.lengths), max(args.tgt_lengths), args.max_new_tokens) > limit:
        raise SystemExit(f"torch_reference: error: a length exceeds sizes.max_len {limit}")
    gen = torch.Generator().manual_seed(args.seed + 1000)
    b, s, t = len(args.lengths), max(args.lengths), max(args.tgt_lengths)
    src = torch.full((b, s), model.pad, dtype=torch.long)
    tgt = torch.full((b, t), model.pad, dtype=torch.long)
    for i, (ls, lt) in enumerate(zip(args.lengths, args.tgt_lengths)):
        src[i, :ls] = random_tokens(gen, int(sizes["src_vocab"]), special, ls)
        tgt[i, 0] = model.bos
        tgt[i, 1:lt] = random_tokens(gen, int(sizes["tgt_vocab"]), special, lt - 1)
    src_valid = (torch.arange(s)[None, :] < torch.tensor(args.lengths)[:, None])
    tgt_valid = (torch.arange(t)[None, :] < torch.tensor(args.tgt_lengths)[:, None])

    with torch.no_grad():
        memory = model.encode(src)
        logits = model.decode(memory, src, tgt)
        tokens, margins = greedy(model, src, args.max_new_tokens, return_margins=True)
    greedy_t = torch.full((b, args.max_new_tokens), -1, dtype=torch.int32)
    margin_t = torch.full((b, args.max_new_tokens), -1.0, dtype=torch.float32)
    for i, (toks, ms) in enumerate(zip(tokens, margins)):
        greedy_t[i, :len(toks)] = torch.tensor(toks, dtype=torch.int32)
        margin_t[i, :len(ms)] = torch.tensor(ms, dtype=torch.float32)

    ref = {
        "src": src.to(torch.int32),
        "tgt": tgt.to(torch.int32),
        "src_lengths": torch.tensor(args.lengths, dtype=torch.int32),
        "tgt_lengths": torch.tensor(args.tgt_lengths, dtype=torch.int32),
        "encoder_output": memory.masked_fill(~src_valid[..., None], 0.0).float().contiguous(),
        "logits": logits.masked_fill(~tgt_valid[..., None], 0.0).float().contiguous(),
        "greedy": greedy_t,
        "greedy_margin": margin_t,
    }
    save_file(ref, os.path.join(args.outdir, "reference.safetensors"))
    if not args.weights:
        tensors, _ = prepare_tensors(model.state_dict())  # clones tied weights, if any
        save_file(tensors, os.path.join(args.outdir, "weights.safetensors"))

    print(f"torch_reference: {spec.get('name', args.spec)} B={b} S={s} T={t} "
          f"d={model.d_model} V={sizes['tgt_vocab']} seed={args.seed} "
          f"greedy={[len(x) for x in tokens]} tokens, min margin "
          f"{min((m for ms in margins for m in ms), default=float('nan')):.3g} -> "
          f"{args.outdir} ({time.time() - t0:.1f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
