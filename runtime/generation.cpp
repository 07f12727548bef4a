// The token choice of one decoding step (semantics: halformer/generation.h).
//
// Design decisions:
// - It runs on the host, one row at a time, on the step's raw logits; the runtime sends
//   plain greedy decoding without processors or scores to its argmax kernel instead, so
//   this code favours being an obviously-correct transcription of
//   transformers' processors over speed: one O(V) pass per processor, a sort only for
//   top-p (of the tokens top-k left).
// - Logits stay float through the processors and temperature, as transformers computes
//   them in float32, so processed logits match it to rounding; probabilities (top-p's
//   cumulative sums, the draw, the log-probability) are computed in double.
// - The random generator is our own (xoroshiro128+ seeded by splitmix64), not <random>'s
//   distributions, whose output is implementation-defined: the same seed gives the same
//   tokens with every compiler and standard library.
#include "halformer/generation.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <sstream>
#include <string>

#include "halformer/error.h"

namespace halformer {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// splitmix64's output function (a bijection of 64-bit words).
uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

template <typename T>
std::string str(T v) {
  std::ostringstream s;
  s << v;
  return s.str();
}

}  // namespace

void validate(const GenerationOptions& o, int vocab) {
  auto fail = [](const std::string& name, const std::string& value, const char* range) {
    throw Error("generation option " + name + " " + value + " is outside " + range);
  };
  if (vocab < 1) throw Error("generation: the vocabulary size " + str(vocab) + " is outside [1, inf)");
  if (o.max_new_tokens < 0) fail("max_new_tokens", str(o.max_new_tokens), "[0, inf) (0: the spec's default)");
  if (o.beam_size < 1) fail("beam_size", str(o.beam_size), "[1, inf)");
  if (o.sampling_topk < 0) fail("sampling_topk", str(o.sampling_topk), "[0, inf) (0: all, 1: greedy)");
  if (!(o.sampling_topp > 0 && o.sampling_topp <= 1)) fail("sampling_topp", str(o.sampling_topp), "(0, 1]");
  if (!(o.sampling_temperature >= 0 && std::isfinite(o.sampling_temperature)))
    fail("sampling_temperature", str(o.sampling_temperature), "[0, inf) (0: greedy)");
  if (!(o.repetition_penalty > 0 && std::isfinite(o.repetition_penalty)))
    fail("repetition_penalty", str(o.repetition_penalty), "(0, inf) (1: off)");
  if (o.no_repeat_ngram_size < 0) fail("no_repeat_ngram_size", str(o.no_repeat_ngram_size), "[0, inf) (0: off)");
  if (o.min_length < 0) fail("min_length", str(o.min_length), "[0, inf)");
  if (o.beam_size > 1 && o.sampling_topk != 1)
    throw Error("generation options beam_size " + str(o.beam_size) + " and sampling_topk " + str(o.sampling_topk) +
                ": beam search does not sample (use sampling_topk 1 with beam_size > 1)");
}

TokenChooser::TokenChooser(const GenerationOptions& o, int vocab, int eos_id, int row)
    : vocab_(vocab),
      eos_(eos_id),
      row_(row),
      topk_(o.sampling_topk),
      ngram_(o.no_repeat_ngram_size),
      min_length_(o.min_length),
      topp_(o.sampling_topp),
      temperature_(o.sampling_temperature),
      penalty_(o.repetition_penalty),
      sampling_(o.sampling_topk != 1 && o.sampling_temperature != 0) {
  uint64_t sm = o.seed ^ mix64(uint64_t(row));  // splitmix64: state += golden; output mix64(state)
  for (uint64_t& s : state_) s = mix64(sm += 0x9e3779b97f4a7c15ULL);
  if (state_[0] == 0 && state_[1] == 0) state_[0] = 1;  // xoroshiro's one bad state
}

uint64_t TokenChooser::next() {
  const uint64_t s0 = state_[0];
  uint64_t s1 = state_[1];
  const uint64_t result = s0 + s1;
  s1 ^= s0;
  state_[0] = rotl(s0, 24) ^ s1 ^ (s1 << 16);
  state_[1] = rotl(s1, 37);
  return result;
}

void TokenChooser::process(float* x, const Sequence& history, int generated) const {
  const int64_t L = int64_t(history.size());
  auto in_vocab = [&](int32_t id) { return id >= 0 && id < vocab_; };
  if (penalty_ != 1.0f) {
    // Once per distinct id (transformers gathers, then scatters the same values back).
    Sequence ids = history;
    std::sort(ids.begin(), ids.end());
    ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
    for (int32_t id : ids)
      if (in_vocab(id)) x[id] = x[id] < 0 ? x[id] * penalty_ : x[id] / penalty_;
  }
  if (ngram_ > 0 && L + 1 >= ngram_) {
    // The last n-1 tokens are a prefix; ban what followed that prefix anywhere before.
    const int n = ngram_;
    const int32_t* tail = history.data() + (L + 1 - n);
    for (int64_t i = 0; i + n <= L; ++i)
      if (std::equal(tail, tail + (n - 1), history.data() + i) && in_vocab(history[i + n - 1]))
        x[history[i + n - 1]] = kNegInf;
  }
  if (generated < min_length_ && in_vocab(eos_)) x[eos_] = kNegInf;
}

int32_t TokenChooser::argmax(const float* x) const {
  int32_t best = 0;
  for (int32_t i = 1; i < vocab_; ++i)
    if (x[i] > x[best]) best = i;  // strictly greater: the first maximum wins
  return best;
}

void TokenChooser::warp(float* x) {
  const int V = vocab_;
  if (temperature_ != 1.0f)
    for (int i = 0; i < V; ++i) x[i] = x[i] / temperature_;
  if (topk_ > 0 && topk_ < V) {
    // -inf below the k-th largest value (values equal to it stay).
    weight_.assign(x, x + V);
    std::nth_element(weight_.begin(), weight_.begin() + (topk_ - 1), weight_.end(), std::greater<double>());
    const double kth = weight_[topk_ - 1];
    for (int i = 0; i < V; ++i)
      if (x[i] < kth) x[i] = kNegInf;
  }
  if (topp_ < 1.0f) {
    // The finite logits from most to least probable (ties: lower id first).
    order_.clear();
    for (int32_t i = 0; i < V; ++i)
      if (x[i] > kNegInf) order_.push_back(i);
    if (order_.empty()) return;
    std::sort(order_.begin(), order_.end(), [&](int32_t a, int32_t b) { return x[a] > x[b] || (x[a] == x[b] && a < b); });
    const double mx = x[order_[0]];
    weight_.resize(order_.size());
    double sum = 0;
    for (size_t j = 0; j < order_.size(); ++j) sum += weight_[j] = std::exp(double(x[order_[j]]) - mx);
    // transformers: in ascending order, remove a token when the cumulative probability up
    // to and including it is <= 1 - top_p. Summed the same way (ascending), so the kept
    // set is the prefix [0, keep); the most probable token is always kept.
    const double limit = (1.0 - double(topp_)) * sum;
    size_t keep = order_.size();
    double cum = 0;
    while (keep > 1 && (cum += weight_[keep - 1]) <= limit) --keep;
    for (size_t j = keep; j < order_.size(); ++j) x[order_[j]] = kNegInf;
  }
}

int32_t TokenChooser::draw(const float* x) {
  const double u = double(next() >> 11) * 0x1.0p-53;  // [0, 1), always one output per draw
  const int32_t best = argmax(x);
  if (!(x[best] > kNegInf)) return best;  // nothing left to draw from
  const double mx = x[best];
  weight_.resize(vocab_);
  double sum = 0;
  // Masked tokens (top-k / top-p / processors) weigh exactly 0: no exp for them (top-k 10
  // of 32000 leaves 10 to compute).
  for (int i = 0; i < vocab_; ++i) sum += weight_[i] = x[i] > kNegInf ? std::exp(double(x[i]) - mx) : 0.0;
  const double target = u * sum;
  double cum = 0;
  int32_t last = best;
  for (int32_t i = 0; i < vocab_; ++i) {
    if (weight_[i] <= 0) continue;
    cum += weight_[i];
    last = i;
    if (cum > target) return i;
  }
  return last;  // rounding left target at the very top: the last id with any weight
}

void nonfinite_logits(const std::string& where, int step, const std::string& what) {
  throw Error(where + ": the logits at step " + std::to_string(step) + " " + what +
              " (the model's activations overflowed)");
}

bool holds_nan_or_inf(const float* x, int n) {
  return !std::all_of(x, x + n, [](float v) { return v < std::numeric_limits<float>::infinity(); });
}

int32_t TokenChooser::choose(float* x, const Sequence& history, int generated, float* logprob) {
  auto where = [&] { return "generation: row " + std::to_string(row_); };
  if (holds_nan_or_inf(x, vocab_)) nonfinite_logits(where(), generated);
  // Raw logits that are all -inf rank nothing either (only overflow gives them: the
  // processors below mask tokens, the model does not).
  if (std::all_of(x, x + vocab_, [](float v) { return v == kNegInf; }))
    nonfinite_logits(where(), generated, "are all -infinity");
  process(x, history, generated);
  if (logprob) processed_.assign(x, x + vocab_);  // the warpers overwrite x
  int32_t id;
  if (sampling_) {
    warp(x);
    id = draw(x);
  } else {
    id = argmax(x);
  }
  if (logprob) {
    // log_softmax of the processed logits (before the warpers) at the chosen id.
    const double mx = processed_[argmax(processed_.data())];
    double sum = 0;
    for (float v : processed_) sum += std::exp(double(v) - mx);
    *logprob = mx > kNegInf ? float(double(processed_[id]) - mx - std::log(sum)) : kNegInf;
  }
  return id;
}

}  // namespace halformer
