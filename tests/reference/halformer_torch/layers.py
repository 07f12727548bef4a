"""The building blocks the reference models share: the annotated LayerNorm, sinusoidal
positions, activations, masks, the spec fields every model reads (_Common), stacks of
torch.nn.TransformerEncoderLayer, and the encoder heads (pooling, pooler, classifier)."""
from __future__ import annotations

import math
from typing import Any, Dict, List, Optional, Sequence, Tuple

import torch
import torch.nn as nn
import torch.nn.functional as F

from .spec import _checked_spec


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


# The spec's plain activations (layer.activation) as PyTorch computes them: the one table
# of the reference (docs/contributing.md, "Adding an activation").
_ACTIVATIONS = {
    "relu": F.relu,
    "gelu": F.gelu,  # erf form
    "gelu_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "silu": F.silu,
    "relu2": lambda x: torch.square(F.relu(x)),  # squared ReLU (Primer, Nemotron)
}


def _activation_fn(name: str):
    """The function of the spec's activation `name`."""
    if name not in _ACTIVATIONS:
        raise ValueError(f"layer.activation: unknown value {name!r} ({', '.join(_ACTIVATIONS)})")
    return _ACTIVATIONS[name]


def _activation(name: str):
    """The `activation` argument of torch.nn.Transformer's layers: relu and gelu by name
    (the names its fused kernels know), the others as functions."""
    return name if name in ("relu", "gelu") else _activation_fn(name)


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
