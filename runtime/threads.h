// Threads: every model's calls share one pool of spinning workers (threads.cpp; sized
// for the largest request), which Halide's parallel loops run on; a call of a model loaded
// with `threads` = k lets at most k - 1 workers join each loop, so it never runs on more
// than k threads at once. The limit belongs to the call (CallThreads, on the calling
// thread), not to the process. A second caller's loop, while one holds the pool, runs on
// Halide's own pool, split into at most k chunks. parallel_for runs the runtime's own host
// loops the same way, within that limit.
#pragma once

#include <HalideRuntime.h>

#include <algorithm>
#include <cstdint>
#include <exception>
#include <vector>

#include "halide_status.h"

namespace halformer {

// Installs the per-call limit once and grows the shared pool to `threads` (never shrinks it).
void reserve_threads(int threads);

// The calling thread's limit (k threads; 0: none) for the duration of one Model call.
struct CallThreads {
  int saved;
  explicit CallThreads(int k);
  ~CallThreads();
};


// body(i) for i in [0, n) on Halide's thread pool (so within the calling model's thread
// limit). An exception thrown by body is rethrown once all have run: the one of the
// lowest i, the error the sequential loop would have met first.
template <typename Body>
void parallel_for(int n, const char* what, const Body& body) {
  struct Job {
    const Body* body;
    std::vector<std::exception_ptr> errors;
  } job{&body, std::vector<std::exception_ptr>(size_t(std::max(n, 0)))};
  auto task = [](void*, int i, uint8_t* closure) -> int {
    auto& j = *reinterpret_cast<Job*>(closure);
    try {
      (*j.body)(i);
    } catch (...) {
      j.errors[size_t(i)] = std::current_exception();
    }
    return 0;
  };
  check_kernel(halide_do_par_for(nullptr, task, 0, n, reinterpret_cast<uint8_t*>(&job)), what);
  for (const auto& e : job.errors)
    if (e) std::rethrow_exception(e);
}

}  // namespace halformer
