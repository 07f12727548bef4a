// The spellings of the spec's own enums (NormPlacement, Activation, ...; those shared
// with the generators and the runtime are in halformer/enums.h), to_string for every
// enum of the spec, the gated activations, and how a Diagnostic reads.
#include "spec.h"

namespace halformer {

namespace {
constexpr std::pair<NormPlacement, const char*> kNormPlacementNames[] = {{NormPlacement::Post, "post"},
                                                                         {NormPlacement::Pre, "pre"}};
constexpr std::pair<Activation, const char*> kActivationNames[] = {
    {Activation::Relu, "relu"},     {Activation::Gelu, "gelu"},     {Activation::GeluTanh, "gelu_tanh"},
    {Activation::Silu, "silu"},     {Activation::Relu2, "relu2"},   {Activation::Swiglu, "swiglu"},
    {Activation::Geglu, "geglu"},   {Activation::GegluTanh, "geglu_tanh"}};
constexpr std::pair<RotaryLayout, const char*> kRotaryLayoutNames[] = {{RotaryLayout::Half, "half"},
                                                                       {RotaryLayout::Interleaved, "interleaved"}};
constexpr std::pair<Pooler, const char*> kPoolerNames[] = {
    {Pooler::None, "none"}, {Pooler::DenseTanh, "dense_tanh"}, {Pooler::DenseGelu, "dense_gelu"}};
constexpr std::pair<DecodeStrategy, const char*> kDecodeStrategyNames[] = {{DecodeStrategy::Greedy, "greedy"},
                                                                           {DecodeStrategy::Beam, "beam"}};
constexpr std::pair<Target, const char*> kTargetNames[] = {
    {Target::Host, "host"}, {Target::Cuda, "cuda"}, {Target::OpenCL, "opencl"}};
}  // namespace

EnumNames<NormPlacement> enum_names(NormPlacement) { return enum_names_of(kNormPlacementNames); }
EnumNames<Activation> enum_names(Activation) { return enum_names_of(kActivationNames); }
EnumNames<RotaryLayout> enum_names(RotaryLayout) { return enum_names_of(kRotaryLayoutNames); }
EnumNames<Pooler> enum_names(Pooler) { return enum_names_of(kPoolerNames); }
EnumNames<DecodeStrategy> enum_names(DecodeStrategy) { return enum_names_of(kDecodeStrategyNames); }
EnumNames<Target> enum_names(Target) { return enum_names_of(kTargetNames); }

const char* to_string(Architecture v) { return enum_name(v); }
const char* to_string(NormPlacement v) { return enum_name(v); }
const char* to_string(NormKind v) { return enum_name(v); }
const char* to_string(Activation v) { return enum_name(v); }
const char* to_string(Positions v) { return enum_name(v); }
const char* to_string(HeadKind v) { return enum_name(v); }
const char* to_string(Pooling v) { return enum_name(v); }
const char* to_string(Pooler v) { return enum_name(v); }
const char* to_string(DecodeStrategy v) { return enum_name(v); }
const char* to_string(WeightPreset v) { return enum_name(v); }
const char* to_string(Precision v) { return enum_name(v); }
std::optional<Precision> parse_precision(const std::string& text) {
  for (const auto& [e, n] : enum_names(Precision{}))
    if (text == n) return e;
  return std::nullopt;
}
const char* to_string(Target v) { return enum_name(v); }
const char* to_string(RotaryLayout v) { return enum_name(v); }

Activation gate_activation(Activation a) {
  switch (a) {
    case Activation::Swiglu: return Activation::Silu;
    case Activation::Geglu: return Activation::Gelu;
    case Activation::GegluTanh: return Activation::GeluTanh;
    default: return a;
  }
}
bool is_gated(Activation a) { return gate_activation(a) != a; }

std::string Diagnostic::str() const {
  std::string s = file;
  if (line > 0) s += ":" + std::to_string(line) + (column > 0 ? ":" + std::to_string(column) : "");
  s += ": error: ";
  if (!field.empty()) s += field + ": ";
  return s + message;
}

}  // namespace halformer
