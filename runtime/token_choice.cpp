// A decoding step's token choice (see decoding.h): plain greedy through the argmax kernel,
// everything else (sampling, processors, scores) on the host, rows in parallel.
#include <limits>
#include <string>

#include "decoding.h"
#include "threads.h"

namespace halformer {

// Plain greedy ranks with the argmax kernel: on the CPU the raw logits (the head keeps a
// row's order up to rounding: where two top logits closer than its rounding tied there
// and the lower id won, the larger raw logit wins here), on a GPU the head output `out`.
void choose(Stack& stack, Chooser& ch, const Array& logits, const Array& out, IBuf& next, const std::vector<Sequence>& history,
            const std::vector<bool>& done, int generated, DecodeResult& r) {
  if (!ch.on_host) {
    const Array& ranked = stack.iface ? out : logits;
    stack.argmax(ranked, next);
    for (int b = 0; b < ranked.B; ++b) {
      if (done[b]) continue;
      auto row = [b] { return "generation: row " + std::to_string(b); };
      if (next(b) < 0) nonfinite_logits(row(), generated);  // the kernel's -1: NaN or +inf in that row
      // A row that is all -inf has no order either (no processor masks tokens here, so
      // only overflow gives it); the head's output made it NaN, raw logits do not.
      if (!stack.iface && ranked.host()[size_t(b) * ranked.C + next(b)] == -std::numeric_limits<float>::infinity())
        nonfinite_logits(row(), generated, "are all -infinity");
    }
    return;
  }
  std::vector<float> h = stack.to_host(logits);
  // The rows in parallel (each its own chooser; transformer-base int8 at batch 8:
  // --scores' log-softmax and sampling's top-k over 32000 logits a row took more than
  // the step's kernels); no log-softmax unless scores are asked.
  const int V = logits.C;
  std::vector<float> logprob(size_t(logits.B));
  parallel_for(logits.B, "token choice", [&](int b) {
    if (done[b]) return;
    next(b) = ch.rows[b].choose(h.data() + size_t(b) * V, history[b], generated,
                                ch.o.return_scores ? &logprob[size_t(b)] : nullptr);
  });
  if (ch.o.return_scores)
    for (int b = 0; b < logits.B; ++b)
      if (!done[b]) r.token_logprobs[b].push_back(logprob[size_t(b)]);
}
bool deliver(const GenerationOptions& o, int row, int32_t token, float logprob, int eos) {
  const bool go_on = !o.on_token || o.on_token(row, token, logprob);
  return go_on && token != eos;
}

}  // namespace halformer
