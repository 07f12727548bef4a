// halformer_peak: the machine's measured limits, the denominators of every "% of peak"
// and "% of bandwidth bound" that bench/run prints.
//
//   halformer_peak [--threads 1,2] [--seconds 0.3] [--samples 5] [--bytes 536870912]
//   -> one JSON object on stdout:
//      {"isa": "avx512", "fma_gflops": {"1": {"best": .., "median": ..}, "2": {...}},
//       "int8_instruction": "vpmaddwd", "int8_gops": {...},
//       "bf16_instruction": "vdpbf16ps", "bf16_gflops": {...},   (AVX-512 BF16 CPUs only)
//       "amx_int8_gops": {...}, "amx_bf16_gflops": {...},         (AMX CPUs only: tdpbusd /
//                                                                 tdpbf16ps, the int8 and
//                                                                 bf16 kernels over 8 rows)
//       "read_gbs": {"1": {...}, "2": {...}}, "buffer_bytes": N}
//
// Design decisions
// * FP32 peak = an FMA loop on registers only, with the widest vector ISA the compiler was
//   told the host has (-march=native in bench/CMakeLists.txt): AVX-512 if __AVX512F__,
//   else AVX2+FMA, else scalar. 16 independent accumulator chains (12 for AVX2, which has
//   only 16 ymm registers) cover FMA latency x FMA ports on current x86 cores (4 cycles x
//   2 ports = 8 chains needed on Zen 4/5 and Ice Lake+); more would only spill.
//   acc = acc * m + c with m < 1 converges to a fixed point, so values stay normal (no
//   denormal slow-down, no overflow) however long it runs.
// * Read bandwidth = a streaming sum over a buffer far larger than the last-level cache
//   (default 512 MiB vs 32 MiB L3 here), split into one contiguous slice per thread, with
//   4 vector accumulators so that the adds are not the bottleneck. Pages are touched
//   (written) before timing so that page faults are not measured. This is the number the
//   decode bound uses: a decode step has to stream every decoder weight from DRAM.
// * Threads are std::threads started once per sample and released together by a spin
//   barrier, so start-up is not timed; the wall time is from the release to the last
//   thread's end. "best" (max over samples) is the peak; "median" shows the noise on a
//   shared machine. bench/run divides by "best" (the conservative choice: it makes every
//   percentage lower, never higher).
#include <immintrin.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "cpu_features.h"     // request_amx_tile_state
#include "halformer/amx.h"  // amx_usable_here

namespace {

using Clock = std::chrono::steady_clock;

#if defined(__AVX512F__)
constexpr const char* kIsa = "avx512";
constexpr int kLanes = 16;
#elif defined(__AVX2__) && defined(__FMA__)
constexpr const char* kIsa = "avx2";
constexpr int kLanes = 8;
#else
constexpr const char* kIsa = "scalar";
constexpr int kLanes = 1;
#endif

// One FMA chain block: `iters` iterations of kChains independent vector FMAs.
// Returns a value depending on every accumulator so that nothing is optimised away.
#if defined(__AVX512F__)
constexpr int kChains = 16;
float fma_loop(int64_t iters) {
  const __m512 m = _mm512_set1_ps(0.999999f), c = _mm512_set1_ps(1e-6f);
  __m512 a[kChains];
  for (int i = 0; i < kChains; ++i) a[i] = _mm512_set1_ps(1.0f + i * 1e-3f);
  for (int64_t it = 0; it < iters; ++it) {
#pragma GCC unroll 16
    for (int i = 0; i < kChains; ++i) a[i] = _mm512_fmadd_ps(a[i], m, c);
  }
  __m512 s = a[0];
  for (int i = 1; i < kChains; ++i) s = _mm512_add_ps(s, a[i]);
  return _mm512_reduce_add_ps(s);
}
#elif defined(__AVX2__) && defined(__FMA__)
constexpr int kChains = 12;
float fma_loop(int64_t iters) {
  const __m256 m = _mm256_set1_ps(0.999999f), c = _mm256_set1_ps(1e-6f);
  __m256 a[kChains];
  for (int i = 0; i < kChains; ++i) a[i] = _mm256_set1_ps(1.0f + i * 1e-3f);
  for (int64_t it = 0; it < iters; ++it) {
#pragma GCC unroll 12
    for (int i = 0; i < kChains; ++i) a[i] = _mm256_fmadd_ps(a[i], m, c);
  }
  __m256 s = a[0];
  for (int i = 1; i < kChains; ++i) s = _mm256_add_ps(s, a[i]);
  alignas(32) float v[8];
  _mm256_store_ps(v, s);
  float r = 0;
  for (float x : v) r += x;
  return r;
}
#else
constexpr int kChains = 8;
float fma_loop(int64_t iters) {
  float a[kChains];
  for (int i = 0; i < kChains; ++i) a[i] = 1.0f + i * 1e-3f;
  for (int64_t it = 0; it < iters; ++it)
    for (int i = 0; i < kChains; ++i) a[i] = __builtin_fmaf(a[i], 0.999999f, 1e-6f);
  float r = 0;
  for (float x : a) r += x;
  return r;
}
#endif

// The int8 kernels' inner instruction (generators/linear_int8.cpp): on Zen 4 class CPUs
// (AVX-512 VNNI and BF16: Halide's avx512_zen4 and later) vpdpbusd, uint8 x int8 quads
// summed into int32 lanes; elsewhere int16 pairs, vpdpwssd on AVX-512 VNNI, else
// vpmaddwd + vpaddd.
// The loop body is a register tile like the kernel's: rows x columns accumulators, each adding the
// product of its own (row, column) operand pair. Written in assembly: compilers hoist or
// share such loop-invariant products, or spill the accumulators (GCC -O2 did: 3x slower).
// One accumulator update = kLanes int32 lanes x kInt8Products products x (multiply + add).
#if defined(__AVX512VNNI__)
// 16 accumulators (4 x 4): vpdp* add in place, so each chain waits for its own latency.
constexpr int kInt8Updates = 16;
#if defined(__AVX512BF16__)
constexpr const char* kInt8Instruction = "vpdpbusd";
constexpr int kInt8Products = 4;
#define HF_INT8_OP "vpdpbusd"
#else
constexpr const char* kInt8Instruction = "vpdpwssd";
constexpr int kInt8Products = 2;
#define HF_INT8_OP "vpdpwssd"
#endif
#define HF_INT8_ROW(X, A0, A1, A2, A3)                                                            \
  HF_INT8_OP " %%zmm0, %%zmm" #X ", %%zmm" #A0 "\n " HF_INT8_OP " %%zmm1, %%zmm" #X ", %%zmm" #A1 "\n"  \
  HF_INT8_OP " %%zmm2, %%zmm" #X ", %%zmm" #A2 "\n " HF_INT8_OP " %%zmm3, %%zmm" #X ", %%zmm" #A3 "\n"
#define HF_INT8_TILE \
  HF_INT8_ROW(4, 8, 9, 10, 11) HF_INT8_ROW(5, 12, 13, 14, 15) HF_INT8_ROW(6, 16, 17, 18, 19) HF_INT8_ROW(7, 20, 21, 22, 23)
#define HF_INT8_CLOBBER "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8", "xmm9", "xmm10", "xmm11", \
  "xmm12", "xmm13", "xmm14", "xmm15", "xmm16", "xmm17", "xmm18", "xmm19", "xmm20", "xmm21", "xmm22", "xmm23"
#elif defined(__AVX2__)
constexpr int kInt8Updates = 8;  // 4 x 2, the AVX2 kernel's shape (16 ymm registers)
constexpr const char* kInt8Instruction = "vpmaddwd";
constexpr int kInt8Products = 2;
#define HF_INT8_UPDATE(X, W, T, A) "vpmaddwd %%ymm" #W ", %%ymm" #X ", %%ymm" #T "\n vpaddd %%ymm" #T ", %%ymm" #A ", %%ymm" #A "\n"
#define HF_INT8_TILE                                                                             \
  HF_INT8_UPDATE(4, 0, 2, 8) HF_INT8_UPDATE(4, 1, 3, 9) HF_INT8_UPDATE(5, 0, 2, 10) HF_INT8_UPDATE(5, 1, 3, 11) \
  HF_INT8_UPDATE(6, 0, 2, 12) HF_INT8_UPDATE(6, 1, 3, 13) HF_INT8_UPDATE(7, 0, 2, 14) HF_INT8_UPDATE(7, 1, 3, 15)
#define HF_INT8_CLOBBER "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8", "xmm9", "xmm10", "xmm11", "xmm12", "xmm13", "xmm14", "xmm15"
#endif
#ifdef HF_INT8_TILE
int32_t int8_loop(int64_t iters) {
  // Operands: whatever the registers hold (the throughput does not depend on values).
  for (int64_t it = 0; it < iters; ++it) __asm__ volatile(HF_INT8_TILE ::: HF_INT8_CLOBBER);
  return 0;
}
#else
constexpr int kInt8Updates = 8;
constexpr const char* kInt8Instruction = "scalar";
constexpr int kInt8Products = 2;
int32_t int8_loop(int64_t iters) {
  int32_t a[kInt8Updates] = {};
  volatile int16_t x = 3, w = -2;
  for (int64_t it = 0; it < iters; ++it)
    for (auto& v : a) v += int32_t(x) * w + int32_t(w) * x;
  int32_t r = 0;
  for (int32_t v : a) r += v;
  return r;
}
#endif

// The bf16 kernels' inner instruction on AVX-512 BF16 CPUs (generators/linear.cpp's
// linear_bf16 multiplies bf16 pairs into fp32 lanes): vdpbf16ps, the same 4 x 4 register
// tile as vpdpwssd above. One update = 16 lanes x 2 products x (multiply + add) = 64 flops.
#if defined(__AVX512BF16__)
#define HF_BF16_ROW(X, A0, A1, A2, A3)                                                              \
  "vdpbf16ps %%zmm0, %%zmm" #X ", %%zmm" #A0 "\n vdpbf16ps %%zmm1, %%zmm" #X ", %%zmm" #A1 "\n"     \
  "vdpbf16ps %%zmm2, %%zmm" #X ", %%zmm" #A2 "\n vdpbf16ps %%zmm3, %%zmm" #X ", %%zmm" #A3 "\n"
#define HF_BF16_TILE \
  HF_BF16_ROW(4, 8, 9, 10, 11) HF_BF16_ROW(5, 12, 13, 14, 15) HF_BF16_ROW(6, 16, 17, 18, 19) HF_BF16_ROW(7, 20, 21, 22, 23)
constexpr int kBf16Updates = 16;
float bf16_loop(int64_t iters) {
  // Operands: zeros (denormal-free; the throughput does not depend on values).
  __asm__ volatile("vpxord %%zmm0, %%zmm0, %%zmm0\n vmovdqa64 %%zmm0, %%zmm1\n vmovdqa64 %%zmm0, %%zmm2\n"
                   "vmovdqa64 %%zmm0, %%zmm3\n vmovdqa64 %%zmm0, %%zmm4\n vmovdqa64 %%zmm0, %%zmm5\n"
                   "vmovdqa64 %%zmm0, %%zmm6\n vmovdqa64 %%zmm0, %%zmm7\n" ::: HF_INT8_CLOBBER);
  for (int64_t it = 0; it < iters; ++it) __asm__ volatile(HF_BF16_TILE ::: HF_INT8_CLOBBER);
  return 0;
}
#endif

// AMX (Sapphire Rapids and later; generators/schedules/cpu_matmul.h): the int8 and bf16
// kernels' tile multiply for calls of more than 8 rows. 4 accumulator tiles fed by 2 A and
// 2 B operand tiles (zeros), registers only. One tdpbusd = 16 x 16 x 64 products, one
// tdpbf16ps 16 x 16 x 32 (x 2: multiply and add). Linux grants the tile registers on
// request (runtime/cpu_features.cpp: request_amx_tile_state, as Model::load asks); where
// the CPU or OS offers no AMX, or the request is refused, the AMX figures are left out.
#if defined(__AMX_TILE__) && defined(__AMX_INT8__) && defined(__AMX_BF16__)
bool amx_granted() { return halformer::amx_usable_here() && halformer::request_amx_tile_state().empty(); }
struct alignas(64) TileConfig {
  uint8_t palette, start_row, reserved[14];
  uint16_t colsb[16];
  uint8_t rows[16];
};
#define HF_AMX_OPS(OP) \
  OP " %%tmm6, %%tmm4, %%tmm0\n " OP " %%tmm7, %%tmm4, %%tmm1\n " OP " %%tmm6, %%tmm5, %%tmm2\n " OP " %%tmm7, %%tmm5, %%tmm3\n"
template <bool kBf16>
float amx_loop(int64_t iters) {
  TileConfig c{};
  c.palette = 1;
  for (int i = 0; i < 8; ++i) c.colsb[i] = 64, c.rows[i] = 16;
  _tile_loadconfig(&c);
  __asm__ volatile(
      "tilezero %%tmm0\n tilezero %%tmm1\n tilezero %%tmm2\n tilezero %%tmm3\n"
      "tilezero %%tmm4\n tilezero %%tmm5\n tilezero %%tmm6\n tilezero %%tmm7\n" ::: "memory");
  for (int64_t it = 0; it < iters; ++it) {
    if constexpr (kBf16)
      __asm__ volatile(HF_AMX_OPS("tdpbf16ps") ::: "memory");
    else
      __asm__ volatile(HF_AMX_OPS("tdpbusd") ::: "memory");
  }
  _tile_release();
  return 0;
}
constexpr double kAmxOps = 4.0 * 16 * 16 * 2;  // per iteration, times the k of one multiply
#endif

// Sum of floats in [p, p + n): vector loads, 4 accumulators.
float read_sum(const float* p, size_t n) {
#if defined(__AVX512F__)
  __m512 s0 = _mm512_setzero_ps(), s1 = s0, s2 = s0, s3 = s0;
  size_t i = 0;
  for (; i + 64 <= n; i += 64) {
    s0 = _mm512_add_ps(s0, _mm512_load_ps(p + i));
    s1 = _mm512_add_ps(s1, _mm512_load_ps(p + i + 16));
    s2 = _mm512_add_ps(s2, _mm512_load_ps(p + i + 32));
    s3 = _mm512_add_ps(s3, _mm512_load_ps(p + i + 48));
  }
  float r = _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(s0, s1), _mm512_add_ps(s2, s3)));
#elif defined(__AVX2__)
  __m256 s0 = _mm256_setzero_ps(), s1 = s0, s2 = s0, s3 = s0;
  size_t i = 0;
  for (; i + 32 <= n; i += 32) {
    s0 = _mm256_add_ps(s0, _mm256_load_ps(p + i));
    s1 = _mm256_add_ps(s1, _mm256_load_ps(p + i + 8));
    s2 = _mm256_add_ps(s2, _mm256_load_ps(p + i + 16));
    s3 = _mm256_add_ps(s3, _mm256_load_ps(p + i + 24));
  }
  alignas(32) float v[8];
  _mm256_store_ps(v, _mm256_add_ps(_mm256_add_ps(s0, s1), _mm256_add_ps(s2, s3)));
  float r = 0;
  for (float x : v) r += x;
#else
  float r = 0;
  size_t i = 0;
#endif
  for (; i < n; ++i) r += p[i];
  return r;
}

// Runs body(t) on `threads` threads released together; returns the wall seconds.
template <typename F>
double run_threads(int threads, F body) {
  std::atomic<int> ready{0};
  std::atomic<bool> go{false};
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t)
    pool.emplace_back([&, t] {
      ready.fetch_add(1);
      while (!go.load(std::memory_order_acquire)) {
      }
      body(t);
    });
  while (ready.load() < threads) {
  }
  auto t0 = Clock::now();
  go.store(true, std::memory_order_release);
  for (auto& th : pool) th.join();
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

struct Stat {
  double best, median;
};
Stat summarize(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return {v.back(), v.size() % 2 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2])};
}

volatile float g_sink;  // keeps results alive

// Operations per second (1e9) of `loop` (ops_per_iter per iteration) on `threads` threads.
template <typename Loop>
Stat measure_compute(Loop loop, double ops_per_iter, int threads, double seconds, int samples) {
  // Calibrate the iteration count on one thread so that a sample lasts ~`seconds`.
  int64_t iters = 1 << 16;
  for (;;) {
    auto t0 = Clock::now();
    g_sink = float(loop(iters));
    double s = std::chrono::duration<double>(Clock::now() - t0).count();
    if (s > 0.05 || iters > (int64_t(1) << 40)) {
      iters = std::max<int64_t>(1, int64_t(iters * seconds / s));
      break;
    }
    iters *= 4;
  }
  const double ops_per_thread = double(iters) * ops_per_iter;
  std::vector<double> gops;
  std::vector<float> sink(threads);
  for (int s = 0; s < samples; ++s) {
    double secs = run_threads(threads, [&](int t) { sink[t] = float(loop(iters)); });
    gops.push_back(ops_per_thread * threads / secs * 1e-9);
  }
  for (float v : sink) g_sink = g_sink + v;
  return summarize(gops);
}

Stat measure_fma(int threads, double seconds, int samples) {
  return measure_compute(fma_loop, double(kChains) * kLanes * 2.0, threads, seconds, samples);
}

// int8 "GOP/s": one int8 x int8 product + its add = 2 ops, as the bench counts a matmul's.
Stat measure_int8(int threads, double seconds, int samples) {
  return measure_compute(int8_loop, double(kInt8Updates) * kLanes * kInt8Products * 2.0, threads, seconds, samples);
}

#if defined(__AVX512BF16__)
Stat measure_bf16(int threads, double seconds, int samples) {
  return measure_compute(bf16_loop, double(kBf16Updates) * kLanes * 4.0, threads, seconds, samples);
}
#endif

#if defined(__AMX_TILE__) && defined(__AMX_INT8__) && defined(__AMX_BF16__)
Stat measure_amx_int8(int threads, double seconds, int samples) {
  return measure_compute(amx_loop<false>, kAmxOps * 64, threads, seconds, samples);
}
Stat measure_amx_bf16(int threads, double seconds, int samples) {
  return measure_compute(amx_loop<true>, kAmxOps * 32, threads, seconds, samples);
}
#endif

Stat measure_read(int threads, const float* buf, size_t n, int samples) {
  std::vector<double> gbs;
  std::vector<float> sink(threads);
  size_t per = (n / threads) & ~size_t(63);
  for (int s = 0; s < samples; ++s) {
    double secs = run_threads(threads, [&](int t) { sink[t] = read_sum(buf + t * per, per); });
    gbs.push_back(double(per) * threads * sizeof(float) / secs * 1e-9);
  }
  for (float v : sink) g_sink = g_sink + v;
  return summarize(gbs);
}

std::vector<int> parse_list(const char* s) {
  std::vector<int> out;
  for (const char* p = s; *p;) {
    out.push_back(std::atoi(p));
    while (*p && *p != ',') ++p;
    if (*p == ',') ++p;
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<int> threads = {1, 2};
  double seconds = 0.3;
  int samples = 5;
  size_t bytes = size_t(512) << 20;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto next = [&]() -> const char* {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "halformer_peak: %s needs a value\n", a.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--threads") threads = parse_list(next());
    else if (a == "--seconds") seconds = std::atof(next());
    else if (a == "--samples") samples = std::max(1, std::atoi(next()));
    else if (a == "--bytes") bytes = size_t(std::atoll(next()));
    else {
      std::fprintf(stderr,
                   "usage: halformer_peak [--threads 1,2] [--seconds S] [--samples N] [--bytes B]\n");
      return 2;
    }
  }
  size_t n = std::max<size_t>(bytes / sizeof(float), 1024) & ~size_t(63);
  float* buf = static_cast<float*>(std::aligned_alloc(64, n * sizeof(float)));
  if (!buf) {
    std::fprintf(stderr, "halformer_peak: cannot allocate %zu bytes\n", n * sizeof(float));
    return 1;
  }
  for (size_t i = 0; i < n; ++i) buf[i] = float(i & 1023) * 1e-3f;  // touch every page

  std::string fma = "{", i8 = "{", rd = "{", bf = "{", ai8 = "{", abf = "{";
  auto add = [](std::string& json, size_t k, int t, Stat st) {
    char tmp[256];
    std::snprintf(tmp, sizeof tmp, "%s\"%d\": {\"best\": %.3f, \"median\": %.3f}", k ? ", " : "", t, st.best,
                  st.median);
    json += tmp;
  };
  for (size_t k = 0; k < threads.size(); ++k) {
    int t = std::max(1, threads[k]);
    add(fma, k, t, measure_fma(t, seconds, samples));
    add(i8, k, t, measure_int8(t, seconds, samples));
#if defined(__AVX512BF16__)
    add(bf, k, t, measure_bf16(t, seconds, samples));
#endif
#if defined(__AMX_TILE__) && defined(__AMX_INT8__) && defined(__AMX_BF16__)
    if (amx_granted()) {
      add(ai8, k, t, measure_amx_int8(t, seconds, samples));
      add(abf, k, t, measure_amx_bf16(t, seconds, samples));
    }
#endif
    add(rd, k, t, measure_read(t, buf, n, samples));
  }
  std::free(buf);
  std::string bf16 = bf.size() > 1 ? ", \"bf16_instruction\": \"vdpbf16ps\", \"bf16_gflops\": " + bf + "}" : "";
  if (ai8.size() > 1) bf16 += ", \"amx_int8_gops\": " + ai8 + "}, \"amx_bf16_gflops\": " + abf + "}";
  std::printf("{\"isa\": \"%s\", \"lanes\": %d, \"chains\": %d, \"fma_gflops\": %s}, "
              "\"int8_instruction\": \"%s\", \"int8_gops\": %s}%s, \"read_gbs\": %s}, \"buffer_bytes\": %zu}\n",
              kIsa, kLanes, kChains, fma.c_str(), kInt8Instruction, i8.c_str(), bf16.c_str(), rd.c_str(),
              n * sizeof(float));
  return 0;
}
