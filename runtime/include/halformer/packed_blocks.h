// int4 weights (generators/linear_int4.cpp): weight-only 4-bit quantization in blocks of
// 32 along K with one scale each -- llama.cpp's Q4_0, so that a GGUF file's Q4_0 blocks
// load as they are -- and the packed layout the kernel streams.
//
// A block of 32 weights w[0..31]: d = the signed value of largest magnitude / -8
// (rounded to fp16, as the file stores it), q[i] = clamp(round-half-up(w[i] / d) + 8, 0,
// 15), w[i] ~= (q[i] - 8) * d. Its 16 bytes: byte i holds q[i] in the low nibble and
// q[i + 16] in the high nibble (Q4_0's own order).
//
// Packed for the kernel in panels of kInt4Panel output features: per panel, per block, 4
// rows of kInt4Panel x 4 bytes: row g's bytes (feature f, j) = the block's byte 4g + j of
// feature f. One row is a 64-byte vector whose low nibbles are k = 4g + j (k groups 0..3)
// and whose high nibbles are k = 16 + 4g + j (groups 4..7): each int32 lane (a feature)
// holds 4 consecutive k, the quad vpdpbusd sums, after one AND or one shift.
// Scales and biases ride in the kernel's float input b (kInt4Panel, P * (1 + pairs)), pairs
// = ceil(blocks / 2): rows 0 .. P - 1 hold the biases (feature n's at float n); row
// P + p * pairs + block / 2 the
// scales of blocks 2i and 2i + 1 as fp16 bits, block 2i in the low half of each feature's
// 32 bits, so that a panel's scales stream beside its weights at 2 bytes per block of 32:
// 18 bytes per 32 weights, Q4_0's own size (fp32 scales read 11% more per decode step).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

namespace halformer {

constexpr int kInt4Block = 32;       // k per scale (Q4_0's QK4_0)
constexpr int kInt4BlockBytes = 16;  // the block's nibbles
constexpr int kInt4Panel = 16;       // output features per panel (one int32 vector on AVX-512)
constexpr int kInt4Quad = 4;         // k per int32 lane (vpdpbusd)
constexpr int kInt4RowsPerBlock = kInt4BlockBytes / kInt4Quad;  // 4 rows of 64 bytes per panel block
constexpr int kInt4Zero = 8;         // the stored value of a zero weight

inline int int4_blocks(int in_features) { return (in_features + kInt4Block - 1) / kInt4Block; }
inline int int4_panel_count(int out_features) { return (out_features + kInt4Panel - 1) / kInt4Panel; }

// Bytes of packed weights, and floats of the bias + scale input.
inline size_t packed_int4_size(int in_features, int out_features) {
  return size_t(int4_panel_count(out_features)) * int4_blocks(in_features) * kInt4Panel * kInt4BlockBytes;
}
inline int int4_scale_pairs(int in_features) { return (int4_blocks(in_features) + 1) / 2; }
inline size_t int4_bias_size(int in_features, int out_features) {
  return size_t(int4_panel_count(out_features)) * (1 + int4_scale_pairs(in_features)) * kInt4Panel;
}
// The float slot that holds feature n's scale of `block` (in its low or high 16 bits).
inline size_t int4_scale_index(int in_features, int out_features, int n, int block) {
  const size_t P = size_t(int4_panel_count(out_features));
  return ((P + size_t(n / kInt4Panel) * int4_scale_pairs(in_features) + block / 2) * kInt4Panel) + n % kInt4Panel;
}

// fp32 -> fp16 -> fp32, round to nearest even (a block scale as a GGUF file stores it).
inline float round_to_fp16(float f) {
  const _Float16 h = static_cast<_Float16>(f);
  return static_cast<float>(h);
}
inline bool fp16_exact(float f) { return round_to_fp16(f) == f || (f != f); }
// Feature n's scale of `block` in the bias + scale input, written and read as fp16 bits.
inline void set_int4_scale(float* bias_scales, int in_features, int out_features, int n, int block, float d) {
  const _Float16 h = static_cast<_Float16>(d);
  uint16_t bits;
  std::memcpy(&bits, &h, 2);
  uint8_t* slot = reinterpret_cast<uint8_t*>(bias_scales + int4_scale_index(in_features, out_features, n, block));
  std::memcpy(slot + 2 * (block % 2), &bits, 2);  // little-endian: the low half first
}
inline float int4_scale(const float* bias_scales, int in_features, int out_features, int n, int block) {
  const uint8_t* slot =
      reinterpret_cast<const uint8_t*>(bias_scales + int4_scale_index(in_features, out_features, n, block));
  _Float16 h;
  std::memcpy(&h, slot + 2 * (block % 2), 2);
  return static_cast<float>(h);
}

// Quantizes one block of `count` <= 32 weights (the rest taken as 0) as llama.cpp's
// Q4_0 reference quantizer does; writes its 16 bytes, returns its scale.
inline float quantize_block_int4(const float* v, int count, uint8_t* bytes) {
  float amax = 0.0f, max = 0.0f;
  for (int i = 0; i < count; ++i)
    if (std::fabs(v[i]) > amax) amax = std::fabs(v[i]), max = v[i];
  const float d = max / -8.0f, inv = d != 0.0f ? 1.0f / d : 0.0f;
  auto q = [&](int i) {
    const float x = i < count ? v[i] * inv : 0.0f;
    return uint8_t(std::min(15, int(int8_t(x + 8.5f))));
  };
  for (int i = 0; i < kInt4BlockBytes; ++i) bytes[i] = uint8_t(q(i) | (q(i + 16) << 4));
  return round_to_fp16(d);
}
// The block's 32 values as integers in [-8, 7] (dequantized: times the scale).
inline int int4_value(const uint8_t* bytes, int i) {
  return (i < kInt4BlockBytes ? bytes[i] & 15 : bytes[i - kInt4BlockBytes] >> 4) - kInt4Zero;
}

// Byte offset of byte `i` (0..15) of block `block` of feature n in the packed layout.
inline size_t packed_int4_index(int in_features, int n, int block, int i) {
  const size_t row = (size_t(n / kInt4Panel) * int4_blocks(in_features) + block) * kInt4RowsPerBlock + i / kInt4Quad;
  return (row * kInt4Panel + n % kInt4Panel) * kInt4Quad + i % kInt4Quad;
}

// Puts feature n's blocks (16 bytes each, Q4_0 order) and scales (fp16 values: each is
// stored as fp16) into the packed layout.
inline void put_int4_channel(uint8_t* packed, float* bias_scales, int in_features, int out_features, int n,
                             const uint8_t* blocks, const float* scales) {
  for (int b = 0; b < int4_blocks(in_features); ++b) {
    for (int i = 0; i < kInt4BlockBytes; ++i)
      packed[packed_int4_index(in_features, n, b, i)] = blocks[size_t(b) * kInt4BlockBytes + i];
    set_int4_scale(bias_scales, in_features, out_features, n, b, scales[b]);
  }
}

// One fp32 channel v[in_features] quantized block by block: blocks[int4_blocks * 16]
// bytes and scales[int4_blocks].
inline void quantize_channel_int4(const float* v, int in_features, uint8_t* blocks, float* scales) {
  for (int b = 0; b < int4_blocks(in_features); ++b)
    scales[b] = quantize_block_int4(v + size_t(b) * kInt4Block, std::min(kInt4Block, in_features - b * kInt4Block),
                                    blocks + size_t(b) * kInt4BlockBytes);
}

// A torch-layout [N][K] weight quantized and packed, with its biases (may be null):
// `bias_scales` gets int4_bias_size floats. The runtime's loader does the same one
// channel at a time (runtime/weight_packing.cpp).
inline std::vector<uint8_t> pack_linear_int4(const float* torch_w, const float* bias, int out_features,
                                             int in_features, std::vector<float>& bias_scales) {
  std::vector<uint8_t> packed(packed_int4_size(in_features, out_features), 0);
  bias_scales.assign(int4_bias_size(in_features, out_features), 0.0f);
  const int B = int4_blocks(in_features);
  std::vector<uint8_t> blocks(size_t(B) * kInt4BlockBytes);
  std::vector<float> scales(static_cast<size_t>(B));
  for (int n = 0; n < out_features; ++n) {
    quantize_channel_int4(torch_w + size_t(n) * in_features, in_features, blocks.data(), scales.data());
    put_int4_channel(packed.data(), bias_scales.data(), in_features, out_features, n, blocks.data(), scales.data());
    if (bias) bias_scales[size_t(n)] = bias[n];
  }
  return packed;
}

// Activations, quantized by the kernel per row in blocks of 32 as llama.cpp's Q8_0:
// d = max |x| / 127, q = round-half-away(x / d) in [-127, 127], d then rounded to fp16.
// The product of a block: d_w * d_x * sum_i (q_w[i] - 8) * q_x[i], exact in int32.
constexpr float kInt4ActivationLevels = 127.0f;

}  // namespace halformer
