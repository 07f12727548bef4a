// The engine's paged key/value cache, its bookkeeping (docs/engine.md): a pool of blocks,
// each kKvBlockSize positions of every decoder layer's keys and values, handed to sequences
// as they grow and read by attention through each sequence's block table
// (paged_self_attention). Blocks are reference-counted so that requests whose prompts start
// alike share the full blocks of that prefix, and a full prompt block stays in a prefix
// cache after its last user leaves, until the pool needs it back (those freed longest ago
// go first). Shared blocks are full and never written again, so no copy on write is needed:
// a sequence writes only its own last block.
#pragma once

#include <cstdint>
#include <list>
#include <unordered_map>
#include <vector>

#include "halformer/generation.h"

namespace halformer {

class KvBlockPool {
 public:
  // blocks: the pool's size; block 0 is the null block (zeros), which pads block tables
  // and is never handed out.
  explicit KvBlockPool(int blocks);
  int capacity() const { return int(refs_.size()) - 1; }  // blocks that can be handed out
  int available() const { return int(free_.size()); }     // unreferenced ones (cached ones included)
  int in_use() const { return capacity() - available(); }
  int cached() const { return int(by_key_.size()); }       // published in the prefix cache

  // A block for one sequence (one reference), or -1 when every block is referenced; a
  // cached block given out this way leaves the prefix cache.
  int allocate();
  // One reference less; at none the block is available again (still cached if published).
  void release(int block);

  // The prefix cache. A full block of a prompt is keyed by the chain of its prompt's tokens
  // up to its end (chain(parent key, its tokens)); share() checks the block's own tokens too.
  static uint64_t chain(uint64_t parent, const int32_t* tokens);
  // The block published under `key` holding `tokens`, with one more reference; -1 if none.
  int share(uint64_t key, const int32_t* tokens);
  // Makes a full block findable (a key already published keeps its first block).
  void publish(int block, uint64_t key, const int32_t* tokens);

 private:
  void unpublish(int block);
  std::vector<int> refs_;
  std::list<int> free_;                           // front: given out first
  std::vector<std::list<int>::iterator> where_;   // a free block's place in free_
  std::unordered_map<uint64_t, int> by_key_;
  std::vector<uint64_t> key_;                     // a published block's key
  std::vector<Sequence> tokens_;                  // a published block's tokens
};

}  // namespace halformer
