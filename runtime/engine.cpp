// Continuous batching (halformer/engine.h; docs/engine.md): slots of one key/value cache,
// each row at its own position. A step prefills waiting prompts within its token budget
// (each prompt alone, in pieces, as Model::generate would in one; then copied into its
// slot), decodes every running row in one pass over the weights, and retires the rows that
// ended.
#include "halformer/engine.h"

#include <algorithm>
#include <deque>

#include "call.h"
#include "decoding.h"

namespace halformer {

namespace {

struct Request {
  int64_t id = 0;
  Sequence prompt;
  GenerationOptions options;
  std::vector<Sequence> stop;
  int max_new = 0;
};

// A running sequence: its request, what its choices see, and its place in the cache.
struct Slot {
  bool busy = false;
  Request req;
  Sequence history;  // prompt + generated (transformers' input ids)
  int generated = 0;
  int len = 0;       // cache positions filled: the next token's position
  int32_t last = 0;  // the token the next step feeds
  std::unique_ptr<TokenChooser> chooser;
  // While its prompt is prefilled (in pieces of the step's budget): the prompt's own
  // one-row cache, and how many of its tokens are in it.
  std::unique_ptr<DecoderState> prefill;
  int prefilled = 0;
  bool decoding() const { return busy && !prefill; }
};

bool ends_with(const Sequence& s, const Sequence& tail) {
  return !tail.empty() && s.size() >= tail.size() && std::equal(tail.rbegin(), tail.rend(), s.rbegin());
}

}  // namespace

struct EngineState {
  EngineOptions opt;
  DecoderState st;  // B = slots, Tmax = max_len; st.len unused (each slot has its own)
  std::vector<Slot> slots;
  std::deque<Request> queue;
  std::vector<int64_t> cancelled;
  int64_t next_id = 1;
};

Engine::Engine(const Model& model, const EngineOptions& options) : model_(&model), s_(std::make_unique<EngineState>()) {
  const ModelConfig& cfg = model.config();
  if (cfg.arch != Architecture::Decoder)
    throw Error("Engine: continuous batching needs a decoder-only model (this one is " +
                std::string(enum_name(cfg.arch)) + ")");
  EngineOptions& o = s_->opt = options;
  if (o.max_len == 0) o.max_len = cfg.max_len;
  if (o.max_sequences < 1 || o.max_sequences > 1024)
    throw Error("Engine: max_sequences " + std::to_string(o.max_sequences) + " is outside [1, 1024]");
  if (o.max_len < 2 || o.max_len > cfg.max_len)
    throw Error("Engine: max_len " + std::to_string(o.max_len) + " is outside [2, the model's max_len " +
                std::to_string(cfg.max_len) + "]");
  if (o.prefill_tokens < 1) throw Error("Engine: prefill_tokens " + std::to_string(o.prefill_tokens) + " must be >= 1");
  Call c = model.call();
  // Relative position biases (T5) read each row's distances from a shared clock; rotary,
  // learned and sinusoidal positions are taken per row.
  if (c->positions_in_attention()) throw Error("Engine: relative position biases are not supported yet");
  s_->st = c->decoder_state(*model.weights_, o.max_sequences, o.max_len);
  s_->slots.resize(size_t(o.max_sequences));
}
Engine::~Engine() = default;
Engine::Engine(Engine&&) noexcept = default;
Engine& Engine::operator=(Engine&&) noexcept = default;

const EngineOptions& Engine::options() const { return s_->opt; }
int Engine::waiting() const { return int(s_->queue.size()); }
int Engine::running() const {
  return int(std::count_if(s_->slots.begin(), s_->slots.end(), [](const Slot& s) { return s.busy; }));
}
bool Engine::idle() const { return s_->queue.empty() && running() == 0 && s_->cancelled.empty(); }

int64_t Engine::submit(const Sequence& prompt, const GenerationOptions& options, std::vector<Sequence> stop) {
  const ModelConfig& cfg = model_->config();
  validate(options, cfg.tgt_vocab);
  if (options.beam_size > 1) throw Error("Engine: beam_size " + std::to_string(options.beam_size) + " > 1 (beam search stays Model::beam_search)");
  Request r;
  r.max_new = options.max_new_tokens > 0 ? options.max_new_tokens : cfg.max_new_tokens;
  model_->call()->pad_batch({prompt}, cfg.tgt_vocab, "prompt");  // empty, ids out of range, longer than max_len
  if (int(prompt.size()) + r.max_new > s_->opt.max_len + 1)
    throw Error("prompt of " + std::to_string(prompt.size()) + " tokens + " + std::to_string(r.max_new) +
                " new tokens exceed the engine's max_len " + std::to_string(s_->opt.max_len));
  for (size_t i = 0; i < stop.size(); ++i)
    if (stop[i].empty()) throw Error("stop sequence " + std::to_string(i + 1) + " is empty");
  r.id = s_->next_id++, r.prompt = prompt, r.options = options, r.stop = std::move(stop);
  r.options.on_token = nullptr;
  s_->queue.push_back(std::move(r));
  return s_->queue.back().id;
}

bool Engine::cancel(int64_t id) {
  auto queued = std::find_if(s_->queue.begin(), s_->queue.end(), [&](const Request& r) { return r.id == id; });
  const bool running = std::any_of(s_->slots.begin(), s_->slots.end(), [&](const Slot& s) { return s.busy && s.req.id == id; });
  if (queued == s_->queue.end() && !running) return false;
  if (std::find(s_->cancelled.begin(), s_->cancelled.end(), id) != s_->cancelled.end()) return false;
  s_->cancelled.push_back(id);
  return true;
}

namespace {

// The request's choice after a step: `logits` its row's V raw logits (overwritten). Appends
// the token event; returns whether the request ends with it.
bool choose_and_emit(Slot& slot, float* logits, int V, int eos, int max_len, std::vector<EngineEvent>& events) {
  if (holds_nan_or_inf(logits, V)) nonfinite_logits("engine request " + std::to_string(slot.req.id), slot.generated);
  const int32_t t = slot.chooser->choose(logits, slot.history, slot.generated);
  slot.history.push_back(t), slot.last = t, ++slot.generated;
  EngineEvent e{slot.req.id, t, false, ""};
  if (t == eos)
    e.reason = "eos";
  else if (slot.generated >= slot.req.max_new || slot.len >= max_len)
    e.reason = "length";
  else if (std::any_of(slot.req.stop.begin(), slot.req.stop.end(), [&](const Sequence& s) {
             return int(s.size()) <= slot.generated && ends_with(slot.history, s);  // new tokens only
           }))
    e.reason = "stop";
  e.finished = !e.reason.empty();
  events.push_back(e);
  return e.finished;
}

}  // namespace

std::vector<EngineEvent> Engine::step() {
  std::vector<EngineEvent> events;
  EngineState& s = *s_;
  Call c = model_->call();
  Stack& stack = c.stack;
  const Weights& w = *model_->weights_;
  const ModelConfig& cfg = stack.cfg;
  const int V = cfg.tgt_vocab, eos = cfg.eos_id, S = s.st.B;
  const int64_t bstride = int64_t(s.st.row) * s.st.Tmax;

  // 1. cancellations, waiting or running
  for (int64_t id : s.cancelled) {
    s.queue.erase(std::remove_if(s.queue.begin(), s.queue.end(), [&](const Request& r) { return r.id == id; }), s.queue.end());
    for (Slot& slot : s.slots)
      if (slot.busy && slot.req.id == id) slot = Slot();
    events.push_back({id, -1, true, "cancelled"});
  }
  s.cancelled.clear();

  // 2. prefill within the step's budget: prompts already in progress first (oldest first),
  // then waiting requests into free slots. A piece runs through the decoder as the whole
  // prompt would (each row's arithmetic is its own); the last piece's logits choose the
  // request's first token and its keys and values go into the slot.
  int budget = s.opt.prefill_tokens;
  auto advance = [&](int b) {
    Slot& slot = s.slots[size_t(b)];
    const int P = int(slot.req.prompt.size()), n = std::min(P - slot.prefilled, budget);
    IBuf tok(n, 1);
    for (int i = 0; i < n; ++i) tok(i, 0) = slot.req.prompt[size_t(slot.prefilled + i)];
    Array x = stack.decode_step(*slot.prefill, w, tok, true);
    slot.prefilled += n, budget -= n;
    if (slot.prefilled < P) return;
    Array logits(V, 1, 1, stack.iface), out(V, 1, 1, stack.iface);
    stack.head(x, w, logits, out);
    for (size_t l = 0; l < slot.prefill->cache.size(); ++l)
      stack.copy_elems(slot.prefill->cache[l], 0, s.st.cache[l], int64_t(b) * bstride, int64_t(P) * slot.prefill->row);
    slot.prefill.reset();
    std::vector<float> row = stack.to_host(logits);
    if (choose_and_emit(slot, row.data(), V, eos, s.opt.max_len, events)) slot = Slot();
  };
  std::vector<int> in_progress;
  for (int b = 0; b < S; ++b)
    if (s.slots[size_t(b)].prefill) in_progress.push_back(b);
  std::sort(in_progress.begin(), in_progress.end(),
            [&](int a, int b) { return s.slots[size_t(a)].req.id < s.slots[size_t(b)].req.id; });
  for (int b : in_progress)
    if (budget > 0) advance(b);
  for (int b = 0; b < S && budget > 0 && !s.queue.empty(); ++b) {
    Slot& slot = s.slots[size_t(b)];
    if (slot.busy) continue;
    slot = Slot();
    slot.busy = true, slot.req = std::move(s.queue.front());
    s.queue.pop_front();
    const int P = int(slot.req.prompt.size());
    slot.history = slot.req.prompt, slot.len = P;
    slot.chooser = std::make_unique<TokenChooser>(slot.req.options, V, eos, 0);  // batch row 0's generator
    slot.prefill = std::make_unique<DecoderState>(stack.decoder_state(w, 1, P));
    advance(b);
  }

  // 3. one decoder step for every running row, each at its own position
  std::vector<int> rows;
  for (int b = 0; b < S; ++b)
    if (s.slots[size_t(b)].decoding()) rows.push_back(b);
  if (rows.empty()) return events;
  // Rows [0, R): every running slot (admission fills the lowest free slots first), so a
  // lightly loaded engine computes no idle rows past its last running one.
  const int R = rows.back() + 1;
  const int d = cfg.d_model, hd = d / cfg.heads, W = stack.qkv_width(), heads = W / hd, row = s.st.row;
  int keys = 0;
  IBuf tokens(1, R);
  std::vector<int> pos(size_t(R), 0);
  for (int b = 0; b < R; ++b) {
    const Slot& slot = s.slots[size_t(b)];
    tokens(0, b) = slot.decoding() ? slot.last : cfg.pad_id;
    pos[size_t(b)] = slot.decoding() ? slot.len : 0;
    keys = std::max(keys, pos[size_t(b)] + 1);
  }
  // Row b sees its own positions [0, len_b]; an idle (or prefilling) row its position 0,
  // which it does not write (its output is never read).
  Array mask = stack.make_input(keys, R, 1, [&](float* m) {
    for (int b = 0; b < R; ++b)
      for (int t = 0; t < keys; ++t) m[int64_t(b) * keys + t] = t <= pos[size_t(b)] ? 0.0f : kMasked;
  });
  Array x = stack.embed_rows(stack.kt.embed_tgt, tokens, w, pos);
  IBuf positions = stack.row_positions(R, [&](int m) { return pos[size_t(m)]; });
  halide_buffer_t* bias = stack.position_bias(w.decoder_position_bias);
  const bool bf16 = stack.self_cache_bf16();
  Array qkv(row, 1, R, stack.iface, bf16);  // the step's rows: queries read here, keys and values copied to the cache
  for (size_t l = 0; l < w.decoder.size(); ++l) {
    const auto& L = w.decoder[l];
    Array& cache = s.st.cache[l];
    Array ff_in = stack.parallel_input(x, L);
    stack.residual_block(x, L.self_norm, [&](const Array& h, const Array& res, Array& y) {
      Array a(d, 1, R, stack.iface);
      stack.qkv_projection(h.flat(), L, view2(qkv, 0, W, R, row), bf16, positions);
      for (int b : rows) stack.copy_elems(qkv, int64_t(b) * row, cache, int64_t(b) * bstride + int64_t(pos[size_t(b)]) * row, W);
      stack.attention(stack.kt.decoder_self_attention, "decoder_self_attention", view4(qkv, 0, hd, heads, 1, R, row, row),
                      view4(cache, 0, hd, heads, keys, R, row, bstride), view2(mask, 0, keys, R, keys), bias,
                      view4(a, 0, hd, d / hd, 1, R, d, d));
      stack.linear_residual(stack.kt.attention_out, "attention_out", a.flat(), L.attn_out, res.flat(), y.flat());
    });
    stack.feed_forward(x, L, ff_in);
  }
  stack.final_norm(x, w.decoder_norm);
  Array logits(V, 1, R, stack.iface);
  stack.generator(x, w, logits);
  std::vector<float> host = stack.to_host(logits);

  // 4. each row's choice; the rows that ended leave
  for (int b : rows) {
    Slot& slot = s.slots[size_t(b)];
    ++slot.len;
    if (choose_and_emit(slot, host.data() + int64_t(b) * V, V, eos, s.opt.max_len, events)) slot = Slot();
  }
  return events;
}

}  // namespace halformer
