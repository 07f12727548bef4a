// Checks for kernels that store bf16 bits (uint16): the cross-attention keys/values of a
// reduced-precision model (precision_overrides.kv_cache; linear's out_bf16).
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

namespace bf16_output {

inline float widen(uint16_t bits) {
  const uint32_t u = uint32_t(bits) << 16;
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

// Every stored value is `want` rounded to the nearest bf16: within half a bf16 unit of it
// (2^(e-8) for a value in [2^e, 2^(e+1))), plus `rel` of the output scale for the
// kernel's own fp32 arithmetic. A truncating store (off by up to a whole unit) fails.
inline void expect_rounded(const std::vector<uint16_t>& got, const std::vector<float>& want, double rel,
                           const char* what) {
  ASSERT_EQ(got.size(), want.size());
  double scale = 1, worst = 0;
  for (float w : want) scale = std::max(scale, double(std::abs(w)));
  size_t at = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    int e = 0;
    std::frexp(double(want[i]), &e);  // want = f * 2^e, f in [0.5, 1): its bf16 unit is 2^(e - 8)
    const double excess = std::abs(double(widen(got[i])) - want[i]) - std::ldexp(1.0, e - 9);
    if (excess > worst) worst = excess, at = i;
  }
  EXPECT_LE(worst, rel * scale) << what << ": value " << at << " is " << widen(got[at]) << ", want "
                                << want[at] << " rounded to bf16";
}

}  // namespace bf16_output
