// halformer_peak: the machine's measured limits, the denominators of every "% of peak"
// and "% of bandwidth bound" that bench/run prints.
//
//   halformer_peak [--threads 1,2] [--seconds 0.3] [--samples 5] [--bytes 536870912]
//   -> one JSON object on stdout:
//      {"isa": "avx512", "fma_gflops": {"1": {"best": .., "median": ..}, "2": {...}},
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

Stat measure_fma(int threads, double seconds, int samples) {
  // Calibrate the iteration count on one thread so that a sample lasts ~`seconds`.
  int64_t iters = 1 << 16;
  for (;;) {
    auto t0 = Clock::now();
    g_sink = fma_loop(iters);
    double s = std::chrono::duration<double>(Clock::now() - t0).count();
    if (s > 0.05 || iters > (int64_t(1) << 40)) {
      iters = std::max<int64_t>(1, int64_t(iters * seconds / s));
      break;
    }
    iters *= 4;
  }
  const double flops_per_thread = double(iters) * kChains * kLanes * 2.0;
  std::vector<double> gflops;
  std::vector<float> sink(threads);
  for (int s = 0; s < samples; ++s) {
    double secs = run_threads(threads, [&](int t) { sink[t] = fma_loop(iters); });
    gflops.push_back(flops_per_thread * threads / secs * 1e-9);
  }
  for (float v : sink) g_sink = g_sink + v;
  return summarize(gflops);
}

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

  std::string fma = "{", rd = "{";
  for (size_t k = 0; k < threads.size(); ++k) {
    int t = std::max(1, threads[k]);
    Stat f = measure_fma(t, seconds, samples);
    Stat r = measure_read(t, buf, n, samples);
    char tmp[256];
    std::snprintf(tmp, sizeof tmp, "%s\"%d\": {\"best\": %.3f, \"median\": %.3f}", k ? ", " : "", t, f.best,
                  f.median);
    fma += tmp;
    std::snprintf(tmp, sizeof tmp, "%s\"%d\": {\"best\": %.3f, \"median\": %.3f}", k ? ", " : "", t, r.best,
                  r.median);
    rd += tmp;
  }
  std::free(buf);
  std::printf("{\"isa\": \"%s\", \"lanes\": %d, \"chains\": %d, \"fma_gflops\": %s}, \"read_gbs\": %s}, "
              "\"buffer_bytes\": %zu}\n",
              kIsa, kLanes, kChains, fma.c_str(), rd.c_str(), n * sizeof(float));
  return 0;
}
