// The linear weight layout shared by the generators (generators/linear.cpp) and the code
// that fills it (runtime/weights.cpp, tests, bench).
//
// Linear weights are stored as panels of kPanel output features: Halide w(n % kPanel, k,
// n / kPanel), i.e. [panels][K][kPanel] row-major, N zero-padded to whole panels. A
// register tile then reads one panel front to back (256-byte rows in a row), where the
// plain transposed [K][N] layout makes it hop N floats per k -- for N = 512 or 2048 a
// power-of-two stride whose rows all fall into the same few cache sets. Measured on
// transformer-base's decode shapes (M = 1): 1.5x the bandwidth of the [K][N] layout.
#pragma once

#include <cstddef>
#include <vector>

namespace halformer {

constexpr int kPanel = 64;

inline int panel_count(int out_features) { return (out_features + kPanel - 1) / kPanel; }

inline size_t packed_size(int in_features, int out_features) {
  return size_t(panel_count(out_features)) * in_features * kPanel;
}

// Writes rows [n0, n0 + rows) of a torch-layout [rows][K] weight (out x in) into the
// packed buffer `w` (of packed_size elements, zero-initialised for the padding).
inline void pack_rows(const float* torch_rows, int rows, int in_features, int n0, std::vector<float>& w) {
  for (int r = 0; r < rows; ++r) {
    const int n = n0 + r;
    float* dst = w.data() + size_t(n / kPanel) * in_features * kPanel + n % kPanel;
    const float* src = torch_rows + size_t(r) * in_features;
    for (int k = 0; k < in_features; ++k) dst[size_t(k) * kPanel] = src[k];
  }
}

// A whole torch-layout [N][K] weight, packed.
inline std::vector<float> pack_linear(const float* torch_w, int out_features, int in_features) {
  std::vector<float> w(packed_size(in_features, out_features), 0.0f);
  pack_rows(torch_w, out_features, in_features, 0, w);
  return w;
}

}  // namespace halformer
