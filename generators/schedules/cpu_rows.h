// CPU schedule for a reduction over one dimension -- a row max or sum, f(row, ...) over
// RVar r -- the CPU twin of schedule_gpu_row_reduction (gpu.h): `vec` lanes of partial
// results (rfactor), vectorised, then one horizontal step per row, instead of a scalar
// scan (docs/performance-log.md#cpu-rows).
#pragma once

#include "Halide.h"

namespace halformer {

inline void schedule_cpu_row_reduction(Halide::Func f, const Halide::LoopLevel& at, const Halide::RVar& r,
                                       const Halide::Var& row, int vec) {
  using namespace Halide;
  RVar ro("ro"), ri("ri");
  Var lane("lane");
  f.compute_at(at);
  Func lanes = f.update().split(r, ro, ri, vec, TailStrategy::GuardWithIf).rfactor(ri, lane);
  lanes.compute_at(f, row).vectorize(lane);
  lanes.update().vectorize(lane);
}

}  // namespace halformer
