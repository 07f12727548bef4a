// rotary: rotary positions applied once to fused QKV rows, before they are attended or
// stored in a key/value cache (rotary_math.h has the arithmetic):
//   out(c, m) = feature c of row m, its head c / head_dim turned by positions(m) when that
//               head is one of the first `heads` (the queries and keys), else copied
// so attention reads keys as they are: a decode step turned every cached key again (half
// of its time at 2,048 positions; docs/performance-log.md#rotary-once). out_bf16: the row
// stored as bf16 bits (a bf16 cache), rounded once, after the turn.
#include "common.h"
#include "rotary_math.h"

namespace halformer {
using namespace Halide;

class Rotary : public Generator<Rotary> {
 public:
  GeneratorParam<int> channels{"channels", 48};  // the row's features: (heads + value heads) x head_dim
  GeneratorParam<int> heads{"heads", 2};         // heads turned, from feature 0 on
  GeneratorParam<int> head_dim{"head_dim", 16};
  GeneratorParam<int> rotary_dim{"rotary_dim", 16};
  GeneratorParam<float> rotary_theta{"rotary_theta", 10000.0f};
  GeneratorParam<bool> rotary_interleaved{"rotary_interleaved", false};
  GeneratorParam<int> rotary_positions{"rotary_positions", 0};  // the model's max_len (0: unknown)
  GeneratorParam<bool> out_bf16{"out_bf16", false};  // CPU only (a GPU cache is fp32)
  // The 16-bit format of the *_bf16 flags (common.h kHalfNames): bf16, or fp16 (an fp16 cache).
  GeneratorParam<Precision> half{"half", Precision::Bf16, kHalfNames};

  Input<Buffer<float, 2>> x{"x"};                  // (channels, rows)
  Input<Buffer<int32_t, 1>> positions{"positions"};  // (rows): each row's position
  Output<Buffer<void, 2>> out{"out"};              // (channels, rows): float, or uint16 with out_bf16

  bool bf16_out() const { return out_bf16 && !get_target().has_gpu_feature(); }
  void configure() { out.set_type(bf16_out() ? UInt(16) : Float(32)); }

  void generate() {
    const int C = channels, H = heads, D = head_dim, R = rotary_dim;
    if (D < 1 || C % D != 0 || H < 1 || H * D > C)
      throw std::invalid_argument("rotary: channels must be whole heads, at least `heads` of them");
    if (R < 2 || R > D || R % 2 != 0) throw std::invalid_argument("rotary: rotary_dim must be even, 2..head_dim");
    const bool cpu = !get_target().has_gpu_feature() && !using_autoscheduler();
    const RotaryMath rope(R, D, float(rotary_theta), rotary_interleaved, rotary_positions, cpu);

    Var d("d"), h("h"), m("m"), c("c");
    // The rows by (feature in head, head): turned heads first, the rest copied.
    // Each row's cos / sin per frequency, once per row (every head shares them).
    Var f("f");
    Func row_cos("row_cos"), row_sin("row_sin"), turned("turned");
    row_cos(f, m) = rope.cos(f, positions(m));
    row_sin(f, m) = rope.sin(f, positions(m));
    Expr turn = rope.rotate_by([&](Expr e) { return x(h * D + e, m); }, d, [&](Expr fc) { return row_cos(fc, m); },
                               [&](Expr fc) { return row_sin(fc, m); });
    turned(d, h, m) = select(h < H, turn, x(h * D + d, m));
    Expr v = turned(c % D, c / D, m);
    out(c, m) = bf16_out() ? to_half_bits(v, half) : v;

    x.dim(0).set_bounds(0, C);
    out.dim(0).set_bounds(0, C);
    out.dim(1).set_min(0);
    x.dim(1).set_min(0);
    positions.dim(0).set_min(0);

    if (using_autoscheduler()) {
      x.set_estimates({{0, C}, {0, 128}});
      positions.set_estimates({{0, 128}});
      out.set_estimates({{0, C}, {0, 128}});
      return;
    }
    if (!cpu) {
      // One thread per feature, a block per group of rows.
      Var co("co"), ci("ci"), mo("mo"), mi("mi");
      out.gpu_tile(c, m, co, mo, ci, mi, std::min(C, 64), 4, TailStrategy::GuardWithIf);
      return;
    }
    // Rows in parallel tasks; each row's heads turned in vectors (regions of R/2 features,
    // rope.vectorize), then stored feature by feature (c split into whole heads: c % D and
    // c / D fold away).
    Var ch("ch"), cd("cd"), mo("mo");
    const int vec = get_target().has_feature(Target::AVX512) ? 16 : 8;
    out.split(m, mo, m, 8, TailStrategy::GuardWithIf).parallel(mo);
    out.split(c, ch, cd, D, TailStrategy::RoundUp).vectorize(cd, pow2_divisor(D, vec));
    rope.vectorize(turned.compute_at(out, m), d, vec);
    for (Func t : {row_cos, row_sin}) t.compute_at(out, m).vectorize(f, pow2_divisor(R / 2, vec));
  }
};

}  // namespace halformer

HALIDE_REGISTER_GENERATOR(halformer::Rotary, rotary)
