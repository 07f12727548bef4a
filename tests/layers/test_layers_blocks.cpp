// The int4 linear kernels (generators/linear_int4.cpp) against the naive Q4_0 x Q8_0
// reference (tests/reference/layers.h, written from the format's description): block sums
// are integers, so the kernel differs from the reference only by fp32 rounding, within
// 2e-5 of the output scale; on the awkward shapes of test_layers.cpp (1 row, rows and
// features not multiples of the tiles, K not a multiple of the block). The packing
// (halformer/packed_int4.h) is checked against the reference's own quantization, and the
// error of int4 against the fp32 linear is stated. CPU only.
#include <gtest/gtest.h>
#include <HalideBuffer.h>

#include <cstdio>
#include <random>

#include "layer_checks.h"
#include "halformer/packed_int4.h"
#include "reference/layers.h"
#include "test_int4_kernels.h"  // KERNEL(name): this build's variant (host or AVX2)

namespace {

using Buf = Halide::Runtime::Buffer<float>;
using ref::Vec;
using ref::random_vec;
namespace hf = halformer;

const int kRows[] = {1, 2, 3, 8, 13, 35, 300};
constexpr double kTolerance = 2e-5;

// The kernel's weight arguments, as the runtime makes them.
struct Int4Weights {
  std::vector<uint8_t> packed;
  Vec bias_scales;
  Halide::Runtime::Buffer<uint8_t> w;
  Buf b;
  Int4Weights(const Vec& w_torch, const Vec& bias, int K, int N) {
    packed = hf::pack_linear_int4(w_torch.data(), bias.data(), N, K, bias_scales);
    const int rows = hf::int4_panel_count(N) * hf::int4_blocks(K) * hf::kInt4RowsPerBlock;
    w = Halide::Runtime::Buffer<uint8_t>(packed.data(), {hf::kInt4Quad, hf::kInt4Panel, rows});
    b = Buf(bias_scales.data(), {hf::kInt4Panel, int(bias_scales.size()) / hf::kInt4Panel});
  }
};

TEST(LinearInt4, LayoutIndices) {
  // K = 40: 2 blocks; feature 19 is lane 3 of panel 1; byte 6 of a block is row 1, j 2.
  EXPECT_EQ(hf::packed_int4_index(40, 19, 1, 6), size_t((((1 * 2 + 1) * 4 + 1) * 16 + 3) * 4 + 2));
  EXPECT_EQ(hf::packed_int4_size(40, 19), size_t(2 * 2 * 16 * 16));
  // 2 blocks = 1 pair of fp16 scales per slot: feature 19's slot is in row P + 1 * 1 + 0.
  EXPECT_EQ(hf::int4_scale_index(40, 19, 19, 1), size_t((2 + 1 * 1 + 0) * 16 + 3));
  EXPECT_EQ(hf::int4_bias_size(40, 19), size_t(2 * (1 + 1) * 16));
  EXPECT_EQ(hf::int4_bias_size(70, 19), size_t(2 * (1 + 2) * 16));  // 3 blocks: 2 pairs
}

// The packing holds the reference's quantization: every nibble and scale.
TEST(LinearInt4, PackingHoldsReferenceBlocks) {
  const int K = 70, N = 19, B = hf::int4_blocks(K);
  Vec w = random_vec(size_t(N) * K, 2, 0.3f), b = random_vec(N, 3);
  w[5] = 0.0f;
  std::fill(w.begin() + K, w.begin() + 2 * K, 0.0f);  // an all-zero channel: scale 0
  Int4Weights kw(w, b, K, N);
  for (int n = 0; n < N; ++n) {
    ASSERT_EQ(kw.bias_scales[size_t(n)], b[n]);
    for (int blk = 0; blk < B; ++blk) {
      int q[32];
      float d;
      ref::quantize_q4_0_block(&w[size_t(n) * K + blk * 32], std::min(32, K - blk * 32), q, &d);
      ASSERT_EQ(hf::int4_scale(kw.bias_scales.data(), K, N, n, blk), d) << "n " << n << " block " << blk;
      uint8_t bytes[16];
      for (int i = 0; i < 16; ++i) bytes[i] = kw.packed[hf::packed_int4_index(K, n, blk, i)];
      for (int i = 0; i < 32; ++i) ASSERT_EQ(hf::int4_value(bytes, i), q[i] - 8) << "n " << n << " k " << blk * 32 + i;
    }
  }
}

enum class Second { None, Residual, Gate };

template <typename Fn>
void check(Fn fn, int K, int N, const char* act, Second second, bool bf16_out = false) {
  Vec w = random_vec(size_t(N) * K, 2, 0.2f), b = random_vec(N, 3);
  Int4Weights kw(w, b, K, N);
  double worst_vs_fp32 = 0;
  for (int M : kRows) {
    SCOPED_TRACE("M=" + std::to_string(M));
    layer_checks::QuantizedLinearCall call(M, K, N, random_vec(size_t(M) * K, 1), random_vec(size_t(M) * N, 4));
    ASSERT_EQ(call.run(fn, kw.w, kw.b, bf16_out), 0);
    const Vec &x = call.x, &res = call.second, &out = call.out;
    const Vec* sec = second == Second::None ? nullptr : &res;
    Vec want = ref::linear_int4(x, w, b, M, K, N, act, sec, second == Second::Gate);
    if (bf16_out) {
      layer_checks::expect_rounded_bf16(call.out_bits, want, act, kTolerance);
      continue;
    }
    layer_checks::expect_close(out, want, act, kTolerance);
    // What 4 bits cost against the fp32 linear (stated, loosely bounded).
    Vec fp32 = ref::linear(x, w, b, M, K, N, act);
    for (size_t i = 0; sec && i < fp32.size(); ++i) fp32[i] = second == Second::Gate ? fp32[i] * res[i] : fp32[i] + res[i];
    double scale = 1, err = 0;
    for (float v : fp32) scale = std::max(scale, double(std::abs(v)));
    for (size_t i = 0; i < out.size(); ++i) err = std::max(err, double(std::abs(out[i] - fp32[i])));
    worst_vs_fp32 = std::max(worst_vs_fp32, err / scale);
  }
  if (!bf16_out) {
    std::printf("int4 K=%d N=%d %s: max error vs fp32 %.2e of the output scale\n", K, N, act, worst_vs_fp32);
    EXPECT_LT(worst_vs_fp32, 0.25);  // 4 bits: about 1/16 of each weight's block maximum
  }
}

TEST(LinearInt4, ReluK60N36) { check(KERNEL(test_linear_int4_relu), 60, 36, "relu", Second::None); }
TEST(LinearInt4, GeluOddK17N100) { check(KERNEL(test_linear_int4_gelu), 17, 100, "gelu", Second::None); }
TEST(LinearInt4, WideTasksK40N264) { check(KERNEL(test_linear_int4_tasks), 40, 264, "relu", Second::None); }
TEST(LinearInt4, ManyBlocksK1024N512) { check(KERNEL(test_linear_int4_wide), 1024, 512, "none", Second::None); }
TEST(LinearInt4, NarrowK40N3) { check(KERNEL(test_linear_int4_narrow), 40, 3, "none", Second::None); }
TEST(LinearInt4, ResidualK96N36) { check(KERNEL(test_linear_int4_residual), 96, 36, "none", Second::Residual); }
TEST(LinearInt4, GatedK96N36) { check(KERNEL(test_linear_int4_gated), 96, 36, "none", Second::Gate); }
TEST(LinearInt4, Bf16OutputK96N36) {
  check(KERNEL(test_linear_int4_out_bf16), 96, 36, "none", Second::None, true);
}

// Extremes: weights at the ends of the nibble range against activations at +-127 levels
// (every block's scale exact), so that any wrapped or mis-signed integer sum shows: the
// kernel's output must equal the integer sum times the scales.
TEST(LinearInt4, IntegerSumsExact) {
  const int K = 96, N = 36;
  std::mt19937 rng(5);
  Vec w(size_t(N) * K), b(N, 0.0f);
  // Values -8 .. 7 with -8 present in every block: d = 1 exactly, q = value + 8.
  std::uniform_int_distribution<int> dw(-8, 7), dx(-127, 127);
  for (float& v : w) v = float(dw(rng));
  for (int n = 0; n < N; ++n)
    for (int blk = 0; blk < 3; ++blk) w[size_t(n) * K + blk * 32 + (n + blk) % 32] = -8.0f;
  for (int k = 0; k < K; ++k) w[size_t(N - 1) * K + k] = 7.0f, w[size_t(N - 2) * K + k] = -8.0f;
  for (int k = 0; k < K; k += 32) w[size_t(N - 1) * K + k] = -8.0f;
  Int4Weights kw(w, b, K, N);
  for (int M : {1, 5, 40}) {
    Vec x(size_t(M) * K), out(size_t(M) * N);
    for (float& v : x) v = float(dx(rng));
    for (int m = 0; m < M; ++m)
      for (int k = 0; k < K; k += 32) x[size_t(m) * K + k] = 127.0f;  // each block's max is 127: d = 1
    for (int k = 0; k < K; ++k) x[size_t(M - 1) * K + k] = (k % 32 == 0) ? 127.0f : -127.0f;
    Buf xb(x.data(), {K, M}), ob(out.data(), {N, M});
    ASSERT_EQ(KERNEL(test_linear_int4_residual)(xb, kw.w, kw.b, Buf(N, M).fill(0.0f), ob), 0);
    for (int m = 0; m < M; ++m)
      for (int n = 0; n < N; ++n) {
        int64_t acc = 0;
        for (int k = 0; k < K; ++k) acc += int64_t(x[size_t(m) * K + k]) * int64_t(w[size_t(n) * K + k]);
        ASSERT_EQ(double(out[size_t(m) * N + n]), double(acc)) << "m " << m << " n " << n;
      }
  }
}

}  // namespace
