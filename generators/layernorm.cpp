// layernorm: out(c, m) = gamma(c) * (x(c, m) - mean(m)) / spread(m) + beta(c)
//   standard  (torch.nn.LayerNorm):        spread = sqrt(biased variance + eps)
//   annotated (The Annotated Transformer): spread = unbiased std + eps
//   rms       (RMSNorm, Llama):            out = gamma(c) * x(c, m) / sqrt(mean(x^2) + eps);
//             no centring and no beta (the input is accepted and not read)
#include "common.h"
#include "schedules/gpu.h"

namespace halformer {
using namespace Halide;

class LayerNorm : public Generator<LayerNorm> {
 public:
  GeneratorParam<int> channels{"channels", 64};
  GeneratorParam<float> eps{"eps", 1e-5f};
  GeneratorParam<NormKind> kind{"kind", NormKind::Standard,
                                param_names({NormKind::Standard, NormKind::Annotated, NormKind::Rms})};
  GeneratorParam<int> vec{"vec", 16};
  GeneratorParam<int> rows_per_task{"rows_per_task", 8};
  // Threads per row on GPUs. 32 (one warp, the width of the reductions): measured faster
  // than 128 (docs/performance-log.md#layernorm).
  GeneratorParam<int> gpu_threads{"gpu_threads", 32};

  Input<Buffer<float, 2>> x{"x"};  // (C, M)
  Input<Buffer<float, 1>> gamma{"gamma"};
  Input<Buffer<float, 1>> beta{"beta"};
  Output<Buffer<float, 2>> out{"out"};

  void generate() {
    const int C = channels;
    Var c("c"), m("m");
    RDom r(0, C, "r");
    Func total("total"), mean("mean"), sqdev("sqdev"), inv_spread("inv_spread");
    total(m) = 0.0f;
    if (kind != NormKind::Rms) total(m) += x(r, m);  // RMSNorm: no centring (mean 0)
    mean(m) = total(m) / float(C);
    Expr dev = x(r, m) - mean(m);
    sqdev(m) = 0.0f;
    sqdev(m) += dev * dev;
    if (kind == NormKind::Standard || kind == NormKind::Rms) {
      inv_spread(m) = 1.0f / sqrt(sqdev(m) / float(C) + float(eps));
    } else {
      inv_spread(m) = 1.0f / (sqrt(sqdev(m) / float(std::max(C - 1, 1))) + float(eps));
    }
    if (kind == NormKind::Rms)
      out(c, m) = gamma(c) * (x(c, m) * inv_spread(m));
    else
      out(c, m) = gamma(c) * ((x(c, m) - mean(m)) * inv_spread(m)) + beta(c);

    // The row sums to schedule (RMSNorm has no mean to sum).
    std::vector<Func> reductions = {sqdev};
    if (kind != NormKind::Rms) reductions.push_back(total);

    x.dim(0).set_bounds(0, C);
    out.dim(0).set_bounds(0, C);
    gamma.dim(0).set_bounds(0, C);
    beta.dim(0).set_bounds(0, C);

    if (using_autoscheduler()) {
      x.set_estimates({{0, C}, {0, 128}});
      gamma.set_estimates({{0, C}});
      beta.set_estimates({{0, C}});
      out.set_estimates({{0, C}, {0, 128}});
      return;
    }
    if (get_target().has_gpu_feature()) {
      schedule_gpu_rows(out, c, m, std::min(int(gpu_threads), C));
      for (Func f : reductions) schedule_gpu_row_reduction(f, out, m, r.x, std::min(32, C));
      mean.compute_at(out, m);
      inv_spread.compute_at(out, m);
      return;
    }
    // Row sums are vectorised by splitting the reduction into `v` lanes (rfactor).
    const int v = pow2_divisor(C, vec);
    Var mo("mo"), u("u");
    out.split(m, mo, m, rows_per_task, TailStrategy::GuardWithIf).parallel(mo).vectorize(c, v);
    for (Func f : reductions) {
      f.compute_at(out, m);
      if (v > 1) {
        RVar ro("ro"), ri("ri");
        Func lanes = f.update().split(r.x, ro, ri, v).rfactor(ri, u);
        lanes.compute_at(out, m).vectorize(u).update().vectorize(u);
      }
    }
    mean.compute_at(out, m);
    inv_spread.compute_at(out, m);
  }
};

}  // namespace halformer

HALIDE_REGISTER_GENERATOR(halformer::LayerNorm, layernorm)
