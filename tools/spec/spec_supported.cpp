// check_supported: the "not supported yet" diagnostics for a valid spec that asks for a
// combination the kernels, presets or runtime do not implement (see docs/spec.md), each at
// the line of the field that asks for it. Never a silent fallback.
#include "spec_internal.h"

namespace halformer {

using spec_internal::Context;
using spec_internal::Loc;
using spec_internal::sort_by_position;

namespace {
// The architecture a preset's files hold (nullopt: the preset is not tied to one).
std::optional<Architecture> preset_architecture(WeightPreset p) {
  switch (p) {
    case WeightPreset::HuggingfaceBert:
    case WeightPreset::HuggingfaceRoberta:
    case WeightPreset::HuggingfaceDistilbert:
    case WeightPreset::HuggingfaceElectra:
    case WeightPreset::HuggingfaceAlbert: return Architecture::Encoder;
    case WeightPreset::AnnotatedTransformer:
    case WeightPreset::HuggingfaceBart:
    case WeightPreset::HuggingfaceT5: return Architecture::EncoderDecoder;
    case WeightPreset::HuggingfaceGpt2:
    case WeightPreset::HuggingfaceLlama:
    case WeightPreset::HuggingfaceQwen2:
    case WeightPreset::HuggingfaceGptj:
    case WeightPreset::HuggingfaceGptNeox:
    case WeightPreset::HuggingfaceOpt: return Architecture::Decoder;
    case WeightPreset::TorchTransformer:
    case WeightPreset::Explicit: return std::nullopt;
  }
  return std::nullopt;
}
}  // namespace

std::vector<Diagnostic> check_supported(const Spec& s) {
  std::vector<Diagnostic> out;
  auto unsupported = [&](const std::string& field, const std::string& what) {
    const Loc at = Context::locate(s, field);
    out.push_back({s.file, at.line, at.column, field, what + " is not supported yet (planned; see docs/spec.md)"});
  };
  auto quoted = [](const char* n) { return std::string("'") + n + "'"; };
  if (s.head == HeadKind::Hidden && s.architecture != Architecture::Encoder)
    unsupported("head.kind", "head kind 'hidden' for architecture " + quoted(enum_name(s.architecture)));
  if (s.decoding == DecodeStrategy::Beam && s.architecture != Architecture::EncoderDecoder)
    unsupported("decoding.strategy", "beam search for architecture " + quoted(enum_name(s.architecture)));
  if (const auto family = preset_architecture(s.preset); family && s.architecture != *family)
    unsupported("weights.preset",
                "preset " + quoted(enum_name(s.preset)) + " for architecture " + quoted(enum_name(s.architecture)));
  if (s.preset == WeightPreset::HuggingfaceAlbert && !s.shared_weights && s.encoder_layers > 1)
    unsupported("layer.shared_weights", "false with preset 'huggingface-albert' (its files hold one layer's weights, "
                                        "which every layer runs with: set shared_weights: true)");
  if (is_gated(s.activation) && s.preset != WeightPreset::HuggingfaceLlama && s.preset != WeightPreset::HuggingfaceT5 &&
      s.preset != WeightPreset::HuggingfaceQwen2 && s.preset != WeightPreset::Explicit)
    unsupported("layer.activation", "gated activation " + quoted(enum_name(s.activation)) + " with preset " +
                                         quoted(enum_name(s.preset)) + " (its files have no gate projection; use "
                                         "'huggingface-llama', 'huggingface-qwen2', 'huggingface-t5' or 'explicit')");
  if (s.positions == Positions::Relative && s.preset != WeightPreset::HuggingfaceT5 &&
      s.preset != WeightPreset::Explicit)
    unsupported("embedding.positions", "positions 'relative' with preset " + quoted(enum_name(s.preset)) +
                                           " (its files have no relative tables; use 'huggingface-t5' or 'explicit')");
  if (s.embedding_size != 0 && s.embedding_size != s.d_model && s.architecture != Architecture::Encoder)
    unsupported("embedding.size", "size " + std::to_string(s.embedding_size) + " != d_model " +
                                      std::to_string(s.d_model) + " (an embedding projection) for architecture " +
                                      quoted(enum_name(s.architecture)) + " (encoder only)");
  if (s.shared_weights && s.architecture != Architecture::Encoder)
    unsupported("layer.shared_weights", "layers sharing one set of weights for architecture " +
                                            quoted(enum_name(s.architecture)) + " (encoder only)");
  if (s.parallel_residual && s.architecture == Architecture::EncoderDecoder)
    unsupported("layer.parallel_residual", "parallel_residual in an encoder-decoder (its cross-attention)");
  if (s.kv_heads != s.heads && s.architecture == Architecture::EncoderDecoder)
    unsupported("sizes.kv_heads", "grouped-query attention (kv_heads " + std::to_string(s.kv_heads) +
                                      " != heads) in an encoder-decoder (its cross-attention)");
  // int8, q8_0 and int4 kernels are CPU only (generators/linear_int8.cpp, linear_blocks.cpp);
  // bf16 ones run on GPUs too (generators/linear.cpp: bf16 weights widened to fp32 there).
  for (Precision p : {Precision::Int8, Precision::Q8_0, Precision::Int4})
    for (Target t : s.targets)
      if ((s.precision == p || s.output_precision() == p || s.table_precision() == p) && t != Target::Host)
        unsupported("targets", std::string("precision '") + enum_name(p) + "' with target '" + enum_name(t) + "' (" +
                                   enum_name(p) + " kernels are CPU only)");
  // fp16 is a cache format only, so far (docs/precision.md).
  if (s.precision == Precision::Fp16)
    unsupported("precision", "'fp16' weights (fp16 is a key/value cache format: precision_overrides.kv_cache; "
                             "for 16-bit weights use bf16)");
  else if (s.output_precision() == Precision::Fp16)
    unsupported("precision_overrides.generator", "'fp16' (the output projection is fp32, bf16, int8, q8_0 or int4)");
  for (Precision p : {Precision::Bf16, Precision::Fp16, Precision::Q8_0, Precision::Int4})
    if (s.table_precision() == p && s.precision != Precision::Fp16)
      unsupported("precision_overrides.embeddings", std::string("'") + enum_name(p) + "' (embedding tables are fp32 or int8)");
  for (Precision p : {Precision::Q8_0, Precision::Int4})
    if (s.cache_precision() == p)
      unsupported("precision_overrides.kv_cache",
                  std::string("'") + enum_name(p) + "' (attention caches are fp32, bf16, fp16 or int8)");
  if (!s.has_target(Target::Host))
    unsupported("targets", "a target list without 'host' (the CPU build is the reference and the fallback-free default)");
  sort_by_position(out);
  return out;
}

}  // namespace halformer
