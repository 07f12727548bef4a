"""Decoding with a reference model, full recomputation of the prefix every step: greedy
(encoder-decoder, batched), greedy_lm (decoder-only, one prompt) and beam_search, the
algorithm the C++ runtime reproduces exactly."""
from __future__ import annotations

import math
from typing import List, Sequence, Tuple

import numpy as np
import torch

from .torch_preset import DecoderOnly


@torch.no_grad()
def greedy(model, src: torch.Tensor, max_new_tokens: int, return_margins: bool = False):
    """Batched greedy decoding for an encoder-decoder, full recomputation each step.

    Returns one token list per row: excludes bos, includes eos when produced. With
    return_margins, also returns per row the (top1 - top2) head-output gap at each step,
    a measure of how close the argmax was to a tie.
    """
    src = src.long()
    b = src.shape[0]
    memory = model.encode(src)
    tgt = torch.full((b, 1), model.bos, dtype=torch.long, device=src.device)
    finished = torch.zeros(b, dtype=torch.bool, device=src.device)
    out: List[List[int]] = [[] for _ in range(b)]
    margins: List[List[float]] = [[] for _ in range(b)]
    for _ in range(max_new_tokens):
        scores = model.decode(memory, src, tgt, tgt_padding=False)[:, -1, :]
        nxt = torch.argmax(scores, dim=-1)  # ties -> first index
        if return_margins:
            top2 = torch.topk(scores, 2, dim=-1).values if scores.shape[-1] > 1 else None
        for i in range(b):
            if not finished[i]:
                out[i].append(int(nxt[i]))
                if return_margins:
                    margins[i].append(float(top2[i, 0] - top2[i, 1]) if top2 is not None else math.inf)
        nxt = torch.where(finished, torch.full_like(nxt, model.pad), nxt)
        finished |= nxt == model.eos
        tgt = torch.cat([tgt, nxt[:, None]], dim=1)
        if bool(finished.all()):
            break
    return (out, margins) if return_margins else out


@torch.no_grad()
def greedy_lm(model: DecoderOnly, prompt: Sequence[int], max_new_tokens: int):
    """Decoder-only greedy continuation of one unpadded prompt, full recomputation.

    Returns (tokens, margins): tokens exclude the prompt and include eos when produced;
    margins[i] = top1 - top2 head output at step i (+inf when V == 1).
    """
    seq = torch.tensor([list(prompt)], dtype=torch.long)
    out: List[int] = []
    margins: List[float] = []
    for _ in range(max_new_tokens):
        scores = model(seq, padding=False)[0, -1]
        nxt = int(torch.argmax(scores))
        margins.append(float(torch.topk(scores, 2).values.diff().neg()) if scores.numel() > 1 else math.inf)
        out.append(nxt)
        if nxt == model.eos:
            break
        seq = torch.cat([seq, torch.tensor([[nxt]])], dim=1)
    return out, margins


@torch.no_grad()
def beam_search(model, src: Sequence[int], beam_size: int, max_new_tokens: int,
                length_penalty: float):
    """Beam search for one source sequence (unpadded token list); the C++ runtime's twin.

    Returns (hyps, margin): hyps = up to K = beam_size (tokens, normalised score) pairs,
    best first; tokens exclude bos and include eos when produced. margin = the smallest
    gap between neighbouring scores wherever an order decided something (a tie there
    could legitimately change the result; see below).

    The algorithm, exactly (scores accumulate in float64):

        hyps = [([bos], 0.0)]; finished = []
        for step in range(max_new_tokens):
            if not hyps: break                     # only when every candidate was eos
            run the decoder on every live hyp (no target padding mask);
            lp = log_softmax(generator_logits_at_last_position.double(), -1)
                 # the RAW generator logits, float64, whatever head.kind is
            candidates = [(score_i + lp[i, v], i, v) for every live hyp i and token v]
            sort by (-score, i, v); keep the first 2K
            new = []
            for rank, (s, i, v) in enumerate(top 2K):
                if v == eos:
                    if rank < K: finished.append((hyp_i tokens after bos + [eos], s))
                else:
                    new.append((hyp_i tokens + [v], s))
                if len(new) == K: break
            hyps = new
            if len(finished) >= K: break
        if len(finished) < K: finished += [(live hyp tokens after bos, s) for each live hyp]
        normalised = s / (len(tokens) ** length_penalty)  # len counts generated tokens incl. eos
        sort finished by (-normalised, tokens lexicographically); return the first K

    margin: min over steps of the gaps between consecutive sorted candidate scores among
    the first min(2K + 1, n) candidates, and of the gaps between consecutive normalised
    scores among the first min(K + 1, n) finished hypotheses (+inf if none).
    """
    k = int(beam_size)
    if k < 1:
        raise ValueError("beam_size must be >= 1")
    src_t = torch.tensor([list(src)], dtype=torch.long)
    memory = model.encode(src_t)
    bos, eos = model.bos, model.eos
    hyps: List[Tuple[List[int], float]] = [([bos], 0.0)]
    finished: List[Tuple[List[int], float]] = []
    margin = math.inf
    for _ in range(max_new_tokens):
        if not hyps:
            break
        n = len(hyps)
        tgt = torch.tensor([h for h, _ in hyps], dtype=torch.long)
        h = model.decode_hidden(memory.expand(n, -1, -1), src_t.expand(n, -1), tgt, tgt_padding=False)
        lp = torch.log_softmax(model.raw_logits(h[:, -1, :]).double(), dim=-1).numpy()
        vocab = lp.shape[1]
        scores = (np.array([s for _, s in hyps], dtype=np.float64)[:, None] + lp).reshape(-1)
        hyp_idx = np.repeat(np.arange(n), vocab)
        tok_idx = np.tile(np.arange(vocab), n)
        order = np.lexsort((tok_idx, hyp_idx, -scores))  # last key is the primary one
        top = order[: 2 * k]
        near = scores[order[: 2 * k + 1]]
        if len(near) > 1:
            margin = min(margin, float(np.min(near[:-1] - near[1:])))
        new: List[Tuple[List[int], float]] = []
        for rank, c in enumerate(top):
            s, i, v = float(scores[c]), int(hyp_idx[c]), int(tok_idx[c])
            if v == eos:
                if rank < k:
                    finished.append((hyps[i][0][1:] + [eos], s))
            else:
                new.append((hyps[i][0] + [v], s))
            if len(new) == k:
                break
        hyps = new
        if len(finished) >= k:
            break
    if len(finished) < k:
        finished += [(toks[1:], s) for toks, s in hyps]
    ranked = sorted(((toks, s / (len(toks) ** length_penalty)) for toks, s in finished),
                    key=lambda ts: (-ts[1], ts[0]))
    top_norm = [s for _, s in ranked[: k + 1]]
    if len(top_norm) > 1:
        margin = min(margin, min(a - b for a, b in zip(top_norm, top_norm[1:])))
    return ranked[:k], margin
