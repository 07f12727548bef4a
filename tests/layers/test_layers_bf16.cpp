// The bf16-weight linear kernels (generators/linear.cpp: linear_bf16, _residual, _gated)
// against the naive fp32 reference (tests/reference/layers.h) given the same weights
// rounded to bf16 (halformer/packed_layout.h: to_bf16, round to nearest even) and, where
// the kernels multiply bf16 pairs (bf16_dot_product targets: AVX-512 BF16), the same
// activations rounded to bf16: every product is then exact in fp32 in both, so only the
// summation order differs (within KERNEL_TOLERANCE of the output scale: 2e-5; 1e-4 for
// the OpenCL build, test_layers_bf16_opencl, run on PoCL, whose erf differs slightly); on
// the awkward shapes of test_layers.cpp (1 row, rows and features not multiples of the
// tiles, fewer features than a vector, odd K).
#include <gtest/gtest.h>
#include <HalideBuffer.h>

#include <algorithm>
#include <cstdio>
#include <random>

#include "amx_tile_state.h"
#include "layer_checks.h"
#include "halformer/packed_layout.h"
#include "reference/layers.h"
#include "test_bf16_kernels.h"  // KERNEL(name): this build's variant (CPU or OpenCL)

namespace {

using Buf = Halide::Runtime::Buffer<float>;
using ref::Vec;
using ref::random_vec;
namespace hf = halformer;


enum class Second { None, Residual, Gate };
// The packed weight layout of these kernels (halformer/packed_layout.h).
const hf::WeightLayout kLayout = hf::weight_layout(KERNEL_METADATA(test_linear_bf16_relu)()->target);
const int kPanel = kLayout.bf16_panel();

TEST(LinearBf16, LayoutFollowsTarget) {
  std::printf("kernels for %s: %s\n", KERNEL_METADATA(test_linear_bf16_relu)()->target,
              kLayout.bf16_pairs ? "bf16 pairs (vdpbf16ps)" : "bf16 weights widened to fp32");
  EXPECT_FALSE(hf::bf16_dot_product("x86-64-linux-avx-avx2-f16c-fma-sse41"));
  EXPECT_FALSE(hf::bf16_dot_product("x86-64-linux-avx-avx2-avx512-avx512_skylake-avx512_cannonlake-f16c-fma-sse41"));
  EXPECT_TRUE(hf::bf16_dot_product("x86-64-linux-avx-avx2-avx512-avx512_cannonlake-avx512_skylake-avx512_zen4-f16c-fma-sse41"));
  // K paired: weight (n, k) at ((n / panel * pairs + k / 2) * panel + n % panel) * 2 + k % 2.
  EXPECT_EQ(hf::packed_bf16_index(5, 67, 3, 64, true), size_t(((1 * 3 + 1) * 64 + 3) * 2 + 1));
  EXPECT_EQ(hf::packed_bf16_size(5, 67, 64, true), size_t(2 * 3 * 64 * 2));
}

// half: the kernel stores 16-bit values of that format (out_bf16; CPU builds only).
template <typename Fn>
void check(Fn fn, int K, int N, const char* act, Second second, const layer_checks::HalfFormat* half = nullptr) {
  const bool bf16_out = half != nullptr;
  for (int M : {1, 2, 3, 8, 13, 35, 300}) {
    SCOPED_TRACE("M=" + std::to_string(M));
    Vec x = random_vec(size_t(M) * K, 1), w = random_vec(size_t(N) * K, 2, 0.2f), b = random_vec(N, 3);
    Vec res = random_vec(size_t(M) * N, 4), out(size_t(M) * N, -7.0f);
    // The runtime's layout and bf16 rounding (runtime/weight_packing.cpp), zero padding included.
    std::vector<uint16_t> wh(hf::packed_bf16_size(K, N, kPanel, kLayout.bf16_pairs), 0);
    for (int n = 0; n < N; ++n)
      for (int k = 0; k < K; ++k)
        wh[hf::packed_bf16_index(K, n, k, kPanel, kLayout.bf16_pairs)] = hf::to_bf16(w[size_t(n) * K + k]);
    Vec wr(w.size()), xr = x;  // the reference's operands: the same rounding, unpacked
    for (size_t i = 0; i < w.size(); ++i) wr[i] = hf::from_bf16(hf::to_bf16(w[i]));
    if (kLayout.bf16_pairs)
      for (float& v : xr) v = hf::from_bf16(hf::to_bf16(v));
    Buf xb(x.data(), {K, M}), bb(b.data(), {N}), rb(res.data(), {N, M}), ob(out.data(), {N, M});
    std::vector<uint16_t> out_bits(out.size(), 0);
    Halide::Runtime::Buffer<uint16_t> obits(out_bits.data(), {N, M});
    halide_buffer_t* o = bf16_out ? obits.raw_buffer() : ob.raw_buffer();
    const hf::Bf16WeightShape ws = hf::bf16_weight_shape(K, N, kPanel, kLayout.bf16_pairs);
    Halide::Runtime::Buffer<void> wb(hf::bf16_weight_type(kLayout.bf16_pairs), wh.data(), {ws.pair, ws.panel, ws.rows()});
    for (halide_buffer_t* in : {xb.raw_buffer(), wb.raw_buffer(), bb.raw_buffer(), rb.raw_buffer()})
      in->set_host_dirty();  // so GPU builds copy them to the device
    ASSERT_EQ(layer_checks::call_linear(fn, xb, wb, bb, rb, o), 0);
    ob.copy_to_host();  // GPU builds leave results on the device
    Vec want = ref::linear(xr, wr, b, M, K, N, act, second == Second::Residual ? &res : nullptr);
    if (second == Second::Gate)
      for (size_t i = 0; i < want.size(); ++i) want[i] *= res[i];
    if (bf16_out) {
      layer_checks::expect_rounded_half(out_bits, want, act, KERNEL_TOLERANCE, *half);
      continue;
    }
    layer_checks::expect_close(out, want, act, KERNEL_TOLERANCE);
  }
}

TEST(LinearBf16, RoundsToNearestEven) {
  EXPECT_EQ(hf::to_bf16(1.0f), 0x3f80);
  EXPECT_EQ(hf::from_bf16(hf::to_bf16(1.00390625f)), 1.0f);         // halfway, even below: down
  EXPECT_EQ(hf::from_bf16(hf::to_bf16(1.01171875f)), 1.015625f);    // halfway, odd below: up
  EXPECT_TRUE(std::isinf(hf::from_bf16(hf::to_bf16(3.4e38f))));     // rounds past the largest
  EXPECT_TRUE(std::isnan(hf::from_bf16(hf::to_bf16(std::nanf("")))));
}

TEST(LinearBf16, ReluK60N36) { check(KERNEL(test_linear_bf16_relu), 60, 36, "relu", Second::None); }
TEST(LinearBf16, GeluOddK17N100) { check(KERNEL(test_linear_bf16_gelu), 17, 100, "gelu", Second::None); }
// K = 48 (16 bf16, 32 bytes a tile step): on AMX CPUs these three run on tiles.
TEST(LinearBf16, WholePanelsK48N192) { check(KERNEL(test_linear_bf16_panels), 48, 192, "none", Second::None); }
TEST(LinearBf16, WideTasksK40N264) { check(KERNEL(test_linear_bf16_tasks), 40, 264, "relu", Second::None); }
TEST(LinearBf16, NarrowK40N3) { check(KERNEL(test_linear_bf16_narrow), 40, 3, "none", Second::None); }
TEST(LinearBf16, ResidualK48N36) { check(KERNEL(test_linear_bf16_residual), 48, 36, "none", Second::Residual); }
TEST(LinearBf16, GatedK48N36) { check(KERNEL(test_linear_bf16_gated), 48, 36, "none", Second::Gate); }

#ifndef KERNEL_GPU  // bf16 caches are CPU only: GPU builds keep them fp32
// The cross-attention cache of a reduced-precision model: its writer (the keys/values
// projection, out_bf16) stores the linear's output rounded to bf16, and its reader
// (attention kv_bf16) gives what fp32 attention gives on the widened keys and values.
TEST(KvCacheBf16, WriterRoundsToNearestK60N36) {
  check(KERNEL(test_linear_bf16_out_bf16), 60, 36, "relu", Second::None, &layer_checks::kBf16);
}
// An fp16 cache (precision_overrides.kv_cache: fp16, half=fp16): the same, to 11 bits.
TEST(KvCacheFp16, WriterRoundsToNearestK60N36) {
  check(KERNEL(test_linear_bf16_out_fp16), 60, 36, "relu", Second::None, &layer_checks::kFp16);
}

TEST(KvCacheBf16, CrossAttentionReadsBf16Head20) {
  const int H = 3, D = 20, Cq = H * D, Ckv = 2 * H * D;
  struct Shape { int B, Tq, Tk; };
  for (Shape s : {Shape{1, 1, 1}, Shape{2, 1, 9}, Shape{8, 1, 37}, Shape{2, 5, 17}, Shape{1, 35, 35}}) {
    SCOPED_TRACE("B=" + std::to_string(s.B) + " Tq=" + std::to_string(s.Tq) + " Tk=" + std::to_string(s.Tk));
    Vec q = ref::random_vec(size_t(s.B) * s.Tq * Cq, 5), kv = ref::random_vec(size_t(s.B) * s.Tk * Ckv, 6);
    std::vector<uint16_t> kv_bits = layer_checks::round_to_half(kv);
    Vec mask(size_t(s.B) * s.Tk, 0.0f);
    if (s.B > 1) mask[size_t(s.Tk) * 2 - 1] = -1e30f;  // batch 1's last key is padding
    Vec out(size_t(s.B) * s.Tq * H * D, -7.0f);
    Buf qb(q.data(), {D, H, s.Tq, s.B}), mb(mask.data(), {s.Tk, s.B}), ob(out.data(), {D, H, s.Tq, s.B});
    Halide::Runtime::Buffer<uint16_t> kvb(kv_bits.data(), {D, 2 * H, s.Tk, s.B});
    ASSERT_EQ(KERNEL(test_attention_cross_kv_bf16)(qb, kvb, mb, layer_checks::no_position_bias(), ob), 0);
    Vec want = ref::attention(q, Cq, kv, Ckv, mask, s.B, s.Tq, s.Tk, H, D, 0, 0, H, false);
    layer_checks::expect_close(out, want, "attention", KERNEL_TOLERANCE);
  }
}

// The self-attention cache: fused QKV rows (4 query heads, 2 key and value heads:
// grouped-query) stored as bf16, queries included; causal, over a whole sequence and as
// decode rows after a cache (the query rows are the cache's last ones); `padded`: that many
// first keys of the second sequence are padding.
template <typename Fn>
void check_self_cache(Fn kernel, const layer_checks::HalfFormat& format, int D = 20, int H = 4, int KVH = 2) {
  const int C = (H + 2 * KVH) * D;
  struct Shape { int B, Tq, Tk, padded = 0; };
  for (Shape s : {Shape{1, 1, 1}, Shape{2, 7, 7}, Shape{1, 1, 9}, Shape{8, 1, 37}, Shape{2, 35, 35}, Shape{2, 20, 45}, Shape{1, 1, 300}, Shape{2, 1, 600, 300}}) {
    SCOPED_TRACE("B=" + std::to_string(s.B) + " Tq=" + std::to_string(s.Tq) + " Tk=" + std::to_string(s.Tk));
    Vec rows = ref::random_vec(size_t(s.B) * s.Tk * C, 7);
    std::vector<uint16_t> bits = layer_checks::round_to_half(rows, format);
    // The query rows: the last Tq of each sequence.
    Vec q(size_t(s.B) * s.Tq * C);
    std::vector<uint16_t> q_bits(q.size());
    for (int b = 0; b < s.B; ++b)
      for (int i = 0; i < s.Tq; ++i)
        for (int c = 0; c < C; ++c) {
          const size_t from = (size_t(b) * s.Tk + s.Tk - s.Tq + i) * C + c, to = (size_t(b) * s.Tq + i) * C + c;
          q[to] = rows[from], q_bits[to] = bits[from];
        }
    Vec mask(size_t(s.B) * s.Tk, 0.0f), out(size_t(s.B) * s.Tq * H * D, -7.0f);
    if (s.padded > 0) std::fill(mask.begin() + s.Tk, mask.begin() + s.Tk + s.padded, -1e30f);
    Halide::Runtime::Buffer<uint16_t> qb(q_bits.data(), {D, C / D, s.Tq, s.B}), kvb(bits.data(), {D, C / D, s.Tk, s.B});
    Buf mb(mask.data(), {s.Tk, s.B}), ob(out.data(), {D, H, s.Tq, s.B});
    ASSERT_EQ(kernel(qb, kvb, mb, layer_checks::no_position_bias(), ob), 0);
    Vec want = ref::attention(q, C, rows, C, mask, s.B, s.Tq, s.Tk, H, D, 0, H, H + KVH, true, H / KVH);
    layer_checks::expect_close(out, want, "attention", KERNEL_TOLERANCE);
  }
}
TEST(KvCacheBf16, SelfAttentionReadsBf16RowsGqaCausal) {
  check_self_cache(KERNEL(test_attention_self_cache_bf16), layer_checks::kBf16);
}
// Head sizes 48 and 32: the decode rows' scores as bf16 pair dot products where the CPU has
// them, per head (2 query heads per key/value head) or the group's heads as lanes (4, 8).
TEST(KvCacheBf16, SelfAttentionReadsBf16RowsHead48) {
  check_self_cache(KERNEL(test_attention_self_cache_bf16_d48), layer_checks::kBf16, 48);
}
TEST(KvCacheBf16, SelfAttentionReadsBf16RowsHead48Group4) {
  check_self_cache(KERNEL(test_attention_self_cache_bf16_d48_g4), layer_checks::kBf16, 48, 8, 2);
}
TEST(KvCacheBf16, SelfAttentionReadsBf16RowsHead32Group8) {
  check_self_cache(KERNEL(test_attention_self_cache_bf16_d32_g8), layer_checks::kBf16, 32, 16, 2);
}
TEST(KvCacheFp16, SelfAttentionReadsFp16RowsGqaCausal) {
  check_self_cache(KERNEL(test_attention_self_cache_fp16), layer_checks::kFp16);
}

// The rotary writer of a 16-bit self-attention cache (rotary out_bf16): each row turned in
// fp32 at its position, then rounded once: within one rounding (2^-8 of the value for
// bf16, 2^-11 for fp16) of the reference turned in double; the heads past the turned ones
// are the input rounded to nearest even, bit for bit.
template <typename Fn>
void check_rotary_writer(Fn kernel, const layer_checks::HalfFormat& format) {
  const int heads_total = 5, H = 3, D = 20, C = heads_total * D, R = 20;
  for (int M : {1, 3, 13, 35}) {
    SCOPED_TRACE("rows " + std::to_string(M));
    Vec x = ref::random_vec(size_t(M) * C, 41);
    std::vector<int32_t> pos(M);
    for (int m = 0; m < M; ++m) pos[m] = (m * 29 + 63) % 64;
    std::vector<uint16_t> got(x.size());
    Buf xb(x.data(), {C, M});
    Halide::Runtime::Buffer<int32_t> pb(pos.data(), M);
    Halide::Runtime::Buffer<uint16_t> ob(got.data(), {C, M});
    ASSERT_EQ(kernel(xb, pb, ob), 0);
    Vec want = x;
    const std::vector<int> p(pos.begin(), pos.end());
    ref::rotary(want, C, 1, M, 0, H, D, R, 10000, false, &p);
    for (size_t i = 0; i < x.size(); ++i) {
      if (int(i % C) >= H * D) {
        ASSERT_EQ(got[i], format.to(x[i])) << "copied feature " << i;
        continue;
      }
      ASSERT_NEAR(format.from(got[i]), want[i], std::ldexp(std::abs(want[i]), -format.significant_bits) + 1e-6)
          << "feature " << i;
    }
  }
}
TEST(KvCacheBf16, RotaryWriterTurnsThenRounds) { check_rotary_writer(KERNEL(test_rotary_out_bf16), layer_checks::kBf16); }
TEST(KvCacheFp16, RotaryWriterTurnsThenRounds) { check_rotary_writer(KERNEL(test_rotary_out_fp16), layer_checks::kFp16); }
#endif

}  // namespace
