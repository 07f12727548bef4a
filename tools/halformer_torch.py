"""halformer's PyTorch reference: a YAML spec -> a torch.nn.Module, greedy and beam decoding.

This module is the independent ground truth that the Halide kernels and the C++ runtime
are compared against. Where a stock module exists it is used, so that "what PyTorch
computes" is not re-derived here: `torch.nn.Transformer` / `nn.TransformerEncoder` for
the "torch.nn.Transformer" preset, Hugging Face `transformers`' BertModel for the
"huggingface-bert" preset. The "annotated-transformer" preset has no stock module; it is
written here after The Annotated Transformer (its names and formulas, not its code).

    build_model(spec)            -> the preset's module (Seq2Seq, EncoderOnly, DecoderOnly,
                                    AnnotatedSeq2Seq or a transformers Bert* subclass)
    randomize_(model, seed)      deterministic test weights
    greedy / greedy_lm           greedy decoding (encoder-decoder / decoder-only)
    beam_search                  the beam search the C++ runtime reproduces exactly
    export_state / load_weights  the state dict as written to / read from safetensors

Shape letters: B batch, S source length, T target length, P prompt length, d = d_model,
F = d_ff, V_s / V_t = src / tgt vocab, C = head.num_classes, N = layer index.

Weight names per preset (the contract with the C++ loader)
===========================================================
A weight file is `save_file(export_torch.prepare_tensors(export_state(model))[0])`
(what tests/torch_reference.py writes): the names below, float32, nothing else. Tied
weights (embedding.share_src_tgt / share_tgt_output) are written under every name, as
equal copies (prepare_tensors clones them).

"torch.nn.Transformer", architecture encoder_decoder (`Seq2Seq`):

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

"torch.nn.Transformer", architecture encoder (`EncoderOnly`, BERT-style):

    src_embedding.weight                                  [V_s, d]
    pos_embedding.weight                                  [max_len, d]  (positions: learned only)
    type_embedding.weight                                 [type_vocab, d]  (sizes.type_vocab > 0)
    embedding_norm.weight / .bias                         [d]   (embedding.norm: true)
      (with embedding.size E != d: these four are E wide, and then
    embed_project.weight / .bias                          [d, E] / [d]  maps them to d)
    transformer.encoder.layers.N.*                        as for encoder_decoder
                                                          (layer.shared_weights: layers.0 alone)
    transformer.encoder.norm.weight / .bias               [d]   (layer.final_norm: true)
    pooler.weight / .bias                                 [d, d] / [d]  (head.pooler: dense_tanh / dense_gelu)
    classifier.weight / .bias                             [C, d] / [C]  (head.kind: classifier)

"torch.nn.Transformer", architecture decoder (`DecoderOnly`, GPT-style): each layer is an
nn.TransformerEncoderLayer (self-attention + feed-forward, no cross-attention) run with
a causal mask, stored under transformer.decoder:

    tgt_embedding.weight                                  [V_t, d]
    pos_embedding.weight                                  [max_len, d]  (positions: learned only)
    transformer.decoder.layers.N.self_attn.in_proj_weight / in_proj_bias / out_proj.*
    transformer.decoder.layers.N.linear1.* / linear2.*
    transformer.decoder.layers.N.norm1.* / norm2.*        attention / feed-forward
    transformer.decoder.norm.weight / .bias               [d]   (layer.final_norm: true)
    generator.weight / .bias                              [V_t, d] / [V_t]

"annotated-transformer" (`AnnotatedSeq2Seq`, encoder_decoder only): exactly the state
dict of The Annotated Transformer's make_model(...):

    src_embed.0.lut.weight                                [V_s, d]
    src_embed.1.pe                                        [1, L, d]  buffer, sinusoidal table
    tgt_embed.0.lut.weight / tgt_embed.1.pe               [V_t, d] / [1, L, d]
    encoder.layers.N.self_attn.linears.{0,1,2,3}.weight / .bias   [d, d] / [d]   q, k, v, out
    encoder.layers.N.feed_forward.w_1.weight / .bias      [F, d] / [F]
    encoder.layers.N.feed_forward.w_2.weight / .bias      [d, F] / [d]
    encoder.layers.N.sublayer.{0,1}.norm.a_2 / .b_2       [d]   attention / feed-forward (gain, bias)
    encoder.norm.a_2 / .b_2                               [d]   (layer.final_norm: true)
    decoder.layers.N.self_attn.linears.{0..3}.*           causal self-attention
    decoder.layers.N.src_attn.linears.{0..3}.*            cross-attention (q from decoder, k/v from memory)
    decoder.layers.N.feed_forward.w_1.* / w_2.*
    decoder.layers.N.sublayer.{0,1,2}.norm.a_2 / .b_2     self-attn / cross-attn / feed-forward
    decoder.norm.a_2 / .b_2                               [d]   (layer.final_norm: true)
    generator.proj.weight / .bias                         [V_t, d] / [V_t]

  The pe buffers exist only for positions: sinusoidal (learned positions cannot be
  expressed in this preset). Here L = sizes.max_len; make_model's own default is 5000,
  so a real checkpoint's L may be larger than max_len (load_weights accepts any L; a
  loader should accept L >= max_len, and may use or recompute the table: written files
  hold the standard 10000-based table, see sinusoidal_positions).

"huggingface-bert" (transformers BertModel, encoder only): BertModel's state dict names
minus buffers; for head.kind classifier, BertForSequenceClassification's ("bert." prefix
on everything below, plus classifier.weight [C, d] / classifier.bias [C]):

    embeddings.word_embeddings.weight                     [V_s, d]
    embeddings.position_embeddings.weight                 [max_len, d]
    embeddings.token_type_embeddings.weight               [type_vocab, d]
    embeddings.LayerNorm.weight / .bias                   [d]
    encoder.layer.N.attention.self.query.weight / .bias   [d, d] / [d]   (key, value alike)
    encoder.layer.N.attention.output.dense.weight / .bias [d, d] / [d]
    encoder.layer.N.attention.output.LayerNorm.weight / .bias   [d]   post-norm after attention
    encoder.layer.N.intermediate.dense.weight / .bias     [F, d] / [F]
    encoder.layer.N.output.dense.weight / .bias           [d, F] / [d]
    encoder.layer.N.output.LayerNorm.weight / .bias       [d]   post-norm after the feed-forward
    pooler.dense.weight / .bias                           [d, d] / [d]  (head.pooler: dense_tanh)

  transformers 4.30 keeps a persistent buffer embeddings.position_ids ([1, max_len]
  int64, = arange) in the state dict; export_state drops it (it is not a weight), and
  real checkpoints that carry it should be accepted with it ignored. For head.pooler:
  none the model is built without a pooler, so a file has no pooler.dense.*; a loader
  should ignore pooler.dense.* found in a real checkpoint in that case. The preset fixes:
  norm_placement post, norm_kind standard, final_norm false, positions learned, scale
  false, embedding.norm true, type_vocab >= 1; a classifier needs head.pooler dense_tanh
  (BertForSequenceClassification always applies the pooler).

Conversions between presets: to_torch_preset(spec, state) maps annotated-transformer
and huggingface-bert state dicts onto the torch.nn.Transformer names (q/k/v matrices
stacked into in_proj_weight); the self-test checks both models compute the same thing.

Semantics decided here
======================
* Embedding: x = emb(tokens) * (sqrt(d) if embedding.scale else 1) + positions
  (+ type_embedding[0]: token type ids are all 0), then LayerNorm if embedding.norm.
  Sinusoidal PE[p, 2i] = sin(p * div[i]), PE[p, 2i+1] = cos(p * div[i]),
  div = exp(arange(0, d, 2) * (-ln(10000)/d)), all float32 (any length works).
* layer.norm_kind applies to every LayerNorm of the model (sublayers, final norms, the
  embedding norm). annotated: w * (x - mean) / (std_unbiased + eps) + b.
* Masks: key padding masks are (tokens == pad) for encoder self-attention, the
  cross-attention memory and teacher-forced decoder / prompt inputs
  (attention.padding_mask); decoder self-attention is causal (attention.causal).
  Outputs at padded query positions are computed but carry no meaning; callers never
  compare them (tests/torch_reference.py zeroes them). The annotated preset fills masked
  scores with -1e9 as the notebook does (same softmax as -inf whenever a row keeps at
  least one key, which every compared row does).
* Encoder heads: pooled = h[:, 0] (pooling cls) or the mean of h over positions whose
  token != pad (pooling mean; padding_mask does not change this); head.pooler
  dense_tanh: pooled = tanh(pooler(pooled)) (dense_gelu: erf gelu); classifier: logits = classifier(pooled);
  embedding: pooled, divided by max(||pooled||_2, 1e-12) if head.normalize; hidden: h.
* Decoder-only: the prompt is used as given (no bos is prepended).
* Decoding recomputes the whole prefix each step and passes NO target padding mask:
  rows are independent, and a generated token that happens to equal pad is an ordinary
  token (as a KV-cache decoder treats it). Decoder-only greedy decodes each prompt alone.
* torch 1.13 fast paths: TransformerEncoder's nested-tensor path (eval + no_grad +
  padding mask) zeroes padded positions and is disabled (enable_nested_tensor = False).
  The fused encoder-layer kernel (torch._transformer_encoder_layer_fwd) hard-codes the
  standard LayerNorm, so it is disabled for norm_kind annotated (activation_relu_or_gelu
  = 0 makes TransformerEncoderLayer take its Python path, which still calls
  self.activation). For standard norm it stays on: it computes the same function
  (checked by the self-test at the bottom of this file, differences ~1e-6).
* Dropout is identity: every reference output is computed in eval mode.
"""
from __future__ import annotations

import copy
import math
import os
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np
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
    ("embedding", "norm"): False,
    ("attention", "causal"): True,  # false for architecture encoder (apply_defaults)
    ("attention", "padding_mask"): True,
    ("head", "kind"): "log_softmax",
    ("head", "pooling"): "cls",
    ("head", "num_classes"): 0,
    ("head", "pooler"): "none",
    ("head", "normalize"): False,
    ("tokens", "pad"): 0,
    ("tokens", "bos"): 1,
    ("tokens", "eos"): 2,
    ("decoding", "strategy"): "greedy",
    ("decoding", "max_new_tokens"): 64,
    ("decoding", "beam_size"): 1,
    ("decoding", "length_penalty"): 1.0,
    ("weights", "preset"): "torch.nn.Transformer",
    ("sizes", "encoder_layers"): 0,
    ("sizes", "decoder_layers"): 0,
    ("sizes", "src_vocab"): 0,
    ("sizes", "tgt_vocab"): 0,
    ("sizes", "type_vocab"): 0,
}

ARCHITECTURES = ("encoder_decoder", "encoder", "decoder")
PRESETS = ("torch.nn.Transformer", "annotated-transformer", "huggingface-bert")


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
    if spec["architecture"] == "encoder":
        att = spec.get("attention")
        if att is None:
            att = spec["attention"] = {}
        att.setdefault("causal", False)
    for (section, key), value in _DEFAULTS.items():
        sec = spec.get(section)
        if sec is None:
            sec = spec[section] = {}
        sec.setdefault(key, value)
    return spec


def _require(spec: Dict[str, Any], keys: Sequence[str]) -> None:
    s = spec.get("sizes") or {}
    missing = [k for k in keys if k not in s or (k in ("src_vocab", "tgt_vocab") and not s[k])]
    if missing:
        raise ValueError("spec is missing " + ", ".join("sizes." + k for k in missing))


def _checked_spec(spec: Dict[str, Any], who: str, architecture: str, required: Sequence[str]) -> Dict[str, Any]:
    """`spec` with its defaults filled in, after checking that `who` gets `architecture`
    and the `required` sizes."""
    spec = apply_defaults(spec)
    if spec["architecture"] != architecture:
        raise ValueError(f"{who} needs architecture {architecture}, got {spec['architecture']!r}")
    _require(spec, required)
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


def _activation_fn(name: str):
    if name == "relu":
        return F.relu
    if name == "gelu":
        return F.gelu
    if name == "gelu_tanh":
        return lambda x: F.gelu(x, approximate="tanh")
    raise ValueError(f"layer.activation: unknown value {name!r} (relu, gelu, gelu_tanh)")


def _replace_layer_norms(module: nn.Module, eps: float) -> None:
    for name, child in list(module.named_children()):
        if isinstance(child, nn.LayerNorm):
            setattr(module, name, AnnotatedLayerNorm(child.normalized_shape[0], eps))
        else:
            _replace_layer_norms(child, eps)


def _layer_norm(kind: str, d: int, eps: float) -> nn.Module:
    if kind == "standard":
        return nn.LayerNorm(d, eps=eps)
    if kind == "annotated":
        return AnnotatedLayerNorm(d, eps)
    raise ValueError(f"layer.norm_kind: unknown value {kind!r}")


def causal_mask(t: int) -> torch.Tensor:
    """[t, t] float mask: 0 on and below the diagonal, -inf above."""
    return torch.triu(torch.full((t, t), float("-inf")), diagonal=1)


class _Common(nn.Module):
    """Spec fields every model reads (plain attributes: nothing here is in the state dict)."""

    def _read_spec(self, spec: Dict[str, Any], who: str, architecture: str,
                   required: Sequence[str]) -> Dict[str, Any]:
        """Checks `spec` (see _checked_spec) and reads its fields; returns it with its
        defaults filled in."""
        spec = _checked_spec(spec, who, architecture, required)
        s, layer, emb = spec["sizes"], spec["layer"], spec["embedding"]
        self.spec = spec
        self.architecture = spec["architecture"]
        self.d_model = int(s["d_model"])
        self.heads = int(s["heads"])
        self.max_len = int(s["max_len"])
        self.positions = emb["positions"]
        self.scale = math.sqrt(self.d_model) if emb["scale"] else 1.0
        self.causal = bool(spec["attention"]["causal"])
        self.padding_mask = bool(spec["attention"]["padding_mask"])
        self.head_kind = spec["head"]["kind"]
        self.pad = int(spec["tokens"]["pad"])
        self.bos = int(spec["tokens"]["bos"])
        self.eos = int(spec["tokens"]["eos"])
        self.eps = float(layer["norm_eps"])
        self.norm_kind = layer["norm_kind"]
        self.placement = layer["norm_placement"]
        if self.positions not in ("sinusoidal", "learned", "none"):
            raise ValueError(f"embedding.positions: unknown value {self.positions!r}")
        if self.placement not in ("post", "pre"):
            raise ValueError(f"layer.norm_placement: unknown value {self.placement!r}")
        if self.norm_kind not in ("standard", "annotated"):
            raise ValueError(f"layer.norm_kind: unknown value {self.norm_kind!r}")
        return spec

    def _add_positions(self, x: torch.Tensor, n: int) -> torch.Tensor:
        if self.positions == "sinusoidal":
            x = x + sinusoidal_positions(n, x.shape[-1]).to(x.device)
        elif self.positions == "learned":
            if n > self.max_len:
                raise ValueError(f"sequence length {n} exceeds sizes.max_len {self.max_len}")
            x = x + self.pos_embedding.weight[:n]
        return x

    def _key_padding(self, tokens: torch.Tensor) -> Optional[torch.Tensor]:
        return (tokens == self.pad) if self.padding_mask else None

    def _lm_head(self, logits: torch.Tensor) -> torch.Tensor:
        if self.head_kind == "log_softmax":
            return F.log_softmax(logits, dim=-1)
        if self.head_kind == "softmax":
            return F.softmax(logits, dim=-1)
        return logits

    def _check_lm_head(self) -> None:
        if self.head_kind not in ("log_softmax", "softmax", "logits"):
            raise ValueError(f"head.kind: {self.head_kind!r} needs architecture encoder "
                             f"(a decoder's head is log_softmax, softmax or logits)")


def _torch_stack(spec: Dict[str, Any], n_layers: int) -> nn.TransformerEncoder:
    """n nn.TransformerEncoderLayer (batch_first), optional final norm, per the spec."""
    s, layer = spec["sizes"], spec["layer"]
    d, eps = int(s["d_model"]), float(layer["norm_eps"])
    proto = nn.TransformerEncoderLayer(
        d_model=d, nhead=int(s["heads"]), dim_feedforward=int(s["d_ff"]),
        dropout=float(layer["dropout"]), activation=_activation(layer["activation"]),
        layer_norm_eps=eps, batch_first=True, norm_first=(layer["norm_placement"] == "pre"))
    norm = nn.LayerNorm(d, eps=eps) if layer["final_norm"] else None
    stack = nn.TransformerEncoder(proto, int(n_layers), norm=norm, enable_nested_tensor=False)
    if layer["norm_kind"] == "annotated":
        _replace_layer_norms(stack, eps)
        for enc_layer in stack.layers:  # the fused kernel would use the standard LayerNorm
            enc_layer.activation_relu_or_gelu = 0
    return stack


class _Stacks(nn.Module):
    """Holds the stacks as .encoder / .decoder so that names read transformer.encoder.*."""


def _torch_residual(stack: nn.Module, per_layer: int) -> List[Tuple[nn.Parameter, int]]:
    """(output projection of each residual branch, residual branches in the stack)."""
    n = per_layer * len(stack.layers)
    out = []
    for layer in stack.layers:
        out.append((layer.self_attn.out_proj.weight, n))
        if hasattr(layer, "multihead_attn"):
            out.append((layer.multihead_attn.out_proj.weight, n))
        out.append((layer.linear2.weight, n))
    return out


# ---------------------------------------------------------------------------------------
# preset torch.nn.Transformer


class Seq2Seq(_Common):
    """Encoder-decoder Transformer built from a spec; state_dict = the torch.nn.Transformer preset.

    Shapes: src [B, S], tgt [B, T] int64 token ids; memory [B, S, d]; head output [B, T, V_t].
    """

    def __init__(self, spec: Dict[str, Any]):
        super().__init__()
        spec = self._read_spec(spec, "Seq2Seq", "encoder_decoder",
                               ("d_model", "heads", "d_ff", "encoder_layers", "decoder_layers",
                                "src_vocab", "tgt_vocab", "max_len"))
        self._check_lm_head()
        s, layer, emb = spec["sizes"], spec["layer"], spec["embedding"]
        d = self.d_model

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
            layer_norm_eps=self.eps,
            batch_first=True,
            norm_first=(self.placement == "pre"),
        )
        # torch 1.13: the nested-tensor encoder path zeroes padded positions; keep it off.
        self.transformer.encoder.enable_nested_tensor = False
        if not layer["final_norm"]:
            self.transformer.encoder.norm = None
            self.transformer.decoder.norm = None
        if self.norm_kind == "annotated":
            _replace_layer_norms(self.transformer, self.eps)
            # The fused encoder-layer kernel would silently use the standard LayerNorm.
            for enc_layer in self.transformer.encoder.layers:
                enc_layer.activation_relu_or_gelu = 0
        self.generator = nn.Linear(d, int(s["tgt_vocab"]))
        if emb["share_tgt_output"]:
            self.generator.weight = self.tgt_embedding.weight

    # -- pieces ---------------------------------------------------------------------------

    def embed(self, table: nn.Embedding, tokens: torch.Tensor) -> torch.Tensor:
        return self._add_positions(table(tokens) * self.scale, tokens.shape[1])

    def head(self, h: torch.Tensor) -> torch.Tensor:
        return self._lm_head(self.generator(h))

    def raw_logits(self, h: torch.Tensor) -> torch.Tensor:
        """The generator's output before head.kind's function (what beam search scores)."""
        return self.generator(h)

    def embedding_tables(self) -> List[Tuple[nn.Parameter, float]]:
        std = self.d_model ** -0.5 if self.scale != 1.0 else 1.0
        tables = [(self.src_embedding.weight, std), (self.tgt_embedding.weight, std)]
        if self.positions == "learned":
            tables.append((self.pos_embedding.weight, 1.0))
        return tables

    def residual_projections(self) -> List[Tuple[nn.Parameter, int]]:
        return (_torch_residual(self.transformer.encoder, 2)
                + _torch_residual(self.transformer.decoder, 3))

    # -- public ---------------------------------------------------------------------------

    def encode(self, src: torch.Tensor) -> torch.Tensor:
        """src [B, S] -> memory [B, S, d]."""
        return self.transformer.encoder(
            self.embed(self.src_embedding, src), src_key_padding_mask=self._key_padding(src))

    def decode_hidden(self, memory: torch.Tensor, src: torch.Tensor, tgt: torch.Tensor,
                      tgt_padding: bool = True) -> torch.Tensor:
        """Decoder output [B, T, d] (after the final norm, before the generator)."""
        t = tgt.shape[1]
        return self.transformer.decoder(
            self.embed(self.tgt_embedding, tgt),
            memory,
            tgt_mask=causal_mask(t).to(memory.device) if self.causal else None,
            tgt_key_padding_mask=self._key_padding(tgt) if tgt_padding else None,
            memory_key_padding_mask=self._key_padding(src),
        )

    def decode(self, memory: torch.Tensor, src: torch.Tensor, tgt: torch.Tensor,
               tgt_padding: bool = True) -> torch.Tensor:
        """Head output [B, T, V_t] for decoder input tgt [B, T] (teacher forcing).

        tgt_padding=False drops the target key padding mask (used by decoding).
        """
        return self.head(self.decode_hidden(memory, src, tgt, tgt_padding))

    def forward(self, src: torch.Tensor, tgt: torch.Tensor) -> torch.Tensor:
        return self.decode(self.encode(src), src, tgt)


def _pool_head(model, h: torch.Tensor, src: torch.Tensor, pooler: Optional[nn.Linear],
               classifier: Optional[nn.Linear]) -> Optional[torch.Tensor]:
    """Encoder head output from the last hidden states h [B, S, d] (see the docstring)."""
    head = model.spec["head"]
    if model.head_kind == "hidden":
        return None
    if head["pooling"] == "cls":
        pooled = h[:, 0]
    elif head["pooling"] == "mean":
        valid = (src != model.pad).to(h.dtype)[..., None]
        pooled = (h * valid).sum(1) / valid.sum(1).clamp_min(1.0)
    else:
        raise ValueError(f"head.pooling: unknown value {head['pooling']!r}")
    if pooler is not None:
        pooled = pooler(pooled)
        pooled = torch.tanh(pooled) if head["pooler"] == "dense_tanh" else F.gelu(pooled)
    if model.head_kind == "classifier":
        return classifier(pooled)
    if head["normalize"]:
        pooled = F.normalize(pooled, p=2.0, dim=-1, eps=1e-12)
    return pooled


def _check_encoder_head(spec: Dict[str, Any]) -> None:
    head = spec["head"]
    kind = head["kind"]
    if kind not in ("classifier", "embedding", "hidden"):
        raise ValueError(f"head.kind: {kind!r} needs a decoder; an encoder's head is "
                         "classifier, embedding or hidden (set head.kind explicitly)")
    if kind == "classifier" and int(head["num_classes"]) < 1:
        raise ValueError("head.num_classes: a classifier needs num_classes >= 1")
    if head["pooler"] not in ("none", "dense_tanh", "dense_gelu"):
        raise ValueError(f"head.pooler: unknown value {head['pooler']!r} (none, dense_tanh, dense_gelu)")
    if spec["attention"]["causal"]:
        raise ValueError("attention.causal: an encoder has no causal self-attention")


class EncoderOnly(_Common):
    """Encoder-only (BERT-style) model; state_dict = the torch.nn.Transformer encoder preset.

    encode(src [B, S]) -> h [B, S, d]; head_output(h, src) -> [B, C] / [B, d] / None.
    """

    def __init__(self, spec: Dict[str, Any]):
        super().__init__()
        spec = self._read_spec(spec, "EncoderOnly", "encoder",
                               ("d_model", "heads", "d_ff", "encoder_layers", "src_vocab", "max_len"))
        _check_encoder_head(spec)
        s, emb, head = spec["sizes"], spec["embedding"], spec["head"]
        d = self.d_model
        e = int(emb.get("size") or d)  # the tables' width; != d: embed_project follows (ELECTRA-small)
        self.src_embedding = nn.Embedding(int(s["src_vocab"]), e)
        if self.positions == "learned":
            self.pos_embedding = nn.Embedding(self.max_len, e)
        if int(s["type_vocab"]) > 0:
            self.type_embedding = nn.Embedding(int(s["type_vocab"]), e)
        if emb["norm"]:
            self.embedding_norm = _layer_norm(self.norm_kind, e, self.eps)
        if e != d:
            self.embed_project = nn.Linear(e, d)
        self.transformer = _Stacks()
        # layer.shared_weights (ALBERT): one layer's weights, run encoder_layers times.
        self.layer_runs = int(s["encoder_layers"]) if spec["layer"].get("shared_weights") else 1
        self.transformer.encoder = _torch_stack(spec, int(s["encoder_layers"]) // self.layer_runs)
        if head["pooler"] != "none" and self.head_kind != "hidden":
            self.pooler = nn.Linear(d, d)
        if self.head_kind == "classifier":
            self.classifier = nn.Linear(d, int(head["num_classes"]))

    def embed(self, src: torch.Tensor) -> torch.Tensor:
        x = self._add_positions(self.src_embedding(src) * self.scale, src.shape[1])
        if hasattr(self, "type_embedding"):
            x = x + self.type_embedding.weight[0]  # token type ids are all 0
        if hasattr(self, "embedding_norm"):
            x = self.embedding_norm(x)
        if hasattr(self, "embed_project"):
            x = self.embed_project(x)
        return x

    def encode(self, src: torch.Tensor) -> torch.Tensor:
        x, padding = self.embed(src), self._key_padding(src)
        stack = self.transformer.encoder
        if self.layer_runs == 1:
            return stack(x, src_key_padding_mask=padding)
        for _ in range(self.layer_runs):
            x = stack.layers[0](x, src_key_padding_mask=padding)
        return stack.norm(x) if stack.norm is not None else x

    def head_output(self, h: torch.Tensor, src: torch.Tensor) -> Optional[torch.Tensor]:
        return _pool_head(self, h, src, getattr(self, "pooler", None), getattr(self, "classifier", None))

    def embedding_tables(self) -> List[Tuple[nn.Parameter, float]]:
        std = self.d_model ** -0.5 if self.scale != 1.0 else 1.0
        tables = [(self.src_embedding.weight, std)]
        if self.positions == "learned":
            tables.append((self.pos_embedding.weight, 1.0))
        if hasattr(self, "type_embedding"):
            tables.append((self.type_embedding.weight, 1.0))
        return tables

    def residual_projections(self) -> List[Tuple[nn.Parameter, int]]:
        return _torch_residual(self.transformer.encoder, 2)

    def forward(self, src: torch.Tensor):
        h = self.encode(src)
        return h, self.head_output(h, src)


class DecoderOnly(_Common):
    """Decoder-only (GPT-style) causal LM; state_dict = the torch.nn.Transformer decoder preset.

    forward(tokens [B, P]) -> head output [B, P, V_t].
    """

    def __init__(self, spec: Dict[str, Any]):
        super().__init__()
        spec = self._read_spec(spec, "DecoderOnly", "decoder",
                               ("d_model", "heads", "d_ff", "decoder_layers", "tgt_vocab", "max_len"))
        self._check_lm_head()
        s, emb = spec["sizes"], spec["embedding"]
        d = self.d_model
        self.tgt_embedding = nn.Embedding(int(s["tgt_vocab"]), d)
        if self.positions == "learned":
            self.pos_embedding = nn.Embedding(self.max_len, d)
        self.transformer = _Stacks()
        self.transformer.decoder = _torch_stack(spec, int(s["decoder_layers"]))
        self.generator = nn.Linear(d, int(s["tgt_vocab"]))
        if emb["share_tgt_output"]:
            self.generator.weight = self.tgt_embedding.weight

    def hidden(self, tokens: torch.Tensor, padding: bool = True) -> torch.Tensor:
        """Last hidden states [B, P, d]; padding=False drops the key padding mask."""
        t = tokens.shape[1]
        x = self._add_positions(self.tgt_embedding(tokens) * self.scale, t)
        return self.transformer.decoder(
            x, mask=causal_mask(t).to(x.device) if self.causal else None,
            src_key_padding_mask=self._key_padding(tokens) if padding else None)

    def raw_logits(self, h: torch.Tensor) -> torch.Tensor:
        return self.generator(h)

    def head(self, h: torch.Tensor) -> torch.Tensor:
        return self._lm_head(self.generator(h))

    def embedding_tables(self) -> List[Tuple[nn.Parameter, float]]:
        std = self.d_model ** -0.5 if self.scale != 1.0 else 1.0
        tables = [(self.tgt_embedding.weight, std)]
        if self.positions == "learned":
            tables.append((self.pos_embedding.weight, 1.0))
        return tables

    def residual_projections(self) -> List[Tuple[nn.Parameter, int]]:
        return _torch_residual(self.transformer.decoder, 2)

    def forward(self, tokens: torch.Tensor, padding: bool = True) -> torch.Tensor:
        return self.head(self.hidden(tokens, padding))


# ---------------------------------------------------------------------------------------
# preset annotated-transformer (The Annotated Transformer's module tree and names)


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


# ---------------------------------------------------------------------------------------
# preset huggingface-bert (transformers' own BertModel / BertForSequenceClassification)

_HF_CLASSES: Dict[str, type] = {}


def _transformers():
    # Never reach for the network: configs are built here, nothing is downloaded.
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")
    try:
        import transformers
    except ImportError as e:
        raise ImportError("weights.preset huggingface-bert needs the 'transformers' package "
                          "(tools/bootstrap.sh installs the pinned version)") from e
    return transformers


class _BertReference:
    """Mixed into transformers' Bert classes: the reference interface, nothing in the state dict."""

    dropped_buffers = ("embeddings.position_ids", "bert.embeddings.position_ids")

    def _base(self):
        return self.bert if hasattr(self, "classifier") else self

    def encode(self, src: torch.Tensor) -> torch.Tensor:
        mask = (src != self.pad) if self.padding_mask else torch.ones_like(src, dtype=torch.bool)
        out = self._base()(input_ids=src, attention_mask=mask.long(),
                           token_type_ids=torch.zeros_like(src), return_dict=True)
        return out.last_hidden_state

    def head_output(self, h: torch.Tensor, src: torch.Tensor) -> Optional[torch.Tensor]:
        pooler = getattr(self._base(), "pooler", None)
        return _pool_head(self, h, src, pooler.dense if pooler is not None else None,
                          getattr(self, "classifier", None))

    def embedding_tables(self) -> List[Tuple[nn.Parameter, float]]:
        e = self._base().embeddings
        return [(e.word_embeddings.weight, 1.0), (e.position_embeddings.weight, 1.0),
                (e.token_type_embeddings.weight, 1.0)]

    def residual_projections(self) -> List[Tuple[nn.Parameter, int]]:
        layers = self._base().encoder.layer
        n = 2 * len(layers)
        return [p for layer in layers
                for p in ((layer.attention.output.dense.weight, n), (layer.output.dense.weight, n))]


def bert_config(spec: Dict[str, Any]):
    """transformers.BertConfig for a huggingface-bert spec (checks what the preset fixes)."""
    tf = _transformers()
    s, layer, emb, head = spec["sizes"], spec["layer"], spec["embedding"], spec["head"]
    fixed = [("layer.norm_placement", layer["norm_placement"], "post"),
             ("layer.norm_kind", layer["norm_kind"], "standard"),
             ("layer.final_norm", layer["final_norm"], False),
             ("embedding.positions", emb["positions"], "learned"),
             ("embedding.scale", emb["scale"], False),
             ("embedding.norm", emb["norm"], True)]
    for field, value, want in fixed:
        if value != want:
            raise ValueError(f"{field}: weights.preset huggingface-bert needs {want!r}, got {value!r}")
    if int(s["type_vocab"]) < 1:
        raise ValueError("sizes.type_vocab: weights.preset huggingface-bert needs type_vocab >= 1")
    if head["kind"] == "classifier" and head["pooler"] != "dense_tanh":
        raise ValueError("head.pooler: a huggingface-bert classifier needs dense_tanh "
                         "(BertForSequenceClassification always applies the pooler)")
    act = {"relu": "relu", "gelu": "gelu", "gelu_tanh": "gelu_pytorch_tanh"}[layer["activation"]]
    return tf.BertConfig(
        vocab_size=int(s["src_vocab"]), hidden_size=int(s["d_model"]),
        num_hidden_layers=int(s["encoder_layers"]), num_attention_heads=int(s["heads"]),
        intermediate_size=int(s["d_ff"]), hidden_act=act,
        hidden_dropout_prob=float(layer["dropout"]),
        attention_probs_dropout_prob=float(layer["dropout"]),
        max_position_embeddings=int(s["max_len"]), type_vocab_size=int(s["type_vocab"]),
        layer_norm_eps=float(layer["norm_eps"]), pad_token_id=int(spec["tokens"]["pad"]),
        num_labels=max(1, int(head["num_classes"])), position_embedding_type="absolute")


def HFBert(spec: Dict[str, Any]) -> nn.Module:
    """transformers' BertModel (or BertForSequenceClassification for a classifier head)
    with the reference interface (encode, head_output) mixed in; state_dict = the
    huggingface-bert preset (plus the position_ids buffer, dropped by export_state)."""
    spec = _checked_spec(spec, "weights.preset huggingface-bert", "encoder",
                         ("d_model", "heads", "d_ff", "encoder_layers", "src_vocab", "max_len"))
    _check_encoder_head(spec)
    config = bert_config(spec)
    tf = _transformers()
    classifier = spec["head"]["kind"] == "classifier"
    key = "classifier" if classifier else "model"
    if key not in _HF_CLASSES:
        base = tf.BertForSequenceClassification if classifier else tf.BertModel
        _HF_CLASSES[key] = type("HalformerBert" + base.__name__[4:], (_BertReference, base), {})
    cls = _HF_CLASSES[key]
    if classifier:
        model = cls(config)
    else:
        model = cls(config, add_pooling_layer=(spec["head"]["pooler"] == "dense_tanh"
                                               and spec["head"]["kind"] != "hidden"))
    _Common._read_spec(model, spec, "weights.preset huggingface-bert", "encoder", ())  # plain attributes only
    return model


# ---------------------------------------------------------------------------------------
# model factory, weights in and out


def build_model(spec: Dict[str, Any]) -> nn.Module:
    """The reference module for spec's architecture and weights.preset."""
    spec = apply_defaults(spec)
    arch, preset = spec["architecture"], spec["weights"]["preset"]
    if arch not in ARCHITECTURES:
        raise ValueError(f"architecture: unknown value {arch!r}")
    if preset == "torch.nn.Transformer":
        return {"encoder_decoder": Seq2Seq, "encoder": EncoderOnly, "decoder": DecoderOnly}[arch](spec)
    if preset == "annotated-transformer":
        return AnnotatedSeq2Seq(spec)
    if preset == "huggingface-bert":
        return HFBert(spec)
    raise ValueError(f"weights.preset: {preset!r} has no PyTorch reference ({', '.join(PRESETS)})")


def export_state(model: nn.Module) -> Dict[str, torch.Tensor]:
    """The state dict as a weight file holds it: preset names, non-weight buffers dropped."""
    drop = set(getattr(model, "dropped_buffers", ()))
    return {k: v for k, v in model.state_dict().items() if k not in drop}


def load_weights(model: nn.Module, state: Dict[str, torch.Tensor]) -> Tuple[List[str], List[str]]:
    """Loads a weight file's tensors; returns (missing, unexpected) names (both empty = ok).

    An annotated-transformer pe buffer of any length is accepted (it replaces the
    model's table); buffers that export_state drops may be present or not; a
    huggingface-bert model built without a pooler ignores pooler.dense.* in the file.
    """
    state = dict(state)
    for name, module in model.named_modules():
        if isinstance(module, AnnotatedPositions) and f"{name}.pe" in state:
            module.pe = state[f"{name}.pe"].detach().to(torch.float32).clone()
    drop = set(getattr(model, "dropped_buffers", ()))
    if isinstance(model, _BertReference) and getattr(model._base(), "pooler", None) is None:
        # head.pooler none: a real checkpoint's unused pooler is ignored, not an error.
        state = {k: v for k, v in state.items() if not k.startswith(("pooler.", "bert.pooler."))}
    missing, unexpected = model.load_state_dict(state, strict=False)
    return [m for m in missing if m not in drop], list(unexpected)


# ---------------------------------------------------------------------------------------
# decoding


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


# ---------------------------------------------------------------------------------------
# test weights


def _is_norm(module: nn.Module) -> bool:
    return isinstance(module, (nn.LayerNorm, AnnotatedLayerNorm, AnnotatedNorm))


@torch.no_grad()
def randomize_(model: nn.Module, seed: int) -> nn.Module:
    """Deterministic random weights with O(1) activations and non-trivial every parameter.

    In this order, each parameter once (tied ones share their first draw):
    every weight matrix but the embedding tables (attention, feed-forward, pooler,
    classifier, generator) ~ N(0, 1/fan_in), so a unit-variance input gives
    unit-variance outputs (xavier on the stacked [3d, d] in_proj gives near-uniform
    attention and logits that barely depend on the input), except that the output
    projection of each residual branch (self-attention out, cross-attention out,
    feed-forward second linear) is further scaled by 1/sqrt(n), n = residual branches
    in its stack (2 per encoder or decoder-only layer, 3 per encoder-decoder decoder
    layer), so that all branches together add about unit variance (like GPT-2's init):
    with unit-scale branches a deep post-norm stack washes its input out, and greedy
    decoding then repeats one token whatever the prefix, which would not test decoding
    (seen: transformer-base's rows were one token repeated);
    every LayerNorm gain = 1 + 0.1 * N(0, 1), bias = 0.1 * N(0, 1);
    embedding tables ~ N(0, 1/d) when scaled by sqrt(d) (so the scaled embedding is
    ~N(0, 1), like the positions), N(0, 1) otherwise; learned position and token-type
    tables ~ N(0, 1); every remaining bias ~ 0.05 * N(0, 1) (torch leaves attention
    biases at 0, which would hide bias bugs). Buffers (the annotated pe) are untouched.
    """
    torch.manual_seed(seed)
    tables = model.embedding_tables()
    table_ids = {id(p) for p, _ in tables}
    branch = {id(p): n ** -0.5 for p, n in model.residual_projections()}
    seen = set()
    for _, p in model.named_parameters():
        if p.dim() > 1 and id(p) not in table_ids:
            p.normal_(0.0, p.shape[1] ** -0.5 * branch.get(id(p), 1.0))  # LeCun normal
            seen.add(id(p))
    for _, module in model.named_modules():
        if _is_norm(module):
            gain, bias = (module.a_2, module.b_2) if isinstance(module, AnnotatedNorm) \
                else (module.weight, module.bias)
            gain.copy_(1.0 + 0.1 * torch.randn_like(gain))
            bias.copy_(0.1 * torch.randn_like(bias))
            seen.update({id(gain), id(bias)})
    for p, std in tables:
        if id(p) not in seen:
            p.normal_(0.0, std)
            seen.add(id(p))
    for name, p in model.named_parameters():
        if name.endswith("bias") and id(p) not in seen:
            p.copy_(0.05 * torch.randn_like(p))
            seen.add(id(p))
    left = [name for name, p in model.named_parameters() if id(p) not in seen]
    if left:
        raise AssertionError(f"randomize_ left parameters untouched: {left}")
    return model


# ---------------------------------------------------------------------------------------
# conversions between presets (documentation of the name maps, and the self-test)


def to_torch_preset(spec: Dict[str, Any], state: Dict[str, torch.Tensor]):
    """(spec, state) of an annotated-transformer or huggingface-bert model ->
    (spec, state) of the same function under the torch.nn.Transformer preset."""
    spec = apply_defaults(spec)
    preset = spec["weights"]["preset"]
    out: Dict[str, torch.Tensor] = {}
    new_spec = copy.deepcopy(spec)
    new_spec["weights"]["preset"] = "torch.nn.Transformer"
    if preset == "annotated-transformer":
        s = spec["sizes"]
        out["src_embedding.weight"] = state["src_embed.0.lut.weight"]
        out["tgt_embedding.weight"] = state["tgt_embed.0.lut.weight"]

        def attn(src_prefix, dst_prefix):
            lin = [f"{src_prefix}.linears.{j}" for j in range(4)]
            out[f"{dst_prefix}.in_proj_weight"] = torch.cat([state[f"{n}.weight"] for n in lin[:3]])
            out[f"{dst_prefix}.in_proj_bias"] = torch.cat([state[f"{n}.bias"] for n in lin[:3]])
            out[f"{dst_prefix}.out_proj.weight"] = state[f"{lin[3]}.weight"]
            out[f"{dst_prefix}.out_proj.bias"] = state[f"{lin[3]}.bias"]

        def norm(src_name, dst_name):
            out[f"{dst_name}.weight"] = state[f"{src_name}.a_2"]
            out[f"{dst_name}.bias"] = state[f"{src_name}.b_2"]

        for stack, n_layers, attns in (("encoder", s["encoder_layers"], [("self_attn", "self_attn")]),
                                       ("decoder", s["decoder_layers"],
                                        [("self_attn", "self_attn"), ("src_attn", "multihead_attn")])):
            for n in range(int(n_layers)):
                a, b = f"{stack}.layers.{n}", f"transformer.{stack}.layers.{n}"
                for src_a, dst_a in attns:
                    attn(f"{a}.{src_a}", f"{b}.{dst_a}")
                for w_src, w_dst in (("w_1", "linear1"), ("w_2", "linear2")):
                    out[f"{b}.{w_dst}.weight"] = state[f"{a}.feed_forward.{w_src}.weight"]
                    out[f"{b}.{w_dst}.bias"] = state[f"{a}.feed_forward.{w_src}.bias"]
                for j in range(len(attns) + 1):
                    norm(f"{a}.sublayer.{j}.norm", f"{b}.norm{j + 1}")
            if f"{stack}.norm.a_2" in state:
                norm(f"{stack}.norm", f"transformer.{stack}.norm")
        out["generator.weight"] = state["generator.proj.weight"]
        out["generator.bias"] = state["generator.proj.bias"]
        return new_spec, out
    if preset == "huggingface-bert":
        p = "bert." if "bert.embeddings.word_embeddings.weight" in state else ""
        e = f"{p}embeddings"
        out["src_embedding.weight"] = state[f"{e}.word_embeddings.weight"]
        out["pos_embedding.weight"] = state[f"{e}.position_embeddings.weight"]
        out["type_embedding.weight"] = state[f"{e}.token_type_embeddings.weight"]
        out["embedding_norm.weight"] = state[f"{e}.LayerNorm.weight"]
        out["embedding_norm.bias"] = state[f"{e}.LayerNorm.bias"]
        for n in range(int(spec["sizes"]["encoder_layers"])):
            a, b = f"{p}encoder.layer.{n}", f"transformer.encoder.layers.{n}"
            qkv = [f"{a}.attention.self.{x}" for x in ("query", "key", "value")]
            out[f"{b}.self_attn.in_proj_weight"] = torch.cat([state[f"{x}.weight"] for x in qkv])
            out[f"{b}.self_attn.in_proj_bias"] = torch.cat([state[f"{x}.bias"] for x in qkv])
            for src_n, dst_n in (("attention.output.dense", "self_attn.out_proj"),
                                 ("attention.output.LayerNorm", "norm1"),
                                 ("intermediate.dense", "linear1"),
                                 ("output.dense", "linear2"),
                                 ("output.LayerNorm", "norm2")):
                out[f"{b}.{dst_n}.weight"] = state[f"{a}.{src_n}.weight"]
                out[f"{b}.{dst_n}.bias"] = state[f"{a}.{src_n}.bias"]
        if f"{p}pooler.dense.weight" in state:
            out["pooler.weight"] = state[f"{p}pooler.dense.weight"]
            out["pooler.bias"] = state[f"{p}pooler.dense.bias"]
        if "classifier.weight" in state:
            out["classifier.weight"] = state["classifier.weight"]
            out["classifier.bias"] = state["classifier.bias"]
        return new_spec, out
    raise ValueError(f"to_torch_preset: nothing to convert from preset {preset!r}")


# ---------------------------------------------------------------------------------------
# self-test: python tools/halformer_torch.py [SPEC...]
#   fast path == slow path (torch preset), other presets == their torch-preset conversion,
#   beam search with K = 1 == greedy.


def _self_test(path: str) -> None:
    spec = load_spec(path)
    m = randomize_(build_model(spec), 0).eval()
    arch, s = spec["architecture"], spec["sizes"]
    special = {m.pad, m.bos, m.eos}
    vocab = int(s["tgt_vocab"] if arch == "decoder" else s["src_vocab"])
    allowed = torch.tensor([t for t in range(vocab) if t not in special])
    gen = torch.Generator().manual_seed(0)
    src = allowed[torch.randint(0, len(allowed), (3, 9), generator=gen)]
    src[1, 1:] = m.pad
    src[2, 5:] = m.pad
    valid_src = (src != m.pad)[..., None]
    if arch == "encoder_decoder":
        tv = int(s["tgt_vocab"])
        allowed_t = torch.tensor([t for t in range(tv) if t not in special])
        tgt = allowed_t[torch.randint(0, len(allowed_t), (3, 6), generator=gen)]
        tgt[:, 0] = m.bos
        tgt[1, 2:] = m.pad
        valid = (tgt != m.pad)[..., None]
        run = lambda mod: mod(src, tgt)  # noqa: E731
    elif arch == "encoder":
        valid = valid_src
        run = lambda mod: mod.encode(src)  # noqa: E731
    else:
        valid = valid_src
        run = lambda mod: mod(src)  # noqa: E731
    report = []
    with torch.no_grad():
        out = run(m)
        if spec["weights"]["preset"] == "torch.nn.Transformer":
            slow = copy.deepcopy(m).train()  # dropout 0 -> same function, slow path everywhere
            for mod in slow.modules():
                if isinstance(mod, nn.Dropout):
                    mod.p = 0.0
                if isinstance(mod, nn.MultiheadAttention):
                    mod.dropout = 0.0
            report.append(("fast - slow", float(((out - run(slow)).abs() * valid).max())))
        else:
            t_spec, t_state = to_torch_preset(spec, export_state(m))
            t = build_model(t_spec)
            missing, unexpected = load_weights(t, t_state)
            assert not missing and not unexpected, (missing, unexpected)
            t.eval()
            report.append(("preset - torch preset", float(((out - run(t)).abs() * valid).max())))
            if arch == "encoder":
                a, b = m.head_output(out, src), t.head_output(run(t), src)
                if a is not None:
                    report.append(("head: preset - torch preset", float((a - b).abs().max())))
                if hasattr(m, "classifier") and spec["head"]["pooling"] == "cls":
                    hf = m(input_ids=src, attention_mask=(src != m.pad).long(),
                           token_type_ids=torch.zeros_like(src)).logits
                    report.append(("classifier: ours - HF forward", float((hf - a).abs().max())))
        if arch == "encoder_decoder":
            g = greedy(m, src[:1], 6)[0]
            b1, _ = beam_search(m, src[0].tolist(), 1, 6, 1.0)
            assert b1[0][0] == g, (b1, g)
            report.append(("beam K=1 == greedy", 0.0))
    print(f"{path}: " + ", ".join(f"{k} {v:.2g}" for k, v in report))


if __name__ == "__main__":
    import sys

    torch.set_num_threads(2)
    for p in sys.argv[1:] or ["models/reverse-tiny.yaml"]:
        _self_test(p)
