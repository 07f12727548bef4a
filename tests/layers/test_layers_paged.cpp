// Attention over a paged key/value cache (generators/attention.cpp block_size; the
// engine's pool, runtime/kv_blocks.h): keys and values live in blocks of a pool, each
// sequence's scattered over blocks named by its block table. Checked against the same
// kernel built for a contiguous cache on the same rows gathered in order -- bit for bit,
// which is what lets the engine promise a request the tokens it gets alone -- and against
// the naive reference (tests/reference/layers.h). Grouped-query heads, a causal prompt
// after earlier blocks, decode rows of different lengths, fp32, bf16 and int8 caches
// (halformer/kv_int8.h: the reference reads the int8 rows' values); block size 4, so
// sequences span several blocks and end inside one.
#include <gtest/gtest.h>
#include <HalideBuffer.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>

#include "halformer/kv_int8.h"
#include "layer_checks.h"
#include "reference/layers.h"
#include "test_paged_kernels.h"  // KERNEL(name)

namespace {

using Buf = Halide::Runtime::Buffer<float>;
using ref::Vec;

constexpr int BS = 4;
// The kernels' heads: query heads, key/value heads, head size (tests/layers/CMakeLists.txt).
struct Heads {
  int H = 4, KVH = 2, D = 20;
};

struct Shape {
  int B, Tq;
  std::vector<int> keys;  // per sequence (the mask hides the rest); Tk is the longest. Tq > 1: all equal
};

// The cache's elements of `values` (rows of `heads` heads of D features), which then hold
// the values the kernel reads: float as they are, uint16_t 16-bit bits, int8_t int8 rows.
template <typename Elem>
std::vector<Elem> encode(Vec& values, int D, const layer_checks::HalfFormat* half) {
  if constexpr (sizeof(Elem) == 4) {
    return values;
  } else if constexpr (sizeof(Elem) == 2) {
    return layer_checks::round_to_half(values, *half);
  } else {
    const int E = halformer::kv_int8_row_bytes(D);
    std::vector<int8_t> bytes(values.size() / D * E);
    for (size_t r = 0; r < values.size() / D; ++r) {
      float* v = &values[r * D];
      int8_t* row = &bytes[r * E];
      halformer::quantize_kv_row(D, [&](int f) { return v[f]; }, row);
      for (int f = 0; f < D; ++f) v[f] = row[f] * halformer::kv_row_scale(row, D);
    }
    return bytes;
  }
}

// Elem: float, uint16_t (16-bit cache bits; the queries too), or int8_t (int8 rows; bf16 queries).
template <typename Elem, typename Paged, typename Contiguous>
void check(Paged paged, Contiguous contiguous, const Shape& s, const layer_checks::HalfFormat* half,
           Heads heads = {}) {
  using QElem = std::conditional_t<sizeof(Elem) == 1, uint16_t, Elem>;
  const int H = heads.H, KVH = heads.KVH, D = heads.D;
  const int Ckv = 2 * KVH * D;  // a pool row: the keys, then the values
  const int E = sizeof(Elem) == 1 ? halformer::kv_int8_row_bytes(D) : D, Ekv = 2 * KVH * E;  // as stored
  const int Cq = H * D;
  const int Tk = *std::max_element(s.keys.begin(), s.keys.end()), per_seq = (Tk + BS - 1) / BS;
  const int blocks = s.B * per_seq + 3;  // more than needed: unused blocks hold noise
  Vec pool = ref::random_vec(size_t(blocks) * BS * Ckv, 11);
  Vec q = ref::random_vec(size_t(s.B) * s.Tq * Cq, 12);
  std::vector<Elem> pool_elems = encode<Elem>(pool, D, half);
  std::vector<QElem> q_elems = encode<QElem>(q, D, half);
  // Each sequence's blocks, shuffled over the pool; contiguous: the same rows in order.
  std::vector<int> order(static_cast<size_t>(blocks));
  std::iota(order.begin(), order.end(), 0);
  std::shuffle(order.begin(), order.end(), std::mt19937(5));
  Halide::Runtime::Buffer<int32_t> table(per_seq, s.B);
  Vec rows(size_t(s.B) * Tk * Ckv, 0.0f), mask(size_t(s.B) * Tk, 0.0f);
  std::vector<Elem> row_elems(size_t(s.B) * Tk * Ekv);
  for (int b = 0; b < s.B; ++b) {
    for (int n = 0; n < per_seq; ++n) table(n, b) = order[size_t(b * per_seq + n)];
    for (int j = 0; j < Tk; ++j) {
      const size_t from = (size_t(table(j / BS, b)) * BS + j % BS) * Ckv, to = (size_t(b) * Tk + j) * Ckv;
      std::copy_n(&pool[from], Ckv, &rows[to]);
      std::copy_n(&pool_elems[from / Ckv * Ekv], Ekv, &row_elems[to / Ckv * Ekv]);
      if (j >= s.keys[size_t(b)]) mask[size_t(b) * Tk + j] = -1e30f;
    }
  }
  Halide::Runtime::Buffer<QElem> qb(q_elems.data(), {D, H, s.Tq, s.B});
  Halide::Runtime::Buffer<Elem> poolb(pool_elems.data(), {E, 2 * KVH, BS, blocks}),
      rowsb(row_elems.data(), {E, 2 * KVH, Tk, s.B});
  Buf mb(mask.data(), {Tk, s.B});
  Vec got(size_t(s.B) * s.Tq * Cq, -7.0f), want(got.size(), -8.0f);
  Buf gotb(got.data(), {D, H, s.Tq, s.B}), wantb(want.data(), {D, H, s.Tq, s.B});
  auto bias = layer_checks::no_position_bias();
  ASSERT_EQ(paged(qb, poolb, mb, bias, table, gotb), 0);
  ASSERT_EQ(contiguous(qb, rowsb, mb, bias, wantb), 0);
  ASSERT_EQ(0, std::memcmp(got.data(), want.data(), got.size() * sizeof(float))) << "paged differs from contiguous";
  // The reference, per sequence over its own keys (the causal offset counts those).
  for (int b = 0; b < s.B; ++b) {
    const int n = s.keys[size_t(b)];
    Vec qs(q.begin() + int64_t(b) * s.Tq * Cq, q.begin() + int64_t(b + 1) * s.Tq * Cq);
    Vec ks(rows.begin() + int64_t(b) * Tk * Ckv, rows.begin() + (int64_t(b) * Tk + n) * Ckv);
    Vec r = ref::attention(qs, Cq, ks, Ckv, Vec(size_t(n), 0.0f), 1, s.Tq, n, H, D, 0, 0, KVH, true, H / KVH);
    Vec g(got.begin() + int64_t(b) * s.Tq * Cq, got.begin() + int64_t(b + 1) * s.Tq * Cq);
    layer_checks::expect_close(g, r, "paged attention, sequence " + std::to_string(b),
                               sizeof(Elem) < 4 ? 1e-4 : KERNEL_TOLERANCE);
  }
}

const std::vector<Shape> kShapes = {
    {1, 1, {1}},                 // the first decode step: one key
    {5, 1, {9, 1, 4, 13, 6}},    // decode rows of different lengths, inside and at block ends
    {1, 7, {11}},                // a prompt piece of 7 after 4 earlier positions (causal offset)
    {1, 35, {35}},               // a whole prompt, several key blocks of the schedule
    {3, 2, {6, 6, 6}},           // two queries per sequence (more than one: equal lengths, as the engine calls it)
};

TEST(PagedAttention, Fp32EqualsContiguousGqaCausal) {
  for (const Shape& s : kShapes) {
    SCOPED_TRACE("B=" + std::to_string(s.B) + " Tq=" + std::to_string(s.Tq));
    check<float>(KERNEL(test_attention_paged), KERNEL(test_attention_paged_twin), s, nullptr);
  }
}

TEST(PagedAttention, Bf16EqualsContiguousGqaCausal) {
  for (const Shape& s : kShapes) {
    SCOPED_TRACE("B=" + std::to_string(s.B) + " Tq=" + std::to_string(s.Tq));
    check<uint16_t>(KERNEL(test_attention_paged_bf16), KERNEL(test_attention_paged_bf16_twin), s,
                    &layer_checks::kBf16);
  }
}

// 8 query heads over 2 key/value heads of size 32: where the CPU has a bf16 dot product the
// decode rows take the group's heads as lanes (heads_as_lanes), keys in groups of 8 across
// blocks of 4.
TEST(PagedAttention, Bf16HeadsAsLanes) {
  std::vector<Shape> shapes = kShapes;
  shapes.push_back({3, 1, {37, 5, 20}});
  for (const Shape& s : shapes) {
    SCOPED_TRACE("B=" + std::to_string(s.B) + " Tq=" + std::to_string(s.Tq));
    check<uint16_t>(KERNEL(test_attention_paged_lanes), KERNEL(test_attention_paged_lanes_twin), s,
                    &layer_checks::kBf16, Heads{8, 2, 32});
  }
}

// The int8 cache's row (halformer/kv_int8.h): max |x| / 127 as the scale, each feature
// rounded half away from zero, the scale read back; a zero row and a row too small for a
// normal scale are zeros; a NaN or Inf makes the scale NaN (the row reads as NaN).
TEST(KvInt8Row, QuantizesRoundsAndPoisons) {
  const int hd = 4;
  std::vector<int8_t> row(halformer::kv_int8_row_bytes(hd));
  auto quantize = [&](std::vector<float> v) {
    halformer::quantize_kv_row(hd, [&](int f) { return v[size_t(f)]; }, row.data());
    return halformer::kv_row_scale(row.data(), hd);
  };
  EXPECT_EQ(quantize({127.0f, 63.5f, -63.5f, -0.49f}), 1.0f);
  EXPECT_EQ(std::vector<int>(row.begin(), row.begin() + hd), (std::vector<int>{127, 64, -64, 0}));
  EXPECT_EQ(quantize({0.0f, -2.54f, 1.0f, 0.0f}), 2.54f / 127.0f);
  EXPECT_EQ(std::vector<int>(row.begin(), row.begin() + hd), (std::vector<int>{0, -127, 50, 0}));
  for (std::vector<float> zero : {std::vector<float>{0, 0, 0, 0}, std::vector<float>{1e-37f, -1e-38f, 0, 0}}) {
    quantize(zero);
    EXPECT_EQ(std::vector<int>(row.begin(), row.begin() + hd), (std::vector<int>{0, 0, 0, 0}));
  }
  for (float bad : {NAN, INFINITY, -INFINITY}) {
    EXPECT_TRUE(std::isnan(quantize({1.0f, bad, 2.0f, 0.0f}))) << bad;
    EXPECT_EQ(std::vector<int>(row.begin(), row.begin() + hd), (std::vector<int>{0, 0, 0, 0}));
  }
}

// An int8 cache (kv_int8, bf16 queries): head size 20 (decode widens the integers), 48
// (decode scores as bf16 pairs per head: 2 query heads per key/value head) and 32 with 8
// query heads per key/value head (heads as lanes); long decode rows besides kShapes.
TEST(PagedAttention, Int8EqualsContiguous) {
  std::vector<Shape> shapes = kShapes;
  shapes.push_back({3, 1, {37, 5, 20}});
  shapes.push_back({2, 1, {300, 601}});
  for (const Shape& s : shapes) {
    SCOPED_TRACE("B=" + std::to_string(s.B) + " Tq=" + std::to_string(s.Tq));
    {
      SCOPED_TRACE("head size 20");
      check<int8_t>(KERNEL(test_attention_paged_int8), KERNEL(test_attention_paged_int8_twin), s, &layer_checks::kBf16);
    }
    {
      SCOPED_TRACE("head size 48");
      check<int8_t>(KERNEL(test_attention_paged_int8_d48), KERNEL(test_attention_paged_int8_d48_twin), s,
                    &layer_checks::kBf16, Heads{4, 2, 48});
    }
    {
      SCOPED_TRACE("heads as lanes");
      check<int8_t>(KERNEL(test_attention_paged_int8_lanes), KERNEL(test_attention_paged_int8_lanes_twin), s,
                    &layer_checks::kBf16, Heads{8, 2, 32});
    }
    {
      SCOPED_TRACE("heads as lanes, 8 heads of size 64 per group");
      check<int8_t>(KERNEL(test_attention_paged_int8_g8), KERNEL(test_attention_paged_int8_g8_twin), s,
                    &layer_checks::kBf16, Heads{16, 2, 64});
    }
  }
}

}  // namespace
