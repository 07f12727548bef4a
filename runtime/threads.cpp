// The per-call thread limit on Halide's shared pool (see threads.h): a custom do_par_for
// that splits a loop into at most the calling model's thread count of chunks.
#include "threads.h"

#include <atomic>
#include <mutex>
#include <thread>

namespace halformer {
namespace {
thread_local int t_call_threads = 0;  // 0: no limit

struct Chunks {
  halide_task_t f;
  uint8_t* closure;
  int min, size, chunks;
};
int run_chunk(void* user_context, int i, uint8_t* closure) {
  const Chunks& c = *reinterpret_cast<Chunks*>(closure);
  const int lo = c.min + int(int64_t(c.size) * i / c.chunks), hi = c.min + int(int64_t(c.size) * (i + 1) / c.chunks);
  for (int j = lo; j < hi; ++j)
    if (int status = c.f(user_context, j, c.closure)) return status;
  return 0;
}
// Halide's pool size: every core, unless a model asked for more threads.
std::atomic<int> g_pool_threads{int(std::max(1u, std::thread::hardware_concurrency()))};

int limited_par_for(void* user_context, halide_task_t f, int min, int size, uint8_t* closure) {
  const int k = t_call_threads;
  // No limit, or one the pool cannot exceed anyway: Halide's own (dynamic) scheduling.
  if (k <= 0 || k >= size || k >= g_pool_threads.load(std::memory_order_relaxed))
    return halide_default_do_par_for(user_context, f, min, size, closure);
  Chunks c{f, closure, min, size, k};
  if (k == 1) return run_chunk(user_context, 0, reinterpret_cast<uint8_t*>(&c));
  return halide_default_do_par_for(user_context, run_chunk, 0, k, reinterpret_cast<uint8_t*>(&c));
}

}  // namespace

// Installs limited_par_for once and grows the shared pool to `threads` (never shrinks it).
void reserve_threads(int threads) {
  static const bool installed = (halide_set_custom_do_par_for(limited_par_for), true);
  (void)installed;
  static std::mutex lock;
  std::lock_guard<std::mutex> guard(lock);
  if (threads > g_pool_threads.load()) {
    g_pool_threads.store(threads);
    halide_set_num_threads(threads);
  }
}
CallThreads::CallThreads(int k) : saved(t_call_threads) { t_call_threads = k; }
CallThreads::~CallThreads() { t_call_threads = saved; }

}  // namespace halformer
