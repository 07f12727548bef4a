// Compiling and calling: a candidate JIT-compiled from the generator registered in this
// program (with the plan's GeneratorParams and the candidate's knobs, or an
// autoscheduler), called with a run-time list of arguments, and its output compared with
// the hand schedule's. Compile errors become exceptions; run-time errors become messages.
#pragma once

#include "Halide.h"

#include <string>
#include <vector>

#include "candidates.h"
#include "kernel_io.h"
#include "plan.h"

namespace halformer::tune {

// A compiled candidate and how to call it.
struct Compiled {
  Halide::Callable fn;
  std::vector<std::string> inputs;  // argument order
  Halide::Type out_type;
  int out_dims = 0;
};

// Halide compile errors become exceptions (not printed: a failing candidate is reported once).
void quiet_compile_errors();

// Kernel `k` with candidate `c`'s schedule, for target `t`.
Compiled compile(const PlannedKernel& k, const Cand& c, const Halide::Target& t);

// Relative error of `out` against the reference: max |a - r| / max(|r|, mean |r|).
double rel_error(const Halide::Buffer<>& a, const Halide::Buffer<>& r, std::string& why);

}  // namespace halformer::tune
