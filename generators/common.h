// Shared vocabulary of the layer generators: shape letters and enum GeneratorParams.
// The enums the spec shares (NormKind, Positions, HeadKind, Pooling) are in
// halformer/enums.h; param_names() turns their spellings into GeneratorParam maps.
//
// Layout convention (Halide dims are innermost first):
//   activations  x(c, m)        c = feature (contiguous), m = row = token (batch*time flattened)
//   4-D views    x(d, h, t, b)  d = within-head feature, h = head, t = time, b = batch
//   weights      w(n, k)        linear weights pre-transposed by the runtime at load time so
//                               that the output feature n is contiguous (vectorised loads).
#pragma once

#include "Halide.h"

#include <initializer_list>
#include <map>
#include <string>

#include "halformer/enums.h"

namespace halformer {

// A shared enum's GeneratorParam map: the spec's names of `values` (halformer/enums.h).
template <class E>
std::map<std::string, E> param_names(std::initializer_list<E> values) {
  std::map<std::string, E> m;
  for (E v : values) m.emplace(enum_name(v), v);
  return m;
}

// The pointwise function a linear applies to its output before the epilogue (the
// GeneratorParam `activation`): not the spec's Activation, whose gated kinds the planner
// splits into a gate (ff1 with its PointwiseFn) and an up projection (ff_up).
enum class PointwiseFn { None, Relu, Gelu, GeluTanh, Tanh, Silu, Relu2 };
inline const std::map<std::string, PointwiseFn> kPointwiseFnNames = {{"none", PointwiseFn::None},
                                                                     {"relu", PointwiseFn::Relu},
                                                                     {"gelu", PointwiseFn::Gelu},
                                                                     {"gelu_tanh", PointwiseFn::GeluTanh},
                                                                     {"tanh", PointwiseFn::Tanh},
                                                                     {"silu", PointwiseFn::Silu},
                                                                     {"relu2", PointwiseFn::Relu2}};

// What a matmul's epilogue does with its second (N, M) input (linear*.cpp).
enum class Epilogue { None, AddResidual, MultiplyGate };

// Elementwise kernels over (C, M) of any width (convert.cpp, gate.cpp): 64 x 4 tiles on a
// GPU; on the CPU rows in parallel with 16-wide vectors.
inline void schedule_elementwise(Halide::Func out, const Halide::Var& c, const Halide::Var& m,
                                 const Halide::Target& target) {
  using namespace Halide;
  if (target.has_gpu_feature()) {
    Var co("co"), mo("mo"), ci("ci"), mi("mi");
    out.gpu_tile(c, m, co, mo, ci, mi, 64, 4, TailStrategy::GuardWithIf);
    return;
  }
  out.parallel(m).vectorize(c, 16, TailStrategy::GuardWithIf);
}

// The epilogue after the activation: y, y + second or y * second.
inline Halide::Expr apply_epilogue(Epilogue e, Halide::Expr y, const Halide::Expr& second) {
  if (e == Epilogue::AddResidual) return y + second;
  if (e == Epilogue::MultiplyGate) return y * second;
  return y;
}

// tanh(x) = 1 - 2 / (exp(2x) + 1): Halide's own tanh is a scalar library call per lane on
// x86 (docs/performance-log.md#common-activations). Absolute error about 1e-7 near 0;
// |x| >= 9 is within 6e-8 of +-1 (and keeps exp's argument in range). A NaN stays NaN
// (the clamp would hide it).
inline Halide::Expr tanh_by_exp(Halide::Expr x) {
  using namespace Halide;
  Expr e = exp(2.0f * clamp(x, -9.0f, 9.0f));
  return select(is_nan(x), x, 1.0f - 2.0f / (e + 1.0f));
}

// erf-based GELU (torch's default) and its tanh approximation (torch approximate="tanh").
inline Halide::Expr apply_pointwise(PointwiseFn fn, Halide::Expr v) {
  using namespace Halide;
  switch (fn) {
    case PointwiseFn::None: return v;
    case PointwiseFn::Relu: return max(v, 0.0f);
    case PointwiseFn::Gelu: return 0.5f * v * (1.0f + erf(v * 0.70710678118654752f));
    case PointwiseFn::Tanh: return tanh_by_exp(v);  // BERT's pooler
    case PointwiseFn::Silu: return v / (1.0f + exp(-v));  // x * sigmoid(x) (swish; Marian)
    case PointwiseFn::Relu2: {  // squared ReLU (Primer, Nemotron)
      Expr r = max(v, 0.0f);
      return r * r;
    }
    case PointwiseFn::GeluTanh: {
      Expr inner = 0.79788456080286536f * (v + 0.044715f * v * v * v);
      return 0.5f * v * (1.0f + tanh_by_exp(inner));
    }
  }
  return v;
}

// bf16 as its 16 bits (uint16), the storage type of bf16 weights and caches
// (halformer/packed_layout.h: to_bf16 / from_bf16, which these mirror). fp32 -> bf16:
// rounded to nearest even in integer arithmetic, NaN kept a NaN, which Halide vectorises
// (its own bf16 cast is emulated anyway).
inline Halide::Expr to_bf16_bits(Halide::Expr f32) {
  using namespace Halide;
  Expr u = reinterpret<uint32_t>(f32);
  Expr rounded = cast<uint16_t>((u + 0x7fff + ((u >> 16) & 1)) >> 16);
  return select((u & 0x7fffffff) > 0x7f800000, cast<uint16_t>((u >> 16) | 0x40), rounded);
}
// bf16 bits -> fp32 (exact): a 16-bit shift.
inline Halide::Expr from_bf16_bits(Halide::Expr u16) {
  using namespace Halide;
  return reinterpret<float>(cast<uint32_t>(u16) << 16);
}

// The 16-bit format of a kernel's 16-bit caches and outputs (the *_bf16 flags: "stored as
// 16 bits"): bf16 by default, or IEEE fp16 -- llama.cpp's key/value cache type, 3 more
// mantissa bits for values within +-65504 (spec precision_overrides.kv_cache: fp16).
// The GeneratorParam `half` of attention, rotary and the linears; F16C converts it.
inline const std::map<std::string, Precision> kHalfNames = {{"bf16", Precision::Bf16}, {"fp16", Precision::Fp16}};
inline Halide::Expr to_half_bits(Halide::Expr f32, Precision half) {
  using namespace Halide;
  if (half == Precision::Fp16) return reinterpret<uint16_t>(cast<float16_t>(f32));
  return to_bf16_bits(f32);
}
inline Halide::Expr from_half_bits(Halide::Expr u16, Precision half) {
  using namespace Halide;
  if (half == Precision::Fp16) return cast<float>(reinterpret<float16_t>(u16));
  return from_bf16_bits(u16);
}

// Largest power of two <= limit that divides n (>= 1). Used to pick vector widths that
// need no tail for sizes baked in at generation time (e.g. d_model 96 -> 16, 60 -> 4).
inline int pow2_divisor(int n, int limit) {
  int v = 1;
  while (v * 2 <= limit && n % (v * 2) == 0) v *= 2;
  return v;
}

}  // namespace halformer
