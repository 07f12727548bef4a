// The attention generator's GPU schedules (generators/attention.cpp defines the stages
// and the arithmetic; attention_stages.h names them): keys in tiles with an online
// softmax, or whole score rows in shared memory.
#include <algorithm>
#include <stdexcept>

#include "attention_stages.h"

namespace halformer {
using namespace Halide;

void schedule_attention_gpu(const AttentionStages& s, Func out, const AttentionGpuKnobs& knobs, int head_dim) {
  // The generator's names for its stages (copies of a Var, RDom or Func name the same one).
  Var d = s.d, h = s.h, i = s.i, j = s.j, b = s.b, jj = s.jj;
  RDom rd = s.rd, rj = s.rj, rk = s.rk, rt = s.rt;
  Func qc = s.qc, kc = s.kc, kt = s.kt, qk = s.qk, score = s.score, masked = s.masked, row_max = s.row_max,
       row_sum = s.row_sum, p = s.p, vc = s.vc, acc = s.acc, tile_score = s.tile_score, tile_max = s.tile_max,
       tile_p = s.tile_p, tile_sum = s.tile_sum, tile_acc = s.tile_acc, online = s.online;
  const int D = head_dim, Bk = knobs.key_tile, gpu_tile_q = knobs.tile_q, gpu_key_lanes = knobs.key_lanes,
            gpu_reduce_lanes = knobs.reduce_lanes, gpu_v_queries = knobs.v_queries,
            gpu_score_queries = knobs.score_queries;
  if (Bk > 0) {
    // One block per (query tile, head, batch); per key tile, in turn: the keys staged in
    // shared memory (padded rows, as below), the scores and their weights (threads over
    // keys x groups of gpu_score_queries queries, summed in registers), each query's max,
    // then per (feature, group of gpu_v_queries queries) thread the tile's sums and V
    // products in registers and the running state's update. Shared memory: a tile's keys,
    // scores and weights and the block's running state, whatever Tk is.
    const int tq = gpu_tile_q, vq = std::clamp(int(gpu_v_queries), 1, tq), sq = std::clamp(int(gpu_score_queries), 1, tq);
    if (D * ((tq + vq - 1) / vq) > 1024 || Bk * ((tq + sq - 1) / sq) > 1024 || D * 8 > 1024)
      throw std::invalid_argument("attention: gpu_tile_q / gpu_v_queries / gpu_score_queries / gpu_key_tile "
                                  "make a block of more than 1024 threads");
    Var io("io"), ii("ii"), iq("iq"), iqi("iqi"), jo2("jo2"), ji2("ji2");
    // Per-block Funcs cover the block's whole query tile (align_bounds): where n divides
    // tq, Halide otherwise aligned the groups to absolute multiples of n and sized the
    // thread loop for every block's range at once (threads growing with Tq).
    for (Func f : {online, tile_score, tile_p, tile_max}) f.align_bounds(i, tq);
    // Threads over (x, groups of n queries), each group's queries unrolled in the thread.
    auto query_groups = [&](Stage st, const VarOrRVar& x, int n) {
      st.split(i, iq, iqi, n, TailStrategy::GuardWithIf).reorder(iqi, x, iq).gpu_threads(x, iq).unroll(iqi);
    };
    out.split(i, io, ii, tq, TailStrategy::GuardWithIf)
        .split(ii, iq, iqi, vq, TailStrategy::GuardWithIf)
        .reorder(iqi, d, iq, io, h, b)
        .gpu_blocks(io, h, b)
        .gpu_threads(d, iq)
        .unroll(iqi);
    online.compute_at(out, io).store_in(MemoryType::GPUShared);
    query_groups(online, d, vq);
    online.update().split(i, iq, iqi, vq, TailStrategy::GuardWithIf).reorder(iqi, d, iq, rt).gpu_threads(d, iq)
        .unroll(iqi);
    const LoopLevel per_tile(online, rt);
    // Queries read straight from q (each thread's few, reused across the block's key
    // threads through L1): staged before the tile loop, Halide 21 pooled their shared
    // bytes with tile_max's (an allocation read inside a serial loop but made before it;
    // seen in the lowered statement, wrong results on PoCL).
    for (Func f : {qc, kc, masked, score, vc}) f.compute_inline();
    kt.compute_at(per_tile).store_in(MemoryType::GPUShared).bound_storage(j, Bk + 1).reorder(d, j)
        .split(j, jo2, ji2, 8, TailStrategy::GuardWithIf).gpu_threads(d, ji2);
    tile_score.compute_at(per_tile).store_in(MemoryType::GPUShared);
    query_groups(tile_score, jj, sq);
    qk.compute_at(tile_score, jj).bound_extent(i, sq).unroll(i);
    qk.update().reorder(i, rd).unroll(i);
    tile_p.compute_at(per_tile).store_in(MemoryType::GPUShared);
    query_groups(tile_p, jj, sq);
    tile_max.compute_at(per_tile).store_in(MemoryType::GPUShared).gpu_threads(i);
    tile_max.update().gpu_threads(i);
    // The tile's sums and V products of a thread's queries in registers (each value row
    // read once for them), inside the state update that consumes them.
    for (Func f : {tile_sum, tile_acc}) {
      f.compute_at(online, d).bound_extent(i, vq).unroll(i);
      f.update().reorder(i, rk).unroll(i);
    }
    return;
  }
    // One block per (query tile, head, batch). Score rows, softmax statistics and the
    // V product live in shared memory; threads span keys (scores) or features (V). With
    // gpu_score_queries / gpu_v_queries the products are summed in registers instead,
    // each thread for a group of queries, and stored once.
    Var io("io"), ii("ii"), jo("jo"), ji("ji"), iq("iq"), iqi("iqi");
    const int vq = std::min(int(gpu_v_queries), int(gpu_tile_q));
    out.split(i, io, ii, gpu_tile_q, TailStrategy::GuardWithIf);
    if (vq > 0) {
      out.split(ii, iq, iqi, vq, TailStrategy::GuardWithIf)
          .reorder(iqi, d, iq, io, h, b)
          .gpu_blocks(io, h, b)
          .gpu_threads(d, iq)
          .unroll(iqi);
    } else {
      out.reorder(d, ii, io, h, b).gpu_blocks(io, h, b).gpu_threads(d, ii);
    }
    // Keys of the current chunk of gpu_key_lanes staged in shared memory, read from kv
    // with threads along the head features (coalesced) and stored key-major with one
    // float of padding per row, so that the score loop's lanes (one key each) and the
    // staging stores both hit distinct banks. Read straight from kv, each lane walked
    // its own key row 3 * d_model floats from its neighbour's
    // (docs/performance-log.md#attention).
    kc.compute_inline();
    masked.compute_inline();
    const int sq = std::min(int(gpu_score_queries), int(gpu_tile_q));
    Func scores = sq > 0 ? score : qk;  // the Func whose rows live in shared memory
    if (sq == 0) score.compute_inline();
    Var jo2("jo2"), ji2("ji2");
    kt.compute_at(scores, jo).store_in(MemoryType::GPUShared).bound_storage(j, gpu_key_lanes + 1)
        .reorder(d, j).split(j, jo2, ji2, gpu_tile_q, TailStrategy::GuardWithIf).gpu_threads(d, ji2);
    for (Func f : {scores, p}) {
      f.compute_at(out, io).store_in(MemoryType::GPUShared)
          .split(j, jo, ji, gpu_key_lanes, TailStrategy::GuardWithIf).reorder(ji, i, jo);
    }
    p.gpu_threads(ji, i);
    if (sq > 0) {
      // Whole groups of sq queries per thread (clamped query reads past Tq; not stored).
      Var iq2("iq2"), iqi2("iqi2");
      score.split(i, iq2, iqi2, sq, TailStrategy::GuardWithIf).reorder(iqi2, ji, iq2, jo).gpu_threads(ji, iq2)
          .unroll(iqi2);
      qk.compute_at(score, ji).bound_extent(i, sq).unroll(i);
      qk.update().reorder(i, rd).unroll(i);
      // The tile's queries in shared memory: every key's thread reads all of them.
      qc.compute_at(out, io).store_in(MemoryType::GPUShared).gpu_threads(d, i);
    } else {
      qk.gpu_threads(ji, i);
      qk.update().split(j, jo, ji, gpu_key_lanes, TailStrategy::GuardWithIf).reorder(ji, i, rd, jo)
          .gpu_threads(ji, i);
    }
    vc.compute_inline();
    for (Func f : {row_max, row_sum}) {
      f.compute_at(out, io).gpu_threads(i);
      if (gpu_reduce_lanes > 0) {
        RVar ro("ro"), ri("ri");
        Var u("u");
        Func lanes = f.update().split(rj, ro, ri, gpu_reduce_lanes, TailStrategy::GuardWithIf).rfactor(ri, u);
        // u the innermost thread dimension (x), as keys and features are elsewhere.
        lanes.compute_at(out, io).reorder(u, i).gpu_threads(u, i);
        lanes.update().reorder(ro, u, i).gpu_threads(u, i);
      }
      f.update().gpu_threads(i);
    }
    if (vq > 0) {
      // Whole groups of vq queries (rows past Tq read clamped queries; not stored).
      acc.compute_at(out, d).bound_extent(i, vq).unroll(i);
      acc.update().reorder(i, rj).unroll(i);
    } else {
      acc.compute_at(out, io).gpu_threads(d, i);
      acc.update().reorder(d, i, rj).gpu_threads(d, i);
    }
}

}  // namespace halformer
