#!/usr/bin/env python3
"""Train the bundled default model, models/reverse-tiny.yaml, to reverse a sequence.

    python tools/train_reverse.py [--out models/reverse-tiny.safetensors] [--force]

Task: source = 1..12 random symbols from 1..13; target = the source reversed, then eos.
Teacher forcing: decoder input = [bos] + reversed, labels = reversed + [eos]; batches are
right-padded with pad, padding masks on, cross-entropy (NLL on the model's own
log_softmax head) ignores pad.

Design decisions:
* The model is halformer_torch.Seq2Seq (tests/reference), so the weights are saved under the
  "torch.nn.Transformer" naming preset with no renaming step.
* Fully deterministic (fixed seeds, fixed number of steps, CPU), sized to finish in a
  few minutes on a 2-core machine. Adam with linear warmup then cosine decay.
* One intra-op thread by default: with torch 1.13 on the 2-core VMs a training step of
  this tiny model (d_model 64, batch 128) took 0.054 s on 1 thread and 0.15-0.22 s on 2
  (thread synchronisation costs more than the tiny matmuls gain). --threads overrides.
* Acceptance is built in: greedy decoding (the same function the reference tests use)
  on 1000 held-out random sequences must be >= 99% exact match, and "3 7 1 9" must
  decode to "9 1 7 3 <eos>"; otherwise nothing is written and the exit status is 1.
* The output is written atomically and never overwritten without --force (checked
  before training so a mistake costs nothing).
"""
from __future__ import annotations

import argparse
import math
import os
import sys
import time

import torch
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(ROOT, "tests", "reference"))  # halformer_torch, the PyTorch reference

from export_torch import ExportError, prepare_tensors, save_atomic  # noqa: E402
from halformer_torch import Seq2Seq, greedy, load_spec  # noqa: E402

SYMBOLS = range(1, 14)  # 1..13
MAX_SYMBOLS = 12


def make_batch(n: int, gen: torch.Generator, pad: int, bos: int, eos: int):
    """src [n, L], tgt_in [n, L+1], labels [n, L+1]; L = longest drawn length."""
    lengths = torch.randint(1, MAX_SYMBOLS + 1, (n,), generator=gen)
    width = int(lengths.max())
    sym = torch.randint(SYMBOLS.start, SYMBOLS.stop, (n, width), generator=gen)
    src = torch.full((n, width), pad, dtype=torch.long)
    tgt_in = torch.full((n, width + 1), pad, dtype=torch.long)
    labels = torch.full((n, width + 1), pad, dtype=torch.long)
    for i in range(n):
        k = int(lengths[i])
        s = sym[i, :k]
        r = s.flip(0)
        src[i, :k] = s
        tgt_in[i, 0] = bos
        tgt_in[i, 1:k + 1] = r
        labels[i, :k] = r
        labels[i, k] = eos
    return src, tgt_in, labels, lengths


def exact_match(model: Seq2Seq, src: torch.Tensor, lengths: torch.Tensor, max_new: int) -> float:
    model.eval()
    out = greedy(model, src, max_new)
    model.train()
    ok = 0
    for i, toks in enumerate(out):
        k = int(lengths[i])
        ok += toks == src[i, :k].flip(0).tolist() + [model.eos]
    return ok / len(out)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--spec", default=os.path.join(ROOT, "models", "reverse-tiny.yaml"))
    ap.add_argument("--out", default=os.path.join(ROOT, "models", "reverse-tiny.safetensors"))
    ap.add_argument("--force", action="store_true", help="overwrite --out if it exists")
    ap.add_argument("--steps", type=int, default=2400)
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--warmup", type=int, default=200)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=1, help="torch intra-op threads (default 1)")
    args = ap.parse_args(argv)

    if os.path.exists(args.out) and not args.force:
        print(f"train_reverse: error: {args.out}: already exists (use --force to overwrite)",
              file=sys.stderr)
        return 1
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    spec = load_spec(args.spec)
    model = Seq2Seq(spec)
    pad, bos, eos = model.pad, model.bos, model.eos
    max_new = int(spec["decoding"]["max_new_tokens"])
    train_gen = torch.Generator().manual_seed(args.seed + 1)
    heldout_gen = torch.Generator().manual_seed(args.seed + 2)  # a separate stream
    ho_src, _, _, ho_len = make_batch(1000, heldout_gen, pad, bos, eos)

    opt = torch.optim.Adam(model.parameters(), lr=args.lr, betas=(0.9, 0.98), eps=1e-9)

    def lr_at(step: int) -> float:  # linear warmup, then cosine decay to 2% of peak
        if step < args.warmup:
            return (step + 1) / args.warmup
        t = (step - args.warmup) / max(1, args.steps - args.warmup)
        return 0.02 + 0.98 * 0.5 * (1 + math.cos(math.pi * t))

    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_at)
    model.train()
    t0 = time.time()
    running = None
    for step in range(1, args.steps + 1):
        src, tgt_in, labels, _ = make_batch(args.batch, train_gen, pad, bos, eos)
        logp = model(src, tgt_in)
        loss = F.nll_loss(logp.reshape(-1, logp.shape[-1]), labels.reshape(-1), ignore_index=pad)
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        running = float(loss) if running is None else 0.95 * running + 0.05 * float(loss)
        if step % 200 == 0 or step == args.steps:
            acc = exact_match(model, ho_src[:200], ho_len[:200], max_new)
            print(f"step {step:5d}  loss {running:.4f}  lr {sched.get_last_lr()[0]:.2e}  "
                  f"held-out exact match (200) {acc:6.1%}  {time.time() - t0:5.0f} s", flush=True)
    train_s = time.time() - t0

    model.eval()
    acc = exact_match(model, ho_src, ho_len, max_new)
    demo = greedy(model, torch.tensor([[3, 7, 1, 9]]), max_new)[0]
    print(f"trained in {train_s:.0f} s; greedy exact match on 1000 held-out sequences: {acc:.1%}")
    print(f"3 7 1 9 -> {' '.join(map(str, demo))} (eos = {eos})")
    if acc < 0.99 or demo != [9, 1, 7, 3, eos]:
        print("train_reverse: error: accuracy below 99% or the demo sequence is wrong; "
              "nothing written", file=sys.stderr)
        return 1
    try:
        tensors, notes = prepare_tensors(model.state_dict())
        for n in notes:
            print("note:", n)
        save_atomic(tensors, args.out, args.force)
    except ExportError as e:
        print(f"train_reverse: error: {e}", file=sys.stderr)
        return 1
    print(f"wrote {args.out} ({os.path.getsize(args.out)} bytes)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
