"""The spec's model as plain tensor functions with a KV cache, for the PyTorch and ONNX
Runtime peers.

halformer_torch.Seq2Seq (stock torch.nn.Transformer) is the reference, but
nn.TransformerDecoder has no KV cache: its greedy() re-runs the whole prefix every step,
which is not what anyone deploys. So this module restates the same function, reading the
same state_dict (the torch.nn.Transformer naming preset), as:

  encode(src)                      -> memory [B, S, d]                (ONNX: encoder.onnx)
  cross_kv(memory)                 -> per decoder layer K, V [B, H, S, hd]   (cross_kv.onnx)
  step(tok, pos, mem_mask, past, cross) -> head output [B, V], new past     (step.onnx)

written with ops that the ONNX exporter maps one to one (Gather, MatMul/Gemm, Softmax,
LayerNormalization, Concat). The KV cache is concatenated each step (past -> present),
the usual ONNX / Hugging Face layout, so the same graph runs in both engines.

Supported: norm_kind standard, post/pre norm, final_norm, relu/gelu/gelu_tanh,
sinusoidal/learned/no positions, embedding scale, log_softmax/softmax/logits heads.
Anything else raises Unsupported (the peer is then reported as such).

KVSeq2Seq(spec, state, sdpa=True) computes every attention with
torch.nn.functional.scaled_dot_product_attention (PyTorch >= 2.0; before that, the same
formula as the default path) and may be cast whole, `.to(torch.bfloat16)`: halbench.gpu's
bf16 rows, where PyTorch picks its fused attention kernels. The default (sdpa=False) is
the exporter-friendly MatMul/Softmax form above.
"""
from __future__ import annotations

import math
import os
import sys
from typing import Dict, List, Tuple

import torch
import torch.nn.functional as F

from .common import REFERENCE_DIR, Unsupported

sys.path.insert(0, REFERENCE_DIR)
from halformer_torch import apply_defaults, sinusoidal_positions  # noqa: E402


def sdpa_available() -> bool:
    return hasattr(F, "scaled_dot_product_attention")


class KVSeq2Seq(torch.nn.Module):
    def __init__(self, spec: Dict, state: Dict[str, torch.Tensor], sdpa: bool = False):
        super().__init__()
        self.sdpa = bool(sdpa) and sdpa_available()
        spec = apply_defaults(spec)
        s, layer, emb = spec["sizes"], spec["layer"], spec["embedding"]
        if layer["norm_kind"] != "standard":
            raise Unsupported(f"layer.norm_kind {layer['norm_kind']!r} (only standard LayerNorm here)")
        self.d = d = int(s["d_model"])
        self.h = int(s["heads"])
        self.hd = d // self.h
        self.n_enc, self.n_dec = int(s["encoder_layers"]), int(s["decoder_layers"])
        self.pre = layer["norm_placement"] == "pre"
        self.final_norm = bool(layer["final_norm"])
        self.eps = float(layer["norm_eps"])
        self.act = layer["activation"]
        self.scale = math.sqrt(d) if emb["scale"] else 1.0
        self.positions = emb["positions"]
        self.head_kind = spec["head"]["kind"]
        self.pad = int(spec["tokens"]["pad"])
        self.max_len = int(s["max_len"])
        # Every tensor becomes a buffer (an ONNX initializer when exported); '.' -> '__'.
        for name, t in state.items():
            self.register_buffer(name.replace(".", "__"), t.detach().to(torch.float32).contiguous())
        if self.positions == "sinusoidal":
            self.register_buffer("pe", sinusoidal_positions(self.max_len, d))
        elif self.positions == "learned":
            self.register_buffer("pe", state["pos_embedding.weight"].to(torch.float32))

    def w(self, name: str) -> torch.Tensor:
        return getattr(self, name.replace(".", "__"))

    # -- pieces -----------------------------------------------------------------------

    def _ln(self, x, prefix):
        return F.layer_norm(x, (self.d,), self.w(prefix + ".weight"), self.w(prefix + ".bias"), self.eps)

    def _act(self, x):
        if self.act == "relu":
            return F.relu(x)
        if self.act == "gelu":
            return F.gelu(x)
        return F.gelu(x, approximate="tanh")

    def _ffn(self, x, p):
        h = self._act(F.linear(x, self.w(p + ".linear1.weight"), self.w(p + ".linear1.bias")))
        return F.linear(h, self.w(p + ".linear2.weight"), self.w(p + ".linear2.bias"))

    def _heads(self, x):  # [B, T, d] -> [B, H, T, hd]
        b, t = x.shape[0], x.shape[1]
        return x.reshape(b, t, self.h, self.hd).transpose(1, 2)

    def _merge(self, x):  # [B, H, T, hd] -> [B, T, d]
        b, t = x.shape[0], x.shape[2]
        return x.transpose(1, 2).reshape(b, t, self.d)

    def _attend(self, q, k, v, mask):
        if self.sdpa:
            # An additive float mask must have the queries' dtype (bf16 when cast).
            return F.scaled_dot_product_attention(q, k, v, attn_mask=None if mask is None else mask.to(q.dtype))
        scores = torch.matmul(q, k.transpose(-1, -2)) * (1.0 / math.sqrt(self.hd))
        if mask is not None:
            scores = scores + (mask if mask.dtype == scores.dtype else mask.to(scores.dtype))
        return torch.matmul(torch.softmax(scores, dim=-1), v)

    def _sublayer(self, x, norm, fn):
        if self.pre:
            return x + fn(self._ln(x, norm))
        return self._ln(x + fn(x), norm)

    def _embed(self, table, tokens, positions):
        x = F.embedding(tokens, self.w(table)) * self.scale
        if self.positions != "none":
            x = x + F.embedding(positions, self.pe)
        return x

    def key_mask(self, src):
        """Additive [B, 1, 1, S] mask: -1e9 at padded source positions (torch.nn.Transformer
        uses -inf; -1e9 gives the same softmax without NaN on all-padded rows)."""
        return ((src == self.pad).to(torch.float32) * -1e9)[:, None, None, :]

    # -- public -----------------------------------------------------------------------

    def encode(self, src: torch.Tensor) -> torch.Tensor:
        b, s = src.shape
        pos = torch.arange(s, device=src.device)[None, :].expand(b, s)
        x = self._embed("src_embedding.weight", src, pos)
        mask = self.key_mask(src)
        for i in range(self.n_enc):
            p = f"transformer.encoder.layers.{i}"

            def attn(h, p=p):
                qkv = F.linear(h, self.w(p + ".self_attn.in_proj_weight"), self.w(p + ".self_attn.in_proj_bias"))
                q, k, v = qkv.split(self.d, dim=-1)
                a = self._attend(self._heads(q), self._heads(k), self._heads(v), mask)
                return F.linear(self._merge(a), self.w(p + ".self_attn.out_proj.weight"),
                                self.w(p + ".self_attn.out_proj.bias"))

            x = self._sublayer(x, p + ".norm1", attn)
            x = self._sublayer(x, p + ".norm2", lambda h, p=p: self._ffn(h, p))
        if self.final_norm:
            x = self._ln(x, "transformer.encoder.norm")
        return x

    def cross_kv(self, memory: torch.Tensor) -> List[torch.Tensor]:
        """[k0, v0, k1, v1, ...]: each [B, H, S, hd]."""
        out = []
        d = self.d
        for i in range(self.n_dec):
            p = f"transformer.decoder.layers.{i}.multihead_attn"
            kv = F.linear(memory, self.w(p + ".in_proj_weight")[d:], self.w(p + ".in_proj_bias")[d:])
            k, v = kv.split(d, dim=-1)
            out += [self._heads(k), self._heads(v)]
        return out

    def step(self, tok: torch.Tensor, pos: torch.Tensor, mem_mask: torch.Tensor,
             past: List[torch.Tensor], cross: List[torch.Tensor]) -> Tuple[torch.Tensor, List[torch.Tensor]]:
        """One greedy step. tok [B, 1] int64, pos [1] int64 (the position of tok),
        mem_mask [B, 1, 1, S], past [k0, v0, ...] each [B, H, t, hd] -> (head [B, V], present)."""
        d = self.d
        x = self._embed("tgt_embedding.weight", tok, pos[None, :].expand(tok.shape[0], 1))
        present: List[torch.Tensor] = []
        for i in range(self.n_dec):
            p = f"transformer.decoder.layers.{i}"

            def self_attn(h, p=p, i=i):
                qkv = F.linear(h, self.w(p + ".self_attn.in_proj_weight"), self.w(p + ".self_attn.in_proj_bias"))
                q, k, v = qkv.split(d, dim=-1)
                k = torch.cat([past[2 * i], self._heads(k)], dim=2)
                v = torch.cat([past[2 * i + 1], self._heads(v)], dim=2)
                present.extend([k, v])
                a = self._attend(self._heads(q), k, v, None)  # one query, the last position: no causal mask
                return F.linear(self._merge(a), self.w(p + ".self_attn.out_proj.weight"),
                                self.w(p + ".self_attn.out_proj.bias"))

            def cross_attn(h, p=p, i=i):
                q = F.linear(h, self.w(p + ".multihead_attn.in_proj_weight")[:d],
                             self.w(p + ".multihead_attn.in_proj_bias")[:d])
                a = self._attend(self._heads(q), cross[2 * i], cross[2 * i + 1], mem_mask)
                return F.linear(self._merge(a), self.w(p + ".multihead_attn.out_proj.weight"),
                                self.w(p + ".multihead_attn.out_proj.bias"))

            x = self._sublayer(x, p + ".norm1", self_attn)
            x = self._sublayer(x, p + ".norm2", cross_attn)
            x = self._sublayer(x, p + ".norm3", lambda h, p=p: self._ffn(h, p))
        if self.final_norm:
            x = self._ln(x, "transformer.decoder.norm")
        logits = F.linear(x[:, 0, :], self.w("generator.weight"), self.w("generator.bias"))
        if self.head_kind == "log_softmax":
            logits = F.log_softmax(logits, dim=-1)
        elif self.head_kind == "softmax":
            logits = F.softmax(logits, dim=-1)
        return logits, present

    def empty_past(self, batch: int) -> List[torch.Tensor]:
        g = self.w("generator.weight")  # the model's device (CPU, or CUDA in halbench.gpu) and dtype
        return [torch.zeros(batch, self.h, 0, self.hd, device=g.device, dtype=g.dtype) for _ in range(2 * self.n_dec)]


def load_state(weights_path: str) -> Dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(weights_path)


def margins_of(scores: torch.Tensor) -> List[float]:
    """top1 - top2 per row of [B, V] head outputs (inf when V == 1)."""
    if scores.shape[-1] < 2:
        return [math.inf] * scores.shape[0]
    top = torch.topk(scores, 2, dim=-1).values
    return [float(x) for x in (top[:, 0] - top[:, 1])]


def greedy_kv(model: KVSeq2Seq, src: torch.Tensor, new_tokens: int, bos: int, with_margins: bool = False):
    """Fixed-length greedy decode (exactly new_tokens steps, eos does not stop it: the
    benchmark needs the same work every run; rows are truncated at eos when compared).
    Returns (tokens [B, N] list, margins [B, N] list or None)."""
    b = src.shape[0]
    memory = model.encode(src)
    cross = model.cross_kv(memory)
    mask = model.key_mask(src)
    past = model.empty_past(b)
    tok = torch.full((b, 1), bos, dtype=torch.long, device=src.device)
    toks: List[List[int]] = [[] for _ in range(b)]
    margins: List[List[float]] = [[] for _ in range(b)]
    for t in range(new_tokens):
        scores, past = model.step(tok, torch.tensor([t], device=src.device), mask, past, cross)
        nxt = torch.argmax(scores, dim=-1)
        if with_margins:
            for r, m in enumerate(margins_of(scores)):
                margins[r].append(m)
        for r in range(b):
            toks[r].append(int(nxt[r]))
        tok = nxt[:, None]
    return toks, (margins if with_margins else None)


def ensure_dir(path: str) -> str:
    os.makedirs(path, exist_ok=True)
    return path
