// The linear weight layout shared by the generators (generators/linear.cpp) and the code
// that fills it (runtime/weight_packing.cpp, tests, bench).
//
// Linear weights are stored as panels of `panel` output features: Halide w(n % panel, k,
// n / panel), i.e. [panels][K][panel] row-major, N zero-padded to whole panels. A
// register tile then reads its panel front to back, where the plain transposed [K][N]
// layout makes it hop N floats per k -- for N = 512 or 2048 a power-of-two stride whose
// rows all fall into the same few cache sets. Measured on transformer-base's decode
// shapes (M = 1): 1.5x the bandwidth of the [K][N] layout.
//
// The panel is as wide as the CPU's register tile (weight_panel), so that the tile's
// weight stream is one contiguous run: AVX-512 tiles are 64 features wide (4 zmm), AVX2
// tiles 16 (2 ymm), which in 64-wide panels read 64 of every 256 bytes along K and lost
// 15-25% (2-core Zen 3, halformer_matmul_bench at 128 rows: 128x2048x512 2.08 -> 1.53 ms,
// 128x512x1536 1.39 -> 1.15 ms with 16-wide panels). GPU kernels read 64-wide panels.
#pragma once

#include <HalideRuntime.h>  // halide_type_t (bf16_weight_type)

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

namespace halformer {

constexpr int kPanelWide = 64;  // AVX-512 and GPU kernels
constexpr int kPanelAvx2 = 16;  // AVX2 (and any other CPU target)

// The panel width of kernels compiled for `halide_target` (a Halide target string, e.g.
// "x86-64-linux-avx-avx2-fma" or a kernel's metadata()->target): the generators and the
// runtime's loader both ask this function, so the two always agree.
inline bool gpu_target(const std::string& halide_target) {
  for (const char* api : {"cuda", "opencl", "metal", "vulkan", "d3d12compute", "webgpu"})
    if (halide_target.find(api) != std::string::npos) return true;
  return false;
}
inline int weight_panel(const std::string& halide_target) {
  return gpu_target(halide_target) || halide_target.find("avx512") != std::string::npos ? kPanelWide : kPanelAvx2;
}

inline int panel_count(int out_features, int panel) { return (out_features + panel - 1) / panel; }

inline size_t packed_size(int in_features, int out_features, int panel) {
  return size_t(panel_count(out_features, panel)) * in_features * panel;
}

// Element offset of weight (n, k) in the packed layout (fp32, and bf16's 16-bit copy).
inline size_t packed_index(int in_features, int n, int k, int panel) {
  return size_t(n / panel) * in_features * panel + size_t(k) * panel + n % panel;
}

// Writes rows [n0, n0 + rows) of a torch-layout [rows][K] weight (out x in) into the
// packed buffer `w` (of packed_size elements, zero-initialised for the padding).
inline void pack_rows(const float* torch_rows, int rows, int in_features, int n0, int panel, float* w) {
  for (int r = 0; r < rows; ++r) {
    const float* src = torch_rows + size_t(r) * in_features;
    for (int k = 0; k < in_features; ++k) w[packed_index(in_features, n0 + r, k, panel)] = src[k];
  }
}

// A whole torch-layout [N][K] weight, packed.
inline std::vector<float> pack_linear(const float* torch_w, int out_features, int in_features, int panel) {
  std::vector<float> w(packed_size(in_features, out_features, panel), 0.0f);
  pack_rows(torch_w, out_features, in_features, 0, panel, w.data());
  return w;
}

// ---- bf16 (generators/linear.cpp's linear_bf16): the fp32 packed layout, each value the
// upper 16 bits of its fp32 rounded to nearest even (NaN stays a NaN); the kernel widens
// a value back by shifting it left 16 bits, exactly.
inline uint16_t to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return uint16_t((u >> 16) | 0x40);  // quiet NaN
  return uint16_t((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}
inline float from_bf16(uint16_t h) {
  const uint32_t u = uint32_t(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// CPUs with a bf16 dot product (AVX-512 BF16: Zen 4 and later, Sapphire Rapids; Halide's
// avx512_zen4 feature, implied by the later ones): linear_bf16 then rounds its activations
// to bf16 too and multiplies bf16 pairs with vdpbf16ps (two products summed into each
// fp32 lane, twice the FMA's rate), so the weights are stored with K in pairs:
// [panels][K / 2][panel][2] (K zero-padded to even), one lane's pair one 32-bit word.
// Elsewhere (GPU kernels too) the fp32 layout, widened in registers.
inline bool bf16_dot_product(const std::string& halide_target) {
  if (gpu_target(halide_target)) return false;  // a GPU build's host features do not count
  for (const char* f : {"avx512_zen4", "avx512_zen5", "avx512_sapphirerapids"})
    if (halide_target.find(f) != std::string::npos) return true;
  return false;
}
constexpr int kBf16Pair = 2;
inline int bf16_pairs_of(int in_features) { return (in_features + kBf16Pair - 1) / kBf16Pair; }
// CPUs whose int8 kernels take 8-bit activations and multiply them with vpdpbusd (u8 x
// s8, four products summed per int32 lane): AVX-512 VNNI, in Halide's avx512_zen4,
// avx512_zen5 and avx512_sapphirerapids features (the same CPUs as bf16_dot_product);
// elsewhere int16 activations in pairs (generators/linear_int8.cpp).
inline bool int8_byte_dot_product(const std::string& halide_target) { return bf16_dot_product(halide_target); }
constexpr int kInt8Pair = 2;
constexpr int kInt8Quad = 4;
// The k group of int8 kernels for a target: quads where it has vpdpbusd, unless the model
// keeps int16 activations (precision_overrides.int16_activations). The generator, the
// loader's layout and the tuner all ask this.
inline int int8_group(const std::string& halide_target, bool int16_activations = false) {
  return !int16_activations && int8_byte_dot_product(halide_target) ? kInt8Quad : kInt8Pair;
}
// Columns of an int8 kernel's bias input: bias, weight scale, and for quads the channel sum.
inline int int8_bias_columns(int group) { return group == kInt8Quad ? 3 : 2; }

// The packed layout of the linear weights a kernel target reads: the panel widths, for
// bf16 whether K is paired, for int8 the k group. The generators and the runtime's
// loader both derive it from the target string.
// Paired bf16 panels are one vector of fp32 lanes wide, so that each vector of a register
// tile reads one panel's pair row, a dense 64-byte load (in 64-wide panels, indexed
// 2 * (n % 64) + s, Halide gathered the last vector of each tile 16 bits at a time).
constexpr int kBf16PairPanel = 16;
struct WeightLayout {
  int panel = kPanelWide;    // fp32 linears, and bf16 ones where K is not paired
  bool bf16_pairs = false;
  int int8_group = kInt8Pair;  // the k run of one int32 lane in packed int8 weights
  int bf16_panel() const { return bf16_pairs ? kBf16PairPanel : panel; }
};
inline WeightLayout weight_layout(const std::string& halide_target) {
  return {weight_panel(halide_target), bf16_dot_product(halide_target), int8_group(halide_target)};
}

// The 3-D shape linear_bf16 reads either layout as (dense, innermost first): (pair,
// panel, K / pair * panels), pair = kBf16Pair where K is paired, else 1: panel p's step j
// is row p * steps + j. A separate panel dimension (not one of 2 * panel) is what lets
// Halide prove a register tile's weight loads dense (with `2 * (n % panel) + s` it
// gathered them 16 bits at a time); the panels as rows, not a 4th dimension, are what
// Halide's AMX tile matcher reads.
struct Bf16WeightShape {
  int pair, panel, steps, panels;
  int rows() const { return steps * panels; }
};
// The element type of a bf16 linear's weight buffer: bfloat16 where K is paired (the AMX
// tile matcher wants bf16 loads), else the raw 16-bit pattern (uint16).
inline halide_type_t bf16_weight_type(bool pairs) {
  return pairs ? halide_type_t(halide_type_bfloat, 16) : halide_type_t(halide_type_uint, 16);
}
inline Bf16WeightShape bf16_weight_shape(int in_features, int out_features, int panel, bool pairs) {
  return {pairs ? kBf16Pair : 1, panel, pairs ? bf16_pairs_of(in_features) : in_features,
          panel_count(out_features, panel)};
}

// Element count and offset of weight (n, k) of a bf16 linear in either layout.
inline size_t packed_bf16_size(int in_features, int out_features, int panel, bool pairs) {
  return pairs ? packed_size(bf16_pairs_of(in_features) * kBf16Pair, out_features, panel)
               : packed_size(in_features, out_features, panel);
}
inline size_t packed_bf16_index(int in_features, int n, int k, int panel, bool pairs) {
  if (!pairs) return packed_index(in_features, n, k, panel);
  return ((size_t(n / panel) * bf16_pairs_of(in_features) + k / kBf16Pair) * panel + n % panel) * kBf16Pair +
         k % kBf16Pair;
}

// ---- int8 (generators/linear_int8.cpp)
// Weights quantized per output channel n: scale(n) = max_k |w(n, k)| / 127 and
// q(n, k) = round-half-even(w(n, k) * 127 / max_k |w(n, k)|), in [-127, 127]. Stored in
// panels of kInt8Panel features, K walked in groups of `group` (zero-padded):
// [panels][groups][kInt8Panel][group], so that one output lane's group is one int32.
// Panels are as narrow as the int8 kernel's narrowest register tile (AVX2: 2 vectors of 8
// int32 lanes; wider tiles cover whole panels), so that a tile's weight loads are dense
// vectors: a tile narrower than its panel made Halide gather the weights byte by byte
// (306 vpinsrb per kernel, 2x slower than fp32).
//
// The group is the k run one instruction sums into an int32 lane, which the target
// decides (int8_byte_dot_product): pairs of int16 activations (vpmaddwd), or on CPUs
// with AVX-512 VNNI quads of uint8 activations (vpdpbusd, twice vpdpwssd's products).
constexpr int kInt8Panel = 16;

inline int int8_panel_count(int out_features) { return (out_features + kInt8Panel - 1) / kInt8Panel; }

inline int int8_groups(int in_features, int group) { return (in_features + group - 1) / group; }

inline size_t packed_int8_size(int in_features, int out_features, int group) {
  return size_t(int8_panel_count(out_features)) * int8_groups(in_features, group) * kInt8Panel * group;
}

// Byte offset of weight (n, k) in the packed int8 layout.
inline size_t packed_int8_index(int in_features, int n, int k, int group) {
  return ((size_t(n / kInt8Panel) * int8_groups(in_features, group) + k / group) * kInt8Panel + n % kInt8Panel) *
             group +
         k % group;
}

// Pair kernels quantize activations per row to int16 levels [-L, L] (vpmaddwd multiplies
// int16 pairs whatever their range), L = 32767, fewer for K > 4128 inputs so
// that no int32 sum can overflow: K * L * 127 < 2^31.
inline int int8_activation_levels(int in_features) {
  const int64_t k = int64_t(int8_groups(in_features, kInt8Pair)) * kInt8Pair;
  return int(std::min<int64_t>(32767, ((int64_t(1) << 31) - 1) / (k * 127)));
}
// Quad kernels quantize activations per row to uint8 with a zero point (asymmetric: the
// row's range [min(x, 0), max(x, 0)] in 255 steps), exact in int32 up to this K.
constexpr int kInt8QuadMaxK = int(((int64_t(1) << 31) - 1) / (255 * 127));

// The symmetric quantization of one weight channel: q[i] in [-127, 127], returns the scale
// (max |v| / 127; 0 for an all-zero channel, whose q are 0).
inline float quantize_row_int8(const float* v, int count, int8_t* q) {
  float amax = 0.0f;
  for (int i = 0; i < count; ++i) amax = std::max(amax, std::fabs(v[i]));
  const float inv = amax > 0.0f ? 127.0f / amax : 0.0f;
  for (int i = 0; i < count; ++i)
    q[i] = int8_t(std::max(-127.0f, std::min(127.0f, std::nearbyint(v[i] * inv))));
  return amax * (1.0f / 127.0f);
}

// Scatters one quantized channel n (q[k], k < in_features) into the packed int8 layout.
inline void put_int8_channel(int8_t* packed, int in_features, int n, const int8_t* q, int group) {
  for (int k = 0; k < in_features; ++k) packed[packed_int8_index(in_features, n, k, group)] = q[k];
}
// The sum of a quantized channel's values: quad kernels subtract zero point x this from
// their sums (exact as a float: |sum| <= 127 K < 2^24).
inline float int8_channel_sum(const int8_t* q, int count) {
  int32_t s = 0;
  for (int i = 0; i < count; ++i) s += q[i];
  return float(s);
}

// int8 embedding tables (generators/embedding.cpp, table_int8): row r is its d values
// quantized as one channel (quantize_row_int8), then the row's fp32 scale as 4 bytes, so
// that a token's lookup reads one contiguous row.
constexpr int kInt8RowScaleBytes = 4;
inline void put_int8_table_row(int8_t* row, int d, const int8_t* q, float scale) {
  std::memcpy(row, q, size_t(d));
  std::memcpy(row + d, &scale, sizeof(float));
}

// A torch-layout [N][K] weight, quantized per channel (quantize_row_int8) into the packed
// int8 layout of `group`; `scales` gets N per-channel scales and `sums` their channel
// sums. The runtime's loader does the same one channel at a time as it reads a file
// (runtime/weight_packing.cpp, LinearBuilder).
inline std::vector<int8_t> pack_linear_int8(const float* torch_w, int out_features, int in_features, int group,
                                            std::vector<float>& scales, std::vector<float>& sums) {
  std::vector<int8_t> q(packed_int8_size(in_features, out_features, group), 0);
  std::vector<int8_t> row(static_cast<size_t>(in_features));
  scales.assign(size_t(out_features), 0.0f);
  sums.assign(size_t(out_features), 0.0f);
  for (int n = 0; n < out_features; ++n) {
    scales[n] = quantize_row_int8(torch_w + size_t(n) * in_features, in_features, row.data());
    sums[n] = int8_channel_sum(row.data(), in_features);
    put_int8_channel(q.data(), in_features, n, row.data(), group);
  }
  return q;
}

}  // namespace halformer
