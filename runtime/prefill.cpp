// Prefill (see decoding.h): a batch of decoder-only prompts through the decoder, those of
// one length together, their keys and values copied into the batch's KV cache rows.
#include <algorithm>
#include <map>

#include "decoding.h"

namespace halformer {

// Decoder-only, with the cache: the prompts through the decoder, those of one length
// together (more rows per matmul) as in teacher forcing; each layer's keys and values of
// prompt b are copied into row b of the batch's cache at [shift[b], Pmax) while hot, its
// last position's head output into row b of logits / out. Past the last layer's QKV
// projection only each prompt's last row is computed (its other rows' keys and values
// are all the cache needs). See docs/performance-log.md#runtime-prefill.
void prefill(Stack& stack, DecoderState& st, const Weights& w, const std::vector<Sequence>& prompts, Array& logits, Array& out) {
  const int V = stack.cfg.tgt_vocab;
  if (st.B == 1) {  // straight into the cache
    const int P = int(prompts[0].size());
    IBuf tok(P, 1);
    for (int i = 0; i < P; ++i) tok(i, 0) = prompts[0][i];
    stack.head(stack.decode_step(st, w, tok, true), w, logits, out);
    return;
  }
  // Masked positions before a row's shift are still read (times a zero weight): on a
  // device, whose memory is not zeroed, they must not hold NaNs.
  const int max_shift = *std::max_element(st.shift.begin(), st.shift.end());
  Array zeros = stack.iface && max_shift > 0 ? stack.make_input(st.row, max_shift, 1, [](float*) {}) : Array();
  std::map<int, std::vector<int>> by_length;  // prompt length -> batch rows
  for (size_t b = 0; b < prompts.size(); ++b) by_length[int(prompts[b].size())].push_back(int(b));
  for (const auto& [P, rows] : by_length) {
    const int G = int(rows.size()), W = stack.qkv_width();
    std::vector<Sequence> group;
    for (int b : rows) group.push_back(prompts[b]);
    Array x = stack.decoder_hidden(w, group, {}, Array(), "prompt", [&](size_t l, const Array& qkv) {
      for (int g = 0; g < G; ++g) {
        const int b = rows[g];
        stack.cache_store(st, l, qkv, int64_t(g) * P * W, b, st.shift[b], P);
        if (stack.iface && st.shift[b] > 0)
          stack.copy_elems(zeros, 0, st.cache[l], int64_t(b) * st.b_stride(), int64_t(st.shift[b]) * st.row);
      }
    }, true);
    Array lg(V, 1, G, stack.iface), og(V, 1, G, stack.iface);
    stack.head(x, w, lg, og);
    for (int g = 0; g < G; ++g) {
      stack.copy_elems(lg, int64_t(g) * V, logits, int64_t(rows[g]) * V, V);
      stack.copy_elems(og, int64_t(g) * V, out, int64_t(rows[g]) * V, V);
    }
  }
  st.len = by_length.rbegin()->first;
}

}  // namespace halformer
