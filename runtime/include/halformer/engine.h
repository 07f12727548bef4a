// Continuous batching for decoder-only models (issue 42; docs/engine.md): requests join
// and leave the running batch at every decode step instead of waiting for a whole batch.
//
// The engine holds `max_sequences` slots, each a row of one key/value cache of `max_len`
// positions. Every step():
//   1. retires cancelled requests;
//   2. prefills prompts, at most `prefill_tokens` tokens per step: those in progress first,
//      then waiting requests, oldest first, into free slots. A prompt runs through the
//      decoder alone, in pieces of the budget (a long prompt never stalls the running
//      decodes for more than the budget), with the arithmetic Model::generate gives it in
//      one piece; then its keys and values go into its slot and its first token is chosen;
//   3. runs one decoder step for every running sequence together, each row at its own
//      position (its own clock: no row waits for another's length), and chooses each
//      row's token with the request's own options and generator;
//   4. retires every sequence that ended (eos, max_new_tokens, a stop sequence, max_len).
// A request's tokens are those of Model::generate on that request alone: its sampling
// generator is the one of batch row 0 with its seed (generation.h), and a row's
// arithmetic does not depend on its neighbours (tests/generation/engine_alone.cpp).
// Not thread-safe: one thread calls submit / cancel / step (the Python engine's loop).
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <vector>

#include "halformer/generation.h"
#include "halformer/model.h"

namespace halformer {

struct EngineOptions {
  int max_sequences = 8;     // slots: sequences decoded together
  int max_len = 0;           // positions per slot, prompt + new tokens (0: the model's max_len)
  int prefill_tokens = 512;  // prompt tokens prefilled per step
};

// What a step produced for one request: a token, and whether the request ended with it.
struct EngineEvent {
  int64_t id = 0;
  int32_t token = -1;        // -1: no token (cancelled, or refused when admitted)
  bool finished = false;
  std::string reason;        // finished: "eos", "length", "stop", "cancelled", or an error
};

struct EngineState;  // the cache, the slots and the queue (engine.cpp)

class Engine {
 public:
  // `model` must outlive the engine. Throws Error for an encoder or encoder-decoder model
  // and for options out of range (naming them).
  Engine(const Model& model, const EngineOptions& options = {});
  ~Engine();
  Engine(Engine&&) noexcept;
  Engine& operator=(Engine&&) noexcept;

  // Queues a request and returns its id. `options`: as Model::generate's (max_new_tokens,
  // sampling, seed, penalties; beam_size 1; on_token is not called: tokens come from
  // step()). `stop`: token sequences that end the request when its new tokens end with
  // one (the stop tokens are delivered). Throws Error, naming the problem, for an empty
  // prompt, ids out of the vocabulary, or prompt + max_new_tokens over max_len.
  int64_t submit(const Sequence& prompt, const GenerationOptions& options = {}, std::vector<Sequence> stop = {});
  // Ends a waiting or running request at the next step (an event with reason "cancelled");
  // false if the id is unknown or already finished.
  bool cancel(int64_t id);
  // One iteration (admit, decode, retire); the events in order. Empty when idle.
  std::vector<EngineEvent> step();
  bool idle() const;        // nothing waiting or running
  int running() const;      // sequences in slots
  int waiting() const;      // requests queued
  const EngineOptions& options() const;

 private:
  const Model* model_;
  std::unique_ptr<EngineState> s_;
};

}  // namespace halformer
