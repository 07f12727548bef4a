// linear_int8 (+ _residual, _gated): the int8 form of generators/linear.cpp, the same
// contract with 8-bit weights. Two forms, chosen by the target (halformer/packed_layout.h,
// int8_byte_dot_product), the weights in the layout of that form:
//
// Pairs (AVX2; AVX-512 without VNNI), int16 activations, symmetric per row:
//   xq(k, m)  = round(x(k, m) * L / max_k |x(k, m)|)                     int16, at run time
//   acc(n, m) = sum_k xq(k, m) * wq(n, k)                                exact, in int32
//   out(n, m) = epilogue(acc(n, m) * sx(m) * sw(n) + b(n))               sx = max|x| / L
// L = int8_activation_levels(K) (32767 up to K = 4128). The pair multiply-add (vpmaddwd,
// vpdpwssd) takes int16 operands, so activations keep 16 bits for free.
//
// Quads (AVX-512 VNNI: Zen 4/5, Sapphire Rapids), uint8 activations with a zero point:
//   lo(m), hi(m) = min(0, min_k x), max(0, max_k x);  sx(m) = (hi - lo) / 255
//   zp(m)     = round(-lo / sx)                                          in [0, 255]
//   xq(k, m)  = clamp(round(x(k, m) / sx) + zp(m), 0, 255)               uint8, at run time
//   acc(n, m) = sum_k xq(k, m) * wq(n, k) - zp(m) * sum_k wq(n, k)       exact, in int32
//   out(n, m) = epilogue(acc(n, m) * sx(m) * sw(n) + b(n))
// vpdpbusd multiplies uint8 by int8 four at a time into each int32 lane: twice
// vpdpwssd's rate. Asymmetric, because 8 bits are scarce: a row's levels span its own
// range (post-GELU rows are mostly positive), not +-max|x| (accuracy measured:
// docs/performance-log.md#linear-int8, docs/precision.md).
//
// Weights are quantized per output channel at load (runtime/weight_packing.cpp,
// halformer/packed_layout.h: quantize_row_int8) and stored as panels of kInt8Panel
// features whose K is walked in groups of G (2 or 4): w(j, n % kInt8Panel, panel *
// groups + k / G), j = k % G, so that the product of a k group is one multiply-add per
// int32 lane. The weights travel as bytes (4x fewer than fp32: decode is
// bandwidth-bound), the activations are quantized once per call. (The panels are one 3-D
// buffer of rows, not a 4th dimension: Halide's AMX matcher wants the panel's offset
// folded into the row index.)
//
// AMX (Sapphire Rapids and later: Halide's avx512_sapphirerapids), more than 8 rows: the
// same quads, multiplied 16 rows x 16 features x 64 (or 32) k at a time by tdpbusd in tile
// registers (a panel's 16 features over 16 k groups are exactly one 1 KB B tile); the sum
// is the same integer, so the output is bit-identical to vpdpbusd's. Fewer rows keep
// vpdpbusd (decode streams weights: a 16-row tile would mostly multiply padding). The
// runtime asks Linux for the tile state first (request_amx_tile_state).
//
// The per-channel scale rides in the bias input, b(n, 0) = bias, b(n, 1) = weight scale
// (quads: b(n, 2) = the channel's sum of quantized weights), so that the kernel's
// signature is linear's (model_config.h's LinearFn): the runtime hands either kind the
// same arguments.
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
  GP<PointwiseFn> activation{"activation", PointwiseFn::None, kPointwiseFnNames};
  // true: int16 pairs even where the target has vpdpbusd (precision_overrides.int16_activations).
  GP<bool> int16_activations{"int16_activations", false};
  // Schedule knobs, as linear's (0 = the target's tile, schedules/cpu_matmul.h); vec
  // counts int32 lanes.
  GP<int> vec{"vec", 0};
  GP<int> tile_n{"tile_n", 0};
  GP<int> tile_m{"tile_m", 0};
  GP<bool> parallel{"parallel", true};
  // true: the output stored as bf16 bits (uint16), as linear's out_bf16.
  GP<bool> out_bf16{"out_bf16", false};
  // The 16-bit format of out_bf16 (common.h kHalfNames): bf16, or fp16 (an fp16 cache).
  GP<Precision> half{"half", Precision::Bf16, kHalfNames};
  // true: AMX tiles for more than 8 rows where the target has them (see above).
  GP<bool> amx{"amx", true};

  In<Buffer<float, 2>> x{"x"};         // (K, M)
  In<Buffer<int8_t, 3>> w{"w"};        // (G, kInt8Panel, groups * panels)
  In<Buffer<float, 2>> b{"b"};         // (N, 2 or 3): bias, weight scale (, channel sum)
  Out<Buffer<void, 2>> out{"out"};     // (N, M): float, or uint16 (bf16 bits) with out_bf16
  In<Buffer<float, 2>>* residual = nullptr;  // (N, M), _residual / _gated only
  static constexpr bool kResidual = kEpilogue != Epilogue::None;

  void configure() {
    out.set_type(out_bf16 ? UInt(16) : Float(32));
    if (kResidual) residual = this->template add_input<Buffer<float, 2>>("residual");
  }

  void generate() {
    const int K = in_features, N = out_features;
    const int G = int8_group(this->get_target().to_string(), int16_activations);
    const bool quads = G == kInt8Quad;
    if (quads && K > kInt8QuadMaxK)
      throw std::runtime_error("linear_int8: in_features " + std::to_string(K) + " exceeds " +
                               std::to_string(kInt8QuadMaxK) + ", where uint8 x int8 sums could overflow int32");
    const int groups = int8_groups(K, G), P = int8_panel_count(N);
    Var n("n"), m("m"), k("kk"), j("j"), l("l");
    Expr M = x.dim(1).extent();

    // Per-row range, in `lanes` partial extremes first (vectorised), min and max in one
    // pass: max |x| (pairs), or min and max including 0 (quads).
    const int lanes = this->get_target().has_feature(Target::AVX512) ? 16 : 8;
    Func xc("x_clamped"), part("part_range"), row("row_range");
    Func inv("inv_scale"), zp("zero_point"), xq("x_quantized");
    xc(k, m) = x(clamp(k, 0, K - 1), min(m, M - 1));
    RDom rp(0, (K + lanes - 1) / lanes, "rp"), rl(0, lanes, "rl");
    Expr xr = xc(rp * lanes + l, m);
    part(l, m) = Tuple(0.0f, 0.0f);
    part(l, m) = Tuple(min(part(l, m)[0], xr), max(part(l, m)[1], quads ? xr : abs(xr)));
    row(m) = Tuple(minimum(part(rl, m)[0]), maximum(part(rl, m)[1]));
    Expr row_lo = row(m)[0], row_hi = row(m)[1];
    Expr kk = k * G + j;
    Expr scale_x;  // sx(m), the epilogue's per-row scale
    if (quads) {
      Expr range = row_hi - row_lo;
      inv(m) = select(range > 0.0f, 255.0f / range, 0.0f);
      zp(m) = cast<int32_t>(round(-row_lo * inv(m)));
      // k past K: any value (its weights are 0).
      xq(j, k, m) = cast<uint8_t>(clamp(cast<int32_t>(round(xc(kk, m) * inv(m))) + zp(m), 0, 255));
      scale_x = (row_hi - row_lo) * (1.0f / 255.0f);
    } else {
      const int levels = int8_activation_levels(K);
      inv(m) = select(row_hi > 0.0f, float(levels) / row_hi, 0.0f);
      // Quantized activations as int16 pairs (the operand vpmaddwd wants); k past K is 0.
      xq(j, k, m) = select(kk < K, cast<int16_t>(round(xc(kk, m) * inv(m))), cast<int16_t>(0));
      scale_x = row_hi * (1.0f / float(levels));
    }

    RDom r(0, G, 0, groups, "r");
    Func wf("w_func"), acc("acc");
    // A last register tile that reaches past N (its extra outputs are not stored) reads a
    // clamped panel index (panels are zero-padded) and bias / scale.
    const MatmulKnobs knobs = matmul_knobs_for(this->get_target(), MatmulKind::Int8, MatmulKnobs{vec, tile_n, tile_m, parallel});
    const int amx_k = quads ? amx_k_step(int8_groups(K, G) * G, G) : 0;
    const bool use_amx = amx_k > 0 && amx && amx_tiles(this->get_target()) && !this->using_autoscheduler();
    const bool overhang = matmul_widths(N, knobs, kInt8Panel, K).overhangs(N);
    Expr panel = overhang ? min(n / kInt8Panel, P - 1) : n / kInt8Panel;
    Expr wv = w(j, n % kInt8Panel, panel * groups + k);
    wf(j, n, k) = quads ? wv : cast<int16_t>(wv);
    // Quads: the zero point's correction, zp(m) * sum_k wq(n, k), starts the sum rather than
    // ending it (the same integer). A zero start was stored to the stack by a memset call
    // per register tile: 5% of a 1024 x 512 x 2048 call on Zen 4 (docs/performance-log.md#linear-int8).
    Expr nc = overhang ? min(n, N - 1) : n, mc = min(m, M - 1);
    Expr zp_sum = quads ? zp(mc) * cast<int32_t>(b(nc, 2)) : Expr(0);
    acc(n, m) = -zp_sum;
    acc(n, m) += cast<int32_t>(xq(r.x, r.y, m)) * cast<int32_t>(wf(r.x, n, r.y));

    // AMX: the same sum over k = 0 .. groups * 4 (one flat reduction, as the tile matcher
    // wants it), accumulated in a tile register and stored to a 16 x 16 block.
    Func acc_amx("acc_amx"), acc_block("acc_block");
    RDom ra(0, groups * G, "ra");
    Expr amx_rows = M > kAmxMinRows;
    if (use_amx) {
      acc_amx(n, m) = 0;
      acc_amx(n, m) += cast<int32_t>(xq(ra % G, ra / G, m)) *
                       cast<int32_t>(w(ra % G, n % kInt8Panel, (n / kInt8Panel) * groups + ra / G));
      acc_block(n, m) = acc_amx(n, m);
    }
    Expr sum = use_amx ? select(amx_rows, acc_block(n, m) - zp_sum, acc(n, m)) : acc(n, m);
    // In source order ((hi - lo) / 255 first, then the channel's scale): left to LLVM, the
    // product was reassociated differently from one kernel version to the next.
    Expr scale = strict_float(substitute(m.name(), mc, scale_x) * b(nc, 1));
    Expr y = apply_epilogue(kEpilogue, apply_pointwise(activation, cast<float>(sum) * scale + b(nc, 0)),
                            kResidual ? (*residual)(n, m) : Expr());
    out(n, m) = out_bf16 ? to_half_bits(y, half) : y;

    // ---- shapes the runtime must honour
    const int b_cols = int8_bias_columns(G);
    x.dim(0).set_bounds(0, K);
    x.dim(1).set_min(0);
    w.dim(0).set_bounds(0, G).dim(1).set_bounds(0, kInt8Panel).set_stride(G);
    w.dim(2).set_bounds(0, groups * P).set_stride(G * kInt8Panel);
    b.dim(0).set_bounds(0, N).dim(1).set_bounds(0, b_cols).set_stride(N);
    out.dim(0).set_bounds(0, N);
    out.dim(1).set_min(0);

    // ---- schedule
    if (this->using_autoscheduler()) {
      x.set_estimates({{0, K}, {0, 128}});
      w.set_estimates({{0, G}, {0, kInt8Panel}, {0, groups * P}});
      b.set_estimates({{0, N}, {0, b_cols}});
      if (kResidual) residual->set_estimates({{0, N}, {0, 128}});
      out.set_estimates({{0, N}, {0, 128}});
      return;
    }
    // Activations quantized once per call (rows in parallel), before the matmul's tiles.
    // (The row ranges are also the epilogue's scales: their own root pass, rows in
    // parallel, min and max in one pass; docs/performance-log.md#linear-int8.)
    Var mo("mo"), jk("jk");
    row.compute_root().split(m, mo, m, 8, TailStrategy::GuardWithIf);
    if (parallel) row.parallel(mo);
    part.compute_at(row, m).vectorize(l);
    part.update().vectorize(l);
    if (quads) zp.compute_root();
    // A row's groups quantized as one dense run (j, k fused), 32 bytes a vector.
    xq.compute_root()
        .fuse(j, k, jk)
        .split(m, mo, m, 8, TailStrategy::GuardWithIf)
        .vectorize(jk, quads ? 32 : 16, TailStrategy::GuardWithIf);
    if (parallel) xq.parallel(mo);
    inv.compute_root();
    if (use_amx) schedule_amx_matmul(out, acc_block, acc_amx, n, m, ra, N, amx_rows, parallel, amx_k);
    // The k group is reduced inside each lane: vectorising r.x (atomic, as the group's
    // sum is associative in int32) is what turns into vpmaddwd / vpdpwssd / vpdpbusd.
    schedule_cpu_matmul(out, acc, n, m, r.y, N, M, knobs, kInt8Panel, K, &r.x);
  }
};

}  // namespace halformer

HALIDE_REGISTER_GENERATOR(halformer::LinearInt8<halformer::Epilogue::None>, linear_int8)
HALIDE_REGISTER_GENERATOR(halformer::LinearInt8<halformer::Epilogue::AddResidual>, linear_int8_residual)
HALIDE_REGISTER_GENERATOR(halformer::LinearInt8<halformer::Epilogue::MultiplyGate>, linear_int8_gated)
