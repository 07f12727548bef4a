// Decoding: turning a model's logits into tokens, step by step, over the decoder stack
// (stack.h). generate() is greedy decoding and sampling, with the token choice of
// halformer/generation.h (processors, scores, callbacks); beam_search() keeps K
// hypotheses per source. Files: token_choice.cpp (a step's choice), prefill.cpp (a batch
// of prompts into the KV cache), generate.cpp, beam_search.cpp.
#pragma once

#include <vector>

#include "halformer/generation.h"
#include "halformer/model.h"
#include "stack.h"

namespace halformer {

DecodeResult generate(Stack& stack, const Weights& w, const std::vector<Sequence>& src, const GenerationOptions& o);
BeamResult beam_search(Stack& stack, const Weights& w, const std::vector<Sequence>& src, int K_beam, double alpha,
                       int max_new_tokens);

// The next token of each row still decoding. Plain greedy decoding runs the argmax
// kernel (on the CPU over the raw logits, on a GPU over the head output, and only the
// ids come down); any other option brings the step's raw logits to the host for the
// rows' TokenChoosers.
struct Chooser {
  const GenerationOptions& o;
  std::vector<TokenChooser> rows;
  bool on_host = false;  // processors, sampling or scores: the choice is made on the host
  Chooser(const GenerationOptions& opts, int V, int eos, int B) : o(opts) {
    for (int b = 0; b < B; ++b) rows.emplace_back(opts, V, eos, b);
    const bool sampling = opts.sampling_topk != 1 && opts.sampling_temperature != 0;  // TokenChooser's rule
    on_host = sampling || opts.repetition_penalty != 1.0f || opts.no_repeat_ngram_size > 0 ||
              opts.min_length > 0 || opts.return_scores;
  }
};
// Each row's next token into `next` (rows not `done`); scores into r when asked.
void choose(Stack& stack, Chooser& ch, const Array& logits, const Array& out, IBuf& next,
            const std::vector<Sequence>& history, const std::vector<bool>& done, int generated, DecodeResult& r);
// Delivers a chosen token; false when the row stops here (eos, or the callback said so).
bool deliver(const GenerationOptions& o, int row, int32_t token, float logprob, int eos);
// Decoder-only prompts into the cache; their last positions' logits / head output (prefill.cpp).
void prefill(Stack& stack, DecoderState& st, const Weights& w, const std::vector<Sequence>& prompts, Array& logits,
             Array& out);

}  // namespace halformer
