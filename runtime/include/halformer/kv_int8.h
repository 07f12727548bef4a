// The int8 key/value cache row (precision_overrides.kv_cache: int8), shared by the
// attention kernel that reads it (generators/attention.cpp kv_int8), the runtime that
// writes it (runtime/self_cache.cpp, runtime/paged_decoder.cpp) and the tests.
//
// One row per (position, key or value head): the head's `hd` features as int8, then their
// scale as 4 bytes of fp32 (little-endian), feature f = int8(f) * scale, scale =
// max |feature| / 127 and each feature rounded half away from zero (as llama.cpp's Q8_0,
// one scale per head rather than per 32 features). hd + 4 bytes where bf16 takes 2 * hd:
// 0.53x at head size 64. docs/precision.md#int8-key-value-cache.
#pragma once

#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstring>

namespace halformer {

constexpr int kKvInt8ScaleBytes = 4;
inline int kv_int8_row_bytes(int hd) { return hd + kKvInt8ScaleBytes; }
// The bytes of one position of `features` key and value features (heads of hd).
inline int kv_int8_bytes(int features, int hd) { return features / hd * kv_int8_row_bytes(hd); }

// Quantizes `hd` features (fp32 from `feature(f)`) into one row of kv_int8_row_bytes(hd).
// A NaN or infinite feature makes the scale NaN (and the features 0), so that the row
// reads as NaN, as a bf16 cache's would, rather than as a finite wrong value; a row whose
// scale would be below FLT_MIN is stored as zeros (its largest feature < 1.5e-36).
template <typename Feature>
inline void quantize_kv_row(int hd, Feature feature, int8_t* row) {
  float amax = 0.0f;
  for (int f = 0; f < hd; ++f) {
    const float a = std::fabs(feature(f));
    amax = a > amax || a != a ? a : amax;
  }
  const bool finite = std::isfinite(amax);
  const float scale = finite ? amax / 127.0f : NAN, inv = finite && scale >= FLT_MIN ? 1.0f / scale : 0.0f;
  for (int f = 0; f < hd; ++f)
    row[f] = finite ? int8_t(std::fmax(-127.0f, std::fmin(127.0f, std::round(feature(f) * inv)))) : int8_t(0);
  std::memcpy(row + hd, &scale, kKvInt8ScaleBytes);  // x86 and the GPU hosts: little-endian
}
inline float kv_row_scale(const int8_t* row, int hd) {
  float scale;
  std::memcpy(&scale, row + hd, kKvInt8ScaleBytes);
  return scale;
}

}  // namespace halformer
