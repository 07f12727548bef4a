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
//   activations as broadcasts. No shared memory: L1 serves the reuse.
// The two sum K in different orders, so a sequence's result can differ in the last
// bits between a call of <= split_rows rows and a larger batch (docs/gpu.md).
// Row-wise kernels (norms, softmax, pooling): one block per row, threads across the
// row; reductions are split across threads with rfactor rather than run by one thread.
#pragma once

#include "Halide.h"

namespace halformer {

constexpr int kGpuSmallRows = 8;  // rows per block on the few-row path
constexpr int kGpuSlices = 16;

struct GpuMatmulKnobs {
  int tile_n = 64;
  int tile_m = 16;
  int reg_n = 4;
  int reg_m = 4;
  int slice_n = 32;
  int split_rows = 256;
  int unroll_k = 4;  // many-row path: K steps unrolled (more loads in flight)
};

// big(n, m): bias + full-K update over rk; part(n, m, s): slice sums (pure + update
// over rs); small(n, m): bias + sum of the slices. out inlines
// select(M <= split_rows, small, big).
inline void schedule_gpu_matmul(Halide::Func out, Halide::Func big, Halide::Func part, Halide::Func small,
                                const Halide::Var& n, const Halide::Var& m, const Halide::Var& s,
                                const Halide::RVar& rk, const Halide::RVar& rs, const Halide::Expr& M,
                                GpuMatmulKnobs k) {
  using namespace Halide;
  Var nb("nb"), mb("mb"), nt("nt"), mt("mt"), nr("nr"), mr("mr");
  const int reg_n = std::max(1, k.reg_n), reg_m = std::max(1, k.reg_m);
  const int tile_n = std::max(reg_n, k.tile_n / reg_n * reg_n), tile_m = std::max(reg_m, k.tile_m / reg_m * reg_m);
  // Few rows (called first: a specialization copies the schedule made so far).
  out.specialize(M <= k.split_rows)
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
  // Many rows.
  out.split(n, nb, nt, tile_n, TailStrategy::GuardWithIf)
      .split(m, mb, mt, tile_m, TailStrategy::GuardWithIf)
      .split(nt, nt, nr, reg_n)
      .split(mt, mt, mr, reg_m)
      .reorder(nr, mr, nt, mt, nb, mb)
      .gpu_blocks(nb, mb)
      .gpu_threads(nt, mt)
      .unroll(nr)
      .unroll(mr);
  // Whole register tiles (reads past N or M are clamped by the algorithm): constant
  // loop extents, no predicated vector loads.
  big.compute_at(out, nt).bound_extent(n, reg_n).bound_extent(m, reg_m).vectorize(n).unroll(m);
  big.update().reorder(n, m, rk).vectorize(n).unroll(m);
  if (k.unroll_k > 1) {
    RVar rko("rko"), rki("rki");
    big.update().split(rk, rko, rki, k.unroll_k, TailStrategy::GuardWithIf).reorder(n, m, rki, rko).unroll(rki);
  }
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
