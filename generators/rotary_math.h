// Rotary positions, the one home of their arithmetic: the rotary kernel (rotary.cpp) turns
// the query and key heads of fused QKV rows once, before a cache stores them; attention.cpp
// can still turn them on read (its own layer tests, rotary_dim > 0).
//
// Feature pairs (c, c + R/2) ("half", Llama / GPT-NeoX) or (2c, 2c + 1) ("interleaved",
// GPT-J) for c < R/2 turn by pos * theta^(-2c/R); features from R on pass through. The angle
// is formed in float32 exactly as transformers forms it (inv_freq = 1 / theta^(2c/R), then
// pos * inv_freq).
#pragma once

#include <algorithm>
#include <cmath>
#include <functional>

#include "common.h"

namespace halformer {

struct RotaryMath {
  int dim = 0, head_dim = 0;  // R (even, <= head_dim); 0: no rotation
  bool interleaved = false;
  bool tables = false;        // cos / sin are constant tables (else computed per call)
  Halide::Func cos{"rope_cos"}, sin{"rope_sin"};  // (frequency, position)

  // positions > 0: the positions a call can see (the model's max_len): where allowed (a CPU
  // target, no autoscheduler) the cos / sin of every (frequency, position) are computed
  // here, once, into constant tables with the same float arithmetic (the angle's product in
  // float, cosf / sinf: the values the kernel computed, bit for bit); else each call
  // computes its positions'. Per call they were scalar libm calls on one thread
  // (docs/performance-log.md#attention) -- tables of up to 2^20 entries each.
  RotaryMath(int R, int D, float theta, bool interleaved_pairs, int positions, bool tables_allowed)
      : dim(R), head_dim(D), interleaved(interleaved_pairs) {
    using namespace Halide;
    Var f("f"), pos("pos");
    const int P = positions;
    tables = R > 0 && P > 0 && int64_t(P) * (R / 2) <= (int64_t(1) << 20) && tables_allowed;
    Buffer<float> freqs(std::max(R / 2, 1), "rope_inv_freq");
    for (int c = 0; c < R / 2; ++c) freqs(c) = 1.0f / std::pow(theta, float(2 * c) / float(R));
    if (tables) {
      Buffer<float> cos_table(R / 2, P, "rope_cos_table"), sin_table(R / 2, P, "rope_sin_table");
      for (int p = 0; p < P; ++p)
        for (int c = 0; c < R / 2; ++c) {
          const float angle = float(p) * freqs(c);
          cos_table(c, p) = std::cos(angle);
          sin_table(c, p) = std::sin(angle);
        }
      cos(f, pos) = cos_table(f, clamp(pos, 0, P - 1));
      sin(f, pos) = sin_table(f, clamp(pos, 0, P - 1));
    } else {
      Func inv_freq("inv_freq");
      inv_freq(f) = freqs(f);
      Expr angle = cast<float>(pos) * inv_freq(f);
      cos(f, pos) = Halide::cos(angle);
      sin(f, pos) = Halide::sin(angle);
    }
  }

  // Feature dd of a head row at position p, rotated; x(e) is the row's feature e (< D).
  Halide::Expr rotate(const std::function<Halide::Expr(Halide::Expr)>& x, Halide::Expr dd, Halide::Expr p) const {
    return rotate_by(x, dd, [&](Halide::Expr f) { return cos(f, p); }, [&](Halide::Expr f) { return sin(f, p); });
  }
  // The same with the row's cos / sin of frequency f given (a caller's per-row Funcs).
  Halide::Expr rotate_by(const std::function<Halide::Expr(Halide::Expr)>& x, Halide::Expr dd,
                         const std::function<Halide::Expr(Halide::Expr)>& cos_of,
                         const std::function<Halide::Expr(Halide::Expr)>& sin_of) const {
    using namespace Halide;
    const int R = dim, D = head_dim;
    if (R == 0) return x(dd);
    Expr fi, partner, sign;
    if (interleaved) {
      fi = dd / 2;
      partner = select(dd % 2 == 0, x(min(dd + 1, D - 1)), x(max(dd - 1, 0)));
      sign = select(dd % 2 == 0, -1.0f, 1.0f);
    } else {
      fi = select(dd < R / 2, dd, dd - R / 2);
      partner = select(dd < R / 2, x(min(dd + R / 2, D - 1)), x(max(dd - R / 2, 0)));
      sign = select(dd < R / 2, -1.0f, 1.0f);
    }
    Expr fc = clamp(fi, 0, std::max(R / 2 - 1, 0));
    Expr rotated = x(dd) * cos_of(fc) + sign * partner * sin_of(fc);
    return R == D ? rotated : select(dd < R, rotated, x(dd));
  }

  // A CPU schedule for a Func whose innermost dimension d is the head feature: the loop
  // split at R/2 (unrolled regions: first halves, second halves, the features past R), so
  // that within a region each partner read is a dense vector at a fixed offset; one loop
  // over d made Halide clamp the partner index lane by lane (docs/performance-log.md#attention).
  // The interleaved layout's partner still clamps at one end of each region. Regions need
  // R/2 to divide the head size and hold whole vectors of 4 or more; else plain vectors.
  Halide::Func vectorize(Halide::Func f, const Halide::Var& d, int vec) const {
    using namespace Halide;
    const int half = dim / 2, rv = half > 0 ? pow2_divisor(half, vec) : 1;
    if (half == 0 || head_dim % half != 0 || rv < 4) return f.vectorize(d, pow2_divisor(head_dim, vec));
    Var region("region"), c("c");
    return f.split(d, region, c, half).unroll(region).vectorize(c, rv);
  }

  // Positions computed per call: their cos / sin once per call (root), not per use.
  void schedule_per_call() const {
    if (dim > 0 && !tables) {
      Halide::Func(cos).compute_root();
      Halide::Func(sin).compute_root();
    }
  }

};

}  // namespace halformer
