// Continuous batching over a paged cache (halformer/engine.h; docs/engine.md): the
// scheduling -- admission within the step's prefill budget and the pool's blocks, one
// decode pass for every running row, preemption when the pool runs out, retirement. The
// decoder over the pool is paged_decoder.h; the blocks' bookkeeping kv_blocks.h.
#include "halformer/engine.h"

#include <algorithm>
#include <cmath>
#include <deque>
#include <mutex>
#include <unordered_set>

#include "call.h"
#include "decoding.h"
#include "paged_decoder.h"

namespace halformer {

namespace {

constexpr int BS = kKvBlockSize;

struct Request {
  int64_t id = 0;
  Sequence prompt;  // the decoder's: an encoder-decoder's is its start token
  Sequence source;  // an encoder-decoder's input
  GenerationOptions options;
  std::vector<Sequence> stop;
  int max_new = 0;
};

// A request's progress, which survives preemption.
struct Progress {
  Request req;
  Sequence history;  // prompt + generated (transformers' input ids)
  int generated = 0;
  std::unique_ptr<TokenChooser> chooser;  // made when first admitted; its state carries on
};

// A running sequence: its progress and its blocks.
struct Slot {
  bool busy = false;
  Progress seq;
  int64_t admitted = 0;     // admission order: the newest is preempted first
  std::vector<int> blocks;  // the block table
  int len = 0;              // cache positions filled: the next position fed
  // A prompt of one token (an encoder-decoder's start token) is not prefilled: its position
  // is a row of the next decode pass, the same arithmetic (a query alone) in one pass less.
  bool prefilling() const { return busy && seq.req.prompt.size() > 1 && len < int(seq.req.prompt.size()); }
  bool decoding() const { return busy && !prefilling(); }
};

bool ends_with(const Sequence& s, const Sequence& tail) {
  return !tail.empty() && s.size() >= tail.size() && std::equal(tail.rbegin(), tail.rend(), s.rbegin());
}

int blocks_for(int64_t positions) { return int((positions + BS - 1) / BS); }

// The next piece of a prompt with `left` tokens to go and `budget` left this step. Never a
// piece of one token out of several: the kernels sum a lone query differently (attention's
// Tq == 1 path), so a prompt's bits would depend on where it was cut; the budget may be
// overrun by one token instead.
int piece(int left, int budget) {
  int n = std::min(left, budget);
  if (left > 1 && n == 1) n = 2;
  if (left - n == 1) n = n >= 3 ? n - 1 : n + 1;
  return n;
}

}  // namespace

struct EngineState {
  EngineOptions opt;
  std::unique_ptr<PagedCache> cache;
  std::vector<Slot> slots;
  std::deque<Progress> queue;  // preempted sequences first, then requests as they came
  std::vector<int64_t> cancelled;
  std::unique_ptr<SourceSlab> sources;  // an encoder-decoder's: slot b's source encoded at admission
  int64_t admissions = 0, preemptions = 0, prefix_tokens = 0;

  // What submit() and cancel() hand over from any thread, taken by the next admit(): a
  // caller never waits for a step that is running.
  struct Inbox {
    std::mutex mu;
    std::vector<Progress> submitted;
    std::vector<int64_t> cancels;
    std::unordered_set<int64_t> live, cancelling;  // ids not yet ended; those asked to cancel
    int64_t next_id = 1;
  } inbox;

  // The start of admit(): what was handed over joins the queue; cancellations of requests
  // that have ended since are dropped.
  void take_inbox() {
    std::lock_guard<std::mutex> lock(inbox.mu);
    for (Progress& p : inbox.submitted) queue.push_back(std::move(p));
    inbox.submitted.clear();
    for (int64_t id : inbox.cancels)
      if (inbox.live.count(id)) cancelled.push_back(id);
    inbox.cancels.clear();
  }
  void forget_ended(const std::vector<EngineEvent>& events) {
    std::lock_guard<std::mutex> lock(inbox.mu);
    for (const EngineEvent& e : events)
      if (e.finished) inbox.live.erase(e.id), inbox.cancelling.erase(e.id);
  }

  void release(Slot& slot) {
    for (int b : slot.blocks) cache->blocks.release(b);
    if (sources) sources->len[size_t(&slot - slots.data())] = 0;
    slot = Slot();
  }
};

Engine::Engine(const Model& model, const EngineOptions& options) : model_(&model), s_(std::make_unique<EngineState>()) {
  const ModelConfig& cfg = model.config();
  if (cfg.arch == Architecture::Encoder)
    throw Error("Engine: continuous batching needs a decoder (this model is " + std::string(enum_name(cfg.arch)) + ")");
  EngineOptions& o = s_->opt = options;
  if (o.max_len == 0) o.max_len = cfg.max_len;
  if (o.max_sequences < 1 || o.max_sequences > 1024)
    throw Error("Engine: max_sequences " + std::to_string(o.max_sequences) + " is outside [1, 1024]");
  if (o.max_len < 2 || o.max_len > cfg.max_len)
    throw Error("Engine: max_len " + std::to_string(o.max_len) + " is outside [2, the model's max_len " +
                std::to_string(cfg.max_len) + "]");
  if (o.prefill_tokens < 1) throw Error("Engine: prefill_tokens " + std::to_string(o.prefill_tokens) + " must be >= 1");
  if (!(o.kv_cache_mb >= 0) || !std::isfinite(o.kv_cache_mb))
    throw Error("Engine: kv_cache_mb " + std::to_string(o.kv_cache_mb) + " must be >= 0 (0: room for max_sequences of max_len)");
  Call c = model.call();
  if (!c->kt.paged_self_attention)
    throw Error("Engine: the model has no paged attention kernel: rebuild it with this halformer");
  const Weights& w = *model.weights_;
  const int64_t block_bytes = PagedCache::bytes_per_block(c.stack, w);
  int64_t count = o.kv_cache_mb > 0 ? int64_t(o.kv_cache_mb * double(1 << 20)) / block_bytes
                                    : int64_t(o.max_sequences) * blocks_for(o.max_len);
  if (count < 1)
    throw Error("Engine: kv_cache_mb " + std::to_string(o.kv_cache_mb) + " holds no block of the cache (" +
                std::to_string(block_bytes) + " bytes: " + std::to_string(BS) + " positions of every layer)");
  if (count >= (int64_t(1) << 31) - 1)  // block ids are int32
    throw Error("Engine: kv_cache_mb " + std::to_string(o.kv_cache_mb) + " asks for " + std::to_string(count) +
                " blocks of the cache; at most " + std::to_string((int64_t(1) << 31) - 2) + " are addressable");
  if (!c.stack.iface)
    refuse_beyond_memory(double(count) * double(block_bytes), "Engine: kv_cache_mb " + std::to_string(o.kv_cache_mb),
                         "a smaller kv_cache_mb (or max_sequences x max_len)");
  if (const int64_t layer_bytes = block_bytes / int64_t(w.decoder.size()) * (count + 1); layer_bytes >= (int64_t(1) << 31))
    throw Error("Engine: kv_cache_mb " + std::to_string(o.kv_cache_mb) + " makes each decoder layer's pool " +
                std::to_string(layer_bytes >> 20) + " MiB; the kernels address at most 2048 MiB per layer");
  s_->cache = std::make_unique<PagedCache>(c.stack, w, int(count) + 1);  // + the null block
  s_->slots.resize(size_t(o.max_sequences));
  if (cfg.arch == Architecture::EncoderDecoder) s_->sources = std::make_unique<SourceSlab>(o.max_sequences);
}
Engine::~Engine() = default;
Engine::Engine(Engine&&) noexcept = default;
Engine& Engine::operator=(Engine&&) noexcept = default;

const EngineOptions& Engine::options() const { return s_->opt; }
int Engine::waiting() const {
  std::lock_guard<std::mutex> lock(s_->inbox.mu);
  return int(s_->queue.size() + s_->inbox.submitted.size());
}
int Engine::running() const {
  return int(std::count_if(s_->slots.begin(), s_->slots.end(), [](const Slot& s) { return s.busy; }));
}
bool Engine::idle() const {
  std::lock_guard<std::mutex> lock(s_->inbox.mu);
  return s_->inbox.submitted.empty() && s_->inbox.cancels.empty() && s_->queue.empty() && running() == 0 &&
         s_->cancelled.empty();
}
EngineStats Engine::stats() const {
  const KvBlockPool& p = s_->cache->blocks;
  return {p.capacity(), p.in_use(), p.cached(), s_->cache->block_bytes, s_->preemptions, s_->prefix_tokens};
}

int64_t Engine::submit(const Sequence& prompt, const GenerationOptions& options, std::vector<Sequence> stop) {
  const ModelConfig& cfg = model_->config();
  validate(options, cfg.tgt_vocab);
  if (options.beam_size > 1) throw Error("Engine: beam_size " + std::to_string(options.beam_size) + " > 1 (beam search stays Model::beam_search)");
  Request r;
  r.max_new = options.max_new_tokens > 0 ? options.max_new_tokens : cfg.max_new_tokens;
  // An encoder-decoder's input is its source; its decoder starts from bos, as Model::generate's.
  const bool enc_dec = cfg.arch == Architecture::EncoderDecoder;
  model_->call()->pad_batch({prompt}, enc_dec ? cfg.src_vocab : cfg.tgt_vocab, enc_dec ? "source" : "prompt");  // empty, ids out of range, longer than max_len
  r.prompt = enc_dec ? Sequence{int32_t(cfg.bos_id)} : prompt;
  if (enc_dec) r.source = prompt;
  const int64_t positions = int64_t(r.prompt.size()) + r.max_new - 1;  // the last token is not fed back
  const std::string asked =
      (enc_dec ? "" : "prompt of " + std::to_string(prompt.size()) + " tokens + ") + std::to_string(r.max_new) + " new tokens";
  if (positions > s_->opt.max_len)
    throw Error(asked + " exceed the engine's max_len " + std::to_string(s_->opt.max_len));
  if (blocks_for(positions) > s_->cache->blocks.capacity())
    throw Error(asked + " need " + std::to_string(blocks_for(positions)) + " blocks of the key/value cache, which holds " +
                std::to_string(s_->cache->blocks.capacity()) + " (raise kv_cache_mb)");
  for (size_t i = 0; i < stop.size(); ++i)
    if (stop[i].empty()) throw Error("stop sequence " + std::to_string(i + 1) + " is empty");
  r.options = options, r.stop = std::move(stop);
  r.options.on_token = nullptr;
  Progress p;
  p.history = r.prompt, p.req = std::move(r);
  std::lock_guard<std::mutex> lock(s_->inbox.mu);
  const int64_t id = p.req.id = s_->inbox.next_id++;
  s_->inbox.live.insert(id);
  s_->inbox.submitted.push_back(std::move(p));
  return id;
}

bool Engine::cancel(int64_t id) {
  std::lock_guard<std::mutex> lock(s_->inbox.mu);
  if (!s_->inbox.live.count(id) || !s_->inbox.cancelling.insert(id).second) return false;
  s_->inbox.cancels.push_back(id);
  return true;
}

namespace {

// The request's choice after a step: `logits` its row's V raw logits (overwritten). Appends
// the token event; returns whether the request ends with it.
bool choose_and_emit(Slot& slot, float* logits, int V, int eos, int max_len, std::vector<EngineEvent>& events) {
  Progress& p = slot.seq;
  if (holds_nan_or_inf(logits, V)) nonfinite_logits("engine request " + std::to_string(p.req.id), p.generated);
  EngineEvent e{p.req.id, -1, false, ""};
  const int32_t t = e.token =
      p.chooser->choose(logits, p.history, p.generated, p.req.options.return_scores ? &e.logprob : nullptr);
  p.history.push_back(t), ++p.generated;
  if (t == eos)
    e.reason = "eos";
  else if (p.generated >= p.req.max_new || slot.len >= max_len)
    e.reason = "length";
  else if (std::any_of(p.req.stop.begin(), p.req.stop.end(), [&](const Sequence& s) {
             return int(s.size()) <= p.generated && ends_with(p.history, s);  // new tokens only
           }))
    e.reason = "stop";
  e.finished = !e.reason.empty();
  events.push_back(e);
  return e.finished;
}

}  // namespace

std::vector<EngineEvent> Engine::step() {
  std::vector<EngineEvent> events = admit(), decoded = decode();
  events.insert(events.end(), decoded.begin(), decoded.end());
  return events;
}

namespace {

// step()'s first half: cancellations, prefill, first tokens.
void admit_prompts(EngineState& s, Stack& stack, const Weights& w, std::vector<EngineEvent>& events) {
  const int V = stack.cfg.tgt_vocab, eos = stack.cfg.eos_id, S = int(s.slots.size());
  KvBlockPool& pool = s.cache->blocks;

  // 1. cancellations, waiting or running
  for (int64_t id : s.cancelled) {
    s.queue.erase(std::remove_if(s.queue.begin(), s.queue.end(), [&](const Progress& p) { return p.req.id == id; }),
                  s.queue.end());
    for (Slot& slot : s.slots)
      if (slot.busy && slot.seq.req.id == id) s.release(slot);
    events.push_back({id, -1, true, "cancelled"});
  }
  s.cancelled.clear();

  // 2. prefill within the step's budget: prompts already in progress first (oldest first),
  // then waiting sequences into free slots while the pool has their prompts' blocks. A
  // piece runs through the decoder as the whole prompt would (each row's arithmetic is its
  // own); the last piece's logits choose the request's first token (a preempted one has it
  // already: its later tokens are replayed by the decode passes).
  int budget = s.opt.prefill_tokens;
  auto advance = [&](Slot& slot) {
    Progress& p = slot.seq;
    const int P = int(p.req.prompt.size()), n = piece(P - slot.len, budget);
    IBuf tok(n, 1);
    for (int i = 0; i < n; ++i) tok(i, 0) = p.history[size_t(slot.len + i)];
    Array x = paged_forward(stack, w, *s.cache, tok, {slot.len}, {&slot.blocks}, {true}, true);
    slot.len += n, budget -= n;
    if (slot.len < P) return;
    // The prompt's full blocks, findable by later prompts that start the same way.
    uint64_t key = 0;
    for (int k = 0; (k + 1) * BS <= P; ++k) {
      key = KvBlockPool::chain(key, p.req.prompt.data() + k * BS);
      pool.publish(slot.blocks[size_t(k)], key, p.req.prompt.data() + k * BS);
    }
    if (p.generated > 0) return;
    Array logits(V, 1, 1, stack.iface), out(V, 1, 1, stack.iface);
    stack.head(x, w, logits, out);
    std::vector<float> row = stack.to_host(logits);
    if (choose_and_emit(slot, row.data(), V, eos, s.opt.max_len, events)) s.release(slot);
  };
  std::vector<Slot*> in_progress;
  for (Slot& slot : s.slots)
    if (slot.prefilling()) in_progress.push_back(&slot);
  std::sort(in_progress.begin(), in_progress.end(), [](const Slot* a, const Slot* b) { return a->admitted < b->admitted; });
  for (Slot* slot : in_progress)
    if (budget > 0) advance(*slot);
  for (int b = 0; b < S && budget > 0 && !s.queue.empty(); ++b) {
    Slot& slot = s.slots[size_t(b)];
    if (slot.busy) continue;
    Progress& p = s.queue.front();
    const int P = int(p.req.prompt.size());
    // The prompt's full blocks that an earlier prompt computed, shared; at least two of its
    // tokens are left to compute (a lone one would be summed differently; see piece()). (An
    // encoder-decoder's decoder prompt is one token: nothing shared, as its keys and values
    // depend on the source too.)
    std::vector<int> table;
    uint64_t key = 0;
    for (int k = 0; k < std::max(P - 2, 0) / BS; ++k) {
      key = KvBlockPool::chain(key, p.req.prompt.data() + k * BS);
      const int shared = pool.share(key, p.req.prompt.data() + k * BS);
      if (shared < 0) break;
      table.push_back(shared);
    }
    const int shared = int(table.size());
    // An encoder-decoder's source counts against the budget too: one that does not fit what
    // is left of it waits for the next step (unless it is the step's first work).
    const int source = int(p.req.source.size());
    if (pool.available() < blocks_for(P) - shared || (source > budget && budget < s.opt.prefill_tokens)) {
      for (int blk : table) pool.release(blk);  // wait for blocks (first come, first served) or budget
      break;
    }
    // The source into the free slot's place in the slab, before the slot changes: a failure
    // leaves the request queued as it was.
    if (source > 0) {
      try {
        s.sources->place(stack, w, b, p.req.source);
      } catch (...) {
        for (int blk : table) pool.release(blk);
        throw;
      }
    }
    while (int(table.size()) < blocks_for(P)) table.push_back(pool.allocate());
    slot.busy = true, slot.seq = std::move(p), slot.admitted = ++s.admissions;
    slot.blocks = std::move(table), slot.len = shared * BS;
    s.queue.pop_front();
    s.prefix_tokens += shared * BS;
    if (!slot.seq.chooser) slot.seq.chooser = std::make_unique<TokenChooser>(slot.seq.req.options, V, eos, 0);  // batch row 0's generator
    if (slot.prefilling()) advance(slot);
    budget -= source;  // the encoder's tokens count too
  }
}

// step()'s second half: one decode pass for the running rows, their choices, retirement.
void decode_rows(EngineState& s, Stack& stack, const Weights& w, std::vector<EngineEvent>& events) {
  const ModelConfig& cfg = stack.cfg;
  const int V = cfg.tgt_vocab, eos = cfg.eos_id, S = int(s.slots.size());
  KvBlockPool& pool = s.cache->blocks;

  // 3. one decoder step for every running row, each at its own position. A row entering a
  // new block takes one from the pool; when none is left the newest sequence is preempted
  // (its blocks freed, itself back at the queue's head), which may be the row itself.
  std::vector<Slot*> by_age;
  for (Slot& slot : s.slots)
    if (slot.decoding()) by_age.push_back(&slot);
  std::sort(by_age.begin(), by_age.end(), [](const Slot* a, const Slot* b) { return a->admitted < b->admitted; });
  for (Slot* slot : by_age) {
    if (!slot->decoding() || slot->len < int(slot->blocks.size()) * BS) continue;
    int blk = pool.allocate();
    while (blk < 0) {
      Slot* newest = nullptr;
      for (Slot& other : s.slots)
        if (other.busy && (!newest || other.admitted > newest->admitted)) newest = &other;
      const bool self = newest == slot;
      Progress p = std::move(newest->seq);
      s.release(*newest);
      s.queue.push_front(std::move(p));
      ++s.preemptions;
      if (self) break;
      blk = pool.allocate();
    }
    if (blk >= 0) slot->blocks.push_back(blk);
  }
  std::vector<int> rows;
  for (int b = 0; b < S; ++b)
    if (s.slots[size_t(b)].decoding()) rows.push_back(b);
  if (rows.empty()) return;
  // Rows [0, R): every running slot (admission fills the lowest free slots first), so a
  // lightly loaded engine computes no idle rows past its last running one. An idle row
  // reads the null block at position 0 and writes nothing.
  const int R = rows.back() + 1;
  IBuf tokens(1, R);
  std::vector<int> start(size_t(R), 0);
  std::vector<const std::vector<int>*> tables(static_cast<size_t>(R));
  std::vector<bool> write(size_t(R), false);
  static const std::vector<int> none;
  for (int b = 0; b < R; ++b) {
    const Slot& slot = s.slots[size_t(b)];
    const bool on = slot.decoding();
    tokens(0, b) = on ? slot.seq.history[size_t(slot.len)] : cfg.pad_id;
    start[size_t(b)] = on ? slot.len : 0;
    tables[size_t(b)] = on ? &slot.blocks : &none;
    write[size_t(b)] = on;
  }
  Array x = paged_forward(stack, w, *s.cache, tokens, start, tables, write, false, s.sources.get());
  Array logits(V, 1, R, stack.iface);
  stack.generator(x, w, logits);
  std::vector<float> host = stack.to_host(logits);

  // 4. each row's choice (a replayed position chooses nothing); the rows that ended leave
  for (int b : rows) {
    Slot& slot = s.slots[size_t(b)];
    if (++slot.len < int(slot.seq.history.size())) continue;
    if (choose_and_emit(slot, host.data() + int64_t(b) * V, V, eos, s.opt.max_len, events)) s.release(slot);
  }
}

}  // namespace

std::vector<EngineEvent> Engine::admit() { return half(true); }
std::vector<EngineEvent> Engine::decode() { return half(false); }

std::vector<EngineEvent> Engine::half(bool admitting) {
  std::vector<EngineEvent> events;
  Call c = model_->call();
  if (admitting) {
    s_->take_inbox();
    admit_prompts(*s_, c.stack, *model_->weights_, events);
  } else {
    decode_rows(*s_, c.stack, *model_->weights_, events);
  }
  s_->forget_ended(events);
  return events;
}

}  // namespace halformer
