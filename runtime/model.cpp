// Stack assembly: embeddings, encoder and decoder layers, head and greedy decoding,
// each step a call into an ahead-of-time compiled Halide pipeline from the
// KernelTable. Activations are row-major [B][T][C] (Halide x(c, t, b), or x(c, m) with
// m = b*T + t); kernels read and write them through non-owning buffer views, which is
// also how the KV cache is addressed (strided rows of a [B][T_max][3d] buffer).
#include "halformer/model.h"

#include <HalideBuffer.h>
#include <HalideRuntime.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <string>

#include "halformer/error.h"
#include "halformer/weights.h"

namespace halformer {
namespace {

using Buf = Halide::Runtime::Buffer<float>;
using IBuf = Halide::Runtime::Buffer<int32_t>;
constexpr float kMasked = -1e30f;  // additive mask for padded keys (see attention.cpp)

const ModelConfig& C() { return halformer_model_config(); }
const KernelTable& K() { return halformer_model_kernels(); }

double now_ms() {
  using namespace std::chrono;
  return duration<double, std::milli>(steady_clock::now().time_since_epoch()).count();
}

// HALFORMER_PROFILE=1: time every kernel call, print a per-kernel table at exit.
struct Profile {
  std::map<std::string, std::pair<double, long>> total;  // name -> (ms, calls)
  ~Profile() {
    std::vector<std::pair<double, std::string>> rows;
    double sum = 0;
    for (auto& [name, t] : total) rows.push_back({t.first, name}), sum += t.first;
    std::sort(rows.rbegin(), rows.rend());
    std::fprintf(stderr, "%-24s %10s %8s %6s\n", "kernel", "total ms", "calls", "share");
    for (auto& [ms, name] : rows)
      std::fprintf(stderr, "%-24s %10.2f %8ld %5.1f%%\n", name.c_str(), ms, total[name].second, 100 * ms / sum);
  }
};
Profile* profile() {
  static std::unique_ptr<Profile> p(std::getenv("HALFORMER_PROFILE") ? new Profile : nullptr);
  return p.get();
}
struct KernelTimer {
  const char* name;
  double t0;
  explicit KernelTimer(const char* n) : name(n), t0(profile() ? now_ms() : 0) {}
  ~KernelTimer() {
    if (Profile* p = profile()) {
      auto& e = p->total[name];
      e.first += now_ms() - t0;
      e.second += 1;
    }
  }
};

void run(int status, const char* what) {
  if (status != 0)
    throw Error(std::string("kernel '") + what + "' failed (Halide error " + std::to_string(status) + ")");
}

// ---- non-owning buffer views
Buf view1(const std::vector<float>& v) { return Buf(const_cast<float*>(v.data()), int(v.size())); }
Buf view2(const float* p, int c, int rows, int64_t row_stride) {
  halide_dimension_t dims[2] = {{0, c, 1}, {0, rows, int32_t(row_stride)}};
  return Buf(const_cast<float*>(p), 2, dims);
}
// (d, head, t, b) view of rows holding `nh` heads of `hd` features each.
Buf view4(const float* p, int hd, int nh, int t, int b, int64_t t_stride, int64_t b_stride) {
  halide_dimension_t dims[4] = {
      {0, hd, 1}, {0, nh, hd}, {0, t, int32_t(t_stride)}, {0, b, int32_t(b_stride)}};
  return Buf(const_cast<float*>(p), 4, dims);
}

// An activation [B][T][C], or a strided window of one (the KV cache).
struct Act {
  int C = 0, T = 0, B = 0;
  std::vector<float> v;
  Act() = default;
  Act(int c, int t, int b) : C(c), T(t), B(b), v(size_t(c) * t * b) {}
  Buf flat() const { return view2(v.data(), C, T * B, C); }
  Buf heads(int hd) const { return view4(v.data(), hd, C / hd, T, B, C, int64_t(C) * T); }
};

// ---- one call per layer kind
void linear(LinearFn fn, const char* name, Buf x, const LinearWeights& w, Buf out) {
  KernelTimer timer(name);
  Buf wb = view2(w.w.data(), w.out, w.in, w.out), bb = view1(w.b);
  run(fn(x.raw_buffer(), wb.raw_buffer(), bb.raw_buffer(), out.raw_buffer()), name);
}
void linear_residual(LinearResidualFn fn, const char* name, Buf x, const LinearWeights& w,
                     Buf residual, Buf out) {
  KernelTimer timer(name);
  Buf wb = view2(w.w.data(), w.out, w.in, w.out), bb = view1(w.b);
  run(fn(x.raw_buffer(), wb.raw_buffer(), bb.raw_buffer(), residual.raw_buffer(), out.raw_buffer()), name);
}
void layer_norm(const Act& x, const NormWeights& n, Act& out) {
  KernelTimer timer("layer_norm");
  Buf g = view1(n.gamma), b = view1(n.beta);
  run(K().layer_norm(x.flat().raw_buffer(), g.raw_buffer(), b.raw_buffer(), out.flat().raw_buffer()),
      "layer_norm");
}
void attention(AttentionFn fn, const char* name, Buf q, Buf kv, Buf mask,
               Buf out) {
  KernelTimer timer(name);
  run(fn(q.raw_buffer(), kv.raw_buffer(), mask.raw_buffer(), out.raw_buffer()), name);
}

// Validates ids and lengths, then right-pads with pad_id into a (T, B) buffer.
IBuf pad_batch(const std::vector<Sequence>& seqs, int vocab, const std::string& what) {
  if (seqs.empty()) throw Error(what + ": empty batch (need at least one sequence)");
  size_t T = 0;
  for (size_t i = 0; i < seqs.size(); ++i) {
    const auto& s = seqs[i];
    std::string where = what + " sequence " + std::to_string(i + 1);
    if (s.empty()) throw Error(where + " is empty");
    if (int64_t(s.size()) > C().max_len)
      throw Error(where + " has " + std::to_string(s.size()) + " tokens; the model's max_len is " +
                  std::to_string(C().max_len));
    for (size_t j = 0; j < s.size(); ++j)
      if (s[j] < 0 || s[j] >= vocab)
        throw Error(where + ", token " + std::to_string(j + 1) + ": id " + std::to_string(s[j]) +
                    " is outside the vocabulary [0, " + std::to_string(vocab) + ")");
    T = std::max(T, s.size());
  }
  IBuf tokens(int(T), int(seqs.size()));
  tokens.fill(C().pad_id);
  for (size_t b = 0; b < seqs.size(); ++b)
    for (size_t t = 0; t < seqs[b].size(); ++t) tokens(int(t), int(b)) = seqs[b][t];
  return tokens;
}

// Additive key mask (T, B): 0 for a real token, kMasked for pad (when the spec masks).
Act key_mask(const IBuf& tokens) {
  Act m(tokens.dim(0).extent(), tokens.dim(1).extent(), 1);
  if (C().padding_mask)
    for (int b = 0; b < m.T; ++b)
      for (int t = 0; t < m.C; ++t)
        if (tokens(t, b) == C().pad_id) m.v[size_t(b) * m.C + t] = kMasked;
  return m;
}

Act embed(EmbeddingFn fn, const IBuf& tokens, const std::vector<float>& table, int vocab,
          const Weights& w, int pos_offset) {
  const int d = C().d_model;
  Act x(d, tokens.dim(0).extent(), tokens.dim(1).extent());
  Buf tb = view2(table.data(), d, vocab, d);
  // Without learned positions the kernel never reads pos_table; pass a 1-row stand-in.
  Buf pb = w.positions.empty() ? view2(table.data(), d, 1, d) : view2(w.positions.data(), d, C().max_len, d);
  halide_dimension_t dims[3] = {{0, d, 1}, {0, x.T, d}, {0, x.B, d * x.T}};
  Buf o3(x.v.data(), 3, dims);
  KernelTimer timer("embedding");
  run(fn(const_cast<IBuf&>(tokens).raw_buffer(), tb.raw_buffer(), pb.raw_buffer(), pos_offset,
         o3.raw_buffer()),
      "embedding");
  return x;
}

// x <- norm(x + f(x)) (post-norm) or x <- x + f(norm(x)) (pre-norm); `sublayer` writes
// f(input) + residual into its output buffer.
template <typename F>
void residual_block(Act& x, const NormWeights& n, F sublayer) {
  Act y(x.C, x.T, x.B);
  if (C().pre_norm) {
    Act h(x.C, x.T, x.B);
    layer_norm(x, n, h);
    sublayer(h, x, y);
    x = std::move(y);
  } else {
    sublayer(x, x, y);
    layer_norm(y, n, x);
  }
}

void feed_forward(Act& x, const LinearWeights& ff1, const LinearWeights& ff2, const NormWeights& n) {
  residual_block(x, n, [&](const Act& h, const Act& res, Act& y) {
    Act mid(ff1.out, h.T, h.B);
    linear(K().ff1, "ff1", h.flat(), ff1, mid.flat());
    linear_residual(K().ff2, "ff2", mid.flat(), ff2, res.flat(), y.flat());
  });
}

Act run_encoder(const Weights& w, const IBuf& src, const Act& src_mask) {
  const int d = C().d_model, hd = d / C().heads;
  Act x = embed(K().embed_src, src, w.src_embedding, C().src_vocab, w, 0);
  Buf mask = src_mask.flat();
  for (const auto& L : w.encoder) {
    residual_block(x, L.norm1, [&](const Act& h, const Act& res, Act& y) {
      Act qkv(3 * d, h.T, h.B), a(d, h.T, h.B);
      linear(K().qkv, "qkv", h.flat(), L.qkv, qkv.flat());
      attention(K().encoder_self_attention, "encoder_self_attention", qkv.heads(hd), qkv.heads(hd),
                mask, a.heads(hd));
      linear_residual(K().attention_out, "attention_out", a.flat(), L.attn_out, res.flat(), y.flat());
    });
    feed_forward(x, L.ff1, L.ff2, L.norm2);
  }
  if (C().final_norm) {
    Act y(x.C, x.T, x.B);
    layer_norm(x, w.encoder_norm, y);
    x = std::move(y);
  }
  return x;
}

// Cross-attention keys/values of one decoder layer: computed once per source.
Act cross_kv(const DecoderLayerWeights& L, const Act& memory) {
  Act kv(2 * C().d_model, memory.T, memory.B);
  linear(K().cross_kv, "cross_kv", memory.flat(), L.cross_kv, kv.flat());
  return kv;
}

void cross_block(Act& x, const DecoderLayerWeights& L, const Act& kv, Buf src_mask) {
  const int d = C().d_model, hd = d / C().heads;
  residual_block(x, L.norm2, [&](const Act& h, const Act& res, Act& y) {
    Act q(d, h.T, h.B), a(d, h.T, h.B);
    linear(K().cross_q, "cross_q", h.flat(), L.cross_q, q.flat());
    attention(K().cross_attention, "cross_attention", q.heads(hd), kv.heads(hd), src_mask, a.heads(hd));
    linear_residual(K().attention_out, "cross_out", a.flat(), L.cross_out, res.flat(), y.flat());
  });
}

void head(const Act& x, const Weights& w, Act& logits, Act& out) {
  linear(K().generator, "generator", x.flat(), w.generator, logits.flat());
  KernelTimer timer("head");
  if (K().head) {
    run(K().head(logits.flat().raw_buffer(), out.flat().raw_buffer()), "head");
  } else {
    out.v = logits.v;
  }
}

void final_norm(Act& x, const NormWeights& n) {
  if (!C().final_norm) return;
  Act y(x.C, x.T, x.B);
  layer_norm(x, n, y);
  x = std::move(y);
}

Tensor to_tensor(const Act& a) { return Tensor{{a.B, a.T, a.C}, a.v}; }

}  // namespace

Model::Model(std::unique_ptr<Weights> w) : weights_(std::move(w)) {}
Model::~Model() = default;
Model::Model(Model&&) noexcept = default;
Model& Model::operator=(Model&&) noexcept = default;

Model Model::load(const std::string& weights_path, int threads) {
  if (threads > 0) halide_set_num_threads(threads);
  return Model(std::make_unique<Weights>(load_weights(C(), weights_path)));
}

const ModelConfig& Model::config() const { return C(); }

Tensor Model::encode(const std::vector<Sequence>& src) const {
  IBuf s = pad_batch(src, C().src_vocab, "source");
  return to_tensor(run_encoder(*weights_, s, key_mask(s)));
}

Tensor Model::score(const std::vector<Sequence>& src, const std::vector<Sequence>& tgt) const {
  if (src.size() != tgt.size())
    throw Error("score: " + std::to_string(src.size()) + " source sequences but " +
                std::to_string(tgt.size()) + " target sequences");
  const Weights& w = *weights_;
  const int d = C().d_model, hd = d / C().heads;
  IBuf s = pad_batch(src, C().src_vocab, "source"), t = pad_batch(tgt, C().tgt_vocab, "target");
  Act smask = key_mask(s), tmask = key_mask(t);
  Act memory = run_encoder(w, s, smask);
  Act x = embed(K().embed_tgt, t, w.tgt_embedding, C().tgt_vocab, w, 0);
  for (const auto& L : w.decoder) {
    residual_block(x, L.norm1, [&](const Act& h, const Act& res, Act& y) {
      Act qkv(3 * d, h.T, h.B), a(d, h.T, h.B);
      linear(K().qkv, "qkv", h.flat(), L.qkv, qkv.flat());
      attention(K().decoder_self_attention, "decoder_self_attention", qkv.heads(hd), qkv.heads(hd),
                tmask.flat(), a.heads(hd));
      linear_residual(K().attention_out, "attention_out", a.flat(), L.attn_out, res.flat(), y.flat());
    });
    cross_block(x, L, cross_kv(L, memory), smask.flat());
    feed_forward(x, L.ff1, L.ff2, L.norm3);
  }
  final_norm(x, w.decoder_norm);
  Act logits(C().tgt_vocab, x.T, x.B), out(C().tgt_vocab, x.T, x.B);
  head(x, w, logits, out);
  return to_tensor(out);
}

DecodeResult Model::greedy(const std::vector<Sequence>& src, int max_new_tokens) const {
  if (max_new_tokens < 1 || max_new_tokens > C().max_len)
    throw Error("max_new_tokens " + std::to_string(max_new_tokens) + " is outside [1, max_len = " +
                std::to_string(C().max_len) + "]");
  const Weights& w = *weights_;
  const int d = C().d_model, hd = d / C().heads, H = C().heads, V = C().tgt_vocab;
  DecodeResult r;
  double t0 = now_ms();
  IBuf s = pad_batch(src, C().src_vocab, "source");
  const int B = s.dim(1).extent(), Tmax = max_new_tokens;
  Act smask = key_mask(s);
  Act memory = run_encoder(w, s, smask);
  std::vector<Act> kv;
  for (const auto& L : w.decoder) kv.push_back(cross_kv(L, memory));
  r.encoder_ms = now_ms() - t0;

  // Self-attention cache per layer: the QKV rows of every position so far, [B][Tmax][3d].
  std::vector<Act> cache(w.decoder.size(), Act(3 * d, Tmax, B));
  Act self_mask(Tmax, B, 1);  // decoder positions are all real tokens: nothing masked
  IBuf tok(1, B);
  tok.fill(C().bos_id);
  Act logits(V, 1, B), out(V, 1, B);
  Halide::Runtime::Buffer<int32_t> next(B);
  std::vector<bool> done(B, false);
  r.tokens.assign(B, {});
  r.last_logits = Tensor{{B, V}, std::vector<float>(size_t(B) * V)};
  for (int step = 0; step < max_new_tokens; ++step) {
    double ts = now_ms();
    Act x = embed(K().embed_tgt, tok, w.tgt_embedding, V, w, step);
    for (size_t l = 0; l < w.decoder.size(); ++l) {
      const auto& L = w.decoder[l];
      Act& c = cache[l];
      const int64_t bstride = int64_t(3 * d) * Tmax;
      residual_block(x, L.norm1, [&](const Act& h, const Act& res, Act& y) {
        Act a(d, 1, B);
        float* row = c.v.data() + size_t(step) * 3 * d;
        linear(K().qkv, "qkv", h.flat(), L.qkv, view2(row, 3 * d, B, bstride));
        attention(K().decoder_self_attention, "decoder_self_attention",
                  view4(row, hd, 3 * H, 1, B, 3 * d, bstride),
                  view4(c.v.data(), hd, 3 * H, step + 1, B, 3 * d, bstride),
                  view2(self_mask.v.data(), step + 1, B, Tmax), a.heads(hd));
        linear_residual(K().attention_out, "attention_out", a.flat(), L.attn_out, res.flat(), y.flat());
      });
      cross_block(x, L, kv[l], smask.flat());
      feed_forward(x, L.ff1, L.ff2, L.norm3);
    }
    final_norm(x, w.decoder_norm);
    head(x, w, logits, out);
    run(K().argmax(out.flat().raw_buffer(), next.raw_buffer()), "argmax");
    bool all_done = true;
    for (int b = 0; b < B; ++b) {
      if (!done[b]) {
        r.tokens[b].push_back(next(b));
        std::copy_n(out.v.data() + size_t(b) * V, V, r.last_logits.data.begin() + size_t(b) * V);
        done[b] = next(b) == C().eos_id;
      }
      all_done = all_done && done[b];
      tok(0, b) = next(b);
    }
    r.step_ms.push_back(now_ms() - ts);
    if (all_done) break;
  }
  return r;
}

}  // namespace halformer
