// The block-quantized linear kernels (generators/linear_blocks.cpp: int4 and q8_0) against
// the naive Q4_0 / Q8_0 x Q8_0 reference (tests/reference/layers.h, written from the
// formats' description): block sums are integers, so the kernel differs from the
// reference only by fp32 rounding, within 2e-5 of the output scale; on the awkward shapes
// of test_layers.cpp (1 row, rows and features not multiples of the tiles, K not a
// multiple of the block). The packing (halformer/packed_blocks.h) is checked against the
// reference's own quantization, and the error of each format against the fp32 linear is
// stated. CPU only.
#include <cstring>
#include <gtest/gtest.h>
#include <HalideBuffer.h>

#include <cstdio>
#include <random>

#include "layer_checks.h"
#include "halformer/packed_blocks.h"
#include "reference/layers.h"
#include "test_blocks_kernels.h"  // KERNEL(name): this build's variant (host or AVX2)

namespace {

using Buf = Halide::Runtime::Buffer<float>;
using ref::Vec;
using ref::random_vec;
namespace hf = halformer;

const int kRows[] = {1, 2, 3, 8, 13, 35, 300};
constexpr double kTolerance = 2e-5;

// The kernel's weight arguments, as the runtime makes them.
struct BlockWeights {
  std::vector<uint8_t> packed;
  Vec bias_scales;
  Halide::Runtime::Buffer<uint8_t> w;
  Buf b;
  BlockWeights(const hf::BlockFormat& f, const Vec& w_torch, const Vec& bias, int K, int N) {
    packed = hf::pack_linear_blocks(f, w_torch.data(), bias.data(), N, K, bias_scales);
    const int rows = hf::block_panel_count(N) * hf::k_blocks(K) * f.rows_per_block();
    w = Halide::Runtime::Buffer<uint8_t>(packed.data(), {hf::kBlockQuad, hf::kBlockPanel, rows});
    b = Buf(bias_scales.data(), {hf::kBlockPanel, int(bias_scales.size()) / hf::kBlockPanel});
  }
};

TEST(LinearInt4, LayoutIndices) {
  // K = 40: 2 blocks; feature 19 is lane 3 of panel 1; byte 6 of a block is row 1, j 2.
  EXPECT_EQ(hf::packed_block_index(hf::kInt4Format, 40, 19, 1, 6), size_t((((1 * 2 + 1) * 4 + 1) * 16 + 3) * 4 + 2));
  EXPECT_EQ(hf::packed_blocks_size(hf::kInt4Format, 40, 19), size_t(2 * 2 * 16 * 16));
  // q8_0: 8 rows per block; byte 22 of block 1 is row 5, j 2.
  EXPECT_EQ(hf::packed_block_index(hf::kQ8_0Format, 40, 19, 1, 22), size_t((((1 * 2 + 1) * 8 + 5) * 16 + 3) * 4 + 2));
  EXPECT_EQ(hf::packed_blocks_size(hf::kQ8_0Format, 40, 19), size_t(2 * 2 * 16 * 32));
  // 2 blocks = 1 pair of fp16 scales per slot: feature 19's slot is in row P + 1 * 1 + 0.
  EXPECT_EQ(hf::block_scale_index(40, 19, 19, 1), size_t((2 + 1 * 1 + 0) * 16 + 3));
  EXPECT_EQ(hf::block_bias_size(40, 19), size_t(2 * (1 + 1) * 16));
  EXPECT_EQ(hf::block_bias_size(70, 19), size_t(2 * (1 + 2) * 16));  // 3 blocks: 2 pairs
}

// The packing holds the reference's quantization: every value and scale.
void check_packing(const hf::BlockFormat& f) {
  const int K = 70, N = 19, B = hf::k_blocks(K);
  Vec w = random_vec(size_t(N) * K, 2, 0.3f), b = random_vec(N, 3);
  w[5] = 0.0f;
  std::fill(w.begin() + K, w.begin() + 2 * K, 0.0f);  // an all-zero channel: scale 0
  BlockWeights kw(f, w, b, K, N);
  for (int n = 0; n < N; ++n) {
    ASSERT_EQ(kw.bias_scales[size_t(n)], b[n]);
    for (int blk = 0; blk < B; ++blk) {
      int q[32];
      float d;
      (f.bits == 8 ? ref::quantize_q8_0_block : ref::quantize_q4_0_block)(&w[size_t(n) * K + blk * 32],
                                                                         std::min(32, K - blk * 32), q, &d);
      ASSERT_EQ(hf::block_scale(kw.bias_scales.data(), K, N, n, blk), d) << "n " << n << " block " << blk;
      uint8_t bytes[32];
      for (int i = 0; i < f.block_bytes; ++i)
        bytes[i] = hf::file_byte(f, kw.packed[hf::packed_block_index(f, K, n, blk, i)]);
      for (int i = 0; i < 32; ++i)
        ASSERT_EQ(hf::block_value(f, bytes, i), q[i] - (f.bits == 8 ? 0 : 8)) << "n " << n << " k " << blk * 32 + i;
    }
  }
}
TEST(LinearInt4, PackingHoldsReferenceBlocks) { check_packing(hf::kInt4Format); }
TEST(LinearQ8_0, PackingHoldsReferenceBlocks) { check_packing(hf::kQ8_0Format); }

enum class Second { None, Residual, Gate };

template <typename Fn>
void check(Fn fn, const hf::BlockFormat& f, int K, int N, const char* act, Second second, bool bf16_out = false) {
  Vec w = random_vec(size_t(N) * K, 2, 0.2f), b = random_vec(N, 3);
  BlockWeights kw(f, w, b, K, N);
  double worst_vs_fp32 = 0;
  for (int M : kRows) {
    SCOPED_TRACE("M=" + std::to_string(M));
    layer_checks::QuantizedLinearCall call(M, K, N, random_vec(size_t(M) * K, 1), random_vec(size_t(M) * N, 4));
    ASSERT_EQ(call.run(fn, kw.w, kw.b, bf16_out), 0);
    const Vec &x = call.x, &res = call.second, &out = call.out;
    const Vec* sec = second == Second::None ? nullptr : &res;
    Vec want = ref::linear_blocks(f.bits, x, w, b, M, K, N, act, sec, second == Second::Gate);
    if (bf16_out) {
      layer_checks::expect_rounded_half(call.out_bits, want, act, kTolerance);
      continue;
    }
    layer_checks::expect_close(out, want, act, kTolerance);
    // What the format costs against the fp32 linear (stated, loosely bounded).
    Vec fp32 = ref::linear(x, w, b, M, K, N, act);
    for (size_t i = 0; sec && i < fp32.size(); ++i) fp32[i] = second == Second::Gate ? fp32[i] * res[i] : fp32[i] + res[i];
    double scale = 1, err = 0;
    for (float v : fp32) scale = std::max(scale, double(std::abs(v)));
    for (size_t i = 0; i < out.size(); ++i) err = std::max(err, double(std::abs(out[i] - fp32[i])));
    worst_vs_fp32 = std::max(worst_vs_fp32, err / scale);
  }
  if (!bf16_out) {
    std::printf("%s K=%d N=%d %s: max error vs fp32 %.2e of the output scale\n", f.bits == 8 ? "q8_0" : "int4", K, N,
                act, worst_vs_fp32);
    // 4 bits: about 1/16 of each weight's block maximum; 8 bits, 1/254 (and the activations' 1/254)
    EXPECT_LT(worst_vs_fp32, f.bits == 8 ? 0.03 : 0.25);
  }
}

const hf::BlockFormat kI4 = hf::kInt4Format, kQ8 = hf::kQ8_0Format;
TEST(LinearInt4, ReluK60N36) { check(KERNEL(test_linear_int4_relu), kI4, 60, 36, "relu", Second::None); }
TEST(LinearInt4, GeluOddK17N100) { check(KERNEL(test_linear_int4_gelu), kI4, 17, 100, "gelu", Second::None); }
TEST(LinearInt4, WideTasksK40N264) { check(KERNEL(test_linear_int4_tasks), kI4, 40, 264, "relu", Second::None); }
TEST(LinearInt4, ManyBlocksK1024N512) { check(KERNEL(test_linear_int4_wide), kI4, 1024, 512, "none", Second::None); }
TEST(LinearInt4, NarrowK40N3) { check(KERNEL(test_linear_int4_narrow), kI4, 40, 3, "none", Second::None); }
TEST(LinearInt4, ResidualK96N36) { check(KERNEL(test_linear_int4_residual), kI4, 96, 36, "none", Second::Residual); }
TEST(LinearInt4, GatedK96N36) { check(KERNEL(test_linear_int4_gated), kI4, 96, 36, "none", Second::Gate); }
TEST(LinearInt4, Bf16OutputK96N36) {
  check(KERNEL(test_linear_int4_out_bf16), kI4, 96, 36, "none", Second::None, true);
}
TEST(LinearQ8_0, ReluK60N36) { check(KERNEL(test_linear_q8_0_relu), kQ8, 60, 36, "relu", Second::None); }
TEST(LinearQ8_0, GeluOddK17N100) { check(KERNEL(test_linear_q8_0_gelu), kQ8, 17, 100, "gelu", Second::None); }
TEST(LinearQ8_0, ManyBlocksK1024N512) { check(KERNEL(test_linear_q8_0_wide), kQ8, 1024, 512, "none", Second::None); }
TEST(LinearQ8_0, NarrowK40N3) { check(KERNEL(test_linear_q8_0_narrow), kQ8, 40, 3, "none", Second::None); }
TEST(LinearQ8_0, ResidualK96N36) { check(KERNEL(test_linear_q8_0_residual), kQ8, 96, 36, "none", Second::Residual); }
TEST(LinearQ8_0, GatedK96N36) { check(KERNEL(test_linear_q8_0_gated), kQ8, 96, 36, "none", Second::Gate); }

// Extremes: weights at the ends of the format's range against activations at +-127
// levels (every block's scale exact), so that any wrapped or mis-signed integer sum
// shows: the kernel's output must equal the integer sum times the scales. int4 values
// -8 .. 7 with -8 in every block (d = 1); q8_0 values -127 .. 127 with 127 in every block.
template <typename Fn>
void check_integer_sums(Fn kernel, const hf::BlockFormat& f) {
  const int K = 96, N = 36;
  const int lo = f.bits == 8 ? -127 : -8, hi = f.bits == 8 ? 127 : 7, pin = f.bits == 8 ? hi : lo;
  std::mt19937 rng(5);
  Vec w(size_t(N) * K), b(N, 0.0f);
  std::uniform_int_distribution<int> dw(lo, hi), dx(-127, 127);
  for (float& v : w) v = float(dw(rng));
  for (int n = 0; n < N; ++n)
    for (int blk = 0; blk < 3; ++blk) w[size_t(n) * K + blk * 32 + (n + blk) % 32] = float(pin);
  for (int k = 0; k < K; ++k) w[size_t(N - 1) * K + k] = float(hi), w[size_t(N - 2) * K + k] = float(lo);
  for (int k = 0; k < K; k += 32) w[size_t(N - 1) * K + k] = float(pin);
  BlockWeights kw(f, w, b, K, N);
  for (int M : {1, 5, 40}) {
    Vec x(size_t(M) * K), out(size_t(M) * N);
    for (float& v : x) v = float(dx(rng));
    for (int m = 0; m < M; ++m)
      for (int k = 0; k < K; k += 32) x[size_t(m) * K + k] = 127.0f;  // each block's max is 127: d = 1
    for (int k = 0; k < K; ++k) x[size_t(M - 1) * K + k] = (k % 32 == 0) ? 127.0f : -127.0f;
    Buf xb(x.data(), {K, M}), ob(out.data(), {N, M});
    ASSERT_EQ(kernel(xb, kw.w, kw.b, Buf(N, M).fill(0.0f), ob), 0);
    for (int m = 0; m < M; ++m)
      for (int n = 0; n < N; ++n) {
        int64_t acc = 0;
        for (int k = 0; k < K; ++k) acc += int64_t(x[size_t(m) * K + k]) * int64_t(w[size_t(n) * K + k]);
        ASSERT_EQ(double(out[size_t(m) * N + n]), double(acc)) << "m " << m << " n " << n;
      }
  }
}
TEST(LinearInt4, IntegerSumsExact) { check_integer_sums(KERNEL(test_linear_int4_residual), kI4); }
TEST(LinearQ8_0, IntegerSumsExact) { check_integer_sums(KERNEL(test_linear_q8_0_residual), kQ8); }

}  // namespace

// A row's output is the same bits at any row count (the engine's decode rows against a
// request alone, docs/engine.md): each row of an M-row call against that row alone.
template <typename Fn>
void check_rows_alike(Fn fn, const hf::BlockFormat& f, int K, int N) {
  Vec w = random_vec(size_t(N) * K, 2, 0.2f), b = random_vec(N, 3);
  BlockWeights kw(f, w, b, K, N);
  for (int M : {2, 5, 8, 13}) {
    layer_checks::QuantizedLinearCall many(M, K, N, random_vec(size_t(M) * K, 1), random_vec(size_t(M) * N, 4));
    ASSERT_EQ(many.run(fn, kw.w, kw.b, false), 0);
    for (int m = 0; m < M; ++m) {
      Vec x(many.x.begin() + m * K, many.x.begin() + (m + 1) * K), sec(many.second.begin() + m * N, many.second.begin() + (m + 1) * N);
      layer_checks::QuantizedLinearCall one(1, K, N, x, sec);
      one.x = x;  // as given (the constructor zeroes the first element)
      ASSERT_EQ(one.run(fn, kw.w, kw.b, false), 0);
      int differ = 0;
      for (int n = 0; n < N; ++n) differ += std::memcmp(&one.out[size_t(n)], &many.out[size_t(m) * N + n], sizeof(float)) != 0;
      EXPECT_EQ(differ, 0) << "M=" << M << " row " << m << ": " << differ << " of " << N << " outputs differ from the row alone";
    }
  }
}
TEST(LinearInt4, RowsAlikeAtAnyCount) { check_rows_alike(KERNEL(test_linear_int4_wide), kI4, 1024, 512); }
TEST(LinearQ8_0, RowsAlikeAtAnyCount) { check_rows_alike(KERNEL(test_linear_q8_0_wide), kQ8, 1024, 512); }
TEST(LinearQ8_0, RowsAlikeAtAnyCountResidual) { check_rows_alike(KERNEL(test_linear_q8_0_residual), kQ8, 96, 36); }
