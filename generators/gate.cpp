// gate: out = act(gate) * up, elementwise over (N, M) -- a gated feed-forward's middle
// (SwiGLU, GeGLU) where its two projections ran as cuBLASLt matmuls (runtime/gpu_blas.h),
// which fuse no SiLU. Any width and row count; out may be up itself.
#include "common.h"

namespace halformer {
using namespace Halide;

class Gate : public Generator<Gate> {
 public:
  GeneratorParam<PointwiseFn> activation{"activation", PointwiseFn::Silu, kPointwiseFnNames};
  GeneratorParam<int> channels{"channels", 64};  // the tuner's width; the kernel takes any
  Input<Buffer<float, 2>> gate{"gate"};          // (N, M), before the activation
  Input<Buffer<float, 2>> up{"up"};              // (N, M)
  Output<Buffer<float, 2>> out{"out"};

  void generate() {
    Var n("n"), m("m");
    out(n, m) = apply_pointwise(activation, gate(n, m)) * up(n, m);
    if (!using_autoscheduler()) return schedule_elementwise(out, n, m, get_target());
    for (auto* b : {&gate, &up}) b->set_estimates({{0, channels}, {0, 512}});
    out.set_estimates({{0, channels}, {0, 512}});
  }
};

}  // namespace halformer

HALIDE_REGISTER_GENERATOR(halformer::Gate, gate)
