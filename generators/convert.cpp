// cast_bf16: fp32 rows -> bf16 bits (uint16), rounded to nearest even as the weights are
// (halformer/packed_layout.h to_bf16; a NaN stays a NaN). On CUDA it makes the A operand
// of the bf16 tensor-core matmuls (runtime/gpu_blas.h), which cuBLASLt cannot read as
// fp32 beside bf16 weights. Any width and row count: one kernel serves every linear input.
#include "common.h"

namespace halformer {
using namespace Halide;

class CastBf16 : public Generator<CastBf16> {
 public:
  GeneratorParam<int> channels{"channels", 64};  // the tuner's width; the kernel takes any
  Input<Buffer<float, 2>> x{"x"};                // (C, M)
  Output<Buffer<uint16_t, 2>> out{"out"};

  void generate() {
    Var c("c"), m("m");
    Expr u = reinterpret<uint32_t>(x(c, m));
    Expr rounded = cast<uint16_t>((u + 0x7fff + ((u >> 16) & 1)) >> 16);
    Expr quiet_nan = cast<uint16_t>((u >> 16) | 0x40);
    out(c, m) = select((u & 0x7fffffff) > 0x7f800000, quiet_nan, rounded);
    if (!using_autoscheduler()) return schedule_elementwise(out, c, m, get_target());
    x.set_estimates({{0, channels}, {0, 512}});
    out.set_estimates({{0, channels}, {0, 512}});
  }
};

}  // namespace halformer

HALIDE_REGISTER_GENERATOR(halformer::CastBf16, convert)
