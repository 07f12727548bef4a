// The host block cache that activations are drawn from (runtime/activations.h): size
// classes, reuse across nearby sizes, and the release of blocks left idle or past the cap.
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "activations.h"

using halformer::HostBlockCache;

TEST(HostBlocks, SizeClassesCoverTheRequestWithinAQuarter) {
  for (size_t bytes = 1; bytes < (size_t(64) << 20); bytes = bytes * 9 / 8 + 1) {
    const size_t c = HostBlockCache::size_class(bytes);
    ASSERT_GE(c, bytes);
    ASSERT_EQ(c % 64, 0u) << bytes;
    ASSERT_LE(c, bytes <= 256 ? bytes + 63 : bytes + bytes / 4 + 64) << bytes;
    ASSERT_EQ(HostBlockCache::size_class(c), c) << "a class is its own class: " << c;
  }
  const size_t huge = HostBlockCache::kMaxCachedBytes + 4096;
  EXPECT_EQ(HostBlockCache::size_class(huge), huge) << "past the cap: the exact size (never cached)";
}

TEST(HostBlocks, ANearbySizeReusesAFreedBlock) {
  HostBlockCache& cache = HostBlockCache::instance();
  float* first = nullptr;
  {
    auto a = cache.take(300000);  // 1.2 MB
    first = a.get();
    a.get()[299999] = 1.0f;
  }
  auto b = cache.take(310000);  // the same class
  EXPECT_EQ(b.get(), first);
  b.get()[309999] = 2.0f;  // the whole request is writable
}

TEST(HostBlocks, IdleBlocksGoBack) {
  HostBlockCache& cache = HostBlockCache::instance();
  const size_t floats = 777777, bytes = HostBlockCache::size_class(floats * sizeof(float));  // a class of its own here
  cache.take(floats);  // freed at once: cached
  EXPECT_EQ(cache.cached(bytes), bytes);
  for (uint64_t i = 0; i < HostBlockCache::kMaxIdleTakes; ++i) cache.take(16);
  EXPECT_EQ(cache.cached(bytes), bytes) << "not yet idle for kMaxIdleTakes takes";
  cache.take(16);
  EXPECT_EQ(cache.cached(bytes), 0u) << "idle longer: back to the system";
}

TEST(HostBlocks, PastTheCapTheLeastRecentlyFreedGoBack) {
  HostBlockCache& cache = HostBlockCache::instance();
  const size_t bytes = HostBlockCache::kMaxCachedBytes / 8 * 3;  // 48 MB: two fit under the cap, not three
  ASSERT_EQ(HostBlockCache::size_class(bytes), bytes);
  std::vector<std::shared_ptr<float>> held;
  for (int i = 0; i < 3; ++i) held.push_back(cache.take(bytes / sizeof(float)));
  float* last = held[2].get();
  held.clear();  // freed in order: the first goes back when the third comes in
  EXPECT_EQ(cache.cached(bytes), 2 * bytes);
  auto again = cache.take(bytes / sizeof(float));
  EXPECT_EQ(again.get(), last) << "the most recently freed block of the class is taken first";
}
