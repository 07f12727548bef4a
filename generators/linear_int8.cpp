// linear_int8 (+ _residual, _gated): the int8 form of generators/linear.cpp, the same
// contract with 8-bit weights.
//
//   xq(k, m)  = round(x(k, m) * L / max_k |x(k, m)|)         per-row symmetric int16, at run time
//   acc(n, m) = sum_k xq(k, m) * wq(n, k)                    exact, in int32
//   out(n, m) = epilogue(acc(n, m) * sx(m) * sw(n) + b(n))   sx = max|x| / L, sw per channel
//
// L = int8_activation_levels(K) (32767 up to K = 4128): the pair multiply-add takes int16
// operands, so activations keep 16 bits for free; only the weights are 8-bit (8-bit
// activations cost all-MiniLM-L6-v2 a worst cosine of 0.981 against fp32; 16-bit: see
// docs/precision.md).
//
// Weights are quantized per output channel at load (runtime/weights.cpp,
// halformer/packed_layout.h: quantize_row_int8) and stored as panels of kInt8Panel
// features whose K is walked in groups of kInt8Group: w(j, n % kInt8Panel, k / kInt8Group,
// panel), j = k % kInt8Group. Both operands are signed (range +-127), so the product of a
// k group is one multiply-add per lane: AVX2's vpmaddwd (two int16 products summed into
// int32) after sign-extending the bytes. The weights travel as bytes (4x fewer than fp32:
// decode is bandwidth-bound), the activations are quantized once per call.
//
// The per-channel scale rides in the bias input, b(n, 0) = bias, b(n, 1) = weight scale,
// so that the kernel's signature is linear's (model_config.h's LinearFn): the runtime
// hands either kind the same arguments.
//
// CPU only: the spec rejects precision int8 with GPU targets (docs/precision.md).
#include "common.h"
#include "halformer/packed_layout.h"
#include "schedules/cpu_matmul.h"

namespace halformer {
using namespace Halide;

template <Epilogue kEpilogue>
class LinearInt8 : public Generator<LinearInt8<kEpilogue>> {
 public:
  template <typename T> using GP = GeneratorParam<T>;
  template <typename T> using In = typename Generator<LinearInt8<kEpilogue>>::template Input<T>;
  template <typename T> using Out = typename Generator<LinearInt8<kEpilogue>>::template Output<T>;

  GP<int> in_features{"in_features", 64};    // K
  GP<int> out_features{"out_features", 64};  // N
  GP<Act> activation{"activation", Act::None, kActNames};
  // Schedule knobs, as linear's (0 = the target's tile, schedules/cpu_matmul.h); vec
  // counts int32 lanes.
  GP<int> vec{"vec", 0};
  GP<int> tile_n{"tile_n", 0};
  GP<int> tile_m{"tile_m", 0};
  GP<bool> parallel{"parallel", true};

  In<Buffer<float, 2>> x{"x"};         // (K, M)
  In<Buffer<int8_t, 4>> w{"w"};        // (kInt8Group, kInt8Panel, groups, panels)
  In<Buffer<float, 2>> b{"b"};         // (N, 2): bias, weight scale
  Out<Buffer<float, 2>> out{"out"};    // (N, M)
  In<Buffer<float, 2>>* residual = nullptr;  // (N, M), _residual / _gated only
  static constexpr bool kResidual = kEpilogue != Epilogue::None;

  void configure() {
    if (kResidual) residual = this->template add_input<Buffer<float, 2>>("residual");
  }

  void generate() {
    const int K = in_features, N = out_features, G = kInt8Group;
    const int groups = int8_groups(K), P = int8_panel_count(N);
    Var n("n"), m("m"), k("kk"), j("j"), l("l");
    Expr M = x.dim(1).extent();

    // Per-row scale: max |x| over the row, in `lanes` partial maxima first (vectorised).
    const int lanes = 8;
    Func xc("x_clamped"), part_max("part_max"), row_max("row_max"), inv("inv_scale"), xq("x_quantized");
    xc(k, m) = x(clamp(k, 0, K - 1), min(m, M - 1));
    RDom rp(0, (K + lanes - 1) / lanes, "rp"), rl(0, lanes, "rl");
    part_max(l, m) = 0.0f;
    part_max(l, m) = max(part_max(l, m), abs(xc(rp * lanes + l, m)));
    row_max(m) = maximum(part_max(rl, m));
    const int levels = int8_activation_levels(K);
    inv(m) = select(row_max(m) > 0.0f, float(levels) / row_max(m), 0.0f);
    // Quantized activations as int16 pairs (the operand vpmaddwd wants); k past K is 0.
    Expr kk = k * G + j;
    xq(j, k, m) = select(kk < K, cast<int16_t>(round(xc(kk, m) * inv(m))), cast<int16_t>(0));

    RDom r(0, G, 0, groups, "r");
    Func wf("w_func"), acc("acc");
    // A last register tile that reaches past N (its extra outputs are not stored) reads a
    // clamped panel index (panels are zero-padded) and bias / scale.
    const MatmulKnobs knobs = matmul_knobs_for(this->get_target(), true, MatmulKnobs{vec, tile_n, tile_m, parallel});
    const bool overhang = matmul_widths(N, knobs, kInt8Panel).overhangs(N);
    wf(j, n, k) = cast<int16_t>(w(j, n % kInt8Panel, k, overhang ? min(n / kInt8Panel, P - 1) : n / kInt8Panel));
    acc(n, m) = 0;
    acc(n, m) += cast<int32_t>(xq(r.x, r.y, m)) * cast<int32_t>(wf(r.x, n, r.y));

    Expr nc = overhang ? min(n, N - 1) : n;
    Expr scale = row_max(min(m, M - 1)) * (1.0f / float(levels)) * b(nc, 1);
    out(n, m) = apply_epilogue(kEpilogue, apply_activation(activation, cast<float>(acc(n, m)) * scale + b(nc, 0)),
                               kResidual ? (*residual)(n, m) : Expr());

    // ---- shapes the runtime must honour
    x.dim(0).set_bounds(0, K);
    x.dim(1).set_min(0);
    w.dim(0).set_bounds(0, G).dim(1).set_bounds(0, kInt8Panel).set_stride(G);
    w.dim(2).set_bounds(0, groups).set_stride(G * kInt8Panel);
    w.dim(3).set_bounds(0, P).set_stride(G * kInt8Panel * groups);
    b.dim(0).set_bounds(0, N).dim(1).set_bounds(0, 2).set_stride(N);
    out.dim(0).set_bounds(0, N);
    out.dim(1).set_min(0);

    // ---- schedule
    if (this->using_autoscheduler()) {
      x.set_estimates({{0, K}, {0, 128}});
      w.set_estimates({{0, G}, {0, kInt8Panel}, {0, groups}, {0, P}});
      b.set_estimates({{0, N}, {0, 2}});
      if (kResidual) residual->set_estimates({{0, N}, {0, 128}});
      out.set_estimates({{0, N}, {0, 128}});
      return;
    }
    // Activations quantized once per call (rows in parallel), before the matmul's tiles.
    // (The row maxima are also the epilogue's scales: their own small root pass.)
    Var mo("mo");
    row_max.compute_root();
    part_max.compute_at(row_max, m).vectorize(l);
    part_max.update().vectorize(l);
    xq.compute_root().split(m, mo, m, 8, TailStrategy::GuardWithIf).vectorize(k, 8, TailStrategy::GuardWithIf);
    if (parallel) xq.parallel(mo);
    inv.compute_at(xq, m);
    // The k group is reduced inside each lane: vectorising r.x (atomic, as the group's
    // sum is associative in int32) is what turns into vpmaddwd.
    schedule_cpu_matmul(out, acc, n, m, r.y, N, M, knobs, kInt8Panel, &r.x);
  }
};

}  // namespace halformer

HALIDE_REGISTER_GENERATOR(halformer::LinearInt8<halformer::Epilogue::None>, linear_int8)
HALIDE_REGISTER_GENERATOR(halformer::LinearInt8<halformer::Epilogue::AddResidual>, linear_int8_residual)
HALIDE_REGISTER_GENERATOR(halformer::LinearInt8<halformer::Epilogue::MultiplyGate>, linear_int8_gated)
