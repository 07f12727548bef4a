// Parallel loops (see threads.h): a custom do_par_for that runs a kernel's parallel loop
// on halformer's own spinning pool, within the calling model's thread limit.
//
// Why a pool of our own: Halide's pool puts an idle worker to sleep on a condition
// variable at once, and waking it took 15-60 us on a 2-core VM; a decode step is some 250
// parallel kernel calls of 0.03-0.3 ms, most after a short single-threaded gap (a norm,
// the runtime's bookkeeping), so a step paid that wake-up again and again. Here a worker
// spins for kSpinMicros after its last loop before it sleeps (docs/performance-log.md#runtime-spinning-pool).
#include "threads.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <thread>

#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>
#define HALFORMER_PAUSE() _mm_pause()
#else
#define HALFORMER_PAUSE() std::this_thread::yield()
#endif

namespace halformer {
namespace {
thread_local int t_call_threads = 0;    // 0: no limit
thread_local bool t_in_pool_loop = false;  // a task of ours is running on this thread

// How long an idle worker spins before it sleeps: long enough to bridge the gaps between a
// step's kernels, short enough that a process between requests goes quiet at once.
constexpr auto kSpinMicros = std::chrono::microseconds(2000);

// One parallel loop: the tasks [min, min + size) claimed one at a time by the caller and
// by at most `helpers` workers.
struct Loop {
  halide_task_t f;
  void* user_context;
  uint8_t* closure;
  int min, size, helpers;
  int joined = 0;                  // under Pool::lock
  std::atomic<int> next{0};        // the next unclaimed task
  std::atomic<int> active{0};      // workers inside this loop
  std::atomic<int> status{0};      // the first failure

  void run() {
    for (int i; status.load(std::memory_order_relaxed) == 0 && (i = next.fetch_add(1)) < size;)
      if (int s = f(user_context, min + i, closure)) {
        int ok = 0;
        status.compare_exchange_strong(ok, s);
      }
  }
};

class Pool {
 public:
  // Grows the pool to `threads` threads counting the caller (never shrinks it).
  void grow(int threads) {
    std::lock_guard<std::mutex> guard(lock_);
    while (int(workers_) + 1 < threads) {
      std::thread(&Pool::work, this).detach();
      ++workers_;
    }
  }
  int threads() const { return int(workers_.load()) + 1; }

  // Runs the loop here with up to `helpers` workers; false if another caller's loop holds
  // the pool (the caller then takes Halide's pool).
  bool run(Loop& loop) {
    {
      std::lock_guard<std::mutex> guard(lock_);
      if (current_) return false;
      current_ = &loop;
    }
    generation_.fetch_add(1);
    if (sleeping_.load() > 0) {
      std::lock_guard<std::mutex> guard(lock_);
      wake_.notify_all();
    }
    t_in_pool_loop = true;
    loop.run();
    t_in_pool_loop = false;
    {
      std::lock_guard<std::mutex> guard(lock_);
      current_ = nullptr;  // no worker joins from here on
    }
    while (loop.active.load(std::memory_order_acquire) > 0) HALFORMER_PAUSE();
    return true;
  }

 private:
  void work() {
    t_in_pool_loop = true;  // a kernel's nested parallel loop runs inline here
    uint64_t seen = generation_.load();
    for (;;) {
      // Spin for a new loop, then sleep until one is published.
      auto until = std::chrono::steady_clock::now() + kSpinMicros;
      for (int n = 0; generation_.load(std::memory_order_acquire) == seen; ++n) {
        HALFORMER_PAUSE();
        if (n % 256 == 255) {
          if (std::chrono::steady_clock::now() < until) {
            std::this_thread::yield();  // a core shared with another process's thread
            continue;
          }
          std::unique_lock<std::mutex> guard(lock_);
          sleeping_.fetch_add(1);
          wake_.wait(guard, [&] { return generation_.load() != seen; });
          sleeping_.fetch_sub(1);
        }
      }
      seen = generation_.load();
      Loop* loop = nullptr;
      {
        std::lock_guard<std::mutex> guard(lock_);
        if (current_ && current_->joined < current_->helpers) {
          loop = current_;
          ++loop->joined;
          loop->active.fetch_add(1);
        }
      }
      if (!loop) continue;
      loop->run();
      loop->active.fetch_sub(1, std::memory_order_release);
    }
  }

  std::mutex lock_;
  std::condition_variable wake_;
  Loop* current_ = nullptr;  // under lock_
  std::atomic<uint64_t> generation_{0};
  std::atomic<int> sleeping_{0};
  std::atomic<unsigned> workers_{0};
};

// Never destroyed: detached workers may still spin while the process exits.
Pool& pool() {
  static Pool* p = new Pool;
  return *p;
}

// A loop in at most `chunks` contiguous chunks of tasks: a second caller's loop on Halide's
// pool, within its limit, or (one chunk) a loop run in order on its caller.
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

int pool_par_for(void* user_context, halide_task_t f, int min, int size, uint8_t* closure) {
  const int threads = pool().threads(), limit = t_call_threads > 0 ? t_call_threads : threads;
  const int helpers = std::min({limit, threads, size}) - 1;
  if (helpers <= 0 || t_in_pool_loop) {
    // One thread, or a loop nested in one of ours: in order, here (one chunk).
    Chunks all{f, closure, min, size, 1};
    return run_chunk(user_context, 0, reinterpret_cast<uint8_t*>(&all));
  }
  Loop loop{f, user_context, closure, min, size, helpers};
  if (pool().run(loop)) return loop.status.load();
  if (helpers + 1 >= size) return halide_default_do_par_for(user_context, f, min, size, closure);
  Chunks c{f, closure, min, size, helpers + 1};
  return halide_default_do_par_for(user_context, run_chunk, 0, helpers + 1, reinterpret_cast<uint8_t*>(&c));
}

}  // namespace

// Installs pool_par_for once and grows the pools to `threads` (never shrinks them).
void reserve_threads(int threads) {
  static const bool installed = (halide_set_custom_do_par_for(pool_par_for), true);
  (void)installed;
  static std::mutex lock;
  std::lock_guard<std::mutex> guard(lock);
  const int want = std::max({threads, int(std::thread::hardware_concurrency()), 1});
  if (want > pool().threads()) {
    pool().grow(want);
    halide_set_num_threads(want);  // Halide's pool serves a second caller's loop meanwhile
  }
}
CallThreads::CallThreads(int k) : saved(t_call_threads) { t_call_threads = k; }
CallThreads::~CallThreads() { t_call_threads = saved; }

}  // namespace halformer
