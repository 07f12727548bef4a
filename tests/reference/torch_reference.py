#!/usr/bin/env python3
"""Write PyTorch reference outputs for a spec, for the C++ whole-model tests.

    python tests/reference/torch_reference.py SPEC OUTDIR [--seed 0] [--lengths 7,1,13]
        [--tgt-lengths 5,1,9] [--max-new-tokens 8] [--weights EXISTING.safetensors]
        [--beam K] [--length-penalty A]

Builds halformer_torch.build_model(SPEC) (the package beside this script: the module of
the spec's architecture and weights.preset) with deterministic random weights
(randomize_(seed)) or the given --weights, and writes (eval mode: dropout is identity;
no grad):

  OUTDIR/weights.safetensors    export_state(model): the preset's names, unchanged,
                                float32, tied weights as equal copies (not with --weights)
  OUTDIR/reference.safetensors  B = number of --lengths, S / T = longest src / tgt,
                                N = --max-new-tokens; by architecture:

  encoder_decoder
    src             int32 [B, S]    random non-special tokens, right-padded with pad
    tgt             int32 [B, T]    teacher-forced decoder input: bos + random
                                    non-special tokens, right-padded with pad
    src_lengths     int32 [B]
    tgt_lengths     int32 [B]       including the bos
    encoder_output  float32 [B, S, d]   padded positions set to 0
    logits          float32 [B, T, V]   head output (log_softmax / softmax / logits as
                                        head.kind says) for tgt; padded positions set to 0
    greedy          int32 [B, N]    greedy tokens (no bos, eos included when produced),
                                    right-padded with -1
    greedy_margin   float32 [B, N]  top1 - top2 head output at each greedy step (+inf
                                    when V == 1), -1 where greedy is -1; a test may
                                    allow a different token where it is tiny
    -- with --beam K, or decoding.strategy beam (K = decoding.beam_size):
    beam_tokens     int32 [B, K, N]   halformer_torch.beam_search's hypotheses, best
                                      first (no bos, eos included), right-padded with -1
                                      (a row with fewer than K hypotheses, possible only
                                      with a tiny vocabulary, is all -1)
    beam_scores     float32 [B, K]    normalised scores (log prob / len^length_penalty,
                                      accumulated in float64); -inf where no hypothesis
    beam_margin     float32 [B]       smallest score gap where an order decided
                                      something (see beam_search); tiny = a near tie
  encoder
    src, src_lengths                  as above (token type ids are all 0)
    encoder_output  float32 [B, S, d] last hidden states, padded positions set to 0
    head_output     float32 [B, C] classifier logits | [B, d] pooled embedding
                                      (L2-normalised if head.normalize); absent for
                                      head.kind hidden
  decoder
    src             int32 [B, P]      prompts: random non-special tokens, right-padded
    src_lengths     int32 [B]
    logits          float32 [B, P, V] head output over the prompts (causal + padding
                                      mask), padded positions set to 0
    greedy, greedy_margin  [B, N]     each prompt continued alone by greedy decoding
                                      (tokens exclude the prompt, include eos)

Design decisions: random tokens are drawn from the ids that are not pad/bos/eos, so the
padding masks are exactly the right-padding; the default batch includes a length-1
source (a 1-row encoder input) and a bos-only target. Outputs at padded positions mean
nothing (see halformer_torch's docstring) and are zeroed so files compare bit-stably.
Decoding (greedy of a decoder-only model, beam) runs each sequence alone, unpadded.
"""
from __future__ import annotations

import argparse
import math
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))  # tests/reference: halformer_torch
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(HERE)), "tools"))  # export_torch
sys.path.insert(0, HERE)

import torch  # noqa: E402
from safetensors.torch import load_file, save_file  # noqa: E402

from export_torch import prepare_tensors  # noqa: E402
from halformer_torch import (  # noqa: E402
    AnnotatedSeq2Seq, beam_search, build_model, export_state, greedy, greedy_lm, load_spec,
    load_weights, randomize_)


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


def padded_batch(gen, lengths, vocab, special, pad, first=None) -> torch.Tensor:
    """[B, max(lengths)] right-padded random tokens; first: a token forced at position 0."""
    out = torch.full((len(lengths), max(lengths)), pad, dtype=torch.long)
    for i, n in enumerate(lengths):
        if first is None:
            out[i, :n] = random_tokens(gen, vocab, special, n)
        else:
            out[i, 0] = first
            out[i, 1:n] = random_tokens(gen, vocab, special, n - 1)
    return out


def valid_mask(lengths, width) -> torch.Tensor:
    return torch.arange(width)[None, :] < torch.tensor(lengths)[:, None]


def zero_padded(x: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    return x.masked_fill(~valid[..., None], 0.0).float().contiguous()


def token_table(rows, width: int, fill, dtype) -> torch.Tensor:
    out = torch.full((len(rows), width), fill, dtype=dtype)
    for i, r in enumerate(rows):
        if r:
            out[i, :len(r)] = torch.tensor(r, dtype=dtype)
    return out


def min_margin(margins) -> float:
    return min((m for ms in margins for m in ms), default=float("nan"))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("spec")
    ap.add_argument("outdir")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--lengths", type=int_list, default=[7, 1, 13],
                    help="source (encoder) / prompt (decoder) lengths")
    ap.add_argument("--tgt-lengths", type=int_list, default=[5, 1, 9],
                    help="decoder input lengths, bos included (encoder_decoder only)")
    ap.add_argument("--max-new-tokens", type=int, default=8)
    ap.add_argument("--weights", help="use these weights instead of random ones")
    ap.add_argument("--beam", type=int, metavar="K",
                    help="also write beam search results with beam size K (encoder_decoder)")
    ap.add_argument("--length-penalty", type=float, metavar="A",
                    help="beam length penalty (default: decoding.length_penalty)")
    args = ap.parse_args(argv)

    t0 = time.time()
    torch.set_num_threads(2)
    spec = load_spec(args.spec)
    arch = spec["architecture"]
    if arch == "encoder_decoder" and len(args.lengths) != len(args.tgt_lengths):
        ap.error("--lengths and --tgt-lengths must have the same number of entries")
    if args.max_new_tokens < 1:
        ap.error("--max-new-tokens must be >= 1")
    beam_k = args.beam
    if beam_k is None and spec["decoding"]["strategy"] == "beam" and arch == "encoder_decoder":
        beam_k = int(spec["decoding"]["beam_size"])
    if beam_k is not None and (beam_k < 1 or arch != "encoder_decoder"):
        ap.error("--beam needs K >= 1 and architecture encoder_decoder")
    alpha = (args.length_penalty if args.length_penalty is not None
             else float(spec["decoding"]["length_penalty"]))

    try:
        model = build_model(spec)
    except (ValueError, ImportError) as e:
        raise SystemExit(f"torch_reference: error: {args.spec}: {e}")
    if args.weights:
        missing, unexpected = load_weights(model, load_file(args.weights))
        if missing or unexpected:
            raise SystemExit(f"torch_reference: error: {args.weights}: missing {missing}, "
                             f"unexpected {unexpected}")
    else:
        randomize_(model, args.seed)
    model.eval()
    os.makedirs(args.outdir, exist_ok=True)

    sizes = spec["sizes"]
    special = {model.pad, model.bos, model.eos}
    n_new = args.max_new_tokens
    limited = model.positions == "learned" or isinstance(model, AnnotatedSeq2Seq)
    limit = int(sizes["max_len"]) if limited else None
    if arch == "encoder_decoder":
        need = max(max(args.lengths), max(args.tgt_lengths), n_new)
    elif arch == "encoder":
        need = max(args.lengths)
    else:
        need = max(args.lengths) + n_new - 1  # the longest sequence the decoder reads
    if limit and need > limit:
        raise SystemExit(f"torch_reference: error: a length ({need}) exceeds sizes.max_len {limit}")
    gen = torch.Generator().manual_seed(args.seed + 1000)
    b = len(args.lengths)
    ref = {}
    note = ""

    if arch == "encoder_decoder":
        s, t = max(args.lengths), max(args.tgt_lengths)
        src = torch.full((b, s), model.pad, dtype=torch.long)
        tgt = torch.full((b, t), model.pad, dtype=torch.long)
        for i, (ls, lt) in enumerate(zip(args.lengths, args.tgt_lengths)):  # interleaved draws
            src[i, :ls] = random_tokens(gen, int(sizes["src_vocab"]), special, ls)
            tgt[i, 0] = model.bos
            tgt[i, 1:lt] = random_tokens(gen, int(sizes["tgt_vocab"]), special, lt - 1)
        with torch.no_grad():
            memory = model.encode(src)
            logits = model.decode(memory, src, tgt)
            tokens, margins = greedy(model, src, n_new, return_margins=True)
        ref.update({
            "src": src.to(torch.int32),
            "tgt": tgt.to(torch.int32),
            "src_lengths": torch.tensor(args.lengths, dtype=torch.int32),
            "tgt_lengths": torch.tensor(args.tgt_lengths, dtype=torch.int32),
            "encoder_output": zero_padded(memory, valid_mask(args.lengths, s)),
            "logits": zero_padded(logits, valid_mask(args.tgt_lengths, t)),
        })
        note = f"S={s} T={t} d={model.d_model} V={sizes['tgt_vocab']}"
    elif arch == "encoder":
        s = max(args.lengths)
        src = padded_batch(gen, args.lengths, int(sizes["src_vocab"]), special, model.pad)
        with torch.no_grad():
            hidden = model.encode(src)
            head = model.head_output(hidden, src)
        ref.update({
            "src": src.to(torch.int32),
            "src_lengths": torch.tensor(args.lengths, dtype=torch.int32),
            "encoder_output": zero_padded(hidden, valid_mask(args.lengths, s)),
        })
        note = f"S={s} d={model.d_model} head={model.head_kind}"
        if head is not None:
            ref["head_output"] = head.float().contiguous()
            note += f"{list(head.shape)} |head| max {float(head.abs().max()):.3g}"
    else:
        p = max(args.lengths)
        src = padded_batch(gen, args.lengths, int(sizes["tgt_vocab"]), special, model.pad)
        with torch.no_grad():
            logits = model(src)
            runs = [greedy_lm(model, src[i, :n].tolist(), n_new) for i, n in enumerate(args.lengths)]
        tokens, margins = [r[0] for r in runs], [r[1] for r in runs]
        ref.update({
            "src": src.to(torch.int32),
            "src_lengths": torch.tensor(args.lengths, dtype=torch.int32),
            "logits": zero_padded(logits, valid_mask(args.lengths, p)),
        })
        note = f"P={p} d={model.d_model} V={sizes['tgt_vocab']}"

    if arch != "encoder":
        ref["greedy"] = token_table(tokens, n_new, -1, torch.int32)
        margin_t = token_table(margins, n_new, -1.0, torch.float32)
        ref["greedy_margin"] = margin_t
        note += (f" greedy={[len(x) for x in tokens]} tokens "
                 f"({len({v for x in tokens for v in x})} distinct), min margin {min_margin(margins):.3g}")

    if beam_k is not None:
        beam_tokens = torch.full((b, beam_k, n_new), -1, dtype=torch.int32)
        beam_scores = torch.full((b, beam_k), -math.inf, dtype=torch.float32)
        beam_margin = torch.zeros(b, dtype=torch.float32)
        n_eos = 0
        for i, n in enumerate(args.lengths):
            hyps, margin = beam_search(model, src[i, :n].tolist(), beam_k, n_new, alpha)
            for j, (toks, score) in enumerate(hyps):
                beam_tokens[i, j, :len(toks)] = torch.tensor(toks, dtype=torch.int32)
                beam_scores[i, j] = score
                n_eos += int(bool(toks) and toks[-1] == model.eos)
            beam_margin[i] = margin
        ref.update({"beam_tokens": beam_tokens, "beam_scores": beam_scores,
                    "beam_margin": beam_margin})
        note += (f" beam K={beam_k} alpha={alpha:g}: {n_eos}/{b * beam_k} end in eos, "
                 f"min margin {float(beam_margin.min()):.3g}")

    save_file(ref, os.path.join(args.outdir, "reference.safetensors"))
    if not args.weights:
        tensors, _ = prepare_tensors(export_state(model))  # clones tied weights, if any
        save_file(tensors, os.path.join(args.outdir, "weights.safetensors"))

    print(f"torch_reference: {spec.get('name', args.spec)} {arch} "
          f"preset={spec['weights']['preset']} B={b} {note} seed={args.seed} -> "
          f"{args.outdir} ({time.time() - t0:.1f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
