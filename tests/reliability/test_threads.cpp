// The runtime's pool for Halide's parallel loops (runtime/threads.cpp), driven as a kernel
// drives it -- through halide_do_par_for: every task runs exactly once, a call's thread
// limit holds, a failing task's status comes back, a loop nested in a task runs, and
// callers on several threads at once (one on the pool, the others on Halide's) all finish.
#include <HalideRuntime.h>
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <mutex>
#include <set>
#include <thread>
#include <vector>

#include "threads.h"

namespace {

struct Counts {
  std::vector<std::atomic<int>> runs;
  std::mutex lock;
  std::set<std::thread::id> threads;
  explicit Counts(int n) : runs(size_t(n)) {}
};

int count_task(void*, int i, uint8_t* closure) {
  auto& c = *reinterpret_cast<Counts*>(closure);
  c.runs[size_t(i)].fetch_add(1);
  {
    std::lock_guard<std::mutex> guard(c.lock);
    c.threads.insert(std::this_thread::get_id());
  }
  std::this_thread::sleep_for(std::chrono::microseconds(200));  // long enough for a helper to join
  return 0;
}

TEST(ThreadPool, EveryTaskOnceWithinTheLimit) {
  halformer::reserve_threads(4);
  for (int limit : {0, 1, 2, 3}) {
    for (int n : {1, 2, 7, 64}) {
      halformer::CallThreads scope(limit);
      Counts c(n);
      ASSERT_EQ(halide_do_par_for(nullptr, count_task, 0, n, reinterpret_cast<uint8_t*>(&c)), 0);
      for (int i = 0; i < n; ++i) EXPECT_EQ(c.runs[size_t(i)].load(), 1) << "task " << i << " of " << n;
      if (limit > 0) EXPECT_LE(int(c.threads.size()), limit) << n << " tasks";
      if (limit == 1) EXPECT_EQ(*c.threads.begin(), std::this_thread::get_id());
    }
  }
  // Without a limit, a long loop finds helpers.
  Counts c(64);
  ASSERT_EQ(halide_do_par_for(nullptr, count_task, 0, 64, reinterpret_cast<uint8_t*>(&c)), 0);
  EXPECT_GT(c.threads.size(), 1u);
}

int fail_at_5(void*, int i, uint8_t*) { return i == 5 ? -17 : 0; }

TEST(ThreadPool, FailureStatusReturned) {
  halformer::reserve_threads(2);
  EXPECT_EQ(halide_do_par_for(nullptr, fail_at_5, 0, 40, nullptr), -17);
  EXPECT_EQ(halide_do_par_for(nullptr, fail_at_5, 10, 40, nullptr), 0);  // tasks 10..49
}

int nested_task(void*, int, uint8_t* closure) {
  Counts inner(9);
  if (int s = halide_do_par_for(nullptr, count_task, 0, 9, reinterpret_cast<uint8_t*>(&inner))) return s;
  for (auto& r : inner.runs)
    if (r.load() != 1) return -1;
  reinterpret_cast<std::atomic<int>*>(closure)->fetch_add(1);
  return 0;
}

TEST(ThreadPool, NestedLoopsRun) {
  halformer::reserve_threads(2);
  std::atomic<int> done{0};
  ASSERT_EQ(halide_do_par_for(nullptr, nested_task, 0, 6, reinterpret_cast<uint8_t*>(&done)), 0);
  EXPECT_EQ(done.load(), 6);
}

TEST(ThreadPool, ConcurrentCallers) {
  halformer::reserve_threads(2);
  std::vector<std::thread> callers;
  std::atomic<int> bad{0};
  for (int t = 0; t < 4; ++t)
    callers.emplace_back([&, t] {
      halformer::CallThreads scope(t % 2 + 1);
      for (int round = 0; round < 20; ++round) {
        Counts c(5 + t);
        if (halide_do_par_for(nullptr, count_task, 0, 5 + t, reinterpret_cast<uint8_t*>(&c)) != 0) bad++;
        for (auto& r : c.runs)
          if (r.load() != 1) bad++;
        if (int(c.threads.size()) > t % 2 + 1) bad++;
      }
    });
  for (auto& c : callers) c.join();
  EXPECT_EQ(bad.load(), 0);
}

}  // namespace
