// Every layer kind's generated CPU pipeline against the naive reference
// (tests/reference/layers.h) on awkward shapes: 1 row (decode), row counts that are
// not a multiple of the row tile (8) or vector width (16), feature sizes that are not
// multiples of the vector width (60, 36, 17, 37), and head size 20 (not a power of two).
// Tolerance: max |got - ref| <= KERNEL_TOLERANCE * max(1, max |ref|): 2e-5 on the CPU
// (fp32 vs double accumulation), 1e-4 for the GPU builds (PoCL's and CUDA's
// exp/erf/tanh differ from the host's). Built three times: test_layers (CPU, label unit),
// test_layers_opencl (the generators' GPU schedules on PoCL, label gpu), and
// test_layers_cuda (the same schedules on an NVIDIA GPU, labels gpu + cuda; skipped
// where there is no CUDA driver or device).
#include <gtest/gtest.h>
#include <HalideBuffer.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <iterator>
#include <limits>
#include <random>

#include "halformer/packed_layout.h"
#include "layer_checks.h"
#include "reference/layers.h"
#include "test_kernels.h"  // KERNEL(name): this build's variant (CPU, OpenCL or CUDA)

#ifdef KERNEL_NEEDS_CUDA
#include <HalideRuntimeCuda.h>
#endif

namespace {

#ifdef KERNEL_NEEDS_CUDA
// A machine without an NVIDIA GPU (CI) skips the CUDA build's tests instead of failing.
// Halide's default error handler aborts: while probing, errors are only recorded.
std::string g_probe_error;
void record_probe_error(void*, const char* msg) { g_probe_error = msg; }

class CudaDevicePresent : public ::testing::Environment {
 public:
  void SetUp() override {
    halide_error_handler_t previous = halide_set_error_handler(record_probe_error);
    Halide::Runtime::Buffer<float> probe(1);
    int rc = probe.device_malloc(halide_cuda_device_interface());
    halide_set_error_handler(previous);
    if (rc != 0) GTEST_SKIP() << "CUDA is not usable here (" << g_probe_error << "): skipped";
  }
};
const ::testing::Environment* const kCudaCheck = ::testing::AddGlobalTestEnvironment(new CudaDevicePresent);
#endif

using Buf = Halide::Runtime::Buffer<float>;
using ref::Vec;
using ref::random_vec;


Buf view(Vec& v, std::initializer_list<int> dims_innermost_first) {
  std::vector<int> d(dims_innermost_first);
  Buf b(v.data(), d);
  b.set_host_dirty();  // so GPU builds copy it to the device
  return b;
}

// This build's bound by default (KERNEL_TOLERANCE: CPU, OpenCL or CUDA).
void expect_close(const Vec& got, const Vec& want, const std::string& what, double rel = KERNEL_TOLERANCE) {
  layer_checks::expect_close(got, want, what, rel);
}

const int kRows[] = {1, 3, 8, 13, 35};
// The packed weight layout's panel width for this build's kernels (halformer/packed_layout.h).
const int kPanel = halformer::weight_panel(KERNEL_METADATA(test_linear_relu)()->target);
// Linear also takes its many-row GPU schedule above 256 rows (schedules/gpu.h): 300 is
// not a multiple of its 16-row block tile.
const int kLinearRows[] = {1, 2, 3, 8, 13, 35, 300};

template <typename Fn>
void check_linear(Fn fn, int K, int N, const char* act, bool residual) {
  for (int M : kLinearRows) {
    SCOPED_TRACE("M=" + std::to_string(M));
    Vec x = random_vec(size_t(M) * K, 1), w = random_vec(size_t(N) * K, 2, 0.2f), b = random_vec(N, 3);
    Vec res = random_vec(size_t(M) * N, 4), out(size_t(M) * N, -7.0f);
    Vec wp = halformer::pack_linear(w.data(), N, K, kPanel);  // the runtime's layout
    Buf xb = view(x, {K, M}), wb = view(wp, {kPanel, K, halformer::panel_count(N, kPanel)}), bb = view(b, {N}), ob = view(out, {N, M}),
        rb = view(res, {N, M});
    ASSERT_EQ(layer_checks::call_linear(fn, xb, wb, bb, rb, ob), 0);
    ob.copy_to_host();  // GPU builds leave results on the device
    expect_close(out, ref::linear(x, w, b, M, K, N, act, residual ? &res : nullptr), act);
  }
}

TEST(Linear, ReluK60N36) { check_linear(KERNEL(test_linear_relu), 60, 36, "relu", false); }
TEST(Linear, GeluK17N100) { check_linear(KERNEL(test_linear_gelu), 17, 100, "gelu", false); }
TEST(Linear, SiluK17N100) { check_linear(KERNEL(test_linear_silu), 17, 100, "silu", false); }
TEST(Linear, Relu2K37N52) { check_linear(KERNEL(test_linear_relu2), 37, 52, "relu2", false); }
TEST(Linear, TanhK60N60) { check_linear(KERNEL(test_linear_tanh), 60, 60, "tanh", false); }
TEST(Linear, WholePanelsK40N192) { check_linear(KERNEL(test_linear_panels), 40, 192, "none", false); }
// 3 to 8 rows: tasks of several panels, the last one partial.
TEST(Linear, WideTasksK40N264) { check_linear(KERNEL(test_linear_tasks), 40, 264, "relu", false); }
// Fewer features than a vector (a classifier's 3 classes): tiles never reach past N.
TEST(Linear, NarrowK40N3) { check_linear(KERNEL(test_linear_narrow), 40, 3, "none", false); }
TEST(Linear, ResidualK60N36) { check_linear(KERNEL(test_linear_residual), 60, 36, "none", true); }
// GPU builds: K summed in slices on the many-row path (300 rows).
TEST(Linear, KSplitGuardedK101N36) { check_linear(KERNEL(test_linear_ksplit), 101, 36, "gelu", false); }
TEST(Linear, KSplitResidualK64N40) { check_linear(KERNEL(test_linear_ksplit_residual), 64, 40, "none", true); }
// GPU builds: K in register-staged chunks of 4 on the many-row path, whole and in slices.
TEST(Linear, StagedK60N36) { check_linear(KERNEL(test_linear_staged), 60, 36, "relu", false); }
TEST(Linear, StagedKSplitResidualK64N40) { check_linear(KERNEL(test_linear_staged_ksplit), 64, 40, "none", true); }

// linear_gated: (x W + b) * gate, the up projection of SwiGLU / GeGLU.
TEST(Linear, GatedK60N36) {
  const int K = 60, N = 36;
  for (int M : kLinearRows) {
    SCOPED_TRACE("M=" + std::to_string(M));
    Vec x = random_vec(size_t(M) * K, 1), w = random_vec(size_t(N) * K, 2, 0.2f), b = random_vec(N, 3);
    Vec gate = random_vec(size_t(M) * N, 4), out(size_t(M) * N, -7.0f);
    Vec wp = halformer::pack_linear(w.data(), N, K, kPanel);
    Buf xb = view(x, {K, M}), wb = view(wp, {kPanel, K, halformer::panel_count(N, kPanel)}), bb = view(b, {N}),
        gb = view(gate, {N, M}), ob = view(out, {N, M});
    ASSERT_EQ(KERNEL(test_linear_gated)(xb, wb, bb, gb, ob), 0);
    ob.copy_to_host();
    Vec want = ref::linear(x, w, b, M, K, N);
    for (size_t i = 0; i < want.size(); ++i) want[i] *= gate[i];
    expect_close(out, want, "linear_gated");
  }
}

// heads 3, head size 20; fused QKV buffer (0, 3, 6) or separate Q / KV buffers (0, 0, 3).
struct AttentionShape { int B, Tq, Tk; };
const std::vector<AttentionShape> kAttentionShapes = {{1, 1, 1}, {2, 5, 5}, {1, 1, 9}, {3, 13, 13}, {2, 3, 17}, {1, 35, 35}};
template <typename Fn>
void check_attention(Fn fn, bool causal, bool cross, const std::vector<AttentionShape>& shapes = kAttentionShapes,
                     bool mask_all_of_second = false) {
  const int H = 3, D = 20, Cq = cross ? H * D : 3 * H * D, Ckv = cross ? 2 * H * D : 3 * H * D;
  for (AttentionShape s : shapes) {
    if (!cross && s.Tq != s.Tk && !causal) continue;  // self-attention: same sequence
    SCOPED_TRACE("B=" + std::to_string(s.B) + " Tq=" + std::to_string(s.Tq) + " Tk=" + std::to_string(s.Tk));
    Vec q = random_vec(size_t(s.B) * s.Tq * Cq, 5), kv = random_vec(size_t(s.B) * s.Tk * Ckv, 6);
    Vec mask(size_t(s.B) * s.Tk, 0.0f);
    if (s.B > 1) mask[size_t(s.Tk) * 2 - 1] = -1e30f;  // batch 1's last key is padding
    if (mask_all_of_second && s.B > 1) std::fill(mask.begin() + s.Tk, mask.begin() + 2 * s.Tk, -1e30f);
    if (!cross) q = kv;                                  // self-attention reads one buffer
    int Tq = cross ? s.Tq : s.Tk;
    Vec out(size_t(s.B) * Tq * H * D, -7.0f);
    Buf qb = cross ? view(q, {D, H, Tq, s.B}) : view(q, {D, 3 * H, Tq, s.B});
    Buf kvb = view(kv, {D, Ckv / D, s.Tk, s.B}), mb = view(mask, {s.Tk, s.B}), ob = view(out, {D, H, Tq, s.B});
    ASSERT_EQ(fn(qb, kvb, mb, layer_checks::no_position_bias(), ob), 0);
    ob.copy_to_host();
    Vec want = cross ? ref::attention(q, Cq, kv, Ckv, mask, s.B, Tq, s.Tk, H, D, 0, 0, H, false)
                     : ref::attention(kv, Ckv, kv, Ckv, mask, s.B, Tq, s.Tk, H, D, 0, H, 2 * H, causal);
    expect_close(out, want, "attention");
  }
}

TEST(Attention, SelfHead20) { check_attention(KERNEL(test_attention_self), false, false); }
TEST(Attention, CausalHead20) { check_attention(KERNEL(test_attention_causal), true, false); }
// GPU: the softmax statistics walked by one thread per query (gpu_reduce_lanes=0).
TEST(Attention, CausalSerialSoftmaxHead20) { check_attention(KERNEL(test_attention_causal_serial), true, false); }
TEST(Attention, CrossHead20) { check_attention(KERNEL(test_attention_cross), false, true); }
// GPU builds: keys in tiles of 32, 16 queries per block in groups (4 per V thread, 3 per
// score thread: partial groups).
TEST(Attention, SelfKeyTilesQueryGroupsHead20) { check_attention(KERNEL(test_attention_self_tiles), false, false); }
// Long inputs: GPU builds walk keys in tiles with an online softmax (gpu_key_tile), shared
// memory independent of the length: causal self-attention over 1,000 and 4,096 tokens,
// cross-attention of a few queries over 4,096 and 16,384 keys, and one with every key of
// a sequence masked (a uniform average, as with whole rows).
TEST(Attention, LongKeysHead20) {
  check_attention(KERNEL(test_attention_causal_tiles), true, false, {{1, 1000, 1000}, {1, 4096, 4096}});
  check_attention(KERNEL(test_attention_cross), false, true, {{2, 5, 4096}, {1, 2, 16384}});
  check_attention(KERNEL(test_attention_cross), false, true, {{2, 3, 700}}, /*mask_all_of_second=*/true);
}
// GPU builds: scores and V sums per thread in registers (gpu_score_queries, gpu_v_queries).
TEST(Attention, SelfRegisterSumsHead20) { check_attention(KERNEL(test_attention_self_regs), false, false); }
TEST(Attention, CausalRegisterSumsHead20) { check_attention(KERNEL(test_attention_causal_regs), true, false); }

// Decode step: one new query row against a longer cache (causal offset Tk - Tq). The
// one-row path sums in another order (dot products along d), so it matches the full
// sequence's row to rounding, not bit for bit.
TEST(Attention, CausalDecodeRowMatchesFullSequence) {
  const int H = 3, D = 20, C = 3 * H * D, T = 11;
  Vec kv = random_vec(size_t(T) * C, 7), mask(T, 0.0f), full(size_t(T) * H * D), row(H * D);
  Buf kvb = view(kv, {D, 3 * H, T, 1}), mb = view(mask, {T, 1}), fb = view(full, {D, H, T, 1});
  ASSERT_EQ(KERNEL(test_attention_causal)(kvb, kvb, mb, layer_checks::no_position_bias(), fb), 0);
  fb.copy_to_host();
  for (int t = 0; t < T; ++t) {
    halide_dimension_t qd[4] = {{0, D, 1}, {0, 3 * H, D}, {0, 1, C}, {0, 1, T * C}};
    halide_dimension_t kd[4] = {{0, D, 1}, {0, 3 * H, D}, {0, t + 1, C}, {0, 1, T * C}};
    Buf qb(kv.data() + size_t(t) * C, 4, qd), kb(kv.data(), 4, kd), m1 = view(mask, {t + 1, 1}),
        ob = view(row, {D, H, 1, 1});
    qb.set_host_dirty();
    kb.set_host_dirty();
    ASSERT_EQ(KERNEL(test_attention_causal)(qb, kb, m1, layer_checks::no_position_bias(), ob), 0);
    ob.copy_to_host();
    for (int i = 0; i < H * D; ++i)
      ASSERT_NEAR(row[i], full[size_t(t) * H * D + i], KERNEL_TOLERANCE * std::max(1.0f, std::abs(row[i])))
          << "t=" << t;
  }
}

#ifndef KERNEL_GPU
// A causal prompt in query chunks, each over only the keys it can see ([0, q1)), as the
// runtime runs it on the CPU (Session::decoder_self_attention, chunks of 32): bit for bit
// the one call over every key, since a hidden key's weight is exactly 0 and it comes after
// the keys a chunk reads. Here chunks of 16 and 13 (the last 13 rows of 45; not multiples
// of the score block), two sequences, one with padding.
TEST(Attention, CausalQueryChunksEqualOneCallBitwise) {
  const int H = 3, D = 20, C = 3 * H * D, T = 45, B = 2;
  Vec kv = random_vec(size_t(B) * T * C, 5), mask(size_t(B) * T, 0.0f), full(size_t(B) * T * H * D),
      chunked(full.size(), -7.0f);
  for (int t = 40; t < T; ++t) mask[T + t] = -1e30f;  // the second sequence: 40 tokens, right-padded
  Buf kvb = view(kv, {D, 3 * H, T, B}), mb = view(mask, {T, B}), fb = view(full, {D, H, T, B});
  ASSERT_EQ(KERNEL(test_attention_causal)(kvb, kvb, mb, layer_checks::no_position_bias(), fb), 0);
  for (int q0 = 0; q0 < T; q0 += 16) {
    const int q1 = std::min(T, q0 + 16);
    halide_dimension_t qd[4] = {{0, D, 1}, {0, 3 * H, D}, {0, q1 - q0, C}, {0, B, T * C}};
    halide_dimension_t kd[4] = {{0, D, 1}, {0, 3 * H, D}, {0, q1, C}, {0, B, T * C}};
    halide_dimension_t md[2] = {{0, q1, 1}, {0, B, T}};
    halide_dimension_t od[4] = {{0, D, 1}, {0, H, D}, {0, q1 - q0, H * D}, {0, B, T * H * D}};
    Buf qb(kv.data() + size_t(q0) * C, 4, qd), kb(kv.data(), 4, kd), m1(mask.data(), 2, md),
        ob(chunked.data() + size_t(q0) * H * D, 4, od);
    ASSERT_EQ(KERNEL(test_attention_causal)(qb, kb, m1, layer_checks::no_position_bias(), ob), 0);
  }
  for (size_t i = 0; i < full.size(); ++i)
    ASSERT_EQ(std::memcmp(&full[i], &chunked[i], sizeof(float)), 0) << "element " << i << ": " << full[i]
                                                                     << " vs " << chunked[i];
}
#endif

// Every position t of one sequence's fused rows kv [T][NH heads of D] again as a one-row
// decode step over the rows up to it (the Tq == 1 path), against row t of `want`.
template <typename Fn>
void expect_decode_rows(Fn fn, Vec& kv, int NH, int H, int D, int T, Vec& mask, const Vec& want, Buf bias) {
  const int C = NH * D;
  Vec row(size_t(H) * D);
  for (int t = 0; t < T; ++t) {
    halide_dimension_t qd[4] = {{0, D, 1}, {0, NH, D}, {0, 1, C}, {0, 1, T * C}};
    halide_dimension_t kd[4] = {{0, D, 1}, {0, NH, D}, {0, t + 1, C}, {0, 1, T * C}};
    Buf qb(kv.data() + size_t(t) * C, 4, qd), kb(kv.data(), 4, kd), m1 = view(mask, {t + 1, 1}),
        o1 = view(row, {D, H, 1, 1});
    qb.set_host_dirty();
    kb.set_host_dirty();
    ASSERT_EQ(fn(qb, kb, m1, bias, o1), 0);
    o1.copy_to_host();
    Vec want_row(want.begin() + size_t(t) * H * D, want.begin() + size_t(t + 1) * H * D);
    expect_close(row, want_row, ("decode row t=" + std::to_string(t)).c_str());
  }
}

// Self-attention on a fused row of H query heads and H / G key and value heads each,
// with rotary positions (R features, theta, layout): the whole sequence against the
// reference (rotated in double, then attention with head h reading key/value head h / G),
// and, when causal, every position again as a one-row decode step over the rows before it.
template <typename Fn>
void check_attention_gqa(Fn fn, int H, int G, int R, double theta, bool interleaved, bool causal) {
  const int D = 20, KVH = H / G, C = (H + 2 * KVH) * D;
  for (auto [B, T] : {std::pair{1, 1}, std::pair{2, 5}, std::pair{3, 13}, std::pair{1, 35}}) {
    SCOPED_TRACE("B=" + std::to_string(B) + " T=" + std::to_string(T));
    Vec kv = random_vec(size_t(B) * T * C, 11), mask(size_t(B) * T, 0.0f), out(size_t(B) * T * H * D, -7.0f);
    if (B > 1 && !causal) mask[size_t(T) * 2 - 1] = -1e30f;  // batch 1's last key is padding
    Buf kvb = view(kv, {D, H + 2 * KVH, T, B}), mb = view(mask, {T, B}), ob = view(out, {D, H, T, B});
    ASSERT_EQ(fn(kvb, kvb, mb, layer_checks::no_position_bias(), ob), 0);
    ob.copy_to_host();
    Vec rotated = kv;
    ref::rotary(rotated, C, B, T, 0, H + KVH, D, R, theta, interleaved);  // queries and keys
    Vec want = ref::attention(rotated, C, rotated, C, mask, B, T, T, H, D, 0, H, H + KVH, causal, G);
    expect_close(out, want, "attention");
    if (causal && B == 1) expect_decode_rows(fn, kv, H + 2 * KVH, H, D, T, mask, want, layer_checks::no_position_bias());
  }
}
TEST(Attention, GroupedQueryRotaryHalfHead20) {
  check_attention_gqa(KERNEL(test_attention_gqa_rotary), 4, 2, 20, 10000, false, true);
}
TEST(Attention, MultiQueryRotaryInterleavedPartial) {
  check_attention_gqa(KERNEL(test_attention_mqa_rotary_interleaved), 3, 3, 12, 500, true, true);
}
TEST(Attention, RotaryPartialEncoder) {
  check_attention_gqa(KERNEL(test_attention_rotary_encoder), 3, 1, 8, 10000, false, false);
}

// Rotary positions turned once in fused rows (generators/rotary.cpp, as a model's QKV
// projection writes them): the first H heads of each row at that row's own position (out
// of order; 0 and the last the cos / sin table holds among them), the other heads copied.
template <typename Fn>
void check_rotary(Fn fn, int heads_total, int H, int R, double theta, bool interleaved, int max_pos) {
  const int D = 20, C = heads_total * D;
  for (int M : kRows) {
    SCOPED_TRACE("rows " + std::to_string(M));
    Vec x = random_vec(size_t(M) * C, 31), out(x.size(), -7.0f);
    std::vector<int32_t> pos(M);
    for (int m = 0; m < M; ++m) pos[m] = m == 0 ? max_pos - 1 : (m * 37 + 5) % max_pos;
    if (M > 2) pos[2] = 0;
    Halide::Runtime::Buffer<int32_t> pb(pos.data(), M);
    pb.set_host_dirty();
    Buf xb = view(x, {C, M}), ob = view(out, {C, M});
    ASSERT_EQ(fn(xb, pb, ob), 0);
    ob.copy_to_host();
    Vec want = x;
    const std::vector<int> p(pos.begin(), pos.end());
    ref::rotary(want, C, 1, M, 0, H, D, R, theta, interleaved, &p);
    expect_close(out, want, "rotary");
  }
}
TEST(Rotary, HalfWholeHeadTablesOfPositions) { check_rotary(KERNEL(test_rotary), 5, 3, 20, 10000, false, 64); }
// Positions below 100: the float32 angle (pos * inv_freq, as transformers forms it) is then
// within the tolerance of the double reference's (at position 3,000 it is 1e-4 off).
TEST(Rotary, InterleavedPartialPerCall) { check_rotary(KERNEL(test_rotary_interleaved), 3, 2, 12, 500, true, 100); }

// Relative position bias (T5): a bucketed table [buckets][H] over j - (query position),
// saturating at distance M = 4, in the (2M + 1, H) form the kernel reads, unscaled scores
// (scale 1); sequences longer than M, and when causal every position again as a one-row
// decode step (the Tq == 1 path).
int t5_like_bucket(int r) { return r <= -3 ? 0 : r < 0 ? 1 : r == 0 ? 2 : r < 3 ? 3 : r < 4 ? 4 : 5; }
template <typename Fn>
void check_attention_relative(Fn fn, bool causal) {
  const int H = 3, D = 20, C = 3 * H * D, M = 4;
  Vec buckets = random_vec(size_t(6) * H, 21), table(size_t(2 * M + 1) * H);
  for (int r = -M; r <= M; ++r)
    for (int h = 0; h < H; ++h) table[size_t(h) * (2 * M + 1) + r + M] = buckets[size_t(t5_like_bucket(r)) * H + h];
  Buf tb = view(table, {2 * M + 1, H});
  for (auto [B, T] : {std::pair{1, 1}, std::pair{2, 5}, std::pair{3, 13}, std::pair{1, 35}}) {
    SCOPED_TRACE("B=" + std::to_string(B) + " T=" + std::to_string(T));
    Vec kv = random_vec(size_t(B) * T * C, 22), mask(size_t(B) * T, 0.0f), out(size_t(B) * T * H * D, -7.0f);
    if (B > 1 && !causal) mask[size_t(T) * 2 - 1] = -1e30f;  // batch 1's last key is padding
    Buf kvb = view(kv, {D, 3 * H, T, B}), mb = view(mask, {T, B}), ob = view(out, {D, H, T, B});
    ASSERT_EQ(fn(kvb, kvb, mb, tb, ob), 0);
    ob.copy_to_host();
    Vec want = ref::attention(kv, C, kv, C, mask, B, T, T, H, D, 0, H, 2 * H, causal, 1, &buckets, t5_like_bucket, 1.0);
    expect_close(out, want, "attention");
    if (causal && B == 1) expect_decode_rows(fn, kv, 3 * H, H, D, T, mask, want, tb);
  }
}
TEST(Attention, RelativeBiasEncoderUnscaled) { check_attention_relative(KERNEL(test_attention_relative), false); }
TEST(Attention, RelativeBiasCausalDecodeRows) { check_attention_relative(KERNEL(test_attention_relative_causal), true); }

template <typename Fn>
void check_layernorm(Fn fn, bool annotated) {
  const int C = 60;
  for (int M : kRows) {
    Vec x = random_vec(size_t(M) * C, 8, 3.0f), g = random_vec(C, 9), b = random_vec(C, 10), out(x.size());
    Buf xb = view(x, {C, M}), gb = view(g, {C}), bb = view(b, {C}), ob = view(out, {C, M});
    ASSERT_EQ(fn(xb, gb, bb, ob), 0);
    ob.copy_to_host();
    expect_close(out, ref::layer_norm(x, g, b, M, C, 1e-5, annotated), "layer_norm");
  }
}
TEST(LayerNorm, StandardC60) { check_layernorm(KERNEL(test_layernorm_standard), false); }
TEST(LayerNorm, AnnotatedC60) { check_layernorm(KERNEL(test_layernorm_annotated), true); }
TEST(LayerNorm, RmsC60) {
  const int C = 60;
  for (int M : kRows) {
    Vec x = random_vec(size_t(M) * C, 8, 3.0f), g = random_vec(C, 9), unused(C, 5.0f), out(x.size());
    Buf xb = view(x, {C, M}), gb = view(g, {C}), bb = view(unused, {C}), ob = view(out, {C, M});
    ASSERT_EQ(KERNEL(test_layernorm_rms)(xb, gb, bb, ob), 0);
    ob.copy_to_host();
    expect_close(out, ref::rms_norm(x, g, M, C, 1e-6), "rms_norm");
  }
}

template <typename Fn>
void check_embedding(Fn fn, const std::string& positions, bool scale, int Y = 0, int C = 60) {
  const int V = 11, P = 40;
  for (int offset : {0, 7}) {
    for (auto [B, T] : {std::pair{1, 1}, {2, 13}, {3, 5}}) {
      std::vector<int32_t> tok(size_t(B) * T);
      for (size_t i = 0; i < tok.size(); ++i) tok[i] = int32_t((i * 7 + 3) % V);
      std::vector<int32_t> types(tok.size());
      for (size_t i = 0; i < types.size(); ++i) types[i] = Y ? int32_t(i % Y) : 0;
      Vec table = random_vec(size_t(V) * C, 11), pos = random_vec(size_t(P) * C, 12), out(size_t(B) * T * C);
      Vec type_table = random_vec(size_t(std::max(Y, 1)) * C, 15);
      Halide::Runtime::Buffer<int32_t> tb(tok.data(), T, B), yb(types.data(), T, B);
      tb.set_host_dirty();
      yb.set_host_dirty();
      Buf tab = view(table, {C, V}), pb = view(pos, {C, P}), ob = view(out, {C, T, B}),
          ytab = view(type_table, {C, std::max(Y, 1)});
      ASSERT_EQ(fn(tb, yb, tab, pb, ytab, offset, ob), 0);
      ob.copy_to_host();
      expect_close(out, ref::embedding(tok, B, T, table, C, scale, positions, pos, offset, types, Y ? type_table : Vec{}),
                   positions.c_str());
    }
  }
}
TEST(Embedding, SinusoidalScaledC60) { check_embedding(KERNEL(test_embedding_sinusoidal), "sinusoidal", true); }
// Marian's layout (transformers' MarianSinusoidalPositionalEmbedding): sin half, cos half.
TEST(Embedding, SinusoidalSplitScaledC60) {
  check_embedding(KERNEL(test_embedding_sinusoidal_split), "sinusoidal_split", true);
}
TEST(Embedding, SinusoidalSplitScaledOddC45) {
  check_embedding(KERNEL(test_embedding_sinusoidal_split_odd), "sinusoidal_split", true, 0, 45);
}
TEST(Embedding, LearnedUnscaledC60) { check_embedding(KERNEL(test_embedding_learned), "learned", false); }
TEST(Embedding, LearnedWithTokenTypesC60) { check_embedding(KERNEL(test_embedding_types), "learned", false, 3); }

template <typename Fn>
void check_pool(Fn fn, bool cls, bool normalize) {
  const int C = 60;
  for (auto [B, T] : {std::pair{1, 1}, {3, 13}, {2, 35}}) {
    Vec x = random_vec(size_t(B) * T * C, 16), valid(size_t(B) * T, 1.0f), out(size_t(B) * C);
    for (int b = 1; b < B; ++b)
      for (int t = T - b * 3; t < T; ++t) valid[size_t(b) * T + std::max(t, 1)] = 0.0f;  // padding at the end
    Buf xb = view(x, {C, T, B}), vb = view(valid, {T, B}), ob = view(out, {C, B});
    ASSERT_EQ(fn(xb, vb, ob), 0);
    ob.copy_to_host();
    expect_close(out, ref::pool(x, valid, B, T, C, cls, normalize), "pool");
  }
}
TEST(Pooling, ClsC60) { check_pool(KERNEL(test_pool_cls), true, false); }
TEST(Pooling, MeanL2NormalisedC60) { check_pool(KERNEL(test_pool_mean_l2), false, true); }

TEST(Softmax, LogAndPlainV37) {
  const int V = 37;
  for (int M : kRows) {
    Vec x = random_vec(size_t(M) * V, 13, 4.0f), a(x.size()), b(x.size());
    Buf xb = view(x, {V, M}), ab = view(a, {V, M}), bb = view(b, {V, M});
    ASSERT_EQ(KERNEL(test_log_softmax_37)(xb, ab), 0);
    ASSERT_EQ(KERNEL(test_softmax_37)(xb, bb), 0);
    ab.copy_to_host();
    bb.copy_to_host();
    expect_close(a, ref::softmax(x, M, V, true), "log_softmax");
    expect_close(b, ref::softmax(x, M, V, false), "softmax");
  }
}

TEST(Argmax, FirstMaximumV37) {
  const int V = 37;
  for (int M : kRows) {
    Vec x = random_vec(size_t(M) * V, 14);
    if (M > 2) x[size_t(2) * V + 30] = x[size_t(2) * V + 4] = 100.0f;  // a tie: first index wins
    std::vector<int32_t> got(M);
    Buf xb = view(x, {V, M});
    Halide::Runtime::Buffer<int32_t> gb(got.data(), M);
    ASSERT_EQ(KERNEL(test_argmax_37)(xb, gb), 0);
    gb.copy_to_host();
    EXPECT_EQ(got, ref::argmax(x, M, V));
  }
}

// cast_bf16 against rounding done by comparing distances: the nearer of the two bf16
// values around x, the even one on a tie (IEEE round-to-nearest-even); NaN stays NaN.
uint16_t nearest_bf16(float x) {
  if (std::isnan(x)) return 0x7fc0;
  uint32_t u;
  std::memcpy(&u, &x, 4);
  const uint16_t lo = uint16_t(u >> 16);  // toward zero; lo + 1 is one step away from zero
  if ((u & 0xffffu) == 0) return lo;
  auto widen = [](uint16_t h) {
    // Past the largest finite bf16 rounding goes to infinity as if the exponent went on: 2^128.
    if ((h & 0x7fff) == 0x7f80) return (h & 0x8000 ? -1.0 : 1.0) * std::ldexp(1.0, 128);
    const uint32_t w = uint32_t(h) << 16;
    float f;
    std::memcpy(&f, &w, 4);
    return double(f);
  };
  const double below = std::abs(double(x) - widen(lo)), above = std::abs(widen(uint16_t(lo + 1)) - double(x));
  if (below != above) return below < above ? lo : uint16_t(lo + 1);
  return (lo & 1) ? uint16_t(lo + 1) : lo;
}

TEST(Convert, CastBf16RoundsToNearestEven) {
  const int C = 37;
  for (int M : kRows) {
    Vec x = random_vec(size_t(M) * C, 16);
    auto bits = [](uint32_t u) {
      float f;
      std::memcpy(&f, &u, 4);
      return f;
    };
    // Ties (even below: stays; odd below: up), a subnormal, infinity, -0, large finite
    // values, FLT_MAX and the tie at the top (both round to infinity), and NaNs that plain
    // rounding would turn into infinity (0x7f800001) or zero (0xffffffff).
    const float special[] = {1.00390625f, 1.01171875f, -2.5e-39f, std::numeric_limits<float>::infinity(), -0.0f,
                             3.0e38f, std::numeric_limits<float>::max(), bits(0x7f7f8000u), bits(0x7f7f7fffu),
                             std::numeric_limits<float>::quiet_NaN(), bits(0x7f800001u), bits(0xffffffffu)};
    for (size_t i = 0; i < std::size(special) && i < x.size(); ++i) x[i] = special[i];
    std::vector<uint16_t> got(x.size());
    Buf xb = view(x, {C, M});
    Halide::Runtime::Buffer<uint16_t> gb(got.data(), C, M);
    ASSERT_EQ(KERNEL(test_cast_bf16)(xb, gb), 0);
    gb.copy_to_host();
    for (size_t i = 0; i < x.size(); ++i) {
      const uint16_t want = nearest_bf16(x[i]);
      if (std::isnan(x[i])) {
        EXPECT_EQ(got[i] & 0x7f80, 0x7f80) << "NaN at " << i;
        EXPECT_NE(got[i] & 0x7f, 0) << "NaN at " << i;
      } else {
        ASSERT_EQ(got[i], want) << "element " << i << " = " << x[i] << " (M " << M << ")";
      }
    }
  }
}

TEST(Gate, SiluTimesUp) {
  const int N = 37;
  for (int M : kRows) {
    Vec g = random_vec(size_t(M) * N, 17), u = random_vec(size_t(M) * N, 18), out(g.size(), -7.0f), want(g.size());
    for (size_t i = 0; i < g.size(); ++i) want[i] = float(double(g[i]) / (1.0 + std::exp(-double(g[i]))) * u[i]);
    Buf gb = view(g, {N, M}), ub = view(u, {N, M}), ob = view(out, {N, M});
    ASSERT_EQ(KERNEL(test_gate_silu)(gb, ub, ob), 0);
    ob.copy_to_host();
    expect_close(out, want, "gate silu");
    // In place, as the runtime calls it (out = up).
    ASSERT_EQ(KERNEL(test_gate_silu)(gb, ub, ub), 0);
    ub.copy_to_host();
    expect_close(u, want, "gate silu in place");
  }
}

// NaN or +inf anywhere in a row (overflowed activations) gives -1, whatever else the row
// holds (a larger value before it, +inf after it, the last index); -inf is an ordinary
// (masked) value. The kernel scans in 16 lanes (index % 16): rows 7 and 8 put the NaN on
// the last lane, before and after the row's maximum.
TEST(Argmax, NonFiniteRowsAreMinusOneV37) {
  const int V = 37, M = 9;
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  Vec x = random_vec(size_t(M) * V, 15);
  auto at = [&](int m, int v) -> float& { return x[size_t(m) * V + v]; };
  at(0, 20) = nan;
  at(1, 3) = 100.0f, at(1, 36) = nan;
  at(2, 5) = inf;
  at(3, 0) = nan, at(3, 9) = inf;
  at(4, 11) = -inf, at(4, 15) = 50.0f;  // an ordinary row: 15
  at(5, 36) = inf;
  for (int v = 0; v < V; ++v) at(6, v) = -inf;  // all masked: the first index
  at(7, 15) = nan, at(7, 30) = 100.0f;
  at(8, 2) = 100.0f, at(8, 31) = nan;
  std::vector<int32_t> got(M);
  Buf xb = view(x, {V, M});
  Halide::Runtime::Buffer<int32_t> gb(got.data(), M);
  ASSERT_EQ(KERNEL(test_argmax_37)(xb, gb), 0);
  gb.copy_to_host();
  EXPECT_EQ(got, (std::vector<int32_t>{-1, -1, -1, -1, 15, -1, 0, -1, -1}));
}

}  // namespace
