// pooling: one vector per sequence from the encoder output (classifier / embedding heads)
//   cls:  out(c, b) = x(c, 0, b)
//   mean: out(c, b) = sum_t valid(t, b) * x(c, t, b) / sum_t valid(t, b)   (non-pad tokens)
//   normalize: out /= max(||out||_2, 1e-12)   (torch.nn.functional.normalize)
#include "common.h"
#include "schedules/gpu.h"

namespace halformer {
using namespace Halide;

class PoolingGenerator : public Generator<PoolingGenerator> {
 public:
  GeneratorParam<int> channels{"channels", 64};
  GeneratorParam<Pooling> kind{"kind", Pooling::Mean, param_names({Pooling::Cls, Pooling::Mean})};
  GeneratorParam<bool> normalize{"normalize", false};
  GeneratorParam<int> vec{"vec", 16};

  Input<Buffer<float, 3>> x{"x"};          // (C, T, B)
  Input<Buffer<float, 2>> valid{"valid"};  // (T, B): 1 for a real token, 0 for padding
  Output<Buffer<float, 2>> out{"out"};     // (C, B)

  void generate() {
    const int C = channels;
    Var c("c"), b("b");
    RDom t(0, x.dim(1).extent(), "t");
    RDom r(0, C, "r");
    Func total("total"), count("count"), pooled("pooled"), sq("sq");
    if (kind == Pooling::Cls) {
      pooled(c, b) = x(c, 0, b);
    } else {
      total(c, b) = 0.0f;
      total(c, b) += x(c, t, b) * valid(t, b);
      count(b) = 0.0f;
      count(b) += valid(t, b);
      pooled(c, b) = total(c, b) / max(count(b), 1.0f);
    }
    if (normalize) {
      sq(b) = 0.0f;
      sq(b) += pooled(r, b) * pooled(r, b);
      out(c, b) = pooled(c, b) / max(sqrt(sq(b)), 1e-12f);
    } else {
      out(c, b) = pooled(c, b);
    }
    x.dim(0).set_bounds(0, C);
    out.dim(0).set_bounds(0, C);

    if (using_autoscheduler()) {
      x.set_estimates({{0, C}, {0, 128}, {0, 8}});
      valid.set_estimates({{0, 128}, {0, 8}});
      out.set_estimates({{0, C}, {0, 8}});
      return;
    }
    const bool mean = kind == Pooling::Mean;
    if (get_target().has_gpu_feature()) {
      // One block per sequence, threads across features (each sums its feature over time).
      const int threads = std::min(C, 128);
      schedule_gpu_rows(out, c, b, threads);
      if (normalize) {
        Var co("co"), ci("ci");
        pooled.compute_at(out, b).split(c, co, ci, threads, TailStrategy::GuardWithIf).gpu_threads(ci);
        schedule_gpu_row_reduction(sq, out, b, r.x, std::min(C, 32));
      }
      if (mean) {
        Var co("co"), ci("ci");
        total.compute_at(out, b).split(c, co, ci, threads, TailStrategy::GuardWithIf).gpu_threads(ci);
        total.update().split(c, co, ci, threads, TailStrategy::GuardWithIf).gpu_threads(ci);
        count.compute_at(out, b);
      }
      return;
    }
    const int v = pow2_divisor(C, vec);
    out.vectorize(c, v).parallel(b);
    if (mean) {
      total.compute_at(out, b).vectorize(c, v);
      total.update().reorder(c, t).vectorize(c, v);
      count.compute_at(out, b);
    }
    if (normalize) {
      pooled.compute_at(out, b).vectorize(c, v);
      sq.compute_at(out, b);
    }
  }
};

}  // namespace halformer

HALIDE_REGISTER_GENERATOR(halformer::PoolingGenerator, pooling)
