// Greedy decoding and sampling (see decoding.h): the encoder (or the prompts' prefill),
// then one decoder step per token for every row still going, each row's token chosen by
// token_choice.cpp; last_logits kept per row at its last step.
#include <algorithm>
#include <cmath>

#include "decoding.h"
#include "profile.h"

namespace halformer {

DecodeResult generate(Stack& stack, const Weights& w, const std::vector<Sequence>& src, const GenerationOptions& o) {
  if (stack.cfg.arch == Architecture::Encoder) throw Error("generate: an encoder-only model does not decode");
  validate(o, stack.cfg.tgt_vocab);
  if (o.beam_size > 1) throw Error("generate: beam_size " + std::to_string(o.beam_size) + " > 1 is beam search");
  const int max_new_tokens = o.max_new_tokens > 0 ? o.max_new_tokens : stack.cfg.max_new_tokens;
  if (max_new_tokens < 1 || max_new_tokens > stack.cfg.max_len)
    throw Error("max_new_tokens " + std::to_string(max_new_tokens) + " is outside [1, max_len = " +
                std::to_string(stack.cfg.max_len) + "]");
  const int V = stack.cfg.tgt_vocab, eos = stack.cfg.eos_id;
  const bool decoder_only = stack.cfg.arch == Architecture::Decoder;
  DecodeResult r;
  Chooser ch(o, V, eos, int(src.size()));
  if (o.return_scores) r.token_logprobs.assign(src.size(), {});

  // The history each row's choice sees: decoder-only, prompt + generated (as
  // transformers' input ids); encoder-decoder, bos + generated.
  std::vector<Sequence> history;
  DecoderState st;
  int B = int(src.size());
  double t0 = now_ms();
  if (decoder_only) {
    // All rows decode together, each at its own position (see DecoderState).
    stack.pad_batch(src, V, "prompt");  // validate the whole batch first
    int Pmax = 0;
    for (int b = 0; b < B; ++b) {
      const int P = int(src[b].size());
      if (P + max_new_tokens > stack.cfg.max_len + 1)
        throw Error("prompt " + std::to_string(b + 1) + ": " + std::to_string(P) + " tokens + " +
                    std::to_string(max_new_tokens) + " new tokens exceed max_len " + std::to_string(stack.cfg.max_len));
      Pmax = std::max(Pmax, P);
    }
    history = src;
    if (o.use_cache) {
      std::vector<int> shift(B);
      for (int b = 0; b < B; ++b) shift[b] = Pmax - int(src[b].size());
      st = stack.decoder_state(w, B, Pmax + max_new_tokens, shift);
    }
  } else {
    IBuf s = stack.pad_batch(src, stack.cfg.src_vocab, "source");
    st = stack.decoder_state(w, B, max_new_tokens);
    st.src_mask = stack.key_mask(src, s.dim(0).extent());
    st.cross = stack.cross_kvs(w, stack.run_encoder(w, s, st.src_mask));
    history.assign(B, Sequence{int32_t(stack.cfg.bos_id)});
    r.encoder_ms = now_ms() - t0;
  }

  IBuf tok(1, B);
  tok.fill(stack.cfg.bos_id);
  Array logits(V, 1, B, stack.iface), out(V, 1, B, stack.iface);
  Array last = stack.iface ? Array(V, 1, B, stack.iface) : Array();  // GPU: last_logits rows stay on the device until the end
  Halide::Runtime::Buffer<int32_t> next(B);
  std::vector<bool> done(B, false);
  r.tokens.assign(B, {});
  r.last_logits = Tensor{{B, V}, std::vector<float>(size_t(B) * V)};
  for (int step = 0; step < max_new_tokens; ++step) {
    double ts = decoder_only && step == 0 ? t0 : now_ms();
    bool have_out = true;  // `out` holds this step's head output
    if (!o.use_cache) {
      // Full recomputation of the decoder over the prefix (the encoder output and the
      // cross-attention K/V are per source and reused).
      stack.decoder_forward(w, history, st.cross, st.src_mask, decoder_only ? "prompt" : "target", &logits, &out);
    } else if (decoder_only && step == 0) {
      prefill(stack, st, w, src, logits, out);
    } else if (!stack.iface) {
      // The CPU chooses from the raw logits (the argmax kernel, or the host's chooser on
      // a copy) and runs the head (softmax / log_softmax over the vocabulary) only in the
      // steps where some row ends, for last_logits (docs/performance-log.md#runtime-greedy-head).
      stack.generator(stack.decode_step(st, w, tok), w, logits);
      have_out = false;
    } else {
      stack.head(stack.decode_step(st, w, tok), w, logits, out);
    }
    choose(stack, ch, logits, out, next, history, done, step, r);
    if (stack.iface)  // rows still decoding, one device copy per run of them
      for (int b0 = 0, b1; b0 < B; b0 = b1) {
        for (b1 = b0; b1 < B && !done[b1]; ++b1) {}
        if (b1 > b0) stack.copy_elems(out, int64_t(b0) * V, last, int64_t(b0) * V, int64_t(b1 - b0) * V);
        else ++b1;
      }
    bool all_done = true;
    std::vector<int> ending;  // rows whose last step this is
    for (int b = 0; b < B; ++b) {
      if (!done[b]) {
        r.tokens[b].push_back(next(b));
        const float lp = o.return_scores ? r.token_logprobs[b].back() : std::nanf("");
        done[b] = !deliver(o, b, next(b), lp, eos);
        history[b].push_back(next(b));
        if (done[b] || step + 1 == max_new_tokens) ending.push_back(b);
      }
      all_done = all_done && done[b];
      tok(0, b) = next(b);
    }
    if (!stack.iface && !ending.empty()) {  // last_logits: each row's head output at its last step
      if (!have_out) stack.head_of(logits, out);
      for (int b : ending) std::copy_n(out.host() + size_t(b) * V, V, r.last_logits.data.begin() + size_t(b) * V);
    }
    // Decoder-only: the prompt and the first token count as the "encoder" time.
    if (decoder_only && step == 0) r.encoder_ms = now_ms() - ts;
    else r.step_ms.push_back(now_ms() - ts);
    if (all_done) break;
  }
  if (stack.iface) r.last_logits.data = stack.to_host(last);
  return r;
}

}  // namespace halformer
