// Packing at load: LinearBuilder (weights_internal.h) fills a linear one output channel
// at a time straight into the layout its kernel reads -- fp32 panels, int8 groups with
// per-channel scales (and channel sums for quads), or bf16 panels, optionally in K pairs
// (halformer/packed_layout.h, docs/precision.md) -- so that loading an int8 or bf16 model
// never holds an fp32 copy of a whole matrix.
#include <algorithm>

#include "halformer/packed_blocks.h"
#include "halformer/packed_layout.h"
#include "weights_internal.h"

namespace halformer {
namespace weights_internal {

LinearBuilder::LinearBuilder(int in, int out, Precision format, const WeightLayout& layout) : format_(format) {
  l_.in = in;
  l_.out = out;
  l_.bf16_pairs = format == Precision::Bf16 && layout.bf16_pairs;
  l_.int8_group = layout.int8_group;
  const int panel = l_.panel = format == Precision::Bf16 ? layout.bf16_panel() : layout.panel;
  if (block_quantized(format)) {
    l_.block_bits = format == Precision::Q8_0 ? 8 : 4;
    const BlockFormat f = l_.block_format();
    l_.blocks.assign(packed_blocks_size(f, in, out), packed_byte(f, 0));
    l_.b.assign(block_bias_size(in, out), 0.0f);
    channel_blocks_.resize(size_t(k_blocks(in)) * f.block_bytes);
    channel_scales_.resize(size_t(k_blocks(in)));
  } else if (format == Precision::Int8) {
    l_.q.assign(packed_int8_size(in, out, l_.int8_group), 0);
    scales_.assign(size_t(out), 0.0f);
    if (l_.int8_group == kInt8Quad) sums_.assign(size_t(out), 0.0f);
    channel_q_.resize(size_t(in));
  } else if (format == Precision::Bf16) {
    l_.h.assign(packed_bf16_size(in, out, panel, l_.bf16_pairs), 0);
  } else {
    l_.w.assign(packed_size(in, out, panel), 0.0f);
  }
}

void LinearBuilder::channel(int n, const float* v) {
  if (block_quantized(format_)) {
    quantize_channel(l_.block_format(), v, l_.in, channel_blocks_.data(), channel_scales_.data());
    channel_blocks(n, channel_blocks_.data(), channel_scales_.data());
  } else if (format_ == Precision::Int8) {
    channel_int8(n, channel_q_.data(), quantize_row_int8(v, l_.in, channel_q_.data()));
  } else if (format_ == Precision::Bf16) {
    for (int k = 0; k < l_.in; ++k) l_.h[packed_bf16_index(l_.in, n, k, l_.panel, l_.bf16_pairs)] = to_bf16(v[k]);
  } else {
    pack_rows(v, 1, l_.in, n, l_.panel, l_.w.data());
  }
}

void LinearBuilder::channel_int8(int n, const int8_t* q, float scale) {
  put_int8_channel(l_.q.data(), l_.in, n, q, l_.int8_group);
  scales_[size_t(n)] = scale;
  if (!sums_.empty()) sums_[size_t(n)] = int8_channel_sum(q, l_.in);
}

void LinearBuilder::channel_blocks(int n, const uint8_t* blocks, const float* scales) {
  put_block_channel(l_.block_format(), l_.blocks.data(), l_.b.data(), l_.in, l_.out, n, blocks, scales);
}

LinearWeights LinearBuilder::finish(WeightVector<float> bias) {
  if (block_quantized(format_)) {  // the biases first, before the scales (packed_blocks.h)
    std::copy(bias.begin(), bias.end(), l_.b.begin());
    return std::move(l_);
  }
  l_.b = std::move(bias);
  l_.b.insert(l_.b.end(), scales_.begin(), scales_.end());  // int8: (bias | scale [| sum])
  l_.b.insert(l_.b.end(), sums_.begin(), sums_.end());
  return std::move(l_);
}

}  // namespace weights_internal
}  // namespace halformer
