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
inline void schedule_cpu_matmul(Halide::Func out, Halide::Func acc, const Halide::Var& n,
                                const Halide::Var& m, const Halide::RVar& rk, int N, Halide::Expr rows,
                                MatmulKnobs k, int panel) {
  using namespace Halide;
  // Never a tile wider than the layer; keep the vector width a divisor of the tile.
  int vec = k.vec;
  while (vec > 1 && (vec > N || panel % vec != 0)) vec /= 2;
  int tn = std::max(1, std::min(k.tile_n, N / vec));
  while (tn > 1 && panel % (vec * tn) != 0 && (vec * tn) % panel != 0) --tn;
  const int width = vec * tn;
  Var no("no"), ni("ni"), mo("mo"), mi("mi"), tile("tile");
  TailStrategy n_tail = (N % width == 0) ? TailStrategy::RoundUp : TailStrategy::ShiftInwards;
  auto tiles = [&](Stage s, int tm) {
    s.split(n, no, ni, width, n_tail)
        .split(m, mo, mi, tm, TailStrategy::GuardWithIf)
        .reorder(ni, mi, mo, no)
        .vectorize(ni, vec)
        .unroll(mi);
    if (k.parallel) s.fuse(mo, no, tile).parallel(tile);
  };
  if (k.tile_m > 1) tiles(out.specialize(rows < k.tile_m), 1);
  tiles(out, k.tile_m);
  acc.compute_at(out, k.parallel ? tile : mo)
      .bound_extent(m, select(rows < k.tile_m, 1, k.tile_m))
      .vectorize(n, vec)
      .unroll(n)
      .unroll(m);
  acc.update(0).reorder(n, m, rk).vectorize(n, vec).unroll(n).unroll(m);
}

}  // namespace halformer
