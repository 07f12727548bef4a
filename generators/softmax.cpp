// softmax: the output head over each row of logits.
//   log_softmax: out = x - max - log(sum exp(x - max));  softmax: exp(x - max) / sum
// argmax: index of the first maximum of each row (greedy decoding), as torch.argmax.
#include "common.h"

namespace halformer {
using namespace Halide;

enum class SoftmaxKind { Softmax, LogSoftmax };

class Softmax : public Generator<Softmax> {
 public:
  GeneratorParam<int> classes{"classes", 16};
  GeneratorParam<SoftmaxKind> kind{"kind", SoftmaxKind::LogSoftmax,
                                   {{"softmax", SoftmaxKind::Softmax},
                                    {"log_softmax", SoftmaxKind::LogSoftmax}}};
  GeneratorParam<int> vec{"vec", 16};

  Input<Buffer<float, 2>> x{"x"};  // (V, M)
  Output<Buffer<float, 2>> out{"out"};

  void generate() {
    const int V = classes;
    Var v("v"), m("m");
    RDom r(0, V, "r");
    Func mx("row_max"), total("row_sum");
    mx(m) = maximum(x(r, m));
    total(m) = sum(exp(x(r, m) - mx(m)));
    if (kind == SoftmaxKind::LogSoftmax) {
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
    out.parallel(m).vectorize(v, vec, TailStrategy::GuardWithIf);
    mx.compute_at(out, m);
    total.compute_at(out, m);
  }
};

class Argmax : public Generator<Argmax> {
 public:
  GeneratorParam<int> classes{"classes", 16};
  Input<Buffer<float, 2>> x{"x"};          // (V, M)
  Output<Buffer<int32_t, 1>> out{"out"};   // (M)

  void generate() {
    Var m("m");
    RDom r(0, int(classes), "r");
    out(m) = argmax(x(r, m))[0];
    x.dim(0).set_bounds(0, int(classes));
    if (using_autoscheduler()) {
      x.set_estimates({{0, int(classes)}, {0, 8}});
      out.set_estimates({{0, 8}});
      return;
    }
    out.parallel(m);
  }
};

}  // namespace halformer

HALIDE_REGISTER_GENERATOR(halformer::Softmax, softmax)
HALIDE_REGISTER_GENERATOR(halformer::Argmax, argmax)
