"""halformer's PyTorch reference: a YAML spec -> a torch.nn.Module, plus greedy decoding.

This module is the independent ground truth that the Halide kernels and the C++ runtime
are compared against. It is deliberately built from stock `torch.nn.Transformer` so that
"what PyTorch computes" is not re-derived here; this file only adds what nn.Transformer
lacks (embeddings, positions, the output head, masks, the annotated LayerNorm variant).

Weight naming: the "torch.nn.Transformer" preset
-------------------------------------------------
`Seq2Seq.state_dict()` names ARE the preset that the C++ loader reads (this list is the
contract; d = d_model, F = d_ff, V_s / V_t = src / tgt vocab, N = layer index):

    src_embedding.weight                                  [V_s, d]
    tgt_embedding.weight                                  [V_t, d]
    pos_embedding.weight                                  [max_len, d]  (positions: learned only)
    transformer.encoder.layers.N.self_attn.in_proj_weight [3d, d]   rows: q, k, v
    transformer.encoder.layers.N.self_attn.in_proj_bias   [3d]
    transformer.encoder.layers.N.self_attn.out_proj.weight [d, d]
    transformer.encoder.layers.N.self_attn.out_proj.bias  [d]
    transformer.encoder.layers.N.linear1.weight / .bias   [F, d] / [F]
    transformer.encoder.layers.N.linear2.weight / .bias   [d, F] / [d]
    transformer.encoder.layers.N.norm1.weight / .bias     [d]   after (post) / before (pre) attention
    transformer.encoder.layers.N.norm2.weight / .bias     [d]   around the feed-forward
    transformer.decoder.layers.N.self_attn.*              as above (causal self-attention)
    transformer.decoder.layers.N.multihead_attn.*         as above (cross-attention: q from decoder, k/v from memory)
    transformer.decoder.layers.N.linear1.* / linear2.*    as above
    transformer.decoder.layers.N.norm1.* / norm2.* / norm3.*   self-attn / cross-attn / feed-forward
    transformer.encoder.norm.weight / .bias               [d]   (layer.final_norm: true only)
    transformer.decoder.norm.weight / .bias               [d]   (layer.final_norm: true only)
    generator.weight                                      [V_t, d]
    generator.bias                                        [V_t]

Nothing else is in the state dict (no buffers: sinusoidal positions are computed, not
stored). With embedding.share_src_tgt / share_tgt_output the tied names still all appear,
pointing at one tensor; writers clone them (see export_torch.py).

Semantics decided here
----------------------
* Embedding: x = emb(tokens) * (sqrt(d) if embedding.scale else 1) + positions; sinusoidal
  PE[p, 2i] = sin(p * div[i]), PE[p, 2i+1] = cos(p * div[i]), div = exp(arange(0, d, 2) *
  (-ln(10000)/d)), all float32, computed for the length at hand (any length works).
* norm_kind annotated: every LayerNorm inside the transformer becomes AnnotatedLayerNorm
  (same parameter names): w * (x - mean) / (std_unbiased + eps) + b.
* Masks: key padding masks are (tokens == pad) for the encoder, the cross-attention memory
  and the teacher-forced decoder input (attention.padding_mask); the decoder self-attention
  gets a float -inf causal mask above the diagonal (attention.causal). Outputs at padded
  query positions are computed normally but carry no meaning; callers never compare them
  (tests/torch_reference.py zeroes them).
* torch 1.13 fast paths: TransformerEncoder's nested-tensor path (eval + no_grad + padding
  mask) zeroes padded positions and is disabled (enable_nested_tensor = False). The fused
  encoder-layer kernel (torch._transformer_encoder_layer_fwd) hard-codes the standard
  LayerNorm, so it is disabled for norm_kind annotated (activation_relu_or_gelu = 0 makes
  TransformerEncoderLayer take its Python path, which still calls self.activation).
  For standard norm it stays on: it computes the same function (checked in the
  self-test at the bottom of this file, max difference ~1e-6).
* Greedy decoding recomputes the whole prefix each step and passes NO target padding mask:
  rows are independent, tokens after a row's eos only affect that row's ignored outputs,
  and a generated token that happens to equal pad is treated as an ordinary token (as a
  KV-cache decoder would).
"""
from __future__ import annotations

import copy
import math
from typing import Any, Dict, List, Optional

import torch
import torch.nn as nn
import torch.nn.functional as F
import yaml

# ---------------------------------------------------------------------------------------
# spec

# (section, key) -> default; the same defaults as halformer::Spec (tools/spec/spec.h).
_DEFAULTS = {
    ("layer", "norm_placement"): "post",
    ("layer", "norm_kind"): "standard",
    ("layer", "norm_eps"): 1e-5,
    ("layer", "final_norm"): False,
    ("layer", "activation"): "relu",
    ("layer", "dropout"): 0.0,
    ("embedding", "positions"): "sinusoidal",
    ("embedding", "scale"): True,
    ("embedding", "share_src_tgt"): False,
    ("embedding", "share_tgt_output"): False,
    ("attention", "causal"): True,
    ("attention", "padding_mask"): True,
    ("head", "kind"): "log_softmax",
    ("tokens", "pad"): 0,
    ("tokens", "bos"): 1,
    ("tokens", "eos"): 2,
    ("decoding", "strategy"): "greedy",
    ("decoding", "max_new_tokens"): 64,
}


def load_spec(path: str) -> Dict[str, Any]:
    """Reads a spec YAML file and fills in the defaults of halformer::Spec.

    Validation is the C++ side's job (halformer check); this only fails on what it needs.
    """
    with open(path, "r", encoding="utf-8") as f:
        spec = yaml.safe_load(f)
    if not isinstance(spec, dict):
        raise ValueError(f"{path}: a spec must be a YAML mapping")
    return apply_defaults(spec)


def apply_defaults(spec: Dict[str, Any]) -> Dict[str, Any]:
    spec = copy.deepcopy(spec)
    spec.setdefault("architecture", "encoder_decoder")
    for (section, key), value in _DEFAULTS.items():
        sec = spec.get(section)
        if sec is None:
            sec = spec[section] = {}
        sec.setdefault(key, value)
    return spec


# ---------------------------------------------------------------------------------------
# building blocks


class AnnotatedLayerNorm(nn.Module):
    """The Annotated Transformer's LayerNorm: w * (x - mean) / (std_unbiased + eps) + b."""

    def __init__(self, d: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d))
        self.bias = nn.Parameter(torch.zeros(d))
        self.eps = eps  # read by nn.Transformer's fast-path checks; must exist

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        mean = x.mean(-1, keepdim=True)
        std = x.std(-1, keepdim=True, unbiased=True)
        return self.weight * (x - mean) / (std + self.eps) + self.bias


def sinusoidal_positions(length: int, d: int) -> torch.Tensor:
    """[length, d] float32 table, the standard way (Vaswani et al. / the Annotated Transformer)."""
    pe = torch.zeros(length, d, dtype=torch.float32)
    position = torch.arange(0, length, dtype=torch.float32).unsqueeze(1)
    div_term = torch.exp(torch.arange(0, d, 2, dtype=torch.float32) * (-math.log(10000.0) / d))
    pe[:, 0::2] = torch.sin(position * div_term)
    pe[:, 1::2] = torch.cos(position * div_term[: d // 2])
    return pe


def _activation(name: str):
    if name == "relu":
        return "relu"
    if name == "gelu":
        return "gelu"  # erf form
    if name == "gelu_tanh":
        return lambda x: F.gelu(x, approximate="tanh")
    raise ValueError(f"layer.activation: unknown value {name!r} (relu, gelu, gelu_tanh)")


def _replace_layer_norms(module: nn.Module, eps: float) -> None:
    for name, child in list(module.named_children()):
        if isinstance(child, nn.LayerNorm):
            setattr(module, name, AnnotatedLayerNorm(child.normalized_shape[0], eps))
        else:
            _replace_layer_norms(child, eps)


def causal_mask(t: int) -> torch.Tensor:
    """[t, t] float mask: 0 on and below the diagonal, -inf above."""
    return torch.triu(torch.full((t, t), float("-inf")), diagonal=1)


# ---------------------------------------------------------------------------------------
# model


class Seq2Seq(nn.Module):
    """Encoder-decoder Transformer built from a spec; state_dict = the torch.nn.Transformer preset.

    Shapes: src [B, S], tgt [B, T] int64 token ids; memory [B, S, d]; head output [B, T, V_t].
    """

    def __init__(self, spec: Dict[str, Any]):
        super().__init__()
        spec = apply_defaults(spec)
        if spec["architecture"] != "encoder_decoder":
            raise ValueError(f"Seq2Seq needs architecture encoder_decoder, got {spec['architecture']!r}")
        s, layer, emb = spec.get("sizes") or {}, spec["layer"], spec["embedding"]
        needed = ("d_model", "heads", "d_ff", "encoder_layers", "decoder_layers",
                  "src_vocab", "tgt_vocab", "max_len")
        missing = [k for k in needed if k not in s]
        if missing:
            raise ValueError("spec is missing " + ", ".join("sizes." + k for k in missing))
        self.spec = spec
        self.d_model = d = int(s["d_model"])
        self.max_len = int(s["max_len"])
        self.positions = emb["positions"]
        self.scale = math.sqrt(d) if emb["scale"] else 1.0
        self.causal = bool(spec["attention"]["causal"])
        self.padding_mask = bool(spec["attention"]["padding_mask"])
        self.head_kind = spec["head"]["kind"]
        self.pad = int(spec["tokens"]["pad"])
        self.bos = int(spec["tokens"]["bos"])
        self.eos = int(spec["tokens"]["eos"])
        if self.positions not in ("sinusoidal", "learned", "none"):
            raise ValueError(f"embedding.positions: unknown value {self.positions!r}")
        if self.head_kind not in ("log_softmax", "softmax", "logits"):
            raise ValueError(f"head.kind: {self.head_kind!r} is not an encoder-decoder head")
        placement = layer["norm_placement"]
        if placement not in ("post", "pre"):
            raise ValueError(f"layer.norm_placement: unknown value {placement!r}")
        eps = float(layer["norm_eps"])

        self.src_embedding = nn.Embedding(int(s["src_vocab"]), d)
        self.tgt_embedding = nn.Embedding(int(s["tgt_vocab"]), d)
        if emb["share_src_tgt"]:
            self.tgt_embedding.weight = self.src_embedding.weight
        if self.positions == "learned":
            self.pos_embedding = nn.Embedding(self.max_len, d)
        self.transformer = nn.Transformer(
            d_model=d,
            nhead=int(s["heads"]),
            num_encoder_layers=int(s["encoder_layers"]),
            num_decoder_layers=int(s["decoder_layers"]),
            dim_feedforward=int(s["d_ff"]),
            dropout=float(layer["dropout"]),
            activation=_activation(layer["activation"]),
            layer_norm_eps=eps,
            batch_first=True,
            norm_first=(placement == "pre"),
        )
        # torch 1.13: the nested-tensor encoder path zeroes padded positions; keep it off.
        self.transformer.encoder.enable_nested_tensor = False
        if not layer["final_norm"]:
            self.transformer.encoder.norm = None
            self.transformer.decoder.norm = None
        if layer["norm_kind"] == "annotated":
            _replace_layer_norms(self.transformer, eps)
            # The fused encoder-layer kernel would silently use the standard LayerNorm.
            for enc_layer in self.transformer.encoder.layers:
                enc_layer.activation_relu_or_gelu = 0
        elif layer["norm_kind"] != "standard":
            raise ValueError(f"layer.norm_kind: unknown value {layer['norm_kind']!r}")
        self.generator = nn.Linear(d, int(s["tgt_vocab"]))
        if emb["share_tgt_output"]:
            self.generator.weight = self.tgt_embedding.weight

    # -- pieces ---------------------------------------------------------------------------

    def embed(self, table: nn.Embedding, tokens: torch.Tensor) -> torch.Tensor:
        x = table(tokens) * self.scale
        n = tokens.shape[1]
        if self.positions == "sinusoidal":
            x = x + sinusoidal_positions(n, self.d_model).to(x.device)
        elif self.positions == "learned":
            if n > self.max_len:
                raise ValueError(f"sequence length {n} exceeds sizes.max_len {self.max_len}")
            x = x + self.pos_embedding.weight[:n]
        return x

    def _key_padding(self, tokens: torch.Tensor) -> Optional[torch.Tensor]:
        return (tokens == self.pad) if self.padding_mask else None

    def head(self, h: torch.Tensor) -> torch.Tensor:
        logits = self.generator(h)
        if self.head_kind == "log_softmax":
            return F.log_softmax(logits, dim=-1)
        if self.head_kind == "softmax":
            return F.softmax(logits, dim=-1)
        return logits

    # -- public ---------------------------------------------------------------------------

    def encode(self, src: torch.Tensor) -> torch.Tensor:
        """src [B, S] -> memory [B, S, d]."""
        return self.transformer.encoder(
            self.embed(self.src_embedding, src), src_key_padding_mask=self._key_padding(src))

    def decode(self, memory: torch.Tensor, src: torch.Tensor, tgt: torch.Tensor,
               tgt_padding: bool = True) -> torch.Tensor:
        """Head output [B, T, V_t] for decoder input tgt [B, T] (teacher forcing).

        tgt_padding=False drops the target key padding mask (used by greedy decoding).
        """
        t = tgt.shape[1]
        h = self.transformer.decoder(
            self.embed(self.tgt_embedding, tgt),
            memory,
            tgt_mask=causal_mask(t).to(memory.device) if self.causal else None,
            tgt_key_padding_mask=self._key_padding(tgt) if tgt_padding else None,
            memory_key_padding_mask=self._key_padding(src),
        )
        return self.head(h)

    def forward(self, src: torch.Tensor, tgt: torch.Tensor) -> torch.Tensor:
        return self.decode(self.encode(src), src, tgt)


# ---------------------------------------------------------------------------------------
# decoding


@torch.no_grad()
def greedy(model: Seq2Seq, src: torch.Tensor, max_new_tokens: int,
           return_margins: bool = False):
    """Batched greedy decoding, full recomputation each step.

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


# ---------------------------------------------------------------------------------------
# test weights


@torch.no_grad()
def randomize_(model: Seq2Seq, seed: int) -> Seq2Seq:
    """Deterministic random weights with O(1) activations and non-trivial every parameter.

    Every weight matrix (attention, feed-forward, generator) ~ N(0, 1/fan_in), so a
    unit-variance input gives unit-variance outputs (xavier on the stacked [3d, d]
    in_proj gives near-uniform attention and logits that barely depend on the input);
    every bias ~ 0.05 * N(0, 1) (torch leaves attention biases at 0, which would hide
    bias bugs); embeddings ~ N(0, 1/d) when scaled by sqrt(d) (so the scaled embedding
    is ~N(0, 1), like the positions), N(0, 1) otherwise; learned positions ~ N(0, 1);
    LayerNorm weight = 1 + 0.1 * N(0, 1), bias = 0.1 * N(0, 1).
    """
    torch.manual_seed(seed)
    d = model.d_model
    for p in list(model.transformer.parameters()) + [model.generator.weight]:
        if p.dim() > 1:  # LeCun normal: unit-variance inputs give unit-variance outputs
            p.normal_(0.0, p.shape[1] ** -0.5)
    seen = set()
    for name, module in model.named_modules():
        if isinstance(module, (nn.LayerNorm, AnnotatedLayerNorm)):
            module.weight.copy_(1.0 + 0.1 * torch.randn_like(module.weight))
            module.bias.copy_(0.1 * torch.randn_like(module.bias))
            seen.update({id(module.weight), id(module.bias)})
    emb_std = d ** -0.5 if model.scale != 1.0 else 1.0
    for table in (model.src_embedding, model.tgt_embedding):
        if id(table.weight) not in seen:
            table.weight.normal_(0.0, emb_std)
            seen.add(id(table.weight))
    if model.positions == "learned":
        model.pos_embedding.weight.normal_(0.0, 1.0)
        seen.add(id(model.pos_embedding.weight))
    for name, p in model.named_parameters():
        if name.endswith("bias") and id(p) not in seen:
            p.copy_(0.05 * torch.randn_like(p))
            seen.add(id(p))
    return model


# ---------------------------------------------------------------------------------------
# self-test: python tools/halformer_torch.py SPEC  (fast path == slow path, greedy == stepwise)

if __name__ == "__main__":
    import sys

    torch.set_num_threads(2)
    spec = load_spec(sys.argv[1] if len(sys.argv) > 1 else "models/reverse-tiny.yaml")
    m = randomize_(Seq2Seq(spec), 0).eval()
    v = spec["sizes"]["src_vocab"]
    src = torch.randint(3, v, (3, 9))
    src[1, 1:] = m.pad
    src[2, 5:] = m.pad
    tgt = torch.randint(3, spec["sizes"]["tgt_vocab"], (3, 6))
    tgt[:, 0] = m.bos
    tgt[1, 2:] = m.pad
    with torch.no_grad():
        fast = m(src, tgt)
    m.train()  # dropout 0 below -> same function, slow path everywhere
    for mod in m.modules():
        if isinstance(mod, nn.Dropout):
            mod.p = 0.0
        if isinstance(mod, nn.MultiheadAttention):
            mod.dropout = 0.0
    with torch.no_grad():
        slow = m(src, tgt)
    valid = (tgt != m.pad)[..., None]
    print("max |fast - slow| at valid positions:", float(((fast - slow).abs() * valid).max()))
