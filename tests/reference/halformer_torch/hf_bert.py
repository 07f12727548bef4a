"""The "huggingface-bert" weight preset: transformers' own BertModel /
BertForSequenceClassification with the reference interface (encode, head_output) mixed in."""
from __future__ import annotations

import os
from typing import Any, Dict, List, Optional, Tuple

import torch
import torch.nn as nn

from .layers import _check_encoder_head, _Common, _pool_head
from .spec import _checked_spec

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
    act = {"relu": "relu", "gelu": "gelu", "gelu_tanh": "gelu_pytorch_tanh",
           "relu2": "relu2"}[layer["activation"]]  # transformers' ACT2FN names
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
