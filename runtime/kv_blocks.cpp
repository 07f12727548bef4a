// The paged cache's block pool and prefix cache (kv_blocks.h).
#include "kv_blocks.h"

#include <algorithm>

#include "halformer/error.h"
#include "halformer/model_config.h"

namespace halformer {

KvBlockPool::KvBlockPool(int blocks)
    : refs_(size_t(blocks), 0), where_(size_t(blocks)), key_(size_t(blocks), 0), tokens_(size_t(blocks)) {
  if (blocks < 2) throw Error("internal: a block pool needs the null block and one more");
  refs_[0] = 1;  // the null block: never free
  for (int b = 1; b < blocks; ++b) where_[size_t(b)] = free_.insert(free_.end(), b);
}

int KvBlockPool::allocate() {
  if (free_.empty()) return -1;
  const int b = free_.front();
  free_.pop_front();
  unpublish(b);
  refs_[size_t(b)] = 1;
  return b;
}

void KvBlockPool::release(int block) {
  if (block <= 0 || block >= int(refs_.size()) || refs_[size_t(block)] <= 0)
    throw Error("internal: releasing block " + std::to_string(block) + ", which is not in use");
  if (--refs_[size_t(block)] > 0) return;
  // Published blocks are kept longest (their contents may be asked for again); the others
  // are given out first.
  const bool cached = !tokens_[size_t(block)].empty();
  where_[size_t(block)] = free_.insert(cached ? free_.end() : free_.begin(), block);
}

uint64_t KvBlockPool::chain(uint64_t parent, const int32_t* tokens) {
  uint64_t h = parent ^ 0x9e3779b97f4a7c15ULL;  // FNV-1a over the parent key and the tokens
  auto mix = [&](uint64_t v) {
    for (int i = 0; i < 8; ++i, v >>= 8) h = (h ^ (v & 0xff)) * 0x100000001b3ULL;
  };
  mix(parent);
  for (int i = 0; i < kKvBlockSize; ++i) mix(uint64_t(uint32_t(tokens[i])));
  return h;
}

int KvBlockPool::share(uint64_t key, const int32_t* tokens) {
  auto it = by_key_.find(key);
  if (it == by_key_.end()) return -1;
  const int b = it->second;
  if (!std::equal(tokens, tokens + kKvBlockSize, tokens_[size_t(b)].begin())) return -1;
  if (refs_[size_t(b)]++ == 0) free_.erase(where_[size_t(b)]);
  return b;
}

void KvBlockPool::publish(int block, uint64_t key, const int32_t* tokens) {
  if (by_key_.count(key) || !tokens_[size_t(block)].empty()) return;
  by_key_.emplace(key, block);
  key_[size_t(block)] = key;
  tokens_[size_t(block)].assign(tokens, tokens + kKvBlockSize);
}

void KvBlockPool::unpublish(int block) {
  if (tokens_[size_t(block)].empty()) return;
  by_key_.erase(key_[size_t(block)]);
  tokens_[size_t(block)].clear();
}

}  // namespace halformer
