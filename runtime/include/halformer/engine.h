// Continuous batching for decoders over a paged key/value cache (issue 42;
// docs/engine.md): requests join and leave the running batch at every decode step instead
// of waiting for a whole batch, and their keys and values live in blocks of a pool sized by
// a memory budget instead of rows reserved for the longest request.
//
// Every step():
//   1. retires cancelled requests;
//   2. prefills prompts, at most `prefill_tokens` tokens per step: those in progress first,
//      then waiting requests, oldest first, into free slots while the pool has blocks for
//      their prompts (an encoder-decoder's request: its source through the encoder, alone,
//      once admitted; its decoder's prompt is the start token, a row of the decode pass).
//      A prompt runs through the decoder alone, in pieces of the budget (a long prompt
//      never stalls the running decodes for more than the budget), with the
//      arithmetic Model::generate gives it in one piece; the full blocks of a prompt prefix
//      that an earlier prompt already computed are shared, not recomputed;
//   3. runs one decoder step for every running sequence together, each row at its own
//      position, attention reading each row's keys through its block table, and chooses
//      each row's token with the request's own options and generator. A row that needs a
//      new block when the pool is empty preempts the newest running sequence: its blocks
//      are freed and it waits at the queue's head, to be prefilled again and its tokens so
//      far replayed, decode step by decode step;
//   4. retires every sequence that ended (eos, max_new_tokens, a stop sequence, max_len).
// A request's tokens are those of Model::generate on that request alone, preempted or not:
// its sampling generator is the one of batch row 0 with its seed (generation.h), and a
// row's arithmetic depends neither on its neighbours, nor on where its blocks are, nor on
// how its prompt was cut (tests/generation/engine_alone.cpp).
// submit() and cancel() may be called from any thread, also while a step runs (they hand
// over to the next step and never wait for one); the rest from one thread at a time, the
// one that steps (the Python engine's loop).
#pragma once

#include <cstdint>
#include <deque>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "halformer/generation.h"
#include "halformer/model.h"

namespace halformer {

struct EngineOptions {
  int max_sequences = 8;     // slots: sequences decoded together
  int max_len = 0;           // positions per sequence, prompt + new tokens (0: the model's max_len)
  int prefill_tokens = 512;  // prompt tokens prefilled per step
  // The key/value cache's budget in MiB (1 MiB = 2^20 bytes), in blocks of kKvBlockSize
  // positions of every layer; 0: room for max_sequences sequences of max_len.
  double kv_cache_mb = 0;
};

// The pool and what happened to it.
struct EngineStats {
  int blocks = 0;                  // blocks the pool can hand out
  int blocks_in_use = 0;           // held by running sequences
  int blocks_cached = 0;           // full prompt blocks findable by a later prompt
  int64_t block_bytes = 0;         // one block: kKvBlockSize positions of every layer's keys and values
  int64_t preemptions = 0;         // sequences preempted for lack of blocks
  int64_t prefix_tokens = 0;       // prompt tokens not computed: their blocks were shared
};

// What a step produced for one request: a token, and whether the request ended with it.
struct EngineEvent {
  int64_t id = 0;
  int32_t token = -1;        // -1: no token (cancelled, or refused when admitted)
  bool finished = false;
  std::string reason;        // finished: "eos", "length", "stop", "cancelled", or an error
  // The token's log-probability as Model::generate's scores give it (return_scores), NaN
  // when the request did not ask for scores.
  float logprob = std::numeric_limits<float>::quiet_NaN();
};

struct EngineState;  // the cache, the slots and the queue (engine.cpp)

class Engine {
 public:
  // `model` must outlive the engine. Throws Error for an encoder-only model and for
  // options out of range (naming them).
  Engine(const Model& model, const EngineOptions& options = {});
  ~Engine();
  Engine(Engine&&) noexcept;
  Engine& operator=(Engine&&) noexcept;

  // Queues a request and returns its id. `prompt`: a decoder-only model's prompt, an
  // encoder-decoder's source. `options`: as Model::generate's (max_new_tokens,
  // sampling, seed, penalties; beam_size 1; on_token is not called: tokens come from
  // step()). `stop`: token sequences that end the request when its new tokens end with
  // one (the stop tokens are delivered). Throws Error, naming the problem, for an empty
  // prompt, ids out of the vocabulary, prompt + max_new_tokens over max_len, or a request
  // whose keys and values would not fit the whole pool.
  int64_t submit(const Sequence& prompt, const GenerationOptions& options = {}, std::vector<Sequence> stop = {});
  // Ends a waiting or running request at the next step (an event with reason "cancelled");
  // false if the id is unknown or already finished.
  bool cancel(int64_t id);
  // One iteration (admit, decode, retire); the events in order. Empty when idle.
  std::vector<EngineEvent> step();
  // step()'s two halves, for a caller that delivers the first tokens of newly prefilled
  // requests before the decode pass runs: admit() (steps 1-2: cancellations, prefill,
  // first tokens), then decode() (steps 3-4).
  std::vector<EngineEvent> admit();
  std::vector<EngineEvent> decode();
  bool idle() const;        // nothing waiting or running
  int running() const;      // sequences in slots
  int waiting() const;      // requests queued
  const EngineOptions& options() const;
  EngineStats stats() const;

 private:
  std::vector<EngineEvent> half(bool admitting);  // admit() or decode(), on one call into the model
  const Model* model_;
  std::unique_ptr<EngineState> s_;
};

}  // namespace halformer
