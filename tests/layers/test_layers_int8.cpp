// The int8 linear kernels (generators/linear_int8.cpp) against the naive int8 reference
// (tests/reference/layers.h), in the form this machine's kernels take (int16 activation
// pairs, or uint8 quads with a zero point on AVX-512 VNNI CPUs): the integer accumulation
// bit-exact, the float epilogue within 2e-5 of the output scale; on the awkward shapes of
// test_layers.cpp (1 row, rows and features not multiples of the tiles, odd K). CPU only
// (the spec keeps int8 off GPU targets).
#include <gtest/gtest.h>
#include <HalideBuffer.h>

#include <cstdio>
#include <random>

#include "amx_tile_state.h"
#include "layer_checks.h"
#include "halformer/packed_layout.h"
#include "reference/layers.h"
#include "test_int8_kernels.h"  // KERNEL(name): this build's variant (host or AVX2)

namespace {

using Buf = Halide::Runtime::Buffer<float>;
using ref::Vec;
using ref::random_vec;
namespace hf = halformer;


const int kRows[] = {1, 2, 3, 8, 13, 35, 300};

// The k group of these kernels' packed weights (halformer/packed_layout.h), from their target.
const int kGroup = hf::weight_layout(KERNEL_METADATA(test_linear_int8_relu)()->target).int8_group;
const bool kQuads = kGroup == hf::kInt8Quad;

TEST(LinearInt8, FormFollowsTarget) {
  std::printf("kernels for %s: %s\n", KERNEL_METADATA(test_linear_int8_relu)()->target,
              kQuads ? "uint8 activation quads (vpdpbusd)" : "int16 activation pairs (vpmaddwd)");
  EXPECT_FALSE(hf::int8_byte_dot_product("x86-64-linux-avx-avx2-f16c-fma-sse41"));
  EXPECT_FALSE(hf::int8_byte_dot_product("x86-64-linux-avx-avx2-avx512-avx512_skylake-avx512_cannonlake-f16c-fma-sse41"));
  EXPECT_TRUE(hf::int8_byte_dot_product("x86-64-linux-avx-avx2-avx512-avx512_cannonlake-avx512_skylake-avx512_zen4-f16c-fma-sse41"));
  // weight (n, k) at ((n / 16 * groups + k / G) * 16 + n % 16) * G + k % G.
  EXPECT_EQ(hf::packed_int8_index(5, 19, 3, 4), size_t(((1 * 2 + 0) * 16 + 3) * 4 + 3));
  EXPECT_EQ(hf::packed_int8_index(5, 19, 3, 2), size_t(((1 * 3 + 1) * 16 + 3) * 2 + 1));
  EXPECT_EQ(hf::packed_int8_size(5, 19, 4), size_t(2 * 2 * 16 * 4));
}

// The kernel's weight arguments, as the runtime makes them: packed int8 in k groups of
// `group`, (bias | scale), quads also | channel sum.
struct Int8Weights {
  std::vector<int8_t> packed;
  Vec bias_scale;
  Halide::Runtime::Buffer<int8_t> w;
  Buf b;
  Int8Weights(const Vec& w_torch, const Vec& bias, int K, int N, int group = kGroup) {
    Vec scales, sums;
    const bool quads = group == hf::kInt8Quad;
    packed = hf::pack_linear_int8(w_torch.data(), N, K, group, scales, sums);
    bias_scale = bias;
    bias_scale.insert(bias_scale.end(), scales.begin(), scales.end());
    if (quads) bias_scale.insert(bias_scale.end(), sums.begin(), sums.end());
    w = Halide::Runtime::Buffer<int8_t>(packed.data(), {group, hf::kInt8Panel, hf::int8_groups(K, group) * hf::int8_panel_count(N)});
    b = Buf(bias_scale.data(), {N, hf::int8_bias_columns(group)});
  }
};

// The reference's own quantization of the same weights: [N][K] and N scales.
void reference_weights(const Vec& w, int K, int N, std::vector<int8_t>& wq, Vec& sw) {
  wq.assign(size_t(N) * K, 0);
  sw.assign(N, 0.0f);
  for (int n = 0; n < N; ++n) sw[n] = ref::quantize_int8(&w[size_t(n) * K], K, &wq[size_t(n) * K]);
}

// The float epilogue's bound (of the output scale).
constexpr double kTolerance = 2e-5;

enum class Second { None, Residual, Gate };

// group: the kernel's k group (int16_activations kernels: pairs on any CPU).
// bf16_out: the kernel stores bf16 bits (out_bf16).
template <typename Fn>
void check(Fn fn, int K, int N, const char* act, Second second, int group = kGroup, bool bf16_out = false) {
  const bool quads = group == hf::kInt8Quad;
  Vec w = random_vec(size_t(N) * K, 2, 0.2f), b = random_vec(N, 3);
  Int8Weights kw(w, b, K, N, group);
  std::vector<int8_t> wq;
  Vec sw;
  reference_weights(w, K, N, wq, sw);
  // The runtime's packing holds the reference's quantized weights and scales.
  for (int n = 0; n < N; ++n) {
    ASSERT_EQ(kw.bias_scale[N + n], sw[n]) << "scale of channel " << n;
    for (int k = 0; k < K; ++k)
      ASSERT_EQ(kw.packed[hf::packed_int8_index(K, n, k, group)], wq[size_t(n) * K + k]) << "w(" << n << ", " << k << ")";
    if (quads) {
      int32_t sum = 0;
      for (int k = 0; k < K; ++k) sum += wq[size_t(n) * K + k];
      ASSERT_EQ(kw.bias_scale[2 * N + n], float(sum)) << "channel sum " << n;
    }
  }
  for (int M : kRows) {
    SCOPED_TRACE("M=" + std::to_string(M));
    layer_checks::QuantizedLinearCall call(M, K, N, random_vec(size_t(M) * K, 1), random_vec(size_t(M) * N, 4));
    ASSERT_EQ(call.run(fn, kw.w, kw.b, bf16_out), 0);
    const Vec &x = call.x, &res = call.second, &out = call.out;
    Vec want = ref::linear_int8(x, wq, sw, b, M, K, N, quads ? 0 : hf::int8_activation_levels(K), act,
                                second == Second::None ? nullptr : &res, second == Second::Gate);
    if (bf16_out)
      layer_checks::expect_rounded_half(call.out_bits, want, act, kTolerance);
    else
      layer_checks::expect_close(out, want, act, kTolerance);
  }
}

TEST(LinearInt8, ReluK60N36) { check(KERNEL(test_linear_int8_relu), 60, 36, "relu", Second::None); }
TEST(LinearInt8, GeluOddK17N100) { check(KERNEL(test_linear_int8_gelu), 17, 100, "gelu", Second::None); }
TEST(LinearInt8, WholePanelsK96N192) { check(KERNEL(test_linear_int8_panels), 96, 192, "none", Second::None); }
TEST(LinearInt8, WideTasksK40N264) { check(KERNEL(test_linear_int8_tasks), 40, 264, "relu", Second::None); }
TEST(LinearInt8, WideTasksWholeK40N512) { check(KERNEL(test_linear_int8_tasks_whole), 40, 512, "none", Second::None); }
TEST(LinearInt8, NarrowK40N3) { check(KERNEL(test_linear_int8_narrow), 40, 3, "none", Second::None); }
// K = 96 (32 bytes a tile step: schedules/cpu_matmul.h, amx_k_step): on AMX CPUs these
// (and the whole panels above) run on tiles, their epilogues after them.
TEST(LinearInt8, ResidualK96N36) { check(KERNEL(test_linear_int8_residual), 96, 36, "none", Second::Residual); }
TEST(LinearInt8, GatedK96N36) { check(KERNEL(test_linear_int8_gated), 96, 36, "none", Second::Gate); }
// The keys/values projection of an int8 model's cross-attention cache (kv_cache bf16).
TEST(LinearInt8, Bf16OutputRoundsToNearestK96N36) {
  check(KERNEL(test_linear_int8_out_bf16), 96, 36, "none", Second::None, kGroup, true);
}
TEST(LinearInt8, Int16ActivationsForcedK60N36) {
  check(KERNEL(test_linear_int8_int16), 60, 36, "relu", Second::None, hf::kInt8Pair);
}

// Integer accumulation bit-exact: integer activations that quantize to themselves,
// weights whose channels reach 127 have unit scales, no bias: the kernel's output is
// float(acc) * c, c the float sx * 1 it computes, exactly as computed here -- an
// accumulator off by one, or wrapped, would show.
// Pairs: rows whose maximum is the activation levels L. K = 1023 (odd, padded to 1024):
// L = 16513 (1024 * 16513 * 127 = 2147482624 < 2^31); the row of all +L against the
// channel of all +127 sums to 1023 * 16513 * 127 = 2145385473, near the int32 limit.
// Quads: rows spanning [-100, 155] (scale 1, zero point 100: the uint8 levels are x + 100),
// so that the zero point's correction (100 x the channel sum) is exercised on every sum.
TEST(LinearInt8, IntegerAccumulationExact) {
  const int K = 1023, N = 100, L = kQuads ? 155 : hf::int8_activation_levels(K), low = kQuads ? -100 : -L;
  if (!kQuads) ASSERT_EQ(L, 16513);
  std::mt19937 rng(7);
  std::uniform_int_distribution<int> dw(-127, 127), dx(low, L);
  Vec w(size_t(N) * K), b(N, 0.0f);
  for (float& v : w) v = float(dw(rng));
  for (int n = 0; n < N; ++n) w[size_t(n) * K + n] = 127.0f;  // every channel's max is 127: scale 1
  for (int k = 0; k < K; ++k) w[size_t(N - 1) * K + k] = 127.0f;  // the extreme channel
  Int8Weights kw(w, b, K, N);
  for (int n = 0; n < N; ++n) ASSERT_EQ(kw.bias_scale[N + n], 1.0f);
  for (int M : {1, 5, 40}) {
    Vec x(size_t(M) * K), out(size_t(M) * N);
    for (float& v : x) v = float(dx(rng));
    for (int m = 0; m < M; ++m) x[size_t(m) * K + m] = float(low), x[size_t(m) * K + K - 1 - m] = float(L);
    for (int k = 0; k < K; ++k) x[size_t(M - 1) * K + k] = float(L);  // the extreme row
    if (kQuads) x[size_t(M - 1) * K] = float(low);                     // (which spans the range too)
    Buf xb(x.data(), {K, M}), ob(out.data(), {N, M});
    ASSERT_EQ(KERNEL(test_linear_int8_exact)(xb, kw.w, kw.b, ob), 0);
    const float c = kQuads ? float(L - low) * (1.0f / 255.0f) : float(L) * (1.0f / float(L));
    for (int m = 0; m < M; ++m)
      for (int n = 0; n < N; ++n) {
        int64_t acc = 0;
        for (int k = 0; k < K; ++k) acc += int64_t(x[size_t(m) * K + k]) * int64_t(w[size_t(n) * K + k]);
        ASSERT_LE(acc, int64_t(INT32_MAX));
        ASSERT_EQ(out[size_t(m) * N + n], float(acc) * c) << "m " << m << " n " << n << " acc " << acc;
      }
  }
}

// int8 embedding tables (embedding_int8): each row quantized by the reference
// (ref::quantize_int8) and laid out as the runtime does (q then the fp32 scale); the kernel
// against the fp32 reference over the dequantized table, with sinusoidal positions added
// at two offsets, on 1 to 39 tokens, C = 60 (not a multiple of the vector width), and a
// row of zeros (scale 0).
TEST(EmbeddingInt8, DequantizedRowsPlusPositionsC60) {
  const int V = 11, C = 60, P = 40;
  Vec table = random_vec(size_t(V) * C, 21, 3.0f), dequant(table.size());
  std::fill(table.begin() + 5 * C, table.begin() + 6 * C, 0.0f);
  const size_t stride = size_t(C) + hf::kInt8RowScaleBytes;
  std::vector<int8_t> rows(V * stride), q(C);
  for (int v = 0; v < V; ++v) {
    const float s = ref::quantize_int8(&table[size_t(v) * C], C, q.data());
    hf::put_int8_table_row(&rows[v * stride], C, q.data(), s);
    for (int c = 0; c < C; ++c) dequant[size_t(v) * C + c] = float(q[c]) * s;
  }
  Halide::Runtime::Buffer<int8_t> tab(rows.data(), {int(stride), V});
  Vec unused(1);
  Buf ub(unused.data(), {1, 1});
  for (int offset : {0, 7}) {
    for (auto [B, T] : {std::pair{1, 1}, {2, 13}, {3, 13}}) {
      std::vector<int32_t> tok(size_t(B) * T), types(tok.size(), 0);
      for (size_t i = 0; i < tok.size(); ++i) tok[i] = int32_t((i * 7 + 3) % V);
      Vec out(size_t(B) * T * C);
      Halide::Runtime::Buffer<int32_t> tb(tok.data(), T, B), yb(types.data(), T, B);
      Buf ob(out.data(), {C, T, B});
      ASSERT_EQ(KERNEL(test_embedding_int8)(tb, yb, tab, ub, ub, offset, ob), 0);
      layer_checks::expect_close(out, ref::embedding(tok, B, T, dequant, C, true, "sinusoidal", Vec{}, offset),
                                 "embedding_int8", 1e-6);
    }
  }
}

}  // namespace
