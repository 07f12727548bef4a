// pooling: one vector per sequence from the encoder output (classifier / embedding heads)
//   cls:  out(c, b) = x(c, 0, b)
//   mean: out(c, b) = sum_t valid(t, b) * x(c, t, b) / sum_t valid(t, b)   (non-pad tokens)
//   normalize: out /= max(||out||_2, 1e-12)   (torch.nn.functional.normalize)
#include "common.h"

namespace halformer {
using namespace Halide;

enum class PoolKind { Cls, Mean };

class Pooling : public Generator<Pooling> {
 public:
  GeneratorParam<int> channels{"channels", 64};
  GeneratorParam<PoolKind> kind{"kind", PoolKind::Mean, {{"cls", PoolKind::Cls}, {"mean", PoolKind::Mean}}};
  GeneratorParam<bool> normalize{"normalize", false};
  GeneratorParam<int> vec{"vec", 16};

  Input<Buffer<float, 3>> x{"x"};          // (C, T, B)
  Input<Buffer<float, 2>> valid{"valid"};  // (T, B): 1 for a real token, 0 for padding
  Output<Buffer<float, 2>> out{"out"};     // (C, B)

  void generate() {
    const int C = channels;
    Var c("c"), b("b");
    Func pooled("pooled");
    if (kind == PoolKind::Cls) {
      pooled(c, b) = x(c, 0, b);
    } else {
      RDom t(0, x.dim(1).extent(), "t");
      Func total("total"), count("count");
      total(c, b) = 0.0f;
      total(c, b) += x(c, t, b) * valid(t, b);
      count(b) = 0.0f;
      count(b) += valid(t, b);
      pooled(c, b) = total(c, b) / max(count(b), 1.0f);
      total.compute_at(out, b).vectorize(c, pow2_divisor(C, vec));
      total.update().reorder(c, t).vectorize(c, pow2_divisor(C, vec));
      count.compute_at(out, b);
    }
    if (normalize) {
      RDom r(0, C, "r");
      Func sq("sq");
      sq(b) = 0.0f;
      sq(b) += pooled(r, b) * pooled(r, b);
      out(c, b) = pooled(c, b) / max(sqrt(sq(b)), 1e-12f);
      pooled.compute_at(out, b);
      sq.compute_at(out, b);
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
    out.vectorize(c, pow2_divisor(C, vec)).parallel(b);
  }
};

}  // namespace halformer

HALIDE_REGISTER_GENERATOR(halformer::Pooling, pooling)
