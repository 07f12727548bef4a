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
#include "halformer/amx.h"  // amx_usable_here

#include <algorithm>

namespace halformer {

// 0 in vec / tile_n / tile_m: the target's register tile (matmul_knobs_for).
struct MatmulKnobs {
  int vec = 0;      // vector width in 32-bit lanes (floats, or int32 sums for int8)
  int tile_n = 0;   // vectors per tile along n
  int tile_m = 0;   // rows per tile
  bool parallel = true;
};

// What a matmul's register tile accumulates: floats (fp32 and bf16 linears), int8 sums,
// or the block formats' float sums with each block's int32 sums beside them (generators/linear_blocks.cpp).
enum class MatmulKind { Float, Int8, Blocks };

// The hand schedule's register tile for a target; a knob left at 0 takes this value.
// The tile's accumulators must fit the register file with room for the weight vectors
// and a broadcast (docs/performance-log.md#cpu-matmul):
//   AVX-512 (32 zmm): 6 rows x 4 vectors of 16 = 24 accumulators; int8 the same shape
//     (vpdpbusd adds in place); int4 4 rows x 4 vectors (16 float + 16 int32 sums: 4x4
//     led at 1 and 4 rows on Sapphire Rapids, 2048x5632, within the noise of 6x2 and 8x2
//     at 128 and 512 rows; 8- and 12-row tiles spilled; docs/precision.md).
//   AVX2 (16 ymm): 6 rows x 2 ymm = 12 accumulators (the AVX-512 tile spills there); int4
//     4 rows x 2 ymm, one 16-feature panel (a tile narrower than its panel made Halide
//     gather the weights byte by byte).
inline MatmulKnobs matmul_knobs_for(const Halide::Target& t, MatmulKind kind, MatmulKnobs requested) {
  const bool avx512 = t.has_feature(Halide::Target::AVX512), integer = kind != MatmulKind::Float;
  MatmulKnobs d;
  d.vec = avx512 ? 16 : (integer ? 8 : 16);
  d.tile_n = avx512 ? 4 : (integer ? 2 : 1);
  d.tile_m = kind == MatmulKind::Blocks ? 4 : 6;
  d.parallel = requested.parallel;
  if (requested.vec > 0) d.vec = requested.vec;
  if (requested.tile_n > 0) d.tile_n = requested.tile_n;
  if (requested.tile_m > 0) d.tile_m = requested.tile_m;
  return d;
}

// The tile widths (in output features) of the three row regimes of schedule_cpu_matmul
// for N features stored in panels of `panel`; each lies within one panel or covers whole
// panels, so that its weight loads are dense vectors.
struct MatmulWidths {
  int vec = 1;     // lanes per vector (the knob, never wider than N or the panel)
  int width = 1;   // many rows (and the strips of the few-row tasks)
  int row1 = 1;    // one row: at least 64 lanes where N allows
  int few = 1;     // 2..8 rows: a task's features (whole panels, kFewTaskBytes of weights)
  // True when some tile reaches past N: its reads past N must be clamped by the caller.
  bool overhangs(int N) const { return N % width || N % row1 || N % few; }
};

// A few-row task's width is doubled while its weights are under this many bytes, N still
// leaves kFewTasks tasks and no partial last task appears (matmul_widths): with one
// 16-feature panel of int8 weights per task (8 KB at K = 512) each task's start missed
// the hardware prefetchers (docs/performance-log.md#cpu-matmul).
constexpr int kFewTaskBytes = 64 << 10;
constexpr int kFewTasks = 8;

// `feature_bytes`: the bytes of one output feature's weights (K x the weight's size).
inline MatmulWidths matmul_widths(int N, const MatmulKnobs& k, int panel, int feature_bytes) {
  MatmulWidths w;
  // Never a tile wider than the layer; keep the vector width a divisor of the tile.
  w.vec = k.vec;
  while (w.vec > 1 && (w.vec > N || panel % w.vec != 0)) w.vec /= 2;
  int tn = std::max(1, std::min(k.tile_n, N / w.vec));
  while (tn > 1 && panel % (w.vec * tn) != 0 && (w.vec * tn) % panel != 0) --tn;
  w.width = w.vec * tn;
  // `width` doubled up to `lanes`, staying within N and panel-aligned.
  auto widened = [&](int lanes) {
    int x = w.width;
    while (x < lanes && 2 * x <= N && (panel % (2 * x) == 0 || (2 * x) % panel == 0)) x *= 2;
    return x;
  };
  w.row1 = widened(64);
  w.few = widened(panel);
  // Wider few-row tasks, within N / kFewTasks, and never a width that leaves a last partial
  // task where N had none (its clamped bias would be a gather in every regime's epilogue).
  const bool whole = N % w.few == 0;
  while (int64_t(w.few) * feature_bytes < kFewTaskBytes && 2 * w.few <= N / kFewTasks &&
         (!whole || N % (2 * w.few) == 0) && (2 * w.few) % panel == 0)
    w.few *= 2;
  return w;
}

// `panel`: the width of w's storage panels (halformer/packed_layout.h). A tile must lie
// within one panel or cover whole panels, so that its loads stay dense vectors.
// `rk_group`: an inner reduction over a small group of k summed within each output lane
// (int8: the pair a vpmaddwd, or the quad a vpdpbusd, multiplies and adds), vectorised
// inside the lane.
inline void schedule_cpu_matmul(Halide::Func out, Halide::Func acc, const Halide::Var& n,
                                const Halide::Var& m, const Halide::RVar& rk, int N, Halide::Expr rows,
                                MatmulKnobs k, int panel, int feature_bytes,
                                const Halide::RVar* rk_group = nullptr) {
  using namespace Halide;
  const MatmulWidths widths = matmul_widths(N, k, panel, feature_bytes);
  const int vec = widths.vec, width = widths.width;
  Var no("no"), ni("ni"), nio("nio"), nii("nii"), mo("mo"), moo("moo"), moi("moi"), mi("mi"), tile("tile");
  // A task covers `width` columns and up to 8 row tiles, walked in turn over the same
  // weights, which stay in that core's cache; its accumulator tile covers `sub` columns
  // at a time.
  // N not a multiple of the task width: the last task's stores are guarded, but its
  // accumulator tiles stay whole (the caller clamps reads past N). Shifting the last task
  // inwards instead would start tiles off the panel grid: Halide then gathers the weights
  // element by element in every tile (docs/performance-log.md#cpu-matmul).
  auto tiles = [&](Stage s, int tm, int width, int sub) {
    const TailStrategy n_tail = (N % width == 0) ? TailStrategy::RoundUp : TailStrategy::GuardWithIf;
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
  //   1 row (decode at batch 1; AVX2 also 2 rows, below): one-row tiles, one weight panel
  //     after the other, bandwidth-bound;
  //   up to 8 rows (decode at batch <= 8, beams): 4-row tiles (one-row tiles where panels
  //     are wider than the register tile, below), all in one task, so each weight is
  //     streamed from memory once, by one core, and the later tiles find the panel in
  //     cache;
  //   more: the tile_m x tile_n tile, each panel reused from L2 by all row tiles.
  // One row has no rows to reuse a weight over: its tile is at least 64 lanes wide (8 ymm
  // or 4 zmm accumulators, spanning narrower panels), enough independent sums to keep
  // loads in flight.
  const int width1 = widths.row1, sub1 = (width1 > 64 && width1 % 64 == 0) ? 64 : width1;
  // A few rows: a task covers whole panels (widths.few: kFewTaskBytes of weights where N
  // allows), walked in `width` strips, so that one core reads each panel. Where panels
  // are wider than the register tile (AVX2's 16 lanes in 64-wide panels), 4-row strips
  // walked the panel with a stride of a panel row and pulled it from memory at half the
  // bandwidth: one-row tiles across the whole panel row instead. Panels as wide as the
  // tile (weight_panel) stream sequentially under 4-row tiles, faster from 4 rows up, but
  // 2 rows keep more weight streams in flight as one-row tiles 64 lanes wide.
  // Measurements of all three regimes: docs/performance-log.md#cpu-matmul.
  const int small_m = 8;
  const bool small_regime = k.tile_m < small_m, narrow_tile = width < sub1;
  const bool few_by_row = narrow_tile && panel > width;
  const int one_row_max = small_regime && narrow_tile && !few_by_row ? 2 : 1;
  tiles(out.specialize(rows <= one_row_max), 1, width1, sub1);
  const int few_tile = few_by_row ? 1 : 4, few_width = few_by_row ? width1 : widths.few,
            few_sub = few_by_row ? sub1 : width;
  if (small_regime) tiles(out.specialize(rows <= small_m), few_tile, few_width, few_sub);
  tiles(out, k.tile_m, width, width);
  Expr acc_rows = select(rows <= one_row_max, 1, small_regime ? select(rows <= small_m, few_tile, k.tile_m) : k.tile_m);
  Expr acc_cols = select(rows <= one_row_max, sub1, small_regime ? select(rows <= small_m, few_sub, width) : width);
  acc.compute_at(out, nio)
      .bound_extent(m, acc_rows)
      .bound_extent(n, acc_cols)
      .vectorize(n, vec)
      .unroll(n)
      .unroll(m);
  if (!rk_group) {
    acc.update(0).reorder(n, m, rk).vectorize(n, vec).unroll(n).unroll(m);
    return;
  }
  acc.update(0).reorder(*rk_group, n, m, rk).atomic().vectorize(*rk_group).vectorize(n, vec).unroll(n).unroll(m);
}

// ---- AMX (Intel Sapphire Rapids and later)
// A tile register holds 16 rows of 64 bytes: a 16 x 16 block of int32 / fp32 sums, a 16-row
// x 64-byte block of activations, or 16 k groups of a 16-feature weight panel.
constexpr int kAmxTile = 16;
// More rows than this take the AMX path; fewer keep the vector kernels (decode).
constexpr int kAmxMinRows = 8;

// Does the target have AMX tiles (Halide's avx512_sapphirerapids includes AMX-TILE, -INT8
// and -BF16)? A host that Halide credits with Sapphire Rapids (from AVX-VNNI and AVX512-BF16
// alone) but whose tiles are off -- Linux before 5.16, a hypervisor hiding them -- builds
// without: its own models could not run them.
inline bool amx_tiles(const Halide::Target& t) {
  using Halide::Target;
  if (t.arch != Target::X86 || !t.has_feature(Target::AVX512_SapphireRapids)) return false;
  static const bool host_claims = Halide::get_host_target().has_feature(Target::AVX512_SapphireRapids);
  return !host_claims || amx_usable_here();
}

// The k of one tile multiply over a flat reduction of k_extent (a multiple of `group`, the
// k one 32-bit lane holds: 4 int8, 2 bf16): 64 bytes (a tile row) where it divides, else
// 32; below that 0 -- no AMX. Steps of 8 bytes were no faster than the vector kernel
// (docs/performance-log.md#cpu-matmul), and Halide's matcher sees no tile in a B operand
// of one k group row.
inline int amx_k_step(int k_extent, int group) {
  for (int step = 16 * group; step >= 8 * group; step /= 2)
    if (k_extent % step == 0) return step;
  return 0;
}

// out(n, m) = epilogue(block(n, m)), block = tile(n, m) stored from a tile register, tile
// the sum over the flat reduction `rk` of a 16 x 16 block, `k_step` k per multiply
// (amx_k_step). Applies where `big` holds (a specialisation declared before the vector
// schedule's, which covers the other rows). A task is up to 4 panels x 8 row blocks, panels
// innermost: the A block (16 rows x K) is reused over the task's panels, each panel over its
// row blocks (row blocks innermost instead: within the noise;
// docs/performance-log.md#cpu-matmul). Each multiply loads its two tiles: Halide's AMX
// support keeps one accumulator tile per Func, so no 2 x 2 register blocking. Halide's
// tile matcher (ExtractTileOperations) wants exactly this shape: the
// block zero-initialised and stored whole (bound_extent, rows not dense), the reduction's
// inner `k_step` and the block's two dimensions vectorised, k innermost (atomic).
inline void schedule_amx_matmul(Halide::Func out, Halide::Func block, Halide::Func tile, const Halide::Var& n,
                                const Halide::Var& m, const Halide::RDom& rk, int N, Halide::Expr big,
                                bool parallel, int k_step) {
  using namespace Halide;
  const int T = kAmxTile;
  const int panels = (N + T - 1) / T, task_panels = std::min(4, panels);
  // Blocks of 16 features, none past the last panel (a partial last block's stores are
  // guarded; its weights are the zero-padded panel), tasks of task_panels blocks.
  Var no("no"), nt("nt"), nio("nio"), nii("nii"), mo("mo"), moo("moo"), moi("moi"), mi("mi"), task("tile");
  Stage s = out.specialize(big);
  s.split(n, nt, nii, T, N % T == 0 ? TailStrategy::RoundUp : TailStrategy::GuardWithIf)
      .split(nt, no, nio, task_panels, panels % task_panels == 0 ? TailStrategy::RoundUp : TailStrategy::GuardWithIf)
      .split(m, mo, mi, T, TailStrategy::GuardWithIf)
      .split(mo, moo, moi, 8, TailStrategy::GuardWithIf)
      .reorder(nii, mi, nio, moi, moo, no)
      .vectorize(nii);
  if (parallel) s.fuse(moo, no, task).parallel(task);
  Var bn("bn"), bm("bm"), tn("tn"), tm("tm");
  // Rows of the stored block padded to 2T: a dense 16 x 16 store is one flat ramp, which
  // the matcher cannot read as a tile store.
  block.compute_at(out, nio)
      .bound_extent(n, T)
      .bound_extent(m, T)
      .align_storage(n, 2 * T)
      .tile(n, m, bn, bm, T, T)
      .vectorize(bn)
      .vectorize(bm);
  tile.compute_at(block, n).store_in(MemoryType::AMXTile).tile(n, m, tn, tm, T, T).vectorize(tn).vectorize(tm);
  RVar rko("rko"), rki("rki");
  tile.update()
      .tile(n, m, tn, tm, T, T, TailStrategy::RoundUp)
      .split(rk.x, rko, rki, k_step)
      .reorder(rki, tn, tm, rko, n, m)
      .atomic()
      .vectorize(rki)
      .vectorize(tn)
      .vectorize(tm);
}

}  // namespace halformer
