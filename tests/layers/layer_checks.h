// The layer tests' comparisons with the naive reference (test_layers*.cpp), and for
// kernels that read or store bf16 bits (uint16) -- the attention caches of a
// reduced-precision model (precision_overrides.kv_cache; linear's out_bf16, attention's
// kv_bf16 / q_bf16) -- their rounding.
#pragma once

#include <gtest/gtest.h>
#include <HalideBuffer.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "halformer/packed_layout.h"  // from_bf16

namespace layer_checks {

using halformer::from_bf16;

// The position_bias argument of an attention kernel built without relative positions
// (not read; any buffer will do).
inline Halide::Runtime::Buffer<float> no_position_bias() { return Halide::Runtime::Buffer<float>(1, 1); }

// A 16-bit cache format (the kernels' `half`): bf16, 8 significant bits, or IEEE fp16, 11
// (rounded here by the compiler's _Float16, to nearest even).
struct HalfFormat {
  uint16_t (*to)(float);
  float (*from)(uint16_t);
  int significant_bits;
};
inline uint16_t to_fp16(float f) {
  const _Float16 h = static_cast<_Float16>(f);
  uint16_t u;
  std::memcpy(&u, &h, 2);
  return u;
}
inline float from_fp16(uint16_t u) {
  _Float16 h;
  std::memcpy(&h, &u, 2);
  return static_cast<float>(h);
}
inline const HalfFormat kBf16{halformer::to_bf16, from_bf16, 8};
inline const HalfFormat kFp16{to_fp16, from_fp16, 11};

// Rounds every value of v to the format in place and returns the bits: a kernel's
// 16-bit input and, in v, the values it reads.
inline std::vector<uint16_t> round_to_half(std::vector<float>& v, const HalfFormat& f = kBf16) {
  std::vector<uint16_t> bits(v.size());
  for (size_t i = 0; i < v.size(); ++i) bits[i] = f.to(v[i]), v[i] = f.from(bits[i]);
  return bits;
}

// max |got - want| within rel of the output scale (max |want|, at least 1).
inline void expect_close(const std::vector<float>& got, const std::vector<float>& want, const std::string& what,
                         double rel) {
  ASSERT_EQ(got.size(), want.size());
  double scale = 1, err = 0;
  for (float v : want) scale = std::max(scale, double(std::abs(v)));
  for (size_t i = 0; i < got.size(); ++i) err = std::max(err, double(std::abs(got[i] - want[i])));
  EXPECT_LE(err, rel * scale) << what << ": max abs error " << err << " (scale " << scale << ")";
}

// Every stored value is `want` rounded to the nearest value of the format: within half a
// unit of it (2^(e-8) for a bf16 value in [2^e, 2^(e+1)), 2^(e-11) for fp16), plus `rel`
// of the output scale for the kernel's own fp32 arithmetic. A truncating store (off by up
// to a whole unit) fails.
inline void expect_rounded_half(const std::vector<uint16_t>& got, const std::vector<float>& want,
                                const std::string& what, double rel, const HalfFormat& f = kBf16) {
  ASSERT_EQ(got.size(), want.size());
  double scale = 1, worst = 0;
  for (float w : want) scale = std::max(scale, double(std::abs(w)));
  size_t at = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    int e = 0;
    std::frexp(double(want[i]), &e);  // want = m * 2^e, m in [0.5, 1): its unit is 2^(e - significant bits)
    const double excess = std::abs(double(f.from(got[i])) - want[i]) - std::ldexp(1.0, e - f.significant_bits - 1);
    if (excess > worst) worst = excess, at = i;
  }
  EXPECT_LE(worst, rel * scale) << what << ": value " << at << " is " << f.from(got[at]) << ", want "
                                << want[at] << " rounded to " << f.significant_bits << " significant bits";
}

// One call of a linear kernel of any precision (the same signature, model_config.h's
// LinearFn): _residual and _gated kernels also take `second`.
template <typename Fn>
int call_linear(Fn fn, halide_buffer_t* x, halide_buffer_t* w, halide_buffer_t* b, halide_buffer_t* second,
                halide_buffer_t* out) {
  using B = halide_buffer_t*;
  if constexpr (std::is_invocable_v<Fn, B, B, B, B, B>)
    return fn(x, w, b, second, out);
  else
    return fn(x, w, b, out);
}

// One call of a quantized linear kernel on M rows (test_layers_int8 / int4): random inputs
// x (K, M) whose first value and (M > 1) second row are zero -- a zero row must give the
// bias only (scale 0), not NaN --, a random second input (N, M) for _residual / _gated
// kernels, and the output as floats (out) or, with bf16_out, as bf16 bits (out_bits).
struct QuantizedLinearCall {
  std::vector<float> x, second, out;
  std::vector<uint16_t> out_bits;
  QuantizedLinearCall(int M, int K, int N, std::vector<float> random_x, std::vector<float> random_second)
      : x(std::move(random_x)), second(std::move(random_second)), out(size_t(M) * N, -7.0f), out_bits(out.size(), 0),
        M_(M), K_(K), N_(N) {
    x[0] = 0;
    if (M > 1) std::fill(x.begin() + K, x.begin() + 2 * K, 0.0f);
  }
  template <typename Fn>
  int run(Fn fn, halide_buffer_t* w, halide_buffer_t* b, bool bf16_out) {
    Halide::Runtime::Buffer<float> xb(x.data(), {K_, M_}), sb(second.data(), {N_, M_}), ob(out.data(), {N_, M_});
    Halide::Runtime::Buffer<uint16_t> obits(out_bits.data(), {N_, M_});
    return call_linear(fn, xb, w, b, sb, bf16_out ? obits.raw_buffer() : ob.raw_buffer());
  }

 private:
  int M_, K_, N_;
};

}  // namespace layer_checks
