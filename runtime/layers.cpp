// The layer blocks (see stack.h): each a call of one kernel of the model's KernelTable,
// or a few of them around a residual connection, on activations; kernels read weights
// through the model's weight buffers (device.h).
#include <algorithm>
#include <cstring>

#include "halformer/kv_int8.h"
#include "stack.h"
#include "threads.h"

namespace halformer {

// A linear's weight and bias arguments: fp32 packed and [N], or (int8 kernels, whose
// signature is the same) int8 packed and (N, 2) = bias | per-channel scale (quads: (N, 3),
// + channel sums), or (bf16) bf16 packed and [N], or (int4 / q8_0) Q4_0 / Q8_0 blocks and (16, rows) =
// biases | block scales (halformer/packed_blocks.h).
std::pair<halide_buffer_t*, halide_buffer_t*> Stack::linear_args(const LinearWeights& w) {
  if (w.block_quantized()) return {wbufs.get_blocks(w), weight(w.b, kBlockPanel, int(w.b.size()) / kBlockPanel)};
  if (w.int8()) return {wbufs.get_int8(w), weight(w.b, w.out, int8_bias_columns(w.int8_group))};
  if (w.bf16()) return {uploaded(wbufs.get_bf16(w)), weight(w.b, w.out, 0)};
  return {weight(w.w, w.in, w.out, w.panel), weight(w.b, w.out, 0)};
}
void Stack::linear(LinearFn fn, const char* name, View x, const LinearWeights& w, View out, const char* act) {
  if (linear_on_blas(x, w, nullptr, act, out)) return;
  auto [wb, bb] = linear_args(w);
  KernelTimer timer(name, iface);
  check_kernel(fn(x.raw(), wb, bb, out.raw()), name);
}
void Stack::linear_residual(LinearResidualFn fn, const char* name, View x, const LinearWeights& w, View residual,
                     View out) {
  if (fn != kt.ff_up && linear_on_blas(x, w, &residual, "none", out)) return;  // ff_up multiplies
  auto [wb, bb] = linear_args(w);
  KernelTimer timer(name, iface);
  check_kernel(fn(x.raw(), wb, bb, residual.raw(), out.raw()), name);
}
// A CUDA model's linear on cuBLASLt (gpu_blas.h) where the policy takes its row count and
// cuBLASLt fuses its epilogue (bias; + ReLU, tanh-GELU or a residual); false: the Halide
// kernel runs. bf16 weights take bf16 inputs: the activations are rounded by cast_bf16 first.
bool Stack::linear_on_blas(View& x, const LinearWeights& w, View* residual, const char* act,
                           View& out) {
  if (!blas || w.int8() || w.block_quantized() || (w.bf16() && !kt.cast_bf16)) return false;
  const halide_buffer_t* xb = x.raw();
  const int K = xb->dim[0].extent, M = xb->dim[1].extent;
  if (!blas->takes(M, K, w.out)) return false;
  GemmEpilogue e = GemmEpilogue::Bias;
  const std::string a = act;
  if (residual) e = GemmEpilogue::BiasResidual;
  else if (a == "relu") e = GemmEpilogue::BiasRelu;
  else if (a == "gelu_tanh") e = GemmEpilogue::BiasGeluTanh;
  else if (a != "none") return false;
  auto dense = [&](const halide_buffer_t* b, int c) { return b->dim[0].stride == 1 && b->dim[1].stride == c; };
  if (K != w.in || !dense(xb, K) || !dense(out.raw(), w.out) || (residual && !dense(residual->raw(), w.out)))
    return false;
  auto [wb, bb] = linear_args(w);  // uploaded on first use
  GemmCall c{M, K, w.out, w.panel, w.bf16(), xb->device, wb->device, bb->device,
             residual ? residual->raw()->device : 0, out.raw()->device, e};
  Array x16 = c.bf16 ? Array(K, M, 1, iface, /*bf16=*/true) : Array();
  View x16v = c.bf16 ? x16.flat() : View{};
  if (c.bf16) c.x = x16v.raw()->device;
  if (!blas->prepare(c)) return false;  // no cuBLASLt algorithm for this shape or alignment
  if (c.bf16) {
    KernelTimer timer("cast_bf16", iface);
    check_kernel(kt.cast_bf16(x.raw(), x16v.raw()), "cast_bf16");
  }
  KernelTimer timer("cublaslt_matmul", iface);  // the profile tells them from the Halide linears
  blas->matmul(c);
  return true;
}
// fn: the norm kernel of n's width (kt.layer_norm: d_model).
void Stack::layer_norm(const Array& x, const NormWeights& n, Array& out, LayerNormFn fn) {
  const int d = int(n.gamma.size());
  halide_buffer_t *gb = weight(n.gamma, d, 0), *bb = weight(n.beta, d, 0);
  KernelTimer timer("layer_norm", iface);
  View xb = x.flat(), ob = out.flat();
  check_kernel((fn ? fn : kt.layer_norm)(xb.raw(), gb, bb, ob.raw()), "layer_norm");
}
// bias: a stack's relative position table (position_bias below).
void Stack::attention(AttentionFn fn, const char* name, View q, View kv, View mask, halide_buffer_t* bias, View out) {
  KernelTimer timer(name, iface);
  check_kernel(fn(q.raw(), kv.raw(), mask.raw(), bias, out.raw()), name);
}
// The decoder's self-attention of T new positions after `len` earlier ones: `q` holds the
// new positions' fused QKV rows (their queries), `keys` views the keys and values of
// positions [0, len + T) of B sequences. mask: (len + T, B), `m_stride` per sequence;
// out: (d, T, B).
// Causal, on the CPU, the queries go in chunks, each reading only the keys it can see,
// [0, len + q1): a 128-token prompt scores 5/8 of the full square. Bit-identical to one
// call: a key left out has weight exactly 0 (its masked score's exp underflows) and lies
// past every key the chunk reads, so every sum sees the same terms in the same order. No
// chunk holds a single query (Tq = 1 is the kernel's other path, summed differently).
// Chunks are whole key blocks (32 on AVX2 and AVX-512) and grow with the keys: each call
// compacts and transposes every key it reads once, so short chunks over long contexts spent
// most of their time there (TinyLlama, a 2,048-token prompt: 32 -> 256 halved the
// attention's cycles; docs/performance-log.md#runtime-causal-chunks).
int Stack::causal_chunk(int keys) { return kCausalChunk * std::clamp(keys / 256, 1, 8); }

void Stack::decoder_self_attention(const QkvRows& q, const KeyView& keys, int len, int T, int B, const Array& mask,
                                   int64_t m_stride, halide_buffer_t* bias, Array& out) {
  const int d = cfg.d_model, hd = d / cfg.heads, heads = qkv_width() / hd;
  const int chunk = iface || !cfg.causal ? T : causal_chunk(len + T);  // device views must start aligned: one call
  for (int q0 = 0, q1; q0 < T; q0 = q1) {
    q1 = std::min(T, q0 + chunk);
    if (T - q1 == 1) q1 = T;
    // One query per row (a decode step) reads the kernel's other path: its own line in the profile.
    attention(kt.decoder_self_attention, T == 1 ? "decode_self_attention" : "decoder_self_attention",
              q.view(hd, heads, q0, q1 - q0, 0, B), keys(len + q1), view2(mask, 0, len + q1, B, m_stride), bias,
              view4(out, int64_t(q0) * d, hd, d / hd, q1 - q0, B, d, int64_t(d) * T));
  }
}
// The (2 * relative_table_distance + 1, heads) table of a stack's self-attention (T5), or for
// every other attention call a 1 x 1 stand-in that its kernel does not read.
halide_buffer_t* Stack::position_bias(const WeightVector<float>& table) {
  static const WeightVector<float> unread(1, 0.0f);
  if (table.empty()) return weight(unread, 1, 1);
  return weight(table, 2 * relative_table_distance(cfg.relative_distance, cfg.max_len) + 1, cfg.heads);
}

// Validates ids and lengths, then right-pads with pad_id into a (T, B) buffer.
IBuf Stack::pad_batch(const std::vector<Sequence>& seqs, int vocab, const std::string& what) {
  if (seqs.empty()) throw Error(what + ": empty batch (need at least one sequence)");
  size_t T = 0;
  for (size_t i = 0; i < seqs.size(); ++i) {
    const auto& s = seqs[i];
    std::string where = what + " sequence " + std::to_string(i + 1);
    if (s.empty()) throw Error(where + " is empty");
    if (int64_t(s.size()) > cfg.max_len)
      throw Error(where + " has " + std::to_string(s.size()) + " tokens; the model's max_len is " +
                  std::to_string(cfg.max_len));
    for (size_t j = 0; j < s.size(); ++j)
      if (s[j] < 0 || s[j] >= vocab)
        throw Error(where + ", token " + std::to_string(j + 1) + ": id " + std::to_string(s[j]) +
                    " is outside the vocabulary [0, " + std::to_string(vocab) + ")");
    T = std::max(T, s.size());
  }
  IBuf tokens(int(T), int(seqs.size()));
  tokens.fill(cfg.pad_id);
  for (size_t b = 0; b < seqs.size(); ++b)
    for (size_t t = 0; t < seqs[b].size(); ++t) tokens(int(t), int(b)) = seqs[b][t];
  return tokens;
}

// Additive key mask (T, B): 0 for a real token, kMasked for the padding pad_batch added
// (when the spec masks). Padding is known by length, not by id: a pad id the caller put
// inside a sequence (e.g. a literal "[PAD]" in text) is an ordinary token, as with a
// tokenizer's attention mask; for right-padded batches that is the same as `== pad`.
Array Stack::key_mask(const std::vector<Sequence>& seqs, int T) {
  return make_input(T, int(seqs.size()), 1, [&](float* m) {
    if (cfg.padding_mask)
      for (size_t b = 0; b < seqs.size(); ++b)
        for (int t = int(seqs[b].size()); t < T; ++t) m[b * T + t] = kMasked;
  });
}

// Embedding (+ positions, + token types), then the embedding LayerNorm if any: the
// encoder's (source table, token types) or, with `tgt`, the decoder's. Source tables of
// embedding_size != d_model (ELECTRA-small) are normed at their width, then projected.
Array Stack::embed(EmbeddingFn fn, const IBuf& tokens, bool tgt, const Weights& w, int pos_offset) {
  Array x(embedding_width(tgt), tokens.dim(0).extent(), tokens.dim(1).extent(), iface);
  embed_into(fn, tokens, tgt, w, pos_offset, x, 0);
  x = embedding_norm(std::move(x), w, tgt);
  if (x.C == cfg.d_model) return x;
  Array y(cfg.d_model, x.T, x.B, iface);
  linear(kt.embed_project, "embed_project", x.flat(), w.embed_project, y.flat());
  return y;
}
int Stack::embedding_width(bool tgt) const { return tgt ? cfg.d_model : cfg.embedding_size; }

// Decoder rows at their own positions (a batch of left-aligned prompts of different
// lengths): one new token per row, row b at position pos[b].
Array Stack::embed_rows(EmbeddingFn fn, const IBuf& tokens, const Weights& w, const std::vector<int>& pos) {
  const int d = cfg.d_model, B = tokens.dim(1).extent();
  Array x(d, 1, B, iface);
  Array row = iface ? Array(d, 1, 1, iface) : Array();  // a kernel argument on a device must start aligned
  for (int b = 0; b < B; ++b) {
    IBuf one(1, 1);
    one(0, 0) = tokens(0, b);
    if (!iface) {
      embed_into(fn, one, true, w, pos[b], x, int64_t(b) * d);
      continue;
    }
    embed_into(fn, one, true, w, pos[b], row, 0);
    copy_elems(row, 0, x, int64_t(b) * d, d);
  }
  return embedding_norm(std::move(x), w, true);
}

// The embedding kernel on tokens (T, B) into x's elements from `offset` (d, T, B).
void Stack::embed_into(EmbeddingFn fn, const IBuf& tokens, bool tgt, const Weights& w, int pos_offset, Array& x,
                int64_t offset) {
  const int d = embedding_width(tgt), T = tokens.dim(0).extent(), B = tokens.dim(1).extent();
  const EmbeddingTable& table = tgt ? w.tgt_table() : w.src_embedding;
  const int vocab = tgt ? cfg.tgt_vocab : cfg.src_vocab;
  const bool token_types = !tgt && cfg.type_vocab > 0;
  // An int8 table's rows carry their scale (generators/embedding.cpp, embedding_int8).
  halide_buffer_t* tb = table.int8() ? wbufs.get_int8_table(table.q, d, vocab) : weight(table.f, d, vocab);
  // Tables a kernel does not read (no learned positions / types) get a stand-in.
  halide_buffer_t* unread = table.int8() ? weight(wbufs.stand_in, 1, 1) : tb;
  // The decoder reads its own positions and norm where the weights have them (BART, Marian).
  const WeightVector<float>& positions = tgt && !w.tgt_positions.empty() ? w.tgt_positions : w.positions;
  halide_buffer_t* pb = positions.empty() ? unread : weight(positions, d, cfg.max_len);
  const bool types_read = token_types && !w.token_types.empty();
  halide_buffer_t* yb = types_read ? weight(w.token_types, d, cfg.type_vocab) : unread;
  IBuf types(T, B);
  types.fill(0);  // token type 0 for every token (single-segment inputs)
  halide_dimension_t dims[3] = {{0, d, 1}, {0, T, d}, {0, B, d * T}};
  View o3 = make_view(x, offset, 3, dims);
  upload(tokens);
  // The kernel reads type ids only with token types; otherwise (on a GPU, where an
  // upload would be wasted) the token ids stand in.
  if (token_types || !iface) upload(types);
  IBuf& tok = const_cast<IBuf&>(tokens);
  KernelTimer timer("embedding", iface);
  check_kernel(fn(tok.raw_buffer(), (token_types || !iface ? types : tok).raw_buffer(), tb, pb, yb, pos_offset, o3.raw()),
      "embedding");
}

Array Stack::embedding_norm(Array x, const Weights& w, bool tgt) {
  if (!cfg.embedding_norm) return x;
  Array y(x.C, x.T, x.B, iface);
  layer_norm(x, tgt && !w.tgt_embedding_norm.gamma.empty() ? w.tgt_embedding_norm : w.embedding_norm, y,
             x.C != cfg.d_model ? kt.embedding_norm : nullptr);
  return y;
}

// parallel_residual: the feed-forward's input, LN2 of the layer's input, taken before the
// attention changes x (empty otherwise); with last_row of each sequence's last row alone.
Array Stack::parallel_input(const Array& x, const LayerWeights& L, bool last_row) {
  if (!cfg.parallel_residual) return Array();
  if (last_row) return parallel_input(last_positions(x), L);
  Array h(x.C, x.T, x.B, iface);
  layer_norm(x, L.ff_norm, h);
  return h;
}

// Large CPU calls (a batch of long sequences) go through the feed-forward and the encoder's
// self-attention block in chunks of about kChunkRows rows, so that a chunk's intermediate
// (the feed-forward's middle, the QKV rows) is still in cache when the next kernel reads it:
// at 1,024 rows the middle alone is 8 MB. Every row's arithmetic is unchanged (rows are
// alike at any count), so the output is the same bits (docs/performance-log.md#runtime-row-chunks).
constexpr int kChunkRows = 256;

// Chunks of `unit`-row pieces (rows / unit of them) of about kChunkRows rows each, balanced;
// 0 where one call is better: a GPU device, or fewer than two chunks' rows.
int Stack::chunk_units(int units, int unit) const {
  if (iface || int64_t(units) * unit < 2 * kChunkRows) return 0;
  const int per = std::max(1, kChunkRows / unit), chunks = (units + per - 1) / per;
  return (units + chunks - 1) / chunks;
}

void Stack::feed_forward(Array& x, const LayerWeights& L, const Array& parallel_in) {
  const Array* normed = cfg.parallel_residual ? &parallel_in : nullptr;
  residual_block(x, L.ff_norm, [&](const Array& h, const Array& res, Array& y) {
    const int rows = h.T * h.B, per = chunk_units(rows, 1);
    if (per == 0) return feed_forward_rows(h.flat(), res.flat(), y.flat(), rows, L);
    for (int r0 = 0; r0 < rows; r0 += per) {
      const int n = std::min(per, rows - r0);
      const int64_t at = int64_t(r0) * h.C;
      feed_forward_rows(view2(h, at, h.C, n, h.C), view2(res, at, res.C, n, res.C), view2(y, at, y.C, n, y.C), n, L);
    }
  }, normed);
}

// y = ff2(act(ff1 h)) + res over `rows` rows (views of them).
void Stack::feed_forward_rows(View h, View res, View y, int rows, const LayerWeights& L) {
  Array mid(L.ff1.out, rows, 1, iface, false, /*zeroed=*/false);
  if (cfg.gated_ff) {  // SwiGLU / GeGLU: mid = act(h W_gate) * (h W_up)
    Array gate(L.ff_gate.out, rows, 1, iface, false, /*zeroed=*/false);
    if (!gated_on_blas(h, L, gate, mid)) {
      linear(kt.ff1, "ff_gate", h, L.ff_gate, gate.flat(), cfg.ff_activation);
      linear_residual(kt.ff_up, "ff_up", h, L.ff1, gate.flat(), mid.flat());
    }
  } else {
    linear(kt.ff1, "ff1", h, L.ff1, mid.flat(), cfg.ff_activation);
  }
  linear_residual(kt.ff2, "ff2", mid.flat(), L.ff2, res, y);
}

// A gated feed-forward's middle with both projections on cuBLASLt (gpu_blas.h), which
// fuses no SiLU: gate and up as plain matmuls, then gate_act. false: not taken (the Halide
// kernels run), decided before anything ran.
bool Stack::gated_on_blas(View x, const LayerWeights& L, Array& gate, Array& mid) {
  if (!kt.gate_act) return false;
  View g = gate.flat(), u = mid.flat();
  if (!linear_on_blas(x, L.ff_gate, nullptr, "none", g)) return false;
  if (!linear_on_blas(x, L.ff1, nullptr, "none", u)) return false;  // the Halide kernels redo the gate too
  KernelTimer timer("gate_act", iface);
  check_kernel(kt.gate_act(g.raw(), u.raw(), u.raw()), "gate_act");
  return true;
}

// Relative positions (T5): a bias by the distance between a key's cache row and the
// query's, added inside self-attention (rotary positions are turned into the rows
// themselves at their sequence positions: qkv_projection).
bool Stack::positions_in_attention() const { return cfg.positions == Positions::Relative; }

// Features of a fused self-attention QKV row: H query heads and kv_heads key and value heads.
int Stack::qkv_width() const { return cfg.d_model + 2 * cfg.kv_heads * (cfg.d_model / cfg.heads); }

// The decoder's self-attention cache is bf16 (its kernels read and write bf16 rows).
bool Stack::self_cache_bf16() const { return cfg.self_cache_bf16 && !iface; }
bool Stack::self_cache_int8() const { return cfg.self_cache_int8 && !iface; }
int Stack::stored_kv_row() const {
  const int hd = cfg.d_model / cfg.heads, features = qkv_width() - cfg.d_model;
  return self_cache_int8() ? kv_int8_bytes(features, hd) : features;
}
int Stack::self_cache_elem_bytes() const { return self_cache_int8() ? 1 : self_cache_bf16() ? 2 : 4; }

// Each row's position for qkv_projection (on the device where the kernels run), made once
// per step or stack and shared by its layers; empty without rotary positions.
IBuf Stack::row_positions(int rows, const std::function<int(int)>& position) {
  if (!kt.rotary) return IBuf();
  IBuf positions(rows);
  for (int m = 0; m < rows; ++m) positions(m) = position(m);
  upload(positions);
  return positions;
}

// The fused QKV projection of the rows x into `out` (bf16: bf16 rows, the decoder's
// cache). Rotary models turn the query and key heads here, once, row m at position
// positions(m) (row_positions; generators/rotary.cpp): attention then reads the rows as
// they are, and a decode step no longer turns every cached key again
// (docs/performance-log.md#rotary-once).
void Stack::qkv_projection(View x, const LayerWeights& L, View out, bool bf16, IBuf& positions) {
  if (!kt.rotary) return linear(bf16 ? kt.qkv_cache : kt.qkv, "qkv", x, L.qkv, out);
  Array rows(qkv_width(), positions.dim(0).extent(), 1, iface, false, /*zeroed=*/false);
  linear(kt.qkv, "qkv", x, L.qkv, rows.flat());
  KernelTimer timer("rotary", iface);
  check_kernel((bf16 ? kt.rotary_cache : kt.rotary)(rows.flat().raw(), positions.raw_buffer(), out.raw()), "rotary");
}

// Self-attention over the whole sequence (no cache): encoder layers, teacher forcing.
// decoder: the decoder's kernels, whose QKV rows are the cache's (bf16 with self_cache_bf16).
// keep: given the QKV rows (W, T, B) before they are dropped (a prefill keeps them).
// last_row (decoder, sequences without padding): only each sequence's last position goes
// on; x becomes (d, 1, B).
void Stack::self_attention_block(Array& x, const LayerWeights& L, const Array& mask, halide_buffer_t* bias,
                          bool decoder, const KeepQkv& keep, bool last_row) {
  const int d = cfg.d_model, hd = d / cfg.heads, W = qkv_width(), heads = W / hd;
  const bool bf16 = decoder && self_cache_bf16();
  residual_block(x, L.self_norm, [&](const Array& h, const Array& res, Array& y) {
    if (!decoder) {
      // An encoder's whole sequences, in chunks of about kChunkRows rows where there are many
      // (chunk_units): QKV rows, attention and output projection per chunk. Not with rotary
      // positions: qkv_projection sizes its rotated rows by the positions' count, which a
      // last, shorter chunk would not match.
      const int chunk = kt.rotary ? 0 : chunk_units(h.B, h.T), seqs = chunk > 0 ? chunk : h.B;
      Array qkv(W, h.T, seqs, iface, bf16, /*zeroed=*/false), a(d, h.T, seqs, iface, false, /*zeroed=*/false);
      IBuf positions = row_positions(h.T * seqs, [&](int m) { return m % h.T; });  // row (t, b): position t
      for (int b0 = 0; b0 < h.B; b0 += seqs) {
        const int nb = std::min(seqs, h.B - b0), rows = nb * h.T;
        const int64_t at = int64_t(b0) * h.T * h.C;
        qkv_projection(view2(h, at, h.C, rows, h.C), L, view2(qkv, 0, W, rows, W), bf16, positions);
        attention(kt.encoder_self_attention, "encoder_self_attention", qkv.heads(hd, nb), qkv.heads(hd, nb),
                  view2(mask, int64_t(b0) * h.T, h.T, nb, h.T), bias, a.heads(hd, nb));
        linear_residual(kt.attention_out, "attention_out", view2(a, 0, d, rows, d), L.attn_out,
                        view2(res, at, res.C, rows, res.C), view2(y, at, y.C, rows, y.C));
      }
      return;
    }
    Array qkv(W, h.T, h.B, iface, bf16, /*zeroed=*/false), a(d, y.T, h.B, iface, false, /*zeroed=*/false);
    IBuf positions = row_positions(h.T * h.B, [&](int m) { return m % h.T; });  // row (t, b): position t
    qkv_projection(h.flat(), L, qkv.flat(), bf16, positions);
    const QkvRows rows{qkv, 0, W, int64_t(W) * h.T};
    const Array kv8 = self_cache_int8() ? int8_keys(qkv) : Array();
    auto keys = [&](int n) { return kv8.int8 ? head_major_keys(kv8, 0, n, h.B) : rows.view(hd, heads, 0, n, 0, h.B); };
    if (last_row) {
      // The last query against every key; its row copied out (a view of it would not
      // start aligned on a device).
      Array q = last_positions(qkv);
      attention(kt.decoder_self_attention, "decoder_self_attention", view4(q, 0, hd, heads, 1, h.B, W, W), keys(h.T),
                view2(mask, 0, h.T, h.B, h.T), bias, a.heads(hd));
    } else {
      decoder_self_attention(rows, keys, 0, h.T, h.B, mask, h.T, bias, a);
    }
    if (keep) keep(qkv);
    linear_residual(kt.attention_out, "attention_out", a.flat(), L.attn_out, res.flat(), y.flat());
  }, nullptr, last_row);
}

void Stack::final_norm(Array& x, const NormWeights& n) {
  if (!cfg.final_norm) return;
  Array y(x.C, x.T, x.B, iface);
  layer_norm(x, n, y);
  x = std::move(y);
}

// Cross-attention keys/values of one decoder layer: computed once per source (bf16 bits
// with cross_kv_bf16: half the bytes each decode step then reads).
// On the CPU the result is stored head by head: a decode step's cross-attention then
// reads each (sequence, head) as one contiguous run, which the hardware prefetchers
// follow, instead of a short piece of every row (a new 4 KB page per key in fp32).
// See docs/performance-log.md#runtime-cross-kv-head-major.
Array Stack::cross_kv(const LayerWeights& L, const Array& memory) {
  const bool bf16 = cfg.cross_kv_bf16 && !iface;
  Array kv(2 * cfg.d_model, memory.T, memory.B, iface, bf16);
  linear(kt.cross_kv, "cross_kv", memory.flat(), L.cross_kv, kv.flat());
  if (iface) return kv;
  KernelTimer timer("cross_kv_heads", iface);
  Array out(kv.C, kv.T, kv.B, nullptr, bf16, /*zeroed=*/false);
  out.head_major_hd = cfg.d_model / cfg.heads;
  // One sequence's rows into its head-major blocks, per task: the rows read in order (a
  // task per (sequence, head) read a piece of every row: 1.6x slower in fp32).
  const uint8_t* rows = reinterpret_cast<const uint8_t*>(kv.mem.data());
  uint8_t* heads = reinterpret_cast<uint8_t*>(out.mem.data());
  const int C = kv.C, T = kv.T, hd = out.head_major_hd;
  const size_t elem = bf16 ? sizeof(uint16_t) : sizeof(float), piece = size_t(hd) * elem, block = size_t(T) * piece;
  parallel_for(kv.B, "cross_kv_heads", [&](int b) {
    const uint8_t* src = rows + int64_t(b) * T * C * elem;
    uint8_t* dst = heads + int64_t(b) * T * C * elem;
    for (int t = 0; t < T; ++t)
      for (int h = 0; h < C / hd; ++h) std::memcpy(dst + h * block + t * piece, src + (int64_t(t) * C + h * hd) * elem, piece);
  });
  return out;
}

std::vector<Array> Stack::cross_kvs(const Weights& w, const Array& memory) {
  std::vector<Array> kv;
  for (const auto& L : w.decoder) kv.push_back(cross_kv(L, memory));
  return kv;
}

void Stack::cross_block(Array& x, const LayerWeights& L, const Array& kv, const Array& src_mask) {
  const int hd = cfg.d_model / cfg.heads;
  cross_sublayer(x, L, [&](const Array& q, Array& a) {
    attention(kt.cross_attention, "cross_attention", q.heads(hd), kv.heads(hd), src_mask.flat(), position_bias({}),
              a.heads(hd));
  });
}

void Stack::cross_sublayer(Array& x, const LayerWeights& L, const std::function<void(const Array& q, Array& a)>& attend) {
  const int d = cfg.d_model;
  residual_block(x, L.cross_norm, [&](const Array& h, const Array& res, Array& y) {
    Array q(d, h.T, h.B, iface, false, /*zeroed=*/false), a(d, h.T, h.B, iface, false, /*zeroed=*/false);
    linear(kt.cross_q, "cross_q", h.flat(), L.cross_q, q.flat());
    attend(q, a);
    linear_residual(kt.attention_out, "cross_out", a.flat(), L.cross_out, res.flat(), y.flat());
  });
}

// The output projection: hidden rows -> raw logits.
void Stack::generator(const Array& x, const Weights& w, Array& logits) {
  linear(kt.generator, "generator", x.flat(), w.generator, logits.flat());
}
// Generator + softmax / log_softmax: `logits` gets the raw generator output, `out` the head's.
void Stack::head(const Array& x, const Weights& w, Array& logits, Array& out) {
  generator(x, w, logits);
  head_of(logits, out);
}
void Stack::head_of(const Array& logits, Array& out) {
  KernelTimer timer("head", iface);
  if (kt.head) {
    View lb = logits.flat(), ob = out.flat();
    check_kernel(kt.head(lb.raw(), ob.raw()), "head");
  } else {
    copy_elems(logits, 0, out, 0, logits.size());
  }
}

// Row-wise argmax of `rows` into `next`, which is then read on the host.
void Stack::argmax(const Array& rows, IBuf& next) {
  {
    KernelTimer timer("argmax", iface);
    View rb = rows.flat();
    check_kernel(kt.argmax(rb.raw(), next.raw_buffer()), "argmax");
  }
  download(next, "argmax");
}

}  // namespace halformer
