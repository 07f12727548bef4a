// The stacks (see stack.h): the encoder, the decoder over whole sequences (teacher
// forcing, prompts) and the decoder step over its KV cache (DecoderState, reordered for
// beam search), and the public calls built on them alone: encode, pooled, score.
#include <algorithm>
#include <cstring>
#include <string>

#include <unistd.h>

#include "stack.h"

namespace halformer {

void refuse_beyond_memory(double bytes, const std::string& what, const std::string& advice) {
  const double ram = double(sysconf(_SC_PHYS_PAGES)) * double(sysconf(_SC_PAGESIZE));
  if (ram > 0 && bytes > ram)
    throw Error(what + " needs " + std::to_string(int64_t(bytes / double(1 << 20))) + " MiB, more than this machine's " +
                std::to_string(int64_t(ram / double(1 << 20))) + " MiB of memory: " + advice);
}

Array Stack::run_encoder(const Weights& w, const IBuf& src, const Array& src_mask) {
  Array x = embed(kt.embed_src, src, false, w, 0);
  for (int l = 0; l < cfg.encoder_layers; ++l) {
    const auto& L = w.encoder[cfg.shared_layers ? 0 : l];
    Array ff_in = parallel_input(x, L);
    self_attention_block(x, L, src_mask, position_bias(w.encoder_position_bias));
    feed_forward(x, L, ff_in);
  }
  final_norm(x, w.encoder_norm);
  return x;
}

Tensor Stack::to_tensor(const Array& a) { return Tensor{{a.B, a.T, a.C}, to_host(a)}; }

// Runs the decoder on `tokens` (T new positions; T > 1 only with B == 1, whose rows are
// then contiguous) and returns the last decoder hidden rows (d, T, B); with last_row only
// the last position's, (d, 1, B): the last layer then needs the other positions' keys and
// values alone (a prompt's).
Array Stack::decode_step(DecoderState& st, const Weights& w, const IBuf& tokens, bool last_row) {
  const int d = cfg.d_model, hd = d / cfg.heads, T = tokens.dim(0).extent();
  const int B = st.B, len = st.len;
  if (len + T > st.Tmax) throw Error("decoder cache overflow (internal)");
  if (T > 1 && B > 1) throw Error("internal: several rows of several positions");
  const bool shifted = st.shifted();
  if (shifted && T != 1) throw Error("internal: a left-aligned batch decodes one position per step");
  Array x;
  if (shifted) {
    std::vector<int> pos(B);
    for (int b = 0; b < B; ++b) pos[b] = len - st.shift[b];
    x = embed_rows(kt.embed_tgt, tokens, w, pos);
  } else {
    x = embed(kt.embed_tgt, tokens, true, w, len);
  }
  // Relative positions bias keys by their distance from the query's cache row: rows at
  // their own positions each get their own call over their own positions. (Rotary rows
  // are turned at their sequence positions when written: one call serves the batch.)
  const bool per_row = shifted && positions_in_attention();
  halide_buffer_t* bias = position_bias(w.decoder_position_bias);
  // The new rows' positions, one upload for every layer: T rows of one sequence, or row b
  // at its own.
  IBuf positions = row_positions(T * B, [&](int m) { return T > 1 ? len + m : len - st.shift[m]; });
  const int W = qkv_width(), heads = W / hd;
  // The new QKV rows: apart from the cache (which then takes their keys and values), or on
  // a device straight into its fused rows at position len.
  Array fresh = st.apart() ? Array(W, T, B, iface, self_cache_bf16(), /*zeroed=*/false) : Array();
  for (size_t l = 0; l < w.decoder.size(); ++l) {
    const auto& L = w.decoder[l];
    const bool tail = last_row && T > 1 && l + 1 == w.decoder.size();
    Array ff_in = parallel_input(x, L, tail);
    residual_block(x, L.self_norm, [&](const Array& h, const Array& res, Array& y) {
      Array a(d, y.T, B, iface);
      const QkvRows q = st.apart() ? QkvRows{fresh, 0, W, int64_t(W) * T}
                                   : QkvRows{st.cache[l], int64_t(len) * st.row, st.row, st.b_stride()};
      qkv_projection(h.flat(), L, T > 1 ? view2(q.a, q.at, W, T, q.t_stride) : view2(q.a, q.at, W, B, q.b_stride),
                     self_cache_bf16(), positions);
      if (st.apart())
        for (int b = 0; b < B; ++b) cache_store(st, l, fresh, b * q.b_stride, b, len, T);
      if (!per_row) {
        // Queries from position T - y.T on (a prompt's last layer: its last position).
        const QkvRows queries{q.a, q.at + (T - y.T) * q.t_stride, q.t_stride, q.b_stride};
        decoder_self_attention(queries, [&](int n) { return cache_keys(st, l, 0, B, 0, n); }, len + T - y.T, y.T, B,
                               st.self_mask, st.Tmax, bias, a);
      } else {
        Array one = iface ? Array(d, 1, 1, iface) : Array();  // device: an aligned output, then copied
        for (int b = 0; b < B; ++b) {
          const int n = len + 1 - st.shift[b];
          View o = iface ? one.heads(hd) : view4(a, int64_t(b) * d, hd, d / hd, 1, 1, d, d);
          attention(kt.decoder_self_attention, "decoder_self_attention", q.view(hd, heads, 0, 1, b, 1),
                    cache_keys(st, l, b, 1, st.shift[b], n), view2(st.zero_mask, 0, n, 1, st.Tmax), bias, o);
          if (iface) copy_elems(one, 0, a, int64_t(b) * d, d);
        }
      }
      linear_residual(kt.attention_out, "attention_out", a.flat(), L.attn_out, res.flat(), y.flat());
    }, nullptr, tail);
    if (!st.cross.empty()) cross_block(x, L, st.cross[l], st.src_mask);
    feed_forward(x, L, ff_in);
  }
  final_norm(x, w.decoder_norm);
  st.len += T;
  return x;
}

// Rows of the last position of x (d, T, B) -> (d, 1, B).
Array Stack::last_rows(const Array& x, const std::vector<int>& last) {
  Array y(x.C, 1, x.B, iface, x.bf16);
  for (int b = 0; b < x.B; ++b) copy_elems(x, (int64_t(b) * x.T + last[b]) * x.C, y, int64_t(b) * x.C, x.C);
  return y;
}

// Each sequence's row at position T - 1 (d, T, B) -> (d, 1, B).
Array Stack::last_positions(const Array& x) { return last_rows(x, std::vector<int>(x.B, x.T - 1)); }

// The decoder's hidden rows (d, T, B) over whole target sequences; keep(l, qkv) gets layer
// l's QKV rows. last_row (sequences of one length): only the last position's, (d, 1, B).
Array Stack::decoder_hidden(const Weights& w, const std::vector<Sequence>& tgt, const std::vector<Array>& cross,
                   const Array& smask, const char* what,
                   const std::function<void(size_t, const Array&)>& keep, bool last_row) {
  IBuf t = pad_batch(tgt, cfg.tgt_vocab, what);
  const int T = t.dim(0).extent();
  if (last_row && std::any_of(tgt.begin(), tgt.end(), [&](const Sequence& s) { return int(s.size()) != T; }))
    throw Error("internal: last rows of sequences of different lengths");
  Array tmask = key_mask(tgt, T);
  Array x = embed(kt.embed_tgt, t, true, w, 0);
  for (size_t l = 0; l < w.decoder.size(); ++l) {
    const auto& L = w.decoder[l];
    const bool tail = last_row && T > 1 && l + 1 == w.decoder.size();
    Array ff_in = parallel_input(x, L, tail);
    KeepQkv keep_l = keep ? KeepQkv([&](const Array& qkv) { keep(l, qkv); }) : KeepQkv();
    self_attention_block(x, L, tmask, position_bias(w.decoder_position_bias), true, keep_l, tail);
    if (!cross.empty()) cross_block(x, L, cross[l], smask);
    feed_forward(x, L, ff_in);
  }
  final_norm(x, w.decoder_norm);
  return x;
}

// The decoder over whole target sequences (teacher forcing / recomputation): head
// output (V, T, B). `cross` holds each layer's cross-attention K/V (empty for
// decoder-only models).
// With `last_logits` / `last_out`, each sequence's last position's generator output
// and head output rows are copied there ((V, 1, B) each).
Array Stack::decoder_forward(const Weights& w, const std::vector<Sequence>& tgt, const std::vector<Array>& cross,
                    const Array& smask, const char* what, Array* last_logits, Array* last_out) {
  Array x = decoder_hidden(w, tgt, cross, smask, what);
  Array logits(cfg.tgt_vocab, x.T, x.B, iface), out(cfg.tgt_vocab, x.T, x.B, iface);
  head(x, w, logits, out);
  if (last_out) {
    const int V = cfg.tgt_vocab, T = x.T;
    for (int b = 0; b < x.B; ++b) {
      const int64_t at = (int64_t(b) * T + int64_t(tgt[b].size()) - 1) * V;
      copy_elems(logits, at, *last_logits, int64_t(b) * V, V);
      copy_elems(out, at, *last_out, int64_t(b) * V, V);
    }
  }
  return out;
}

// Rows repeated: (C, S, B) -> (C, S, B * k), each sequence k times in a row (its element
// type and layout kept: a cross-attention cache is bf16 and head-major on the CPU).
Array Stack::repeat_rows(const Array& a, int k) {
  Array r(a.C, a.T, a.B * k, iface, a.bf16, /*zeroed=*/false);
  r.head_major_hd = a.head_major_hd;
  const int64_t n = int64_t(a.C) * a.T;
  for (int b = 0; b < a.B; ++b)
    for (int j = 0; j < k; ++j) copy_elems(a, b * n, r, (int64_t(b) * k + j) * n, n);
  return r;
}


Tensor Stack::encode(const Weights& w, const std::vector<Sequence>& src) {
  if (cfg.arch == Architecture::Decoder) throw Error("encode: a decoder-only model has no encoder");
  IBuf s = pad_batch(src, cfg.src_vocab, "source");
  return to_tensor(run_encoder(w, s, key_mask(src, s.dim(0).extent())));
}

Tensor Stack::pooled(const Weights& w, const std::vector<Sequence>& src) {
  if (!kt.pool) throw Error("pooled: the model's head is not 'classifier' or 'embedding'");
  IBuf s = pad_batch(src, cfg.src_vocab, "source");
  Array x = run_encoder(w, s, key_mask(src, s.dim(0).extent()));
  Array valid = make_input(x.T, x.B, 1, [&](float* v) {  // (T, B): 1 for a real token
    for (int b = 0; b < x.B; ++b)
      for (int t = 0; t < x.T; ++t) v[size_t(b) * x.T + t] = t < int(src[b].size()) ? 1.0f : 0.0f;
  });
  Array p(cfg.d_model, 1, x.B, iface);
  halide_dimension_t dims[3] = {{0, x.C, 1}, {0, x.T, x.C}, {0, x.B, x.C * x.T}};
  {
    View x3 = make_view(x, 0, 3, dims), pb = view2(p, 0, p.C, x.B, p.C), vb = valid.flat();
    KernelTimer timer("pool", iface);
    check_kernel(kt.pool(x3.raw(), vb.raw(), pb.raw()), "pool");
  }
  if (cfg.head != HeadKind::Classifier) return Tensor{{x.B, p.C}, to_host(p)};
  if (cfg.pooler) {
    Array q(p.C, 1, p.B, iface);
    linear(kt.pooler, "pooler", p.flat(), w.pooler, q.flat(), "tanh or gelu");  // never cuBLASLt's
    p = std::move(q);
  }
  Array out(cfg.num_classes, 1, x.B, iface);
  linear(kt.classifier, "classifier", p.flat(), w.classifier, out.flat());
  return Tensor{{x.B, out.C}, to_host(out)};
}

Tensor Stack::score(const Weights& w, const std::vector<Sequence>& src, const std::vector<Sequence>& tgt) {
  if (cfg.arch == Architecture::Encoder) throw Error("score: an encoder-only model has no decoder");
  if (cfg.arch == Architecture::Decoder) return to_tensor(decoder_forward(w, src, {}, Array(), "prompt"));
  if (src.size() != tgt.size())
    throw Error("score: " + std::to_string(src.size()) + " source sequences but " + std::to_string(tgt.size()) +
                " target sequences");
  IBuf s = pad_batch(src, cfg.src_vocab, "source");
  Array smask = key_mask(src, s.dim(0).extent());
  return to_tensor(decoder_forward(w, tgt, cross_kvs(w, run_encoder(w, s, smask)), smask, "target"));
}

}  // namespace halformer
