// CPU schedule for out(n, m) = epilogue(acc(n, m)), acc(n, m) = sum_k a(k, m) * w(n, k).
// One helper, used by every matmul-shaped layer (linear, output projection).
//
// Register-blocked micro-kernel: a tile of `tile_m` rows x `tile_n` vectors of `vec`
// output features is accumulated in registers over the whole K loop (w read as
// contiguous vectors, a broadcast per row), then the epilogue (bias, activation,
// residual) is applied to the tile while it is hot. Tiles are distributed over threads.
// Rows are dynamic: the row loop is GuardWithIf, so the caller must clamp row indices of
// its inputs (the accumulator is computed over the whole tile, see Linear); fewer rows
// than a tile (decode) take a one-row-per-tile specialisation.
#pragma once

#include "Halide.h"

namespace halformer {

struct MatmulKnobs {
  int vec = 16;     // vector width in floats
  int tile_n = 2;   // vectors per tile along n
  int tile_m = 8;   // rows per tile
  bool parallel = true;
};

inline void schedule_cpu_matmul(Halide::Func out, Halide::Func acc, const Halide::Var& n,
                                const Halide::Var& m, const Halide::RVar& rk, int N, Halide::Expr rows,
                                MatmulKnobs k) {
  using namespace Halide;
  // Never a tile wider than the layer; keep the vector width a divisor of the tile.
  int vec = k.vec;
  while (vec > 1 && vec > N) vec /= 2;
  int tn = std::max(1, std::min(k.tile_n, N / vec));
  int width = vec * tn;
  Var no("no"), ni("ni"), mo("mo"), mi("mi"), tile("tile");
  TailStrategy n_tail = (N % width == 0) ? TailStrategy::RoundUp : TailStrategy::ShiftInwards;
  // Fewer rows than a tile (decode steps): one row per tile instead of computing a
  // whole tile of clamped duplicate rows.
  auto tiles = [&](Stage s, int tm) {
    s.split(n, no, ni, width, n_tail)
        .split(m, mo, mi, tm, TailStrategy::GuardWithIf)
        .reorder(ni, mi, no, mo)
        .vectorize(ni, vec)
        .unroll(mi);
    if (k.parallel) s.fuse(no, mo, tile).parallel(tile);
  };
  if (k.tile_m > 1) tiles(out.specialize(rows < k.tile_m), 1);
  tiles(out, k.tile_m);
  acc.compute_at(out, k.parallel ? tile : no)
      .vectorize(n, vec)
      .unroll(n)
      .unroll(m);
  acc.update(0).reorder(n, m, rk).vectorize(n, vec).unroll(n).unroll(m);
}

}  // namespace halformer
