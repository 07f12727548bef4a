// linear_int4 and linear_q8_0 (+ _residual, _gated): the block-quantized forms of
// generators/linear.cpp, the same contract (model_config.h's LinearFn) with weights in
// blocks of 32 along K (halformer/packed_blocks.h: llama.cpp's Q4_0 and Q8_0, a GGUF
// file's blocks kept as they are).
//
// The arithmetic is llama.cpp's Q4_0 (Q8_0) x Q8_0 dot product, so that the same file
// gives close results in both engines:
//   activations, per row m and block b of 32 k (quantized once per call):
//     dx(b, m) = max_k |x(k, m)| / 127,  xq(k, m) = round-half-away(x / dx) in [-127, 127]
//     (dx then rounded to fp16, as llama.cpp's Q8_0 stores it)
//   out(n, m) = epilogue(sum_b dw(n, b) * dx(b, m) * sum_{k in b} (u(n, k) - zero) * xq(k, m) + bias(n))
// where u is the stored unsigned value: a wv in [0, 15] (zero 8), or a Q8_0 value +
// 128 in [1, 255] (zero 128). vpdpbusd multiplies uint8 by int8, four products summed per
// int32 lane, so the block sum is taken on the unsigned values and corrected once:
// sum (u - zero) xq = sum u xq - zero * sum xq (the second sum per row and block, computed
// with the quantization). Without VNNI Halide lowers the same sums to vpmaddubsw /
// vpmaddwd pairs where they cannot saturate (int4), vpmaddwd on widened values otherwise.
//
// int4 weights travel as 4.5 bits (nibbles + an fp16 scale per 32), q8_0 as 8.5: decode,
// which is bandwidth-bound, reads 7x (3.8x) fewer bytes than fp32. The block sums are
// integers (exact); the float sum over blocks is accumulated in registers like linear's,
// tile by tile (schedules/cpu_matmul.h), each block's int32 sums in registers beside it.
//
// CPU only: the spec rejects precision int4 / q8_0 with GPU targets (docs/precision.md).
#include "common.h"
#include "halformer/packed_blocks.h"
#include "schedules/cpu_matmul.h"

namespace halformer {
using namespace Halide;

// kBits 4: int4 (Q4_0), 8: q8_0 (Q8_0).
template <Epilogue kEpilogue, int kBits>
class LinearBlocks : public Generator<LinearBlocks<kEpilogue, kBits>> {
 public:
  template <typename T> using GP = GeneratorParam<T>;
  template <typename T> using In = typename Generator<LinearBlocks<kEpilogue, kBits>>::template Input<T>;
  template <typename T> using Out = typename Generator<LinearBlocks<kEpilogue, kBits>>::template Output<T>;
  static constexpr BlockFormat kFormat = kBits == 4 ? kInt4Format : kQ8_0Format;

  GP<int> in_features{"in_features", 64};    // K
  GP<int> out_features{"out_features", 64};  // N
  GP<PointwiseFn> activation{"activation", PointwiseFn::None, kPointwiseFnNames};
  // Schedule knobs, as linear's (0 = the target's block tile, schedules/cpu_matmul.h); vec
  // counts int32 lanes.
  GP<int> vec{"vec", 0};
  GP<int> tile_n{"tile_n", 0};
  GP<int> tile_m{"tile_m", 0};
  GP<bool> parallel{"parallel", true};
  // true: the output stored as bf16 bits (uint16), as linear's out_bf16.
  GP<bool> out_bf16{"out_bf16", false};
  // The 16-bit format of out_bf16 (common.h kHalfNames): bf16, or fp16 (an fp16 cache).
  GP<Precision> half{"half", Precision::Bf16, kHalfNames};

  In<Buffer<float, 2>> x{"x"};         // (K, M)
  In<Buffer<uint8_t, 3>> w{"w"};       // (4, kBlockPanel, P * blocks * rows per block): packed blocks
  In<Buffer<float, 2>> b{"b"};         // (kBlockPanel, P * (1 + pairs)): biases, then fp16 scale pairs
  Out<Buffer<void, 2>> out{"out"};     // (N, M): float, or uint16 (bf16 bits) with out_bf16
  In<Buffer<float, 2>>* residual = nullptr;  // (N, M), _residual / _gated only
  static constexpr bool kResidual = kEpilogue != Epilogue::None;

  void configure() {
    out.set_type(out_bf16 ? UInt(16) : Float(32));
    if (kResidual) residual = this->template add_input<Buffer<float, 2>>("residual");
  }

  void generate() {
    const int K = in_features, N = out_features;
    const int B = k_blocks(K), P = block_panel_count(N), Q = kBlockQuad, pairs = block_scale_pairs(K);
    const int groups = kBlockK / Q;  // 8 quads per block (int4: 4 in the low nibbles, 4 in the high)
    const int rows = kFormat.rows_per_block();
    Var n("n"), m("m"), j("j"), g("g"), blk("blk");
    Expr M = x.dim(1).extent();

    // ---- activations: Q8_0 blocks, per row
    Func xc("x_clamped"), dx("dx"), inv("inv_dx"), xq("x_quantized"), xsum("x_block_sum");
    xc(j, g, blk, m) = select(blk * kBlockK + g * Q + j < K,
                              x(min(blk * kBlockK + g * Q + j, K - 1), min(m, M - 1)), 0.0f);
    RDom rq(0, Q, 0, groups, "rq");
    Func amax("block_amax");
    amax(blk, m) = maximum(abs(xc(rq.x, rq.y, blk, m)));
    Expr d = amax(blk, m) * (1.0f / kBlockActivationLevels);
    inv(blk, m) = select(d > 0.0f, 1.0f / d, 0.0f);
    dx(blk, m) = cast<float>(cast<float16_t>(d));
    Expr v = xc(j, g, blk, m) * inv(blk, m);
    xq(j, g, blk, m) = cast<int8_t>(select(v < 0.0f, -floor(0.5f - v), floor(v + 0.5f)));  // half away from 0
    xsum(blk, m) = sum(cast<int32_t>(xq(rq.x, rq.y, blk, m)));

    // ---- weights: q8_0 group g is row g; int4 group g < 4 is the low wv of row g, g >=
    // 4 the high wv of row g - 4
    const MatmulKnobs knobs = matmul_knobs_for(this->get_target(), MatmulKind::Blocks, MatmulKnobs{vec, tile_n, tile_m, parallel});
    const int feature_bytes = B * (kFormat.block_bytes + 2);
    const bool overhang = matmul_widths(N, knobs, kBlockPanel, feature_bytes).overhangs(N);
    Expr panel = overhang ? min(n / kBlockPanel, P - 1) : n / kBlockPanel;
    // Unpacked into their own Func (registers): read back from it, a weight value is any uint8
    // to Halide, which then keeps the uint8 x int8 product (vpdpbusd); seeing [0, 15], it
    // narrowed the nibble to int8 and multiplied int8 pairs in 16 bits (vpmaddwd).
    Expr row = (panel * B + blk) * rows + g % rows;
    Expr byte = w(j, n % kBlockPanel, row);
    Func wv("w_value");
    wv(j, n, g, blk) = kBits == 8 ? byte : select(g < rows, byte & 15, byte >> 4);

    // One block's integer sums, then the float sum over blocks.
    RDom r(0, Q, 0, groups, "r");
    Func bsum("block_sum"), acc("acc");
    bsum(n, m, blk) = 0;
    bsum(n, m, blk) += cast<int32_t>(wv(r.x, n, r.y, blk)) * cast<int32_t>(xq(r.x, r.y, blk, m));
    RDom rb(0, B, "rb");
    Expr mc = min(m, M - 1);
    // The block's fp16 scale: half of its pair's 32-bit slot (halformer/packed_blocks.h).
    Expr pair_bits = reinterpret<uint32_t>(b(n % kBlockPanel, P + panel * pairs + rb / 2));
    Expr scale_w = cast<float>(reinterpret<float16_t>(cast<uint16_t>(pair_bits >> (16 * (rb % 2)))));
    acc(n, m) = 0.0f;
    // strict: with LLVM's fused multiply-adds chosen per unrolled row, a row's float sum
    // came out an ulp apart in the several-row tiles from the one-row one (so a request
    // alone and in a batch differed, docs/engine.md); products and sums as written.
    acc(n, m) += strict_float(cast<float>(bsum(n, m, rb) - kFormat.zero * xsum(rb, mc)) * (scale_w * dx(rb, mc)));

    Expr bias = b(n % kBlockPanel, panel);
    Expr y = apply_epilogue(kEpilogue, apply_pointwise(activation, acc(n, m) + bias),
                            kResidual ? (*residual)(n, m) : Expr());
    out(n, m) = out_bf16 ? to_half_bits(y, half) : y;

    // ---- shapes the runtime must honour
    x.dim(0).set_bounds(0, K);
    x.dim(1).set_min(0);
    w.dim(0).set_bounds(0, Q).dim(1).set_bounds(0, kBlockPanel).set_stride(Q);
    w.dim(2).set_bounds(0, P * B * rows).set_stride(Q * kBlockPanel);
    b.dim(0).set_bounds(0, kBlockPanel).dim(1).set_bounds(0, P * (1 + pairs)).set_stride(kBlockPanel);
    out.dim(0).set_bounds(0, N);
    out.dim(1).set_min(0);

    // ---- schedule
    if (this->using_autoscheduler()) {
      x.set_estimates({{0, K}, {0, 128}});
      w.set_estimates({{0, Q}, {0, kBlockPanel}, {0, P * B * rows}});
      b.set_estimates({{0, kBlockPanel}, {0, P * (1 + pairs)}});
      if (kResidual) residual->set_estimates({{0, N}, {0, 128}});
      out.set_estimates({{0, N}, {0, 128}});
      return;
    }
    // Activations quantized once per call, rows in parallel, a block's 32 values a vector.
    Var mo("mo"), jg("jg");
    xq.compute_root().fuse(j, g, jg).split(m, mo, m, 8, TailStrategy::GuardWithIf).vectorize(jg, Q * groups);
    if (parallel) xq.parallel(mo);
    amax.compute_root();
    dx.compute_root();
    xsum.compute_root();
    // The float tile as linear's; each block's int32 sums computed inside the block loop,
    // as registers beside it: the quad reduced inside each lane (vectorised r.x,
    // atomic: its int32 sum is associative) is what turns into vpdpbusd.
    schedule_cpu_matmul(out, acc, n, m, rb, N, M, knobs, kBlockPanel, feature_bytes);
    bsum.compute_at(acc, rb).vectorize(n, knobs.vec).unroll(n).unroll(m);
    bsum.update().reorder(r.x, n, m, r.y).atomic().vectorize(r.x).vectorize(n, knobs.vec).unroll(n).unroll(m).unroll(r.y);
    wv.compute_at(bsum, r.y).reorder(j, n, g).vectorize(j).vectorize(n, knobs.vec).unroll(n).unroll(g);
  }
};

// One name per (epilogue, format): the registration macro takes no template commas.
using LinearInt4 = LinearBlocks<Epilogue::None, 4>;
using LinearInt4Residual = LinearBlocks<Epilogue::AddResidual, 4>;
using LinearInt4Gated = LinearBlocks<Epilogue::MultiplyGate, 4>;
using LinearQ8_0 = LinearBlocks<Epilogue::None, 8>;
using LinearQ8_0Residual = LinearBlocks<Epilogue::AddResidual, 8>;
using LinearQ8_0Gated = LinearBlocks<Epilogue::MultiplyGate, 8>;

}  // namespace halformer

HALIDE_REGISTER_GENERATOR(halformer::LinearInt4, linear_int4)
HALIDE_REGISTER_GENERATOR(halformer::LinearInt4Residual, linear_int4_residual)
HALIDE_REGISTER_GENERATOR(halformer::LinearInt4Gated, linear_int4_gated)
HALIDE_REGISTER_GENERATOR(halformer::LinearQ8_0, linear_q8_0)
HALIDE_REGISTER_GENERATOR(halformer::LinearQ8_0Residual, linear_q8_0_residual)
HALIDE_REGISTER_GENERATOR(halformer::LinearQ8_0Gated, linear_q8_0_gated)
