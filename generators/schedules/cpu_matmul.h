// CPU schedule for out(n, m) = epilogue(acc(n, m)), acc(n, m) = sum_k a(k, m) * w(n, k).
// One helper, used by every matmul-shaped layer (linear, output projection).
//
// Register-blocked micro-kernel: a tile of `tile_m` rows x `tile_n` vectors of `vec`
// output features is accumulated in registers over the whole K loop (w read as
// contiguous vectors, a broadcast per row), then the epilogue (bias, activation,
// residual) is applied to the tile while it is hot.
//
// Loop order: for each column panel of w, all row tiles (rows inner), so the panel (K x
// tile width, 128 KiB at K = 512) is read from memory once and then stays in L2 while
// every row tile passes over it. Tiles are distributed over threads.
//
// Rows are dynamic. The accumulator always covers a whole tile (bound_extent), so the K
// loop carries no per-row guards and keeps its tile in registers (with guards, LLVM
// spilled it: 2x slower); the caller clamps the row index of its inputs (see Linear),
// and only the epilogue's stores are guarded. Fewer rows than a tile (decode) take a
// one-row-per-tile specialisation.
#pragma once

#include "Halide.h"

namespace halformer {

struct MatmulKnobs {
  int vec = 16;     // vector width in floats
  int tile_n = 2;   // vectors per tile along n
  int tile_m = 8;   // rows per tile
  bool parallel = true;
};

// `panel`: the width of w's storage panels (halformer/packed_layout.h). A tile must lie
// within one panel or cover whole panels, so that its loads stay dense vectors.
// `rk_group`: an inner reduction over a small group of k summed within each output lane
// (int8: the pair a vpmaddwd multiplies and adds), vectorised inside the lane.
inline void schedule_cpu_matmul(Halide::Func out, Halide::Func acc, const Halide::Var& n,
                                const Halide::Var& m, const Halide::RVar& rk, int N, Halide::Expr rows,
                                MatmulKnobs k, int panel, const Halide::RVar* rk_group = nullptr) {
  using namespace Halide;
  // Never a tile wider than the layer; keep the vector width a divisor of the tile.
  int vec = k.vec;
  while (vec > 1 && (vec > N || panel % vec != 0)) vec /= 2;
  int tn = std::max(1, std::min(k.tile_n, N / vec));
  while (tn > 1 && panel % (vec * tn) != 0 && (vec * tn) % panel != 0) --tn;
  const int width = vec * tn;
  Var no("no"), ni("ni"), nio("nio"), nii("nii"), mo("mo"), moo("moo"), moi("moi"), mi("mi"), tile("tile");
  // A task covers `width` columns and up to 8 row tiles, walked in turn over the same
  // weights, which stay in that core's cache (one task per panel and 8 tiles instead of
  // one per tile: 128x512x512 0.18 -> 0.15 ms, 128x512x2048 0.70 -> 0.62 ms); its
  // accumulator tile covers `sub` columns at a time.
  auto tiles = [&](Stage s, int tm, int sub) {
    const TailStrategy n_tail = (N % width == 0) ? TailStrategy::RoundUp : TailStrategy::ShiftInwards;
    s.split(n, no, ni, width, n_tail)
        .split(ni, nio, nii, sub)
        .split(m, mo, mi, tm, TailStrategy::GuardWithIf)
        .split(mo, moo, moi, 8, TailStrategy::GuardWithIf)
        .reorder(nii, mi, nio, moi, moo, no)
        .vectorize(nii, vec)
        .unroll(mi);
    if (k.parallel) s.fuse(moo, no, tile).parallel(tile);
  };
  // Row-count regimes, each with its own tile (the accumulator extent follows the same
  // conditions, which Halide substitutes into each specialisation):
  //   1 row (decode at batch 1): one-row tiles, one weight panel after the other,
  //     bandwidth-bound;
  //   2..8 rows (decode at batch <= 8, beams): 4-row tiles, both in one task, so each
  //     weight is streamed from memory once, by one core, and the second tile finds the
  //     panel in cache (8x512x2048: 0.113 -> 0.075 ms);
  //   more: the tile_m x tile_n tile, each panel reused from L2 by all row tiles.
  const int small_m = 8, small_tile = 4, sub = (width % panel == 0) ? panel : width;
  const bool small_regime = k.tile_m < small_m;
  tiles(out.specialize(rows == 1), 1, sub);
  if (small_regime) tiles(out.specialize(rows <= small_m), small_tile, sub);
  tiles(out, k.tile_m, width);
  Expr acc_rows = select(rows == 1, 1, small_regime ? select(rows <= small_m, small_tile, k.tile_m) : k.tile_m);
  acc.compute_at(out, nio)
      .bound_extent(m, acc_rows)
      .vectorize(n, vec)
      .unroll(n)
      .unroll(m);
  if (!rk_group) {
    acc.update(0).reorder(n, m, rk).vectorize(n, vec).unroll(n).unroll(m);
    return;
  }
  acc.update(0).reorder(*rk_group, n, m, rk).atomic().vectorize(*rk_group).vectorize(n, vec).unroll(n).unroll(m);
}

}  // namespace halformer
