// GPU schedules shared by the layer generators (CUDA, and OpenCL for testing on PoCL).
//
// Matmul (generators/linear.cpp), two schedules picked at run time by the row count M
// (Func::specialize):
// * few rows (decode, short encoder inputs; M <= split_rows): one thread per output
//   walking all of K would leave the GPU idle on a latency chain, so K is cut into
//   kGpuSlices slices; a block owns slice_n outputs x 8 rows with one thread per
//   (output, slice), the slice sums go to shared memory, and each output adds them.
// * many rows: a block owns tile_n x tile_m outputs and each thread reg_n x reg_m of
//   them in registers, walking all of K; weights come in as float4 loads of reg_n
//   neighbouring features (coalesced: the packed panels keep them adjacent),
//   activations as broadcasts. No shared memory: L1 serves the reuse. With k_split S
//   > 1 (knob gpu_k_slice) each register tile is computed by S threads over a slice of K
//   each, the S partial tiles summed through shared memory: S times the threads and a
//   chain S times shorter where few, long tiles would leave the GPU latency-bound
//   (N = 512 with K = 2048 at 1024 rows: 512 blocks of 64 threads, 2048 steps each).
// The two sum K in different orders, so a sequence's result can differ in the last
// bits between a call of <= split_rows rows and a larger batch (docs/gpu.md).
// Row-wise kernels (norms, softmax, pooling): one block per row, threads across the
// row; reductions are split across threads with rfactor rather than run by one thread.
// Measurements: docs/performance-log.md#gpu-schedules.
#pragma once

#include "Halide.h"

namespace halformer {

constexpr int kGpuSmallRows = 8;  // rows per block on the few-row path
constexpr int kGpuSlices = 16;
constexpr int kGpuMaxKSplit = 8;  // many-row path: at most this many K slices per tile

struct GpuMatmulKnobs {
  int tile_n = 64;
  int tile_m = 16;
  int reg_n = 4;
  int reg_m = 4;
  int slice_n = 32;
  int split_rows = 256;
  int unroll_k = 4;  // many-row path: K steps unrolled (more loads in flight)
  int k_split = 1;   // many-row path: K slices per register tile (gpu_k_split)
  int stage_k = 0;   // many-row path: K steps per register-staged chunk (0: none; gpu_stage_k)
};

// The many-row path's K split: `count` slices of `steps` (the last one guarded when
// count does not divide K). slice_steps 0 or >= K: one slice. Both paths are compiled
// into each specialization's kernel, so a block has the larger of their thread shapes:
// fewer slices where that would pass CUDA's 1024 threads per block, or where the partial
// tiles would take more than 32 KB of shared memory (Halide launches with the 48 KB
// default, and the few-row path's slice sums need room too).
struct GpuKSplit {
  int count = 1;
  int steps = 0;
};
inline GpuKSplit gpu_k_split(int K, int slice_steps, const GpuMatmulKnobs& k) {
  GpuKSplit r;
  if (slice_steps > 0) r.count = std::max(1, std::min(kGpuMaxKSplit, (K + slice_steps - 1) / slice_steps));
  const int reg_n = std::max(1, k.reg_n), reg_m = std::max(1, k.reg_m);
  const int tile_n = std::max(reg_n, k.tile_n / reg_n * reg_n), tile_m = std::max(reg_m, k.tile_m / reg_m * reg_m);
  const int x = std::max(std::max(1, k.slice_n), tile_n / reg_n);
  auto y = [&](int count) { return std::max({kGpuSlices, kGpuSmallRows, tile_m, tile_m / reg_m * count}); };
  while (r.count > 1 && (x * y(r.count) > 1024 || tile_n * tile_m * r.count * 4 > 32768)) r.count--;
  r.steps = (K + r.count - 1) / r.count;
  return r;
}

// big(n, m): bias + full-K update over rk, or (k_split > 1) bias + the sum over rsum of
// kshared(n, m, s), a copy of kslice(n, m, s): one K slice, pure + update over rk.
// part(n, m, s): few-row slice sums (pure + update over rs); small(n, m): bias + sum of
// the slices. out inlines select(M <= split_rows, small, big). x(k, m) and w(n, k): the
// activations and weights the many-row update reads (staged in registers with stage_k).
struct GpuMatmulFuncs {
  Halide::Func big, part, small, kslice, kshared, x, w;
  Halide::Var k;  // x's and w's K variable
};
inline void schedule_gpu_matmul(Halide::Func out, GpuMatmulFuncs f, const Halide::Var& n, const Halide::Var& m,
                                const Halide::Var& s, const Halide::RVar& rk, const Halide::RVar& rs,
                                const Halide::RVar& rsum, const Halide::Expr& few_rows, GpuMatmulKnobs k) {
  using namespace Halide;
  Func big = f.big, part = f.part, small = f.small;
  Var nb("nb"), mb("mb"), nt("nt"), mt("mt"), nr("nr"), mr("mr");
  const int reg_n = std::max(1, k.reg_n), reg_m = std::max(1, k.reg_m);
  const int tile_n = std::max(reg_n, k.tile_n / reg_n * reg_n), tile_m = std::max(reg_m, k.tile_m / reg_m * reg_m);
  // Few rows (called first: a specialization copies the schedule made so far).
  out.specialize(few_rows)
      .split(n, nb, nt, std::max(1, k.slice_n), TailStrategy::GuardWithIf)
      .split(m, mb, mt, kGpuSmallRows, TailStrategy::GuardWithIf)
      .reorder(nt, mt, nb, mb)
      .gpu_blocks(nb, mb)
      .gpu_threads(nt, mt);
  // (No bound_extent on these: bounds inference sees them in both branches, and the
  // other branch's larger tiles would trip it at build time.)
  part.compute_at(out, nb).store_in(MemoryType::GPUShared).reorder(m, n, s).gpu_threads(n, s);
  part.update().reorder(m, rs, n, s).gpu_threads(n, s);
  small.compute_at(out, nb).gpu_threads(n, m);
  small.update().gpu_threads(n, m);
  // Many rows. A thread's reg_n x reg_m accumulators (all of K, or one K slice) walking
  // rk: whole register tiles (reads past N or M are clamped by the algorithm), so
  // constant loop extents and no predicated vector loads.
  auto register_tile = [&](Func acc, const LoopLevel& at) {
    acc.compute_at(at).bound_extent(n, reg_n).bound_extent(m, reg_m).vectorize(n).unroll(m);
    acc.update().reorder(n, m, rk).vectorize(n).unroll(m);
    // K in chunks of stage_k (a divisor of the steps: no tail) staged in registers, else
    // unroll_k steps unrolled. Staged, each chunk's activations (reg_m rows x stage_k,
    // float4 loads along K) and weights (stage_k x float4) are loaded before its
    // reg_n x reg_m x stage_k FMAs, instead of a float4 and reg_m scalar loads per K step:
    // fewer load instructions through L1, which bounds the unstaged kernel (docs/gpu.md).
    const int chunk = k.stage_k > 1 ? k.stage_k : k.unroll_k;
    if (chunk > 1) {
      RVar rko("rko"), rki("rki");
      acc.update().split(rk, rko, rki, chunk, TailStrategy::GuardWithIf).reorder(n, m, rki, rko).unroll(rki);
      if (k.stage_k > 1) {
        f.x.in(acc).compute_at(acc, rko).bound_extent(f.k, chunk).bound_extent(m, reg_m).vectorize(f.k).unroll(m);
        f.w.in(acc).compute_at(acc, rko).bound_extent(n, reg_n).bound_extent(f.k, chunk).vectorize(n).unroll(f.k);
      }
    }
  };
  if (k.k_split > 1) {
    // Final stage: a thread per reg_n outputs of one row adds the k_split partial tiles.
    out.split(n, nb, nt, tile_n, TailStrategy::GuardWithIf)
        .split(m, mb, mt, tile_m, TailStrategy::GuardWithIf)
        .split(nt, nt, nr, reg_n)
        .reorder(nr, nt, mt, nb, mb)
        .gpu_blocks(nb, mb)
        .gpu_threads(nt, mt)
        .unroll(nr);
    big.compute_at(out, nt).bound_extent(n, reg_n).bound_extent(m, 1).vectorize(n);
    big.update().reorder(n, m, rsum).vectorize(n).unroll(rsum);
    // Partial tiles: threads (n tile, m tile, slice), each reg_n x reg_m in registers.
    // (m tile, slice) fused into one thread dimension: the block keeps the final stage's
    // tile_n / reg_n x tile_m threads instead of the product of both stages' shapes.
    Var no("no"), ni("ni"), mo("mo"), mi("mi"), ms("ms");
    // Whole tiles (the last one's rows past M and features past N read clamped inputs and
    // are never stored): a constant shared allocation, and no tile shifted to before row 0.
    f.kshared.compute_at(out, nb)
        .store_in(MemoryType::GPUShared)
        .bound_extent(n, tile_n)
        .bound_extent(m, tile_m)
        .bound(s, 0, k.k_split)
        .split(n, no, ni, reg_n)
        .split(m, mo, mi, reg_m)
        .reorder(ni, mi, no, mo, s)
        .fuse(mo, s, ms)
        .gpu_threads(no, ms)
        .vectorize(ni)
        .unroll(mi);
    register_tile(f.kslice, LoopLevel(f.kshared, no));
    return;
  }
  out.split(n, nb, nt, tile_n, TailStrategy::GuardWithIf)
      .split(m, mb, mt, tile_m, TailStrategy::GuardWithIf)
      .split(nt, nt, nr, reg_n)
      .split(mt, mt, mr, reg_m)
      .reorder(nr, mr, nt, mt, nb, mb)
      .gpu_blocks(nb, mb)
      .gpu_threads(nt, mt)
      .unroll(nr)
      .unroll(mr);
  register_tile(big, LoopLevel(out, nt));
}

// One block per row `m` of out(c, m), `threads` threads striding across c.
inline void schedule_gpu_rows(Halide::Func out, const Halide::Var& c, const Halide::Var& m, int threads) {
  using namespace Halide;
  Var co("co"), ci("ci");
  out.split(c, co, ci, threads, TailStrategy::GuardWithIf).reorder(ci, co, m).gpu_blocks(m).gpu_threads(ci);
}

// A row reduction f(m) (one pure var, one update over RDom r) computed per block with
// `lanes` threads, each reducing a strided share, then one combine over the lanes.
inline void schedule_gpu_row_reduction(Halide::Func f, Halide::Func out, const Halide::Var& block_var,
                                       const Halide::RVar& r, int lanes) {
  using namespace Halide;
  RVar ro("ro"), ri("ri");
  Var u("u");
  f.compute_at(out, block_var);
  Func partial = f.update().split(r, ro, ri, lanes, TailStrategy::GuardWithIf).reorder(ro, ri).rfactor(ri, u);
  partial.compute_at(out, block_var).gpu_threads(u);
  partial.update().gpu_threads(u);
}

}  // namespace halformer
