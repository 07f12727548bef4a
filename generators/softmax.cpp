// softmax: the output head over each row of logits.
//   log_softmax: out = x - max - log(sum exp(x - max));  softmax: exp(x - max) / sum
// argmax: index of the first maximum of each row (greedy decoding), as torch.argmax.
#include "common.h"

#include <limits>
#include "schedules/cpu_rows.h"
#include "schedules/gpu.h"

namespace halformer {
using namespace Halide;

class Softmax : public Generator<Softmax> {
 public:
  GeneratorParam<int> classes{"classes", 16};
  // The spec's head kinds this kernel computes.
  GeneratorParam<HeadKind> kind{"kind", HeadKind::LogSoftmax, param_names({HeadKind::Softmax, HeadKind::LogSoftmax})};
  GeneratorParam<int> vec{"vec", 16};

  Input<Buffer<float, 2>> x{"x"};  // (V, M)
  Output<Buffer<float, 2>> out{"out"};

  void generate() {
    const int V = classes;
    Var v("v"), m("m");
    RDom r(0, V, "r");
    Func mx("row_max"), total("row_sum");
    mx(m) = std::numeric_limits<float>::lowest();
    mx(m) = max(mx(m), x(r, m));
    total(m) = 0.0f;
    total(m) += exp(x(r, m) - mx(m));
    if (kind == HeadKind::LogSoftmax) {
      out(v, m) = x(v, m) - mx(m) - log(total(m));
    } else {
      out(v, m) = exp(x(v, m) - mx(m)) / total(m);
    }
    x.dim(0).set_bounds(0, V);
    out.dim(0).set_bounds(0, V);
    if (using_autoscheduler()) {
      x.set_estimates({{0, V}, {0, 8}});
      out.set_estimates({{0, V}, {0, 8}});
      return;
    }
    if (get_target().has_gpu_feature()) {
      schedule_gpu_rows(out, v, m, std::min(V, 256));
      for (Func f : {mx, total}) schedule_gpu_row_reduction(f, out, m, r.x, std::min(V, 256));
      return;
    }
    out.parallel(m).vectorize(v, vec, TailStrategy::GuardWithIf);
    for (Func f : {mx, total}) schedule_cpu_row_reduction(f, LoopLevel(out, m), r.x, m, vec);
  }
};

class Argmax : public Generator<Argmax> {
 public:
  GeneratorParam<int> classes{"classes", 16};
  GeneratorParam<int> lanes{"lanes", 16};  // parallel partial scans per row (GPU threads)
  Input<Buffer<float, 2>> x{"x"};          // (V, M)
  Output<Buffer<int32_t, 1>> out{"out"};   // (M)

  void generate() {
    const int V = classes, L = std::max(1, std::min(int(lanes), V));
    Var m("m"), u("u");
    // Lane u scans indices u, u + L, ...; strict > keeps the first maximum within a lane,
    // and the combine keeps the lower index on ties, so the result is the first maximum.
    // NaN or +inf (overflowed activations) anywhere in a row makes its result -1, an error
    // for the runtime. Found from the bits with two integer maxima per lane, independent of
    // the scan: of the bits as int32 (>= +inf's: +inf or a NaN of positive sign) and of the
    // magnitude's (> +inf's: any NaN). Halide compiles float compares assuming neither
    // occurs; a flag folded into the index serialised the scan
    // (docs/performance-log.md#softmax-and-argmax).
    RDom rs(0, (V + L - 1) / L, "rs");
    Expr idx = rs * L + u;
    Expr val = x(min(idx, V - 1), m);
    Expr bits = reinterpret<int32_t>(val);
    const int inf_bits = 0x7f800000, lowest_bits = std::numeric_limits<int32_t>::min();
    Func partial("partial"), best("best");
    partial(u, m) = {std::numeric_limits<float>::lowest(), 0, lowest_bits, 0};
    Expr take = idx < V && val > partial(u, m)[0];
    partial(u, m) = {select(take, val, partial(u, m)[0]), select(take, idx, partial(u, m)[1]),
                     max(partial(u, m)[2], bits), max(partial(u, m)[3], bits & 0x7fffffff)};
    RDom ru(0, L, "ru");
    best(m) = {std::numeric_limits<float>::lowest(), 0, lowest_bits, 0};
    Expr pv = partial(ru, m)[0], pi = partial(ru, m)[1];
    Expr better = pv > best(m)[0] || (pv == best(m)[0] && pi < best(m)[1]);
    best(m) = {select(better, pv, best(m)[0]), select(better, pi, best(m)[1]), max(best(m)[2], partial(ru, m)[2]),
               max(best(m)[3], partial(ru, m)[3])};
    out(m) = select(best(m)[2] >= inf_bits || best(m)[3] > inf_bits, -1, best(m)[1]);
    x.dim(0).set_bounds(0, V);
    if (using_autoscheduler()) {
      // One row (batch-1 greedy): with 8, Adams2019 on an AVX2 host vectorised the rows
      // by 8 with ShiftInwards, and a batch of 3 then wrote out[-5].
      x.set_estimates({{0, V}, {0, 1}});
      out.set_estimates({{0, 1}});
      return;
    }
    if (get_target().has_gpu_feature()) {
      Var mo("mo");
      out.split(m, mo, m, 1).gpu_blocks(mo).gpu_threads(m);  // one block per row
      // The combine runs inside the (single) thread loop so the tuple lives in registers:
      // at block level Halide updates its two halves with a barrier between them.
      best.compute_at(out, m);
      partial.compute_at(out, mo).gpu_threads(u);
      partial.update().gpu_threads(u);
      return;
    }
    // The lanes are one vector: each step compares `lanes` consecutive values at once
    // (a scalar scan was far slower: docs/performance-log.md#softmax-and-argmax).
    out.parallel(m);
    best.compute_at(out, m);
    partial.compute_at(out, m).vectorize(u);
    partial.update().vectorize(u);
  }
};

}  // namespace halformer

HALIDE_REGISTER_GENERATOR(halformer::Softmax, softmax)
HALIDE_REGISTER_GENERATOR(halformer::Argmax, argmax)
