// The decoder over the engine's paged key/value cache (docs/engine.md): per layer a pool of
// blocks, each kKvBlockSize positions of keys and values (a fused QKV row without its
// queries), and one pass of the decoder over new positions of some sequences, their keys
// and values written into their blocks and attention reading them through each sequence's
// block table (paged_self_attention). The bookkeeping of blocks is kv_blocks.h.
#pragma once

#include <vector>

#include "kv_blocks.h"
#include "stack.h"

namespace halformer {

struct PagedCache {
  // Per decoder layer: (kv_row, kKvBlockSize, blocks), bf16 with self_cache_bf16; on the CPU
  // head by head in each block (Array::head_major_hd), as the decoder's own cache; int8
  // (self_cache_int8): (Stack::stored_kv_row(), kKvBlockSize, blocks) bytes.
  std::vector<Array> pool;
  KvBlockPool blocks;
  int kv_row = 0;           // features of a pool position: the keys, then the values
  int64_t block_bytes = 0;  // one block of every layer
  // A pool of `count` blocks (block 0 the null block, zeros).
  PagedCache(Stack& stack, const Weights& w, int count);
  // Bytes of one block of every layer, for a budget.
  static int64_t bytes_per_block(const Stack& stack, const Weights& w);
};

// The running requests' sources side by side: per decoder layer every slot's cross-
// attention keys/values in one array, slot b's as sequence b of `cap` positions, masked
// past its own length, so that one cross-attention call per layer serves every decode row
// (not a call per row) with each row's arithmetic its lone call's (masked keys add exact
// zeros). cap grows to the longest source placed, in whole blocks, and never shrinks:
// slots x cap positions of every layer (docs/engine.md).
struct SourceSlab {
  std::vector<Array> kv;  // per decoder layer: (2 d_model, cap, slots), laid out as cross_kv's
  std::vector<int> len;   // per slot: its source's positions (0: none)
  int cap = 0;
  explicit SourceSlab(int slots) : len(size_t(slots), 0) {}
  // An admitted request's source through the encoder (a batch of one, as the request alone
  // computes it) into slot `slot`, which is free; on failure that slot stays empty.
  void place(Stack& stack, const Weights& w, int slot, const Sequence& source);
  // The key mask of slots [0, rows): 0 over a slot's source, kMasked past it.
  Array mask(Stack& stack, int rows) const;
  // Layer l's cross-attention sublayer for rows [0, x.B), row b over slot b's source.
  void cross_block(Stack& stack, Array& x, const LayerWeights& L, size_t l, const Array& mask) const;
};

// New positions of B sequences through the decoder: Tq each (Tq > 1 only for one sequence, a
// piece of a prompt), tokens (Tq, B), sequence b's at positions [start[b], start[b] + Tq).
// Their keys and values go into the blocks of tables[b] (which must cover those positions)
// when write[b]; attention reads each sequence's positions [0, start[b] + Tq) through its
// table. last_row: past the last layer's attention only the last position goes on (a
// prompt's logits). An encoder-decoder's decode rows (Tq == 1) attend row b to slot b of
// `sources`; decoder-only: null. Returns the final hidden rows, (d, 1 or Tq, B). The
// arithmetic is Stack::decode_step's on a contiguous cache, bit for bit.
Array paged_forward(Stack& stack, const Weights& w, PagedCache& cache, const IBuf& tokens, const std::vector<int>& start,
                    const std::vector<const std::vector<int>*>& tables, const std::vector<bool>& write, bool last_row,
                    const SourceSlab* sources = nullptr);

}  // namespace halformer
