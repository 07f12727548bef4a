"""The "torch.nn.Transformer" weight preset's models, built from stock PyTorch modules:
Seq2Seq (encoder-decoder, torch.nn.Transformer), EncoderOnly (BERT-style) and
DecoderOnly (GPT-style, its layers nn.TransformerEncoderLayer run with a causal mask)."""
from __future__ import annotations

from typing import Any, Dict, List, Optional, Tuple

import torch
import torch.nn as nn

from .layers import (_activation, _check_encoder_head, _Common, _layer_norm, _pool_head,
                     _replace_layer_norms, _Stacks, _torch_residual, _torch_stack, causal_mask)


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
