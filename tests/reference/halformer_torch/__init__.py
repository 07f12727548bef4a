"""halformer's PyTorch reference (the oracle): a YAML spec -> a torch.nn.Module, greedy
and beam decoding.

This package is the independent ground truth that the Halide kernels and the C++ runtime
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

Modules: spec (the spec and its defaults), layers (shared building blocks),
torch_preset / annotated / hf_bert (one per weights.preset), weights (building a model,
its weight names, test weights), decoding (greedy, beam search); `python
tests/reference/halformer_torch [SPEC...]` runs the self-test (__main__.py). Every
public name is importable from the package itself: `from halformer_torch import ...`
with tests/reference on sys.path.

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
  compare them (tests/reference/torch_reference.py zeroes them). The annotated preset
  fills masked scores with -1e9 as the notebook does (same softmax as -inf whenever a
  row keeps at least one key, which every compared row does).
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
  (checked by the self-test, __main__.py, differences ~1e-6).
* Dropout is identity: every reference output is computed in eval mode.
"""
from .annotated import (AnnotatedAttention, AnnotatedDecoderLayer, AnnotatedEmbeddings,
                        AnnotatedEncoderLayer, AnnotatedFeedForward, AnnotatedGenerator,
                        AnnotatedNorm, AnnotatedPositions, AnnotatedSeq2Seq, AnnotatedStack,
                        AnnotatedSublayer)
from .decoding import beam_search, greedy, greedy_lm
from .hf_bert import HFBert, bert_config
from .layers import AnnotatedLayerNorm, causal_mask, sinusoidal_positions
from .spec import ARCHITECTURES, PRESETS, apply_defaults, load_spec, spec_defaults
from .torch_preset import DecoderOnly, EncoderOnly, Seq2Seq
from .weights import build_model, export_state, load_weights, randomize_, to_torch_preset

__all__ = [
    "ARCHITECTURES", "PRESETS", "spec_defaults", "load_spec", "apply_defaults",
    "AnnotatedLayerNorm", "causal_mask", "sinusoidal_positions",
    "Seq2Seq", "EncoderOnly", "DecoderOnly",
    "AnnotatedNorm", "AnnotatedAttention", "AnnotatedFeedForward", "AnnotatedSublayer",
    "AnnotatedEncoderLayer", "AnnotatedDecoderLayer", "AnnotatedStack", "AnnotatedEmbeddings",
    "AnnotatedPositions", "AnnotatedGenerator", "AnnotatedSeq2Seq",
    "HFBert", "bert_config",
    "build_model", "export_state", "load_weights", "randomize_", "to_torch_preset",
    "greedy", "greedy_lm", "beam_search",
]
