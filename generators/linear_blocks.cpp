// linear_int4 (+ _residual, _gated): the int4 form of generators/linear.cpp, the same
// contract (model_config.h's LinearFn) with 4-bit weights in blocks of 32 along K
// (halformer/packed_int4.h: llama.cpp's Q4_0, a GGUF file's blocks kept as they are).
//
// The arithmetic is llama.cpp's Q4_0 x Q8_0 dot product, so that the same file gives
// close results in both engines:
//   activations, per row m and block b of 32 k (quantized once per call):
//     dx(b, m) = max_k |x(k, m)| / 127,  xq(k, m) = round-half-away(x / dx) in [-127, 127]
//     (dx then rounded to fp16, as llama.cpp's Q8_0 stores it)
//   out(n, m) = epilogue(sum_b dw(n, b) * dx(b, m) * sum_{k in b} (u(n, k) - 8) * xq(k, m) + bias(n))
// where u in [0, 15] is the stored nibble. vpdpbusd multiplies uint8 by int8, four
// products summed per int32 lane, so the block sum is taken on the unsigned nibbles and
// corrected once: sum (u - 8) xq = sum u xq - 8 sum xq (the second sum per row and block,
// computed with the quantization). Without VNNI Halide lowers the same sums to
// vpmaddubsw / vpmaddwd pairs (u <= 15: no saturation).
//
// The weights travel as 4.5 bits (nibbles + an fp16 scale per 32): decode, which is
// bandwidth-bound, reads 7x fewer bytes than fp32. The block sums are integers (exact);
// the float sum over blocks is accumulated in registers like linear's, tile by tile
// (schedules/cpu_matmul.h), each block's int32 sums in registers beside it.
//
// CPU only: the spec rejects precision int4 with GPU targets (docs/precision.md).
#include "common.h"
#include "halformer/packed_int4.h"
#include "schedules/cpu_matmul.h"

namespace halformer {
using namespace Halide;

template <Epilogue kEpilogue>
class LinearInt4 : public Generator<LinearInt4<kEpilogue>> {
 public:
  template <typename T> using GP = GeneratorParam<T>;
  template <typename T> using In = typename Generator<LinearInt4<kEpilogue>>::template Input<T>;
  template <typename T> using Out = typename Generator<LinearInt4<kEpilogue>>::template Output<T>;

  GP<int> in_features{"in_features", 64};    // K
  GP<int> out_features{"out_features", 64};  // N
  GP<PointwiseFn> activation{"activation", PointwiseFn::None, kPointwiseFnNames};
  // Schedule knobs, as linear's (0 = the target's int4 tile, schedules/cpu_matmul.h); vec
  // counts int32 lanes.
  GP<int> vec{"vec", 0};
  GP<int> tile_n{"tile_n", 0};
  GP<int> tile_m{"tile_m", 0};
  GP<bool> parallel{"parallel", true};
  // true: the output stored as bf16 bits (uint16), as linear's out_bf16.
  GP<bool> out_bf16{"out_bf16", false};

  In<Buffer<float, 2>> x{"x"};         // (K, M)
  In<Buffer<uint8_t, 3>> w{"w"};       // (4, kInt4Panel, P * blocks * 4): packed nibbles
  In<Buffer<float, 2>> b{"b"};         // (kInt4Panel, P * (1 + pairs)): biases, then fp16 scale pairs
  Out<Buffer<void, 2>> out{"out"};     // (N, M): float, or uint16 (bf16 bits) with out_bf16
  In<Buffer<float, 2>>* residual = nullptr;  // (N, M), _residual / _gated only
  static constexpr bool kResidual = kEpilogue != Epilogue::None;

  void configure() {
    out.set_type(out_bf16 ? UInt(16) : Float(32));
    if (kResidual) residual = this->template add_input<Buffer<float, 2>>("residual");
  }

  void generate() {
    const int K = in_features, N = out_features;
    const int B = int4_blocks(K), P = int4_panel_count(N), Q = kInt4Quad, pairs = int4_scale_pairs(K);
    const int groups = kInt4Block / Q;  // 8 quads per block: 4 in the low nibbles, 4 in the high
    Var n("n"), m("m"), j("j"), g("g"), blk("blk");
    Expr M = x.dim(1).extent();

    // ---- activations: Q8_0 blocks, per row
    Func xc("x_clamped"), dx("dx"), inv("inv_dx"), xq("x_quantized"), xsum("x_block_sum");
    xc(j, g, blk, m) = select(blk * kInt4Block + g * Q + j < K,
                              x(min(blk * kInt4Block + g * Q + j, K - 1), min(m, M - 1)), 0.0f);
    RDom rq(0, Q, 0, groups, "rq");
    Func amax("block_amax");
    amax(blk, m) = maximum(abs(xc(rq.x, rq.y, blk, m)));
    Expr d = amax(blk, m) * (1.0f / kInt4ActivationLevels);
    inv(blk, m) = select(d > 0.0f, 1.0f / d, 0.0f);
    dx(blk, m) = cast<float>(cast<float16_t>(d));
    Expr v = xc(j, g, blk, m) * inv(blk, m);
    xq(j, g, blk, m) = cast<int8_t>(select(v < 0.0f, -floor(0.5f - v), floor(v + 0.5f)));  // half away from 0
    xsum(blk, m) = sum(cast<int32_t>(xq(rq.x, rq.y, blk, m)));

    // ---- weights: group g < 4 is the low nibble of row g, g >= 4 the high nibble of row g - 4
    const MatmulKnobs knobs = matmul_knobs_for(this->get_target(), MatmulKind::Int4, MatmulKnobs{vec, tile_n, tile_m, parallel});
    const int feature_bytes = B * (kInt4BlockBytes + 2);
    const bool overhang = matmul_widths(N, knobs, kInt4Panel, feature_bytes).overhangs(N);
    Expr panel = overhang ? min(n / kInt4Panel, P - 1) : n / kInt4Panel;
    // Unpacked into their own Func (registers): read back from it, a nibble is any uint8
    // to Halide, which then keeps the uint8 x int8 product (vpdpbusd); seeing [0, 15], it
    // narrowed the nibble to int8 and multiplied int8 pairs in 16 bits (vpmaddwd).
    Expr row = (panel * B + blk) * kInt4RowsPerBlock + g % kInt4RowsPerBlock;
    Expr byte = w(j, n % kInt4Panel, row);
    Func nibble("w_nibble");
    nibble(j, n, g, blk) = select(g < kInt4RowsPerBlock, byte & 15, byte >> 4);

    // One block's integer sums, then the float sum over blocks.
    RDom r(0, Q, 0, groups, "r");
    Func bsum("block_sum"), acc("acc");
    bsum(n, m, blk) = 0;
    bsum(n, m, blk) += cast<int32_t>(nibble(r.x, n, r.y, blk)) * cast<int32_t>(xq(r.x, r.y, blk, m));
    RDom rb(0, B, "rb");
    Expr mc = min(m, M - 1);
    // The block's fp16 scale: half of its pair's 32-bit slot (halformer/packed_int4.h).
    Expr pair_bits = reinterpret<uint32_t>(b(n % kInt4Panel, P + panel * pairs + rb / 2));
    Expr scale_w = cast<float>(reinterpret<float16_t>(cast<uint16_t>(pair_bits >> (16 * (rb % 2)))));
    acc(n, m) = 0.0f;
    acc(n, m) += cast<float>(bsum(n, m, rb) - kInt4Zero * xsum(rb, mc)) * (scale_w * dx(rb, mc));

    Expr bias = b(n % kInt4Panel, panel);
    Expr y = apply_epilogue(kEpilogue, apply_pointwise(activation, acc(n, m) + bias),
                            kResidual ? (*residual)(n, m) : Expr());
    out(n, m) = out_bf16 ? to_bf16_bits(y) : y;

    // ---- shapes the runtime must honour
    x.dim(0).set_bounds(0, K);
    x.dim(1).set_min(0);
    w.dim(0).set_bounds(0, Q).dim(1).set_bounds(0, kInt4Panel).set_stride(Q);
    w.dim(2).set_bounds(0, P * B * kInt4RowsPerBlock).set_stride(Q * kInt4Panel);
    b.dim(0).set_bounds(0, kInt4Panel).dim(1).set_bounds(0, P * (1 + pairs)).set_stride(kInt4Panel);
    out.dim(0).set_bounds(0, N);
    out.dim(1).set_min(0);

    // ---- schedule
    if (this->using_autoscheduler()) {
      x.set_estimates({{0, K}, {0, 128}});
      w.set_estimates({{0, Q}, {0, kInt4Panel}, {0, P * B * kInt4RowsPerBlock}});
      b.set_estimates({{0, kInt4Panel}, {0, P * (1 + pairs)}});
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
    schedule_cpu_matmul(out, acc, n, m, rb, N, M, knobs, kInt4Panel, feature_bytes);
    bsum.compute_at(acc, rb).vectorize(n, knobs.vec).unroll(n).unroll(m);
    bsum.update().reorder(r.x, n, m, r.y).atomic().vectorize(r.x).vectorize(n, knobs.vec).unroll(n).unroll(m).unroll(r.y);
    nibble.compute_at(bsum, r.y).reorder(j, n, g).vectorize(j).vectorize(n, knobs.vec).unroll(n).unroll(g);
  }
};

}  // namespace halformer

HALIDE_REGISTER_GENERATOR(halformer::LinearInt4<halformer::Epilogue::None>, linear_int4)
HALIDE_REGISTER_GENERATOR(halformer::LinearInt4<halformer::Epilogue::AddResidual>, linear_int4_residual)
HALIDE_REGISTER_GENERATOR(halformer::LinearInt4<halformer::Epilogue::MultiplyGate>, linear_int4_gated)
