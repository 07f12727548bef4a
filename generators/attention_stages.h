// The stages of the attention generator (generators/attention.cpp) that its schedules
// share: the generator defines them, attention_gpu.cpp schedules them for a GPU. Each
// Func's name is written here once.
#pragma once

#include "Halide.h"

namespace halformer {

struct AttentionStages {
  // d: head feature, h: head, i: query, j: key, b: sequence; jj: a key within its tile.
  Halide::Var d{"d"}, h{"h"}, i{"i"}, j{"j"}, b{"b"}, jj{"jj"};
  Halide::RDom rd, rj, rk, rt;  // head features; keys; a tile's keys; key tiles
  // Many queries: queries (clamped, rotated), keys compacted and transposed, the dot
  // products and their masked scores, the softmax's max, sum and weights, the values
  // compacted and the V product.
  Halide::Func qc{"q_clamped"}, kc{"k_compact"}, kt{"k_transposed"}, qk{"qk"}, score{"score"}, masked{"masked"},
      row_max{"row_max"}, row_sum{"row_sum"}, p{"p"}, vc{"v_compact"}, acc{"acc"};
  // Keys in tiles (online softmax): a tile's scores, max, weights, sum and V product, and
  // the running (max, sum, V product) they fold into.
  Halide::Func tile_score{"tile_score"}, tile_max{"tile_max"}, tile_p{"tile_p"}, tile_sum{"tile_sum"},
      tile_acc{"tile_acc"}, online{"online"};
};

// The generator's GPU knobs (its GeneratorParams of the same names, gpu_ dropped).
struct AttentionGpuKnobs {
  int tile_q, key_lanes, reduce_lanes, v_queries, score_queries;
  int key_tile;  // > 0: keys in tiles of this many (the stages' tile_*), else whole rows
};

// Schedules `out` and the stages on a GPU (one block per query tile, head and sequence).
void schedule_attention_gpu(const AttentionStages& s, Halide::Func out, const AttentionGpuKnobs& knobs, int head_dim);

}  // namespace halformer
