// GPU schedules shared by the layer generators (CUDA, and OpenCL for testing on PoCL).
//
// Matmul: each block owns a tile_n x tile_m tile of outputs, one thread per output.
// The K loop is walked in chunks of k_chunk; for each chunk the whole block stages the
// matching rows of the activations and columns of the weights in shared memory, then
// every thread accumulates its output from shared memory. Row counts are dynamic, so the
// row dimension is GuardWithIf and the caller clamps row reads (see Linear).
//
// Row-wise kernels (norms, softmax, pooling): one block per row, threads across the
// row; reductions are split across threads with rfactor rather than run by one thread.
#pragma once

#include "Halide.h"

namespace halformer {

struct GpuMatmulKnobs {
  int tile_n = 32;
  int tile_m = 8;
  int k_chunk = 16;
};

inline void schedule_gpu_matmul(Halide::Func out, Halide::Func acc, Halide::Func a_in, Halide::Func w_in,
                                const Halide::Var& n, const Halide::Var& m, const Halide::RVar& rk, int N, int K,
                                GpuMatmulKnobs k) {
  using namespace Halide;
  const int tn = std::max(1, std::min(k.tile_n, N));
  const int kc = std::max(1, std::min(k.k_chunk, K));
  Var nb("nb"), mb("mb"), nt("nt"), mt("mt");
  out.gpu_tile(n, m, nb, mb, nt, mt, tn, k.tile_m, TailStrategy::GuardWithIf);
  acc.compute_at(out, nb).gpu_threads(n, m);
  RVar ko("ko"), ki("ki");
  acc.update()
      .split(rk, ko, ki, kc, TailStrategy::GuardWithIf)
      .reorder(ki, n, m, ko)
      .gpu_threads(n, m);
  // Cooperative loads of this chunk of both operands into shared memory.
  Func a_shared = a_in.in(acc), w_shared = w_in.in(acc);
  a_shared.compute_at(acc, ko).store_in(MemoryType::GPUShared).gpu_threads(a_shared.args()[0], a_shared.args()[1]);
  w_shared.compute_at(acc, ko).store_in(MemoryType::GPUShared).gpu_threads(w_shared.args()[0], w_shared.args()[1]);
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
