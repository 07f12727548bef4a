// Beam search (see decoding.h; the algorithm of the PyTorch reference's beam_search()):
// K hypotheses per source as decoder rows, ranked on the host from the raw logits (each
// row's log-sum-exp and best candidates in parallel), the KV cache reordered each step.
#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <string>

#include "decoding.h"
#include "profile.h"
#include "threads.h"

namespace halformer {
namespace {

// Beam search's work on one hypothesis' logits: the log-sum-exp of the row (double) and
// its best `top` candidates by score, ties to the lower token, into `best`. NaN / +inf
// logits (finite weights can still overflow) leave no order to rank by, and neither do
// logits that are all -inf (no processor masks tokens here): an error naming `where`.
struct BeamCand { double score; int hyp, token; };
void beam_candidates(const float* x, int V, double score_so_far, int hyp, int top, int step,
                            const std::function<std::string()>& where, std::vector<BeamCand>& best) {
  if (holds_nan_or_inf(x, V)) nonfinite_logits(where(), step);
  double mx = -std::numeric_limits<double>::infinity(), total = 0;
  for (int v = 0; v < V; ++v) mx = std::max(mx, double(x[v]));
  if (mx == -std::numeric_limits<double>::infinity()) nonfinite_logits(where(), step, "are all -infinity");
  for (int v = 0; v < V; ++v) total += std::exp(double(x[v]) - mx);
  const double lse = mx + std::log(total);
  best.reserve(size_t(top));
  for (int v = 0; v < V; ++v) {
    const double score = score_so_far + (double(x[v]) - lse);
    if (best.size() == size_t(top)) {
      if (!(score > best.back().score)) continue;  // a tie keeps the lower token
      best.pop_back();
    }
    // After the equal scores: they have lower tokens.
    auto at = std::upper_bound(best.begin(), best.end(), score,
                               [](double sc, const BeamCand& c) { return sc > c.score; });
    best.insert(at, BeamCand{score, hyp, v});
  }
}

}  // namespace

BeamResult beam_search(Stack& stack, const Weights& w, const std::vector<Sequence>& src, int K_beam, double alpha,
                       int max_new_tokens) {
  if (stack.cfg.arch != Architecture::EncoderDecoder) throw Error("beam search needs an encoder-decoder model");
  if (K_beam < 1) throw Error("beam size " + std::to_string(K_beam) + " must be >= 1");
  if (max_new_tokens < 1 || max_new_tokens > stack.cfg.max_len)
    throw Error("max_new_tokens " + std::to_string(max_new_tokens) + " is outside [1, max_len = " +
                std::to_string(stack.cfg.max_len) + "]");
  const int V = stack.cfg.tgt_vocab, eos = stack.cfg.eos_id;
  BeamResult r;
  double t0 = now_ms();
  IBuf s = stack.pad_batch(src, stack.cfg.src_vocab, "source");
  const int B = s.dim(1).extent(), R = B * K_beam;  // R decoder rows: K per source
  Array smask = stack.key_mask(src, s.dim(0).extent());
  Array memory = stack.run_encoder(w, s, smask);
  DecoderState st = stack.decoder_state(w, R, max_new_tokens);
  std::vector<Sequence> src_rep;  // each source once per beam row
  for (const auto& seq : src) src_rep.insert(src_rep.end(), K_beam, seq);
  st.src_mask = stack.key_mask(src_rep, s.dim(0).extent());
  // Each source's cross-attention keys and values once, then copied to its K beam rows
  // (docs/performance-log.md#runtime-beam-cross-kv).
  for (const auto& L : w.decoder) st.cross.push_back(stack.repeat_rows(stack.cross_kv(L, memory), K_beam));
  r.encoder_ms = now_ms() - t0;

  struct Hyp { Sequence tokens; double score; };
  std::vector<std::vector<Hyp>> live(B, std::vector<Hyp>{{{}, 0.0}}), finished(B);
  std::vector<bool> done(B, false);
  IBuf tok(1, R);
  tok.fill(stack.cfg.bos_id);
  Array logits(V, 1, R, stack.iface);
  for (int step = 0; step < max_new_tokens; ++step) {
    double ts = now_ms();
    Array x = stack.decode_step(st, w, tok);
    // The host ranks candidates from the raw logits (its own log-softmax per row; the
    // head kernel's output is not needed): on a GPU they come down once a step.
    stack.generator(x, w, logits);
    std::vector<float> logits_h = stack.iface ? stack.to_host(logits) : std::vector<float>();
    const float* lg = stack.iface ? logits_h.data() : logits.host();
    // Each live hypothesis' row in parallel (log-sum-exp and its best candidates: the
    // host's share of a step; transformer-base int8, beam 4 at batch 8: 32 rows of 32000),
    // then each source's candidates ranked in order.
    const int top = std::min(2 * K_beam, V);
    std::vector<std::pair<int, int>> rows;  // (source, hypothesis), in order
    for (int b = 0; b < B; ++b)
      for (int i = 0; !done[b] && i < int(live[b].size()); ++i) rows.emplace_back(b, i);
    std::vector<std::vector<BeamCand>> best(rows.size());
    parallel_for(int(rows.size()), "beam search", [&](int n) {
      const auto [b, i] = rows[size_t(n)];
      beam_candidates(lg + size_t(b * K_beam + i) * V, V, live[b][i].score, i, top, step, [b = b, i = i] {
        return "beam search: source " + std::to_string(b) + ", hypothesis " + std::to_string(i);
      }, best[size_t(n)]);
    });
    std::vector<int> parent(R);
    size_t n = 0;
    for (int b = 0; b < B; ++b) {
      for (int k = 0; k < K_beam; ++k) parent[b * K_beam + k] = b * K_beam + k;  // finished sources: rows unused
      if (done[b]) continue;
      // Candidates, best first; ties -> lower hyp, then lower token. The best 2K over all
      // hypotheses are among each hypothesis' best `top` (beam_candidates), so K x 2K
      // candidates are ranked, not K x V (4 x 32000 a step, 2 MB: milliseconds).
      std::vector<BeamCand> cands;
      cands.reserve(live[b].size() * size_t(top));
      for (size_t i = 0; i < live[b].size(); ++i, ++n) cands.insert(cands.end(), best[n].begin(), best[n].end());
      const size_t keep = std::min(cands.size(), size_t(2 * K_beam));
      std::partial_sort(cands.begin(), cands.begin() + keep, cands.end(), [](const BeamCand& a, const BeamCand& c) {
        if (a.score != c.score) return a.score > c.score;
        return a.hyp != c.hyp ? a.hyp < c.hyp : a.token < c.token;
      });
      std::vector<Hyp> next;
      std::vector<int> next_parent;
      for (size_t rank = 0; rank < keep && int(next.size()) < K_beam; ++rank) {
        const BeamCand& c = cands[rank];
        Sequence t = live[b][c.hyp].tokens;
        t.push_back(c.token);
        if (c.token == eos) {
          if (int(rank) < K_beam) finished[b].push_back({t, c.score});
        } else {
          next.push_back({t, c.score});
          next_parent.push_back(b * K_beam + c.hyp);
        }
      }
      if (int(finished[b].size()) >= K_beam || next.empty()) done[b] = true;
      for (size_t k = 0; k < next.size(); ++k) {
        parent[b * K_beam + k] = next_parent[k];
        tok(0, b * K_beam + int(k)) = next[k].tokens.back();
      }
      for (size_t k = next.size(); k < size_t(K_beam); ++k) tok(0, b * K_beam + int(k)) = stack.cfg.pad_id;
      live[b] = std::move(next);
    }
    stack.reorder(st, parent);
    r.step_ms.push_back(now_ms() - ts);
    if (std::all_of(done.begin(), done.end(), [](bool d) { return d; })) break;
  }
  r.hypotheses.resize(B);
  r.scores.resize(B);
  for (int b = 0; b < B; ++b) {
    if (int(finished[b].size()) < K_beam)
      for (auto& h : live[b]) finished[b].push_back(h);
    std::vector<std::pair<double, Sequence>> ranked;
    for (auto& h : finished[b])
      ranked.push_back({h.score / std::pow(double(h.tokens.size()), alpha), h.tokens});
    std::stable_sort(ranked.begin(), ranked.end(), [](const auto& a, const auto& c) {
      if (a.first != c.first) return a.first > c.first;
      return a.second < c.second;
    });
    for (int k = 0; k < K_beam && k < int(ranked.size()); ++k) {
      r.hypotheses[b].push_back(ranked[k].second);
      r.scores[b].push_back(ranked[k].first);
    }
  }
  return r;
}

}  // namespace halformer
