// The enums that cross layers, each defined once with its spelling in the spec: the spec
// compiler (tools/spec) parses them, the planner passes some to the generators as
// GeneratorParams (generators/*.cpp take their names from here), and the generated model
// bakes others into ModelConfig (model_config.h) for the runtime. Enums only one layer
// uses stay with it (the spec's Activation, NormPlacement, ... in tools/spec/spec.h; the
// linears' PointwiseFn and Epilogue in generators/common.h).
// The numeric values of the enums in ModelConfig are part of the descriptor's ABI
// (kDescriptorVersion): append, never reorder.
#pragma once

#include <cstddef>
#include <utility>

namespace halformer {

enum class Architecture { EncoderDecoder, Encoder, Decoder };
// standard: biased variance, eps inside the sqrt | annotated: unbiased std, eps added to
// it (The Annotated Transformer) | rms: RMSNorm, no centring and no beta
enum class NormKind { Standard, Annotated, Rms };
// Rotary: applied to queries and keys inside the self-attention kernels (baked in).
// Relative: T5's bucketed bias per head on the self-attention scores. Neither adds
// anything to the embeddings.
enum class Positions { Sinusoidal, Learned, None, SinusoidalSplit, Rotary, Relative };
enum class HeadKind { LogSoftmax, Softmax, Logits, Classifier, Embedding, Hidden };
enum class Pooling { Cls, Mean };  // classifier / embedding heads: the first token, or the mean over tokens
enum class WeightPreset {
  TorchTransformer,
  AnnotatedTransformer,
  HuggingfaceBert,
  HuggingfaceRoberta,
  HuggingfaceDistilbert,
  HuggingfaceGpt2,
  HuggingfaceBart,
  HuggingfaceLlama,
  HuggingfaceT5,
  HuggingfaceQwen2,
  HuggingfaceGptj,
  HuggingfaceGptNeox,
  HuggingfaceOpt,
  HuggingfaceElectra,
  HuggingfaceAlbert,
  Explicit
};
// The spec's precision and the format the runtime stores weights in (docs/precision.md).
// fp16: key/value caches only on the CPU (precision_overrides.kv_cache). q8_0: int8 weights
// in blocks of 32 with an fp16 scale each (llama.cpp's Q8_0), the int4 kernel's twin.
enum class Precision { Fp32, Int8, Bf16, Int4, Fp16, Q8_0 };

// ---- the spelling of each value in the spec (docs/spec.md)

// A fixed list of (value, name) pairs, iterable with range-for.
template <class E>
struct EnumNames {
  const std::pair<E, const char*>* first;
  std::size_t size;
  const std::pair<E, const char*>* begin() const { return first; }
  const std::pair<E, const char*>* end() const { return first + size; }
};
template <class E, std::size_t N>
constexpr EnumNames<E> enum_names_of(const std::pair<E, const char*> (&table)[N]) {
  return {table, N};
}

inline constexpr std::pair<Architecture, const char*> kArchitectureNames[] = {
    {Architecture::EncoderDecoder, "encoder_decoder"}, {Architecture::Encoder, "encoder"}, {Architecture::Decoder, "decoder"}};
inline constexpr std::pair<NormKind, const char*> kNormKindNames[] = {
    {NormKind::Standard, "standard"}, {NormKind::Annotated, "annotated"}, {NormKind::Rms, "rms"}};
inline constexpr std::pair<Positions, const char*> kPositionsNames[] = {
    {Positions::Sinusoidal, "sinusoidal"},       {Positions::Learned, "learned"}, {Positions::None, "none"},
    {Positions::SinusoidalSplit, "sinusoidal_split"}, {Positions::Rotary, "rotary"}, {Positions::Relative, "relative"}};
inline constexpr std::pair<HeadKind, const char*> kHeadKindNames[] = {
    {HeadKind::LogSoftmax, "log_softmax"}, {HeadKind::Softmax, "softmax"},     {HeadKind::Logits, "logits"},
    {HeadKind::Classifier, "classifier"},  {HeadKind::Embedding, "embedding"}, {HeadKind::Hidden, "hidden"}};
inline constexpr std::pair<Pooling, const char*> kPoolingNames[] = {{Pooling::Cls, "cls"}, {Pooling::Mean, "mean"}};
// In documentation order (the spec's error messages list them so).
inline constexpr std::pair<WeightPreset, const char*> kWeightPresetNames[] = {
    {WeightPreset::TorchTransformer, "torch.nn.Transformer"},
    {WeightPreset::AnnotatedTransformer, "annotated-transformer"},
    {WeightPreset::HuggingfaceBert, "huggingface-bert"},
    {WeightPreset::HuggingfaceRoberta, "huggingface-roberta"},
    {WeightPreset::HuggingfaceDistilbert, "huggingface-distilbert"},
    {WeightPreset::HuggingfaceElectra, "huggingface-electra"},
    {WeightPreset::HuggingfaceAlbert, "huggingface-albert"},
    {WeightPreset::HuggingfaceGpt2, "huggingface-gpt2"},
    {WeightPreset::HuggingfaceBart, "huggingface-bart"},
    {WeightPreset::HuggingfaceLlama, "huggingface-llama"},
    {WeightPreset::HuggingfaceT5, "huggingface-t5"},
    {WeightPreset::HuggingfaceQwen2, "huggingface-qwen2"},
    {WeightPreset::HuggingfaceGptj, "huggingface-gptj"},
    {WeightPreset::HuggingfaceGptNeox, "huggingface-gpt-neox"},
    {WeightPreset::HuggingfaceOpt, "huggingface-opt"},
    {WeightPreset::Explicit, "explicit"}};
inline constexpr std::pair<Precision, const char*> kPrecisionNames[] = {
    {Precision::Fp32, "fp32"}, {Precision::Bf16, "bf16"}, {Precision::Fp16, "fp16"},
    {Precision::Int8, "int8"}, {Precision::Q8_0, "q8_0"}, {Precision::Int4, "int4"}};

constexpr EnumNames<Architecture> enum_names(Architecture) { return enum_names_of(kArchitectureNames); }
constexpr EnumNames<NormKind> enum_names(NormKind) { return enum_names_of(kNormKindNames); }
constexpr EnumNames<Positions> enum_names(Positions) { return enum_names_of(kPositionsNames); }
constexpr EnumNames<HeadKind> enum_names(HeadKind) { return enum_names_of(kHeadKindNames); }
constexpr EnumNames<Pooling> enum_names(Pooling) { return enum_names_of(kPoolingNames); }
constexpr EnumNames<WeightPreset> enum_names(WeightPreset) { return enum_names_of(kWeightPresetNames); }
constexpr EnumNames<Precision> enum_names(Precision) { return enum_names_of(kPrecisionNames); }

// The spec's name of `v` ("encoder_decoder", "log_softmax", ...); "?" for a value
// outside the enum. Any enum with an enum_names() overload (found by ADL).
template <class E>
const char* enum_name(E v) {
  for (const auto& [e, n] : enum_names(E{}))
    if (e == v) return n;
  return "?";
}

}  // namespace halformer
