// Generation options and the per-step token choice of decoding: logits processors
// (repetition penalty, no-repeat n-grams, minimum length) and the pick itself (greedy,
// or sampling with temperature, top-k and top-p from a seeded generator).
//
// The semantics are those of Hugging Face transformers 4.30.2's LogitsProcessor /
// LogitsWarper classes (checked against them by tests/generation/check_generation.py), with
// CTranslate2's option names; per step, on one row of V raw logits:
//   1. repetition_penalty (RepetitionPenaltyLogitsProcessor): every id in the row's
//      history, once however often it occurs: logit < 0 is multiplied by the penalty,
//      otherwise divided.
//   2. no_repeat_ngram_size n (NoRepeatNGramLogitsProcessor): -inf for every token that
//      would complete an n-gram already in the history (n = 1: every history token).
//   3. min_length (as MinNewTokensLengthLogitsProcessor, CTranslate2's min_length):
//      eos gets -inf while fewer than min_length new tokens were generated.
//   4. greedy (sampling_topk == 1 or temperature == 0): argmax, the lowest id on ties --
//      the runtime's argmax kernel (first max wins) gives the same id.
//   5. otherwise the warpers, in generate()'s order: / temperature (TemperatureLogitsWarper,
//      in float), top-k (TopKLogitsWarper: -inf below the k-th largest value, so ties with
//      it are kept; 0 = off), top-p (TopPLogitsWarper, min_tokens_to_keep = 1: the most
//      probable tokens are kept while the probability of the tokens before them is
//      < top_p; on a tie at the boundary the lower id counts as more probable; 1 = off),
//      then one draw from the softmax of what is left, in double precision.
//
// Sampling is reproducible: the generator of batch row `row` is xoroshiro128+ whose two
// state words are the first two outputs of splitmix64 started at
// seed XOR mix64(row) (mix64: splitmix64's output function). Every sampling choose()
// takes exactly one 64-bit output, u = (output >> 11) * 2^-53, and returns the first id
// (in id order) whose cumulative weight exp(x - max) exceeds u * (sum of weights). So a
// row's draws depend only on (seed, row index, the logits and history of each step) --
// never on the batch composition, the thread count or the device.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace halformer {

using Sequence = std::vector<int32_t>;

struct GenerationOptions {
  int max_new_tokens = 0;            // 0: the spec's decoding.max_new_tokens
  int beam_size = 1;                 // > 1: beam search (encoder-decoder models)
  double length_penalty = 1.0;       // beam search: score / length^penalty
  int sampling_topk = 1;             // 1: greedy; 0: the whole vocabulary; k: the k best
  float sampling_topp = 1.0f;        // (0, 1]: nucleus filtering after top-k
  float sampling_temperature = 1.0f; // > 0; 0 means greedy
  uint64_t seed = 0;                 // sampling generator seed
  float repetition_penalty = 1.0f;   // > 0; 1 = off
  int no_repeat_ngram_size = 0;      // 0 = off
  int min_length = 0;                // eos is not chosen before this many new tokens
  bool return_scores = false;        // per-token log-probabilities in the result
  bool use_cache = true;             // false: recompute the prefix every step (comparison)
  // Called for every token as soon as it is chosen (batch row, token id, its
  // log-probability with return_scores, else NaN); return false to stop that row.
  // Tokens arrive in order per row; eos is delivered too.
  std::function<bool(int row, int32_t token, float logprob)> on_token;
};

// Throws halformer::Error naming the option, its value and the allowed range when a
// value is out of range (or beam search is combined with sampling), or when vocab < 1.
void validate(const GenerationOptions& options, int vocab);

// NaN or +inf among a step's logits (finite weights can still overflow): no token can be
// chosen or ranked by them. Throws halformer::Error "<where>: the logits at step <step>
// <what> (the model's activations overflowed)".
[[noreturn]] void nonfinite_logits(const std::string& where, int step, const std::string& what = "hold NaN or +infinity");
// Whether x[0..n) holds NaN or +inf (-inf is an ordinary, masked logit).
bool holds_nan_or_inf(const float* x, int n);

// One batch row's token choice; holds the row's random generator, so one object per row
// lives for the whole decode. It copies the options it needs.
class TokenChooser {
 public:
  TokenChooser(const GenerationOptions& options, int vocab, int eos_id, int row);

  // Steps 1-5 on `logits` (V floats, overwritten) and returns the chosen id. `history`
  // is what repetition penalty and n-gram blocking look at (decoder-only: prompt +
  // generated; encoder-decoder: bos + generated, as transformers' decoder input ids);
  // `generated` = new tokens so far. `logprob` (optional) gets the log-probability of
  // the chosen id as CTranslate2's return_scores defines it: log_softmax of the logits
  // after steps 1-3, before temperature, top-k and top-p (for greedy the same thing).
  // A row whose logits are all -inf after steps 1-3 gets the greedy choice (id 0); NaN or
  // +inf among them is an error (nonfinite_logits).
  int32_t choose(float* logits, const Sequence& history, int generated, float* logprob = nullptr);
  bool sampling() const { return sampling_; }

  // The pieces of choose(), for tests and tools: steps 1-3 in place; the warpers in
  // place (filtered ids become -inf); greedy argmax; one draw from softmax(warped)
  // (advances the generator; all -inf: argmax).
  void process(float* logits, const Sequence& history, int generated) const;
  void warp(float* logits);
  int32_t argmax(const float* logits) const;
  int32_t draw(const float* warped);

 private:
  uint64_t next();  // xoroshiro128+

  int vocab_, eos_, row_, topk_, ngram_, min_length_;
  float topp_, temperature_, penalty_;
  bool sampling_;
  uint64_t state_[2];
  std::vector<int32_t> order_;  // scratch: the finite ids, most probable first (top-p)
  std::vector<double> weight_;  // scratch: top-k values; weights of top-p and the draw
  std::vector<float> processed_;  // scratch: the logits after steps 1-3 (logprob)
};

}  // namespace halformer
