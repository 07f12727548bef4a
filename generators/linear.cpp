// linear: out(n, m) = act(sum_k x(k, m) * w(n, k) + b(n)) [+ residual(n, m)]
// linear_gated: out(n, m) = (sum_k x(k, m) * w(n, k) + b(n)) * gate(n, m), the "up"
//   projection of a gated feed-forward (SwiGLU, GeGLU), whose gate act(x W_gate) a plain
//   linear with the activation computed first; gate arrives as the `residual` input.
//
// The workhorse of every Transformer layer (QKV / output projections, feed-forward,
// vocabulary projection). Sizes K and N are baked in at generation time so that the
// schedule can pick exact tiles; the row count M (batch * time) is dynamic, down to 1
// (decode). Fusing bias + activation + residual into the epilogue saves a full pass
// over the activations for each of them.
#include "common.h"
#include "halformer/packed_layout.h"
#include "schedules/cpu_matmul.h"
#include "schedules/gpu.h"

namespace halformer {
using namespace Halide;

// kBf16: linear_bf16 (+ _residual, _gated), the same kernel over weights stored as bf16
// (the upper 16 bits of each fp32, rounded at load: halformer/packed_layout.h). Half the
// weight bytes of fp32: decode, bound by streaming the weights, reads half as much.
// * On a CPU with a bf16 dot product (bf16_dot_product: AVX-512 BF16) the activations
//   are rounded to bf16 too, once per call, and each fp32 lane sums a pair of bf16
//   products per instruction (vdpbf16ps, K paired in the weights): twice the FMA's rate.
//   With AMX (Sapphire Rapids and later: amx_tiles) calls of more than 8 rows multiply
//   16 rows x 16 features x 32 (or 16) k at a time in tile registers (tdpbf16ps; a 16-feature
//   panel's 16 pairs of k are one 1 KB tile), fp32 sums as vdpbf16ps's (another order).
//   Paired weights are typed bfloat16 (the tile matcher wants bf16 loads): the runtime
//   hands them over as such (halformer/packed_layout.h, bf16_weight_type).
// * Elsewhere each weight is widened in registers by a 16-bit shift and the arithmetic
//   is fp32's.
template <Epilogue kEpilogue, bool kBf16 = false>
class Linear : public Generator<Linear<kEpilogue, kBf16>> {
 public:
  template <typename T> using GP = GeneratorParam<T>;
  template <typename T> using In = typename Generator<Linear<kEpilogue, kBf16>>::template Input<T>;
  template <typename T> using Out = typename Generator<Linear<kEpilogue, kBf16>>::template Output<T>;
  // bf16: uint16 bits, or bfloat16 where K is paired (configure()).
  using WeightBuffer = std::conditional_t<kBf16, Buffer<void, 3>, Buffer<float, 3>>;

  // Algorithm parameters.
  GP<int> in_features{"in_features", 64};    // K
  GP<int> out_features{"out_features", 64};  // N
  GP<PointwiseFn> activation{"activation", PointwiseFn::None, kPointwiseFnNames};
  // Schedule knobs (the tuner sets these; schedules/cpu_matmul.h). 0 = the register tile
  // chosen for the target's ISA (matmul_knobs_for: AVX-512 6 rows x 4 vectors of 16, AVX2
  // 6 rows x 16).
  GP<int> vec{"vec", 0};
  GP<int> tile_n{"tile_n", 0};
  GP<int> tile_m{"tile_m", 0};
  GP<bool> parallel{"parallel", true};
  // true: the output is stored as bf16 bits (uint16) on the CPU -- the projections that
  // write a bf16 attention cache (docs/precision.md); GPU targets keep fp32.
  GP<bool> out_bf16{"out_bf16", false};
  // The 16-bit format of out_bf16 (common.h kHalfNames): bf16, or fp16 (an fp16 cache).
  GP<Precision> half{"half", Precision::Bf16, kHalfNames};
  // The weights' panel width; 0: the target's (weight_panel). Set only by the tuner, whose
  // CPU reference for a GPU kernel reads the GPU's layout.
  GP<int> panel_width{"panel", 0};
  // GPU (schedules/gpu.h): a block of gpu_tile_n x gpu_tile_m outputs, gpu_reg_n x
  // gpu_reg_m of them per thread; calls of at most gpu_split_rows rows: gpu_slice_n
  // outputs x 16 K slices per block.
  GP<int> gpu_tile_n{"gpu_tile_n", 64};
  GP<int> gpu_tile_m{"gpu_tile_m", 16};
  GP<int> gpu_reg_n{"gpu_reg_n", 4};
  GP<int> gpu_reg_m{"gpu_reg_m", 4};
  GP<int> gpu_slice_n{"gpu_slice_n", 32};
  GP<int> gpu_split_rows{"gpu_split_rows", 256};
  GP<int> gpu_unroll_k{"gpu_unroll_k", 4};
  // Many-row path: K cut into slices of about this many steps (at most kGpuMaxKSplit),
  // each walked by its own thread and summed through shared memory; 0: every thread
  // walks all of K. 512: K > 512 split, shorter chains where few long tiles would leave
  // the GPU latency-bound (docs/performance-log.md#linear).
  GP<int> gpu_k_slice{"gpu_k_slice", 512};
  // Many-row path: K walked in chunks of this many steps, each chunk's activations and
  // weights loaded into registers as vectors before its FMAs (schedules/gpu.h); 0, or a
  // chunk that does not divide the (slice's) K: loads per step, gpu_unroll_k unrolled.
  // 8: fewer load instructions through L1 (docs/performance-log.md#linear).
  GP<int> gpu_stage_k{"gpu_stage_k", 8};
  // bf16 with K paired: AMX tiles for more than 8 rows where the target has them.
  GP<bool> amx{"amx", true};

  In<Buffer<float, 2>> x{"x"};        // (K, M)
  // fp32 (panel, K, panels); bf16 (pair, panel, K / pair * panels): halformer/packed_layout.h
  In<WeightBuffer> w{"w"};
  In<Buffer<float, 1>> b{"b"};        // (N)
  Out<Buffer<void, 2>> out{"out"};    // (N, M): float, or uint16 (bf16 bits) with out_bf16
  In<Buffer<float, 2>>* residual = nullptr;  // (N, M), linear_residual / linear_gated only
  static constexpr bool kResidual = kEpilogue != Epilogue::None;

  bool bf16_out() const { return out_bf16 && !this->get_target().has_gpu_feature(); }
  bool gpu_schedule() const { return this->get_target().has_gpu_feature() && !this->using_autoscheduler(); }
  // bf16 pairs of K (a CPU with a bf16 dot product).
  bool paired() const {
    return kBf16 && !gpu_schedule() && weight_layout(this->get_target().to_string()).bf16_pairs;
  }
  void configure() {
    out.set_type(bf16_out() ? UInt(16) : Float(32));
    if (kBf16) w.set_type(bf16_weight_type(paired()));
    if (kResidual) residual = this->template add_input<Buffer<float, 2>>("residual");
  }

  void generate() {
    const int K = in_features, N = out_features;
    Var n("n"), m("m"), k("kk"), s("s");
    RDom r(0, K, "k");

    // Rows beyond M are computed by the last partial tile and discarded: clamp reads.
    Expr M = x.dim(1).extent();
    const bool gpu = gpu_schedule();
    // bf16 pairs: K walked as `pairs` pairs (the last one zero-padded when K is odd).
    const WeightLayout layout = weight_layout(this->get_target().to_string());
    const bool paired = this->paired();
    const int pairs = bf16_pairs_of(K);
    const int panel = panel_width > 0 ? int(panel_width) : kBf16 ? layout.bf16_panel() : layout.panel;
    const int P = panel_count(N, panel);
    Func xc("x_clamped"), wf("w_func");
    xc(k, m) = x(k, min(m, M - 1));
    // A last tile that reaches past N (whole register tiles keep the loads dense vectors;
    // its extra outputs are not stored) reads a clamped panel index (panels are zero-padded
    // to whole panels already) and bias. Only then: a clamped bias is a gather.
    const MatmulKnobs knobs = matmul_knobs_for(this->get_target(), MatmulKind::Float, MatmulKnobs{vec, tile_n, tile_m, parallel});
    // Bytes of one output feature's weights (bf16: 16-bit).
    const int feature_bytes = K * (kBf16 ? 2 : 4);
    const bool overhang = gpu || matmul_widths(N, knobs, panel, feature_bytes).overhangs(N);
    Expr wpanel = overhang ? min(n / panel, P - 1) : n / panel;
    // bf16 panels are rows of one 3-D buffer: panel p's k (pair) step j is row p * steps + j
    // (the AMX tile matcher wants the panel's offset in the row index, not a 4th dimension).
    const int steps = paired ? pairs : K;
    Func wpair("w_pair"), xpair("x_bf16");
    RDom rp(0, kBf16Pair, 0, pairs, "rp");
    if (paired) {
      // The activations rounded to bf16, zero past K.
      xpair(k, m) = reinterpret(BFloat(16), select(k < K, to_bf16_bits(xc(min(k, K - 1), m)), cast<uint16_t>(0)));
      wpair(s, n, k) = w(s, n % panel, wpanel * steps + k);
    } else if (kBf16) {
      wf(n, k) = from_bf16_bits(w(0, n % panel, wpanel * steps + k));
    } else {
      wf(n, k) = w(n % panel, k, wpanel);
    }
    Func bc("b_clamped");
    bc(n) = b(overhang ? min(n, N - 1) : n);

    // The GPU's two paths (the kernel is specialized on this; schedules/gpu.h).
    Expr few_rows = M <= gpu_split_rows;
    const GpuMatmulKnobs gpu_knobs{gpu_tile_n, gpu_tile_m, gpu_reg_n, gpu_reg_m, gpu_slice_n, gpu_split_rows, gpu_unroll_k};
    const GpuKSplit gpu_slices = gpu_k_split(K, gpu_k_slice, gpu_knobs);
    // Register staging (gpu_stage_k) needs whole chunks of unguarded K steps (a guarded
    // last slice reads clamped K).
    const bool staged = gpu && gpu_stage_k > 1 && K % gpu_slices.count == 0 && gpu_slices.steps % gpu_stage_k == 0;
    const int gpu_stage = staged ? int(gpu_stage_k) : 0;
    const int ks = (K + kGpuSlices - 1) / kGpuSlices;  // GPU few-row path: K per slice
    // With the many-row K split both paths keep tiles in shared memory, and both are
    // compiled into each specialization's kernel: the other path's slice count is 0 there,
    // so its shared tile is empty instead of adding to the block's shared memory.
    const bool both_shared = gpu_slices.count > 1;
    RDom rs(0, ks, "ks"), ru(0, both_shared ? select(few_rows, kGpuSlices, 0) : Expr(kGpuSlices), "u");
    RDom rsum(0, both_shared ? select(few_rows, 0, gpu_slices.count) : Expr(1), "sk");
    Func acc("acc");
    Func big("acc_big"), part("acc_part"), small("acc_small"), bslice("acc_slice"), bshared("acc_slices");
    RVar big_k = r.x;
    if (paired) {
      // A bf16 x bf16 product is exact in fp32: the pair sum is what vdpbf16ps computes.
      acc(n, m) = bc(n);
      acc(n, m) += cast<float>(xpair(kBf16Pair * rp.y + rp.x, m)) * cast<float>(wpair(rp.x, n, rp.y));
    } else if (!gpu) {
      acc(n, m) = bc(n);
      acc(n, m) += xc(r, m) * wf(n, r);
    } else {
      // GPU: two schedules picked at run time by the row count (schedules/gpu.h).
      // Many rows: register tiles, each thread walking all of K or one of K's slices.
      if (gpu_slices.count > 1) {
        RDom rb(0, gpu_slices.steps, "kb");
        Expr kq = s * gpu_slices.steps + rb;
        bslice(n, m, s) = 0.0f;
        if (K % gpu_slices.count == 0)
          bslice(n, m, s) += xc(kq, m) * wf(n, kq);
        else
          bslice(n, m, s) += select(kq < K, xc(clamp(kq, 0, K - 1), m) * wf(n, clamp(kq, 0, K - 1)), 0.0f);
        bshared(n, m, s) = bslice(n, m, s);
        big(n, m) = bc(n);
        big(n, m) += bshared(n, m, rsum);
        big_k = rb.x;
      } else {
        big(n, m) = bc(n);
        big(n, m) += xc(r, m) * wf(n, r);
      }
      // Few rows: K cut into kGpuSlices slices summed by parallel threads, then added.
      Expr kk = s * ks + rs;
      part(n, m, s) = 0.0f;
      part(n, m, s) += select(kk < K, xc(min(kk, K - 1), m) * wf(n, min(kk, K - 1)), 0.0f);
      small(n, m) = bc(n);
      small(n, m) += part(n, m, ru);
      acc(n, m) = select(few_rows, small(n, m), big(n, m));
    }

    // AMX: the same sum over k = 0 .. 2 * pairs in one flat reduction (as the tile matcher
    // wants it), accumulated in a tile register and stored to a 16 x 16 block.
    const int amx_k = paired && panel == kAmxTile ? amx_k_step(pairs * kBf16Pair, kBf16Pair) : 0;
    const bool use_amx = amx_k > 0 && amx && amx_tiles(this->get_target()) && !this->using_autoscheduler();
    Func acc_amx("acc_amx"), acc_block("acc_block");
    RDom ra(0, pairs * kBf16Pair, "ra");
    Expr amx_rows = M > kAmxMinRows;
    if (use_amx) {
      acc_amx(n, m) = 0.0f;
      acc_amx(n, m) += cast<float>(xpair(ra, m)) * cast<float>(w(ra % kBf16Pair, n % panel, (n / panel) * steps + ra / kBf16Pair));
      acc_block(n, m) = acc_amx(n, m);
    }
    Expr acc_nm = use_amx ? select(amx_rows, acc_block(n, m) + bc(n), acc(n, m)) : acc(n, m);
    Expr y = apply_epilogue(kEpilogue, apply_pointwise(activation, acc_nm), kResidual ? (*residual)(n, m) : Expr());
    out(n, m) = bf16_out() ? to_half_bits(y, half) : y;

    // ---- shapes the runtime must honour
    x.dim(0).set_bounds(0, K);
    // Staged activations load as float4 along K: rows K apart (the runtime's activations
    // are dense) from a 16-byte aligned start.
    if (gpu_stage > 1) x.set_host_alignment(16).dim(1).set_stride(K);
    if (kBf16) {
      const Bf16WeightShape ws = bf16_weight_shape(K, N, panel, paired);
      w.dim(0).set_bounds(0, ws.pair).dim(1).set_bounds(0, panel).set_stride(ws.pair);
      w.dim(2).set_bounds(0, ws.steps * P).set_stride(ws.pair * panel);
    } else {
      w.dim(0).set_bounds(0, panel).dim(1).set_bounds(0, K).set_stride(panel);
      w.dim(2).set_bounds(0, P).set_stride(panel * K);
    }
    out.dim(0).set_bounds(0, N);
    x.dim(1).set_min(0);
    out.dim(1).set_min(0);
    b.dim(0).set_bounds(0, N);

    // ---- schedule
    if (this->using_autoscheduler()) {
      x.set_estimates({{0, K}, {0, 128}});
      if (kBf16) {
        const Bf16WeightShape ws = bf16_weight_shape(K, N, panel, paired);
        w.set_estimates({{0, ws.pair}, {0, panel}, {0, ws.steps * P}});
      } else {
        w.set_estimates({{0, panel}, {0, K}, {0, P}});
      }
      b.set_estimates({{0, N}});
      if (kResidual) residual->set_estimates({{0, N}, {0, 128}});
      out.set_estimates({{0, N}, {0, 128}});
      return;
    }
    if (gpu) {
      GpuMatmulKnobs knobs_split = gpu_knobs;
      knobs_split.k_split = gpu_slices.count;
      knobs_split.stage_k = gpu_stage;
      schedule_gpu_matmul(out, GpuMatmulFuncs{big, part, small, bslice, bshared, xc, wf, k}, n, m, s, big_k, rs,
                          rsum.x, few_rows, knobs_split);
      return;
    }
    if (paired) {
      // Activations rounded once per call (rows in parallel), before the matmul's tiles;
      // the pair is reduced inside each lane: vectorising rp.x (atomic) makes vdpbf16ps.
      Var mo("mo");
      xpair.compute_root().split(m, mo, m, 8, TailStrategy::GuardWithIf).vectorize(k, 16, TailStrategy::GuardWithIf);
      if (parallel) xpair.parallel(mo);
      if (use_amx) schedule_amx_matmul(out, acc_block, acc_amx, n, m, ra, N, amx_rows, parallel, amx_k);
      schedule_cpu_matmul(out, acc, n, m, rp.y, N, M, knobs, panel, feature_bytes, &rp.x);
      return;
    }
    schedule_cpu_matmul(out, acc, n, m, r.x, N, M, knobs, panel, feature_bytes);
  }
};

// (One name each: the registration macro takes no template argument lists.)
using LinearBf16 = Linear<Epilogue::None, true>;
using LinearBf16Residual = Linear<Epilogue::AddResidual, true>;
using LinearBf16Gated = Linear<Epilogue::MultiplyGate, true>;

}  // namespace halformer

HALIDE_REGISTER_GENERATOR(halformer::Linear<halformer::Epilogue::None>, linear)
HALIDE_REGISTER_GENERATOR(halformer::Linear<halformer::Epilogue::AddResidual>, linear_residual)
HALIDE_REGISTER_GENERATOR(halformer::Linear<halformer::Epilogue::MultiplyGate>, linear_gated)
HALIDE_REGISTER_GENERATOR(halformer::LinearBf16, linear_bf16)
HALIDE_REGISTER_GENERATOR(halformer::LinearBf16Residual, linear_bf16_residual)
HALIDE_REGISTER_GENERATOR(halformer::LinearBf16Gated, linear_bf16_gated)
