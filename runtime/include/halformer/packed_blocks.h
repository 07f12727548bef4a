// Block-quantized weights (generators/linear_blocks.cpp): weight-only quantization in
// blocks of 32 along K with one fp16 scale each, in llama.cpp's formats, so that a GGUF
// file's blocks load as they are -- and the packed layout the kernels stream.
//   int4 (Q4_0): d = the signed value of largest magnitude / -8 (rounded to fp16, as the
//     file stores it), q[i] = clamp(round-half-up(w[i] / d) + 8, 0, 15), w[i] ~= (q[i] - 8) d.
//     Its 16 bytes: byte i holds q[i] in the low nibble and q[i + 16] in the high nibble.
//   q8_0 (Q8_0): d = max |w| / 127 (rounded to fp16), q[i] = round-half-away(w[i] / d) in
//     [-127, 127], w[i] ~= q[i] d. Its 32 bytes: q[i] as int8; packed as q[i] + 128 (uint8).
//
// Packed for the kernel in panels of kBlockPanel output features: per panel, per block,
// rows of kBlockPanel x 4 bytes (4 for int4, 8 for q8_0): row g's bytes (feature f, j) =
// the block's byte 4g + j of feature f. A row is a 64-byte vector, each int32 lane (a
// feature) 4 consecutive k, the quad vpdpbusd sums: q8_0 row g holds k = 4g + j; an int4
// row's low nibbles k = 4g + j and its high nibbles k = 16 + 4g + j (after one AND or shift).
// Scales and biases ride in the kernel's float input b (kBlockPanel, P * (1 + pairs)), pairs
// = ceil(blocks / 2): rows 0 .. P - 1 hold the biases (feature n's at float n); row
// P + p * pairs + block / 2 the scales of blocks 2i and 2i + 1 as fp16 bits, block 2i in
// the low half of each feature's 32 bits, so that a panel's scales stream beside its
// weights at 2 bytes per block of 32: 18 (34) bytes per 32 weights, Q4_0's (Q8_0's) own
// size (fp32 scales read 11% more per int4 decode step).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

namespace halformer {

constexpr int kBlockK = 32;     // k per scale (QK4_0 = QK8_0)
constexpr int kBlockPanel = 16;  // output features per panel (one int32 vector on AVX-512)
constexpr int kBlockQuad = 4;    // k per int32 lane (vpdpbusd)

// One block format: its bits per weight, bytes per block and the stored (unsigned) value
// of a zero weight in the packed layout.
struct BlockFormat {
  int bits, block_bytes, zero;
  int rows_per_block() const { return block_bytes / kBlockQuad; }  // rows of 64 bytes per panel block
};
constexpr BlockFormat kInt4Format{4, 16, 8};
constexpr BlockFormat kQ8_0Format{8, 32, 128};
constexpr int kInt4BlockBytes = kInt4Format.block_bytes;

inline int k_blocks(int in_features) { return (in_features + kBlockK - 1) / kBlockK; }
inline int block_panel_count(int out_features) { return (out_features + kBlockPanel - 1) / kBlockPanel; }

// Bytes of packed weights, and floats of the bias + scale input.
inline size_t packed_blocks_size(const BlockFormat& f, int in_features, int out_features) {
  return size_t(block_panel_count(out_features)) * k_blocks(in_features) * kBlockPanel * f.block_bytes;
}
inline int block_scale_pairs(int in_features) { return (k_blocks(in_features) + 1) / 2; }
inline size_t block_bias_size(int in_features, int out_features) {
  return size_t(block_panel_count(out_features)) * (1 + block_scale_pairs(in_features)) * kBlockPanel;
}
// The float slot that holds feature n's scale of `block` (in its low or high 16 bits).
inline size_t block_scale_index(int in_features, int out_features, int n, int block) {
  const size_t P = size_t(block_panel_count(out_features));
  return ((P + size_t(n / kBlockPanel) * block_scale_pairs(in_features) + block / 2) * kBlockPanel) + n % kBlockPanel;
}

// fp32 -> fp16 -> fp32, round to nearest even (a block scale as a GGUF file stores it).
inline float round_to_fp16(float f) {
  const _Float16 h = static_cast<_Float16>(f);
  return static_cast<float>(h);
}
inline bool fp16_exact(float f) { return round_to_fp16(f) == f || (f != f); }
// Feature n's scale of `block` in the bias + scale input, written and read as fp16 bits.
inline void set_block_scale(float* bias_scales, int in_features, int out_features, int n, int block, float d) {
  const _Float16 h = static_cast<_Float16>(d);
  uint16_t bits;
  std::memcpy(&bits, &h, 2);
  uint8_t* slot = reinterpret_cast<uint8_t*>(bias_scales + block_scale_index(in_features, out_features, n, block));
  std::memcpy(slot + 2 * (block % 2), &bits, 2);  // little-endian: the low half first
}
inline float block_scale(const float* bias_scales, int in_features, int out_features, int n, int block) {
  const uint8_t* slot =
      reinterpret_cast<const uint8_t*>(bias_scales + block_scale_index(in_features, out_features, n, block));
  _Float16 h;
  std::memcpy(&h, slot + 2 * (block % 2), 2);
  return static_cast<float>(h);
}

// Quantizes one block of `count` <= 32 weights (the rest taken as 0) as llama.cpp's
// reference quantizers do (quantize_row_q4_0_ref / q8_0_ref); writes its bytes in the
// file's order, returns its scale.
inline float quantize_block(const BlockFormat& f, const float* v, int count, uint8_t* bytes) {
  float amax = 0.0f, max = 0.0f;
  for (int i = 0; i < count; ++i)
    if (std::fabs(v[i]) > amax) amax = std::fabs(v[i]), max = v[i];
  if (f.bits == 8) {
    const float d = amax / 127.0f, inv = d != 0.0f ? 1.0f / d : 0.0f;
    for (int i = 0; i < kBlockK; ++i) bytes[i] = uint8_t(int8_t(std::round(i < count ? v[i] * inv : 0.0f)));
    return round_to_fp16(d);
  }
  const float d = max / -8.0f, inv = d != 0.0f ? 1.0f / d : 0.0f;
  auto q = [&](int i) {
    const float x = i < count ? v[i] * inv : 0.0f;
    return uint8_t(std::min(15, int(int8_t(x + 8.5f))));
  };
  for (int i = 0; i < f.block_bytes; ++i) bytes[i] = uint8_t(q(i) | (q(i + 16) << 4));
  return round_to_fp16(d);
}
// Value i (0..31) of a block in the file's order, as a signed integer (times the scale: the weight).
inline int block_value(const BlockFormat& f, const uint8_t* bytes, int i) {
  if (f.bits == 8) return int8_t(bytes[i]);
  return (i < kInt4BlockBytes ? bytes[i] & 15 : bytes[i - kInt4BlockBytes] >> 4) - kInt4Format.zero;
}

// Byte offset of byte `i` of block `block` of feature n in the packed layout.
inline size_t packed_block_index(const BlockFormat& f, int in_features, int n, int block, int i) {
  const size_t row = (size_t(n / kBlockPanel) * k_blocks(in_features) + block) * f.rows_per_block() + i / kBlockQuad;
  return (row * kBlockPanel + n % kBlockPanel) * kBlockQuad + i % kBlockQuad;
}
// A file-order byte as packed (q8_0: int8 + 128, the unsigned operand of vpdpbusd), and back.
inline uint8_t packed_byte(const BlockFormat& f, uint8_t file_byte) { return f.bits == 8 ? file_byte ^ 0x80 : file_byte; }
inline uint8_t file_byte(const BlockFormat& f, uint8_t packed) { return packed_byte(f, packed); }

// Puts feature n's blocks (block_bytes each, the file's order) and scales (fp16 values:
// each is stored as fp16) into the packed layout.
inline void put_block_channel(const BlockFormat& f, uint8_t* packed, float* bias_scales, int in_features,
                              int out_features, int n, const uint8_t* blocks, const float* scales) {
  for (int b = 0; b < k_blocks(in_features); ++b) {
    for (int i = 0; i < f.block_bytes; ++i)
      packed[packed_block_index(f, in_features, n, b, i)] = packed_byte(f, blocks[size_t(b) * f.block_bytes + i]);
    set_block_scale(bias_scales, in_features, out_features, n, b, scales[b]);
  }
}

// One fp32 channel v[in_features] quantized block by block: blocks[k_blocks * block_bytes]
// bytes and scales[k_blocks].
inline void quantize_channel(const BlockFormat& f, const float* v, int in_features, uint8_t* blocks, float* scales) {
  for (int b = 0; b < k_blocks(in_features); ++b)
    scales[b] = quantize_block(f, v + size_t(b) * kBlockK, std::min(kBlockK, in_features - b * kBlockK),
                               blocks + size_t(b) * f.block_bytes);
}

// A torch-layout [N][K] weight quantized and packed, with its biases (may be null):
// `bias_scales` gets block_bias_size floats. The runtime's loader does the same one
// channel at a time (runtime/weight_packing.cpp).
inline std::vector<uint8_t> pack_linear_blocks(const BlockFormat& f, const float* torch_w, const float* bias,
                                               int out_features, int in_features, std::vector<float>& bias_scales) {
  std::vector<uint8_t> packed(packed_blocks_size(f, in_features, out_features), packed_byte(f, 0));
  bias_scales.assign(block_bias_size(in_features, out_features), 0.0f);
  const int B = k_blocks(in_features);
  std::vector<uint8_t> blocks(size_t(B) * f.block_bytes);
  std::vector<float> scales(static_cast<size_t>(B));
  for (int n = 0; n < out_features; ++n) {
    quantize_channel(f, torch_w + size_t(n) * in_features, in_features, blocks.data(), scales.data());
    put_block_channel(f, packed.data(), bias_scales.data(), in_features, out_features, n, blocks.data(), scales.data());
    if (bias) bias_scales[size_t(n)] = bias[n];
  }
  return packed;
}

// Activations, quantized by the kernel per row in blocks of 32 as llama.cpp's Q8_0:
// d = max |x| / 127, q = round-half-away(x / d) in [-127, 127], d then rounded to fp16.
// The product of a block: d_w * d_x * sum_i (u_w[i] - zero) * q_x[i], exact in int32.
constexpr float kBlockActivationLevels = 127.0f;

}  // namespace halformer
