"""The "annotated-transformer" weight preset: The Annotated Transformer's module tree and
state-dict names (its make_model), written after the notebook's names and formulas."""
from __future__ import annotations

import math
from typing import Any, Dict, List, Optional, Tuple

import torch
import torch.nn as nn
import torch.nn.functional as F

from .layers import _activation_fn, _Common, sinusoidal_positions


class AnnotatedNorm(nn.Module):
    """LayerNorm with the Annotated Transformer's parameter names a_2 (gain), b_2 (bias).

    kind annotated: a_2 * (x - mean) / (std_unbiased + eps) + b_2 (the notebook's);
    kind standard: torch.nn.functional.layer_norm (biased variance, eps inside the sqrt).
    """

    def __init__(self, d: int, eps: float, kind: str):
        super().__init__()
        self.a_2 = nn.Parameter(torch.ones(d))
        self.b_2 = nn.Parameter(torch.zeros(d))
        self.eps = eps
        self.kind = kind

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.kind == "standard":
            return F.layer_norm(x, (x.shape[-1],), self.a_2, self.b_2, self.eps)
        mean = x.mean(-1, keepdim=True)
        std = x.std(-1, keepdim=True, unbiased=True)
        return self.a_2 * (x - mean) / (std + self.eps) + self.b_2


class AnnotatedAttention(nn.Module):
    """Multi-head attention with linears[0..3] = q, k, v, output projections."""

    def __init__(self, d: int, h: int):
        super().__init__()
        self.h, self.d_k = h, d // h
        self.linears = nn.ModuleList([nn.Linear(d, d) for _ in range(4)])

    def forward(self, query, key, value, mask: Optional[torch.Tensor] = None):
        """mask: bool, broadcastable to [B, 1, Tq, Tk], True = may attend."""
        b = query.shape[0]
        q, k, v = [lin(x).view(b, -1, self.h, self.d_k).transpose(1, 2)
                   for lin, x in zip(self.linears, (query, key, value))]
        scores = torch.matmul(q, k.transpose(-2, -1)) / math.sqrt(self.d_k)
        if mask is not None:
            scores = scores.masked_fill(~mask, -1e9)
        x = torch.matmul(scores.softmax(dim=-1), v)
        x = x.transpose(1, 2).contiguous().view(b, -1, self.h * self.d_k)
        return self.linears[3](x)


class AnnotatedFeedForward(nn.Module):
    def __init__(self, d: int, d_ff: int, activation: str):
        super().__init__()
        self.w_1 = nn.Linear(d, d_ff)
        self.w_2 = nn.Linear(d_ff, d)
        self.act = _activation_fn(activation)

    def forward(self, x):
        return self.w_2(self.act(self.w_1(x)))


class AnnotatedSublayer(nn.Module):
    """Residual connection: pre x + f(norm(x)) (the notebook's) or post norm(x + f(x))."""

    def __init__(self, d: int, eps: float, kind: str, placement: str):
        super().__init__()
        self.norm = AnnotatedNorm(d, eps, kind)
        self.pre = placement == "pre"

    def forward(self, x, f):
        return x + f(self.norm(x)) if self.pre else self.norm(x + f(x))


class AnnotatedEncoderLayer(nn.Module):
    def __init__(self, d, h, d_ff, activation, eps, kind, placement):
        super().__init__()
        self.self_attn = AnnotatedAttention(d, h)
        self.feed_forward = AnnotatedFeedForward(d, d_ff, activation)
        self.sublayer = nn.ModuleList([AnnotatedSublayer(d, eps, kind, placement) for _ in range(2)])

    def forward(self, x, mask):
        x = self.sublayer[0](x, lambda y: self.self_attn(y, y, y, mask))
        return self.sublayer[1](x, self.feed_forward)


class AnnotatedDecoderLayer(nn.Module):
    def __init__(self, d, h, d_ff, activation, eps, kind, placement):
        super().__init__()
        self.self_attn = AnnotatedAttention(d, h)
        self.src_attn = AnnotatedAttention(d, h)
        self.feed_forward = AnnotatedFeedForward(d, d_ff, activation)
        self.sublayer = nn.ModuleList([AnnotatedSublayer(d, eps, kind, placement) for _ in range(3)])

    def forward(self, x, memory, src_mask, tgt_mask):
        x = self.sublayer[0](x, lambda y: self.self_attn(y, y, y, tgt_mask))
        # The intended cross-attention (src_attn), not seed 004's self_attn reuse.
        x = self.sublayer[1](x, lambda y: self.src_attn(y, memory, memory, src_mask))
        return self.sublayer[2](x, self.feed_forward)


class AnnotatedStack(nn.Module):
    def __init__(self, layers: List[nn.Module], norm: Optional[AnnotatedNorm]):
        super().__init__()
        self.layers = nn.ModuleList(layers)
        if norm is not None:
            self.norm = norm

    def forward(self, x, *args):
        for layer in self.layers:
            x = layer(x, *args)
        return self.norm(x) if hasattr(self, "norm") else x


class AnnotatedEmbeddings(nn.Module):
    def __init__(self, vocab: int, d: int, scale: float):
        super().__init__()
        self.lut = nn.Embedding(vocab, d)
        self.scale = scale

    def forward(self, x):
        return self.lut(x) * self.scale


class AnnotatedPositions(nn.Module):
    """Adds the sinusoidal table, stored as the buffer pe [1, L, d] like the notebook's."""

    def __init__(self, d: int, length: int):
        super().__init__()
        self.register_buffer("pe", sinusoidal_positions(length, d).unsqueeze(0))

    def forward(self, x):
        n = x.shape[1]
        if n > self.pe.shape[1]:
            raise ValueError(f"sequence length {n} exceeds the position table ({self.pe.shape[1]})")
        return x + self.pe[:, :n]


class AnnotatedGenerator(nn.Module):
    def __init__(self, d: int, vocab: int):
        super().__init__()
        self.proj = nn.Linear(d, vocab)


class AnnotatedSeq2Seq(_Common):
    """The Annotated Transformer (seed 004) as an encoder-decoder; state_dict = its make_model's.

    Same interface as Seq2Seq: encode, decode_hidden, decode, head, raw_logits, forward.
    """

    def __init__(self, spec: Dict[str, Any]):
        super().__init__()
        spec = self._read_spec(spec, "weights.preset annotated-transformer", "encoder_decoder",
                               ("d_model", "heads", "d_ff", "encoder_layers", "decoder_layers",
                                "src_vocab", "tgt_vocab", "max_len"))
        self._check_lm_head()
        if self.positions == "learned":
            raise ValueError("embedding.positions: learned positions cannot be expressed in "
                             "weights.preset annotated-transformer (it stores a sinusoidal pe buffer)")
        s, layer, emb = spec["sizes"], spec["layer"], spec["embedding"]
        d, h, d_ff = self.d_model, self.heads, int(s["d_ff"])
        args = (d, h, d_ff, layer["activation"], self.eps, self.norm_kind, self.placement)

        def final():
            return AnnotatedNorm(d, self.eps, self.norm_kind) if layer["final_norm"] else None

        self.encoder = AnnotatedStack(
            [AnnotatedEncoderLayer(*args) for _ in range(int(s["encoder_layers"]))], final())
        self.decoder = AnnotatedStack(
            [AnnotatedDecoderLayer(*args) for _ in range(int(s["decoder_layers"]))], final())

        def embed(vocab):
            parts = [AnnotatedEmbeddings(int(vocab), d, self.scale)]
            if self.positions == "sinusoidal":
                parts.append(AnnotatedPositions(d, self.max_len))
            return nn.Sequential(*parts)

        self.src_embed = embed(s["src_vocab"])
        self.tgt_embed = embed(s["tgt_vocab"])
        if emb["share_src_tgt"]:
            self.tgt_embed[0].lut.weight = self.src_embed[0].lut.weight
        self.generator = AnnotatedGenerator(d, int(s["tgt_vocab"]))
        if emb["share_tgt_output"]:
            self.generator.proj.weight = self.tgt_embed[0].lut.weight

    def _mask(self, tokens: torch.Tensor) -> Optional[torch.Tensor]:
        return (tokens != self.pad)[:, None, None, :] if self.padding_mask else None

    def encode(self, src: torch.Tensor) -> torch.Tensor:
        return self.encoder(self.src_embed(src), self._mask(src))

    def decode_hidden(self, memory, src, tgt, tgt_padding: bool = True) -> torch.Tensor:
        t = tgt.shape[1]
        tgt_mask = None
        if self.causal:
            tgt_mask = torch.ones(t, t, dtype=torch.bool, device=tgt.device).tril()[None, None]
        if tgt_padding and self.padding_mask:
            pad = self._mask(tgt)
            tgt_mask = pad if tgt_mask is None else (tgt_mask & pad)
        return self.decoder(self.tgt_embed(tgt), memory, self._mask(src), tgt_mask)

    def raw_logits(self, h: torch.Tensor) -> torch.Tensor:
        return self.generator.proj(h)

    def head(self, h: torch.Tensor) -> torch.Tensor:
        return self._lm_head(self.generator.proj(h))

    def decode(self, memory, src, tgt, tgt_padding: bool = True) -> torch.Tensor:
        return self.head(self.decode_hidden(memory, src, tgt, tgt_padding))

    def embedding_tables(self) -> List[Tuple[nn.Parameter, float]]:
        std = self.d_model ** -0.5 if self.scale != 1.0 else 1.0
        return [(self.src_embed[0].lut.weight, std), (self.tgt_embed[0].lut.weight, std)]

    def residual_projections(self) -> List[Tuple[nn.Parameter, int]]:
        out = []
        for stack, per in ((self.encoder, 2), (self.decoder, 3)):
            n = per * len(stack.layers)
            for layer in stack.layers:
                out.append((layer.self_attn.linears[3].weight, n))
                if hasattr(layer, "src_attn"):
                    out.append((layer.src_attn.linears[3].weight, n))
                out.append((layer.feed_forward.w_2.weight, n))
        return out

    def forward(self, src, tgt):
        return self.decode(self.encode(src), src, tgt)
