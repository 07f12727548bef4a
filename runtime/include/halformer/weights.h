// Model weights in the layout the kernels want, loaded from a safetensors file through
// a naming preset. Linear weights are packed at load time into panels of output
// features (halformer/packed_layout.h), so the matmul vectorises over outputs with plain
// loads that walk each panel front to back. Q, K and V projections are concatenated into one
// d -> 3d matmul (self-attention) or split Q | KV (cross-attention) whatever the file
// stores: packed (torch in_proj_weight) or separate (HF query/key/value).
#pragma once

#include <cstddef>
#include <cstdint>
#include <new>
#include <string>
#include <vector>

#include "halformer/model_config.h"
#include "halformer/packed_blocks.h"
#include "halformer/packed_layout.h"

namespace halformer {

// Weight storage starts on a cache line (std::vector's 16 bytes are not enough): the
// kernels' vector loads walk each packed panel from its start, and at an offset of 16
// bytes every other 32-byte load straddles two lines (fp32 128 x 2048 x 512, 2-core
// Zen 3: 1.88 ms aligned, 2.43 ms at 16 bytes; transformer-base's encoder at batch 1
// 44.3 -> 39.0 ms).
template <typename T>
struct CacheLineAllocator {
  using value_type = T;
  static constexpr std::align_val_t kAlign{64};
  CacheLineAllocator() = default;
  template <typename U>
  CacheLineAllocator(const CacheLineAllocator<U>&) {}
  T* allocate(size_t n) { return static_cast<T*>(::operator new(n * sizeof(T), kAlign)); }
  void deallocate(T* p, size_t) { ::operator delete(p, kAlign); }
  template <typename U>
  bool operator==(const CacheLineAllocator<U>&) const { return true; }
  template <typename U>
  bool operator!=(const CacheLineAllocator<U>&) const { return false; }
};
template <typename T>
using WeightVector = std::vector<T, CacheLineAllocator<T>>;

struct LinearWeights {
  int in = 0, out = 0;
  int panel = 0;  // fp32 / bf16: the packed layout's panel width (weight_panel)
  bool bf16_pairs = false;  // bf16: K in pairs (bf16_dot_product targets, packed_layout.h)
  int int8_group = kInt8Pair;  // int8: the k group of the packed layout (WeightLayout::int8_group)
  WeightVector<float> w;  // fp32 only: packed [panel_count(out, panel)][in][panel]
  WeightVector<float> b;  // [out]; int4 / q8_0: see blocks; int8: [out] biases, [out] per-channel weight scales, and
                          // for quads [out] channel sums (generators/linear_int8.cpp)
  WeightVector<int8_t> q;  // int8 only: packed_int8 layout (halformer/packed_layout.h)
  WeightVector<uint16_t> h;  // bf16 only: bf16 bits, packed_bf16_index's layout
  // int4 / q8_0 only: Q4_0 / Q8_0 blocks in packed_block_index's layout
  // (halformer/packed_blocks.h); b is then (kBlockPanel, panels * (1 + ceil(blocks / 2))):
  // biases, then the blocks' fp16 scales. block_bits: 4 (int4) or 8 (q8_0).
  WeightVector<uint8_t> blocks;
  int block_bits = 0;
  bool int8() const { return !q.empty(); }
  bool bf16() const { return !h.empty(); }
  bool block_quantized() const { return !blocks.empty(); }
  BlockFormat block_format() const { return block_bits == 8 ? kQ8_0Format : kInt4Format; }
};
// A token embedding table [vocab][d]: fp32, or int8 (ModelConfig::embedding_weights):
// each row quantized like a linear's output channel and stored as its d int8 values
// followed by the row's fp32 scale (4 bytes, little-endian), halformer/packed_layout.h.
struct EmbeddingTable {
  WeightVector<float> f;   // fp32: [vocab][d]
  WeightVector<int8_t> q;  // int8: [vocab][d + kInt8RowScaleBytes]
  bool int8() const { return !q.empty(); }
  bool empty() const { return f.empty() && q.empty(); }
};
struct NormWeights {
  WeightVector<float> gamma, beta;
};
struct LayerWeights {
  LinearWeights qkv, attn_out, ff1, ff2;
  LinearWeights ff_gate;  // gated feed-forward only; ff1 is then the up projection
  LinearWeights cross_q, cross_kv, cross_out;  // decoder layers of an encoder-decoder
  NormWeights self_norm, cross_norm, ff_norm;
};
struct Weights {
  // [vocab][d]; a decoder sharing the encoder's table (share_src_tgt) leaves
  // tgt_embedding empty: tgt_table() is the one it reads.
  EmbeddingTable src_embedding, tgt_embedding;
  const EmbeddingTable& tgt_table() const { return tgt_embedding.empty() ? src_embedding : tgt_embedding; }
  WeightVector<float> positions;                     // [max_len][d], learned only
  WeightVector<float> token_types;                   // [type_vocab][d]
  NormWeights embedding_norm;
  // The decoder's own position table and embedding norm (BART, Marian: each stack has
  // its own); empty: the decoder uses `positions` and `embedding_norm` as the encoder.
  WeightVector<float> tgt_positions;
  NormWeights tgt_embedding_norm;
  std::vector<LayerWeights> encoder, decoder;
  NormWeights encoder_norm, decoder_norm;           // final_norm only
  // Relative positions (T5): each stack's table [relative_buckets][heads] as in the file,
  // and expanded to what the attention kernels read, (2 * relative_table_distance + 1, heads)
  // (relative_position_table); all empty without relative positions.
  WeightVector<float> encoder_relative_bias, decoder_relative_bias;
  WeightVector<float> encoder_position_bias, decoder_position_bias;
  LinearWeights generator, pooler, classifier;
  LinearWeights embed_project;  // embedding_size != d_model: the encoder's tables -> d_model
};

// Checks every tensor the preset expects (name, dtype F32, shape, finite values) and
// that there are no unexpected ones, reporting all problems in one Error, then loads.
// The canonical names of docs/weights.md are what an explicit weights.map maps from.
// A file written by save_weights (metadata halformer.names = canonical) is read by its
// canonical names whatever the preset; its I8 linears and tables load as they are.
// `layout`: the packed fp32 / bf16 layout of the kernels the weights are for
// (weight_layout(kernel target), halformer/packed_layout.h).
Weights load_weights(const ModelConfig& config, const std::string& path, const WeightLayout& layout);

// Writes loaded weights as a safetensors file under the canonical names, in the formats
// the model's kernels read (`halformer quantize`, docs/precision.md): int8 linears and
// tables as I8 [rows][cols] plus F32 "<name>_scale" [rows], bf16 linears as BF16, the
// rest F32. Loading the file back gives bit-identical weights.
void save_weights(const ModelConfig& config, const Weights& weights, const std::string& path);

// T5's bucket of the relative position r = key position - query position: `buckets`
// buckets (half for each sign when bidirectional; causal: keys after the query share
// bucket 0), exact below buckets / 4 (bidirectional) or / 2, then logarithmic up to
// `distance`, beyond which it saturates. In float32 as transformers computes it.
int relative_position_bucket(int r, bool bidirectional, int buckets, int distance);
// bias [buckets][heads] -> the kernels' (2 * half + 1, heads) table: entry (r + half, h) =
// bias[bucket(r)][h] for |r| <= half (half: relative_table_distance, model_config.h).
WeightVector<float> relative_position_table(const WeightVector<float>& bias, int heads, bool bidirectional,
                                            int buckets, int distance, int half);

}  // namespace halformer
