"""The reference models' weights: build_model (a spec's module), export_state and
load_weights (the state dict as a weight file holds it), randomize_ (deterministic test
weights) and to_torch_preset (one preset's names mapped onto another's).

Weight names per preset (the contract with the C++ loader)
===========================================================
A weight file is `save_file(export_torch.prepare_tensors(export_state(model))[0])`
(what tests/reference/torch_reference.py writes): the names below, float32, nothing else. Tied
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
"""
from __future__ import annotations

import copy
from typing import Any, Dict, List, Tuple

import torch
import torch.nn as nn

from .annotated import AnnotatedNorm, AnnotatedPositions, AnnotatedSeq2Seq
from .hf_bert import _BertReference, HFBert
from .layers import AnnotatedLayerNorm
from .spec import ARCHITECTURES, PRESETS, apply_defaults
from .torch_preset import DecoderOnly, EncoderOnly, Seq2Seq


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
