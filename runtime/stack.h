// The layer blocks of one call into a model: embedding, norms, the attention block, the
// feed-forward block, cross-attention, the head -- each a call of a kernel from the
// model's KernelTable on activations (activations.h) -- and the stacks built of them: the
// encoder, the decoder over whole sequences and the decoder step over its KV cache
// (DecoderState). Definitions: layers.cpp (blocks), self_cache.cpp (the decoder's cache),
// stacks.cpp (stacks, encode / pooled / score). Decoding (token choice, prefill, greedy,
// sampling, beam) is decoding.h.
#pragma once

#include <algorithm>
#include <functional>
#include <string>
#include <vector>

#include "activations.h"
#include "device.h"
#include "halformer/model.h"
#include "halformer/weights.h"

namespace halformer {

// Throws naming `what` (and the advice) when `bytes` exceed the machine's memory: host
// caches are refused up front rather than left to the overcommitting allocator.
void refuse_beyond_memory(double bytes, const std::string& what, const std::string& advice);

// Decoder state for incremental decoding over B rows: per layer the self-attention cache
// (keys and values of every position so far; self_cache.cpp) and, for an
// encoder-decoder, the cross-attention keys/values of the memory.
// The cache's layout: on the CPU the keys and values alone, head by head
// ([B][2 * kv_heads][Tmax][head_row], Array::head_major_hd; keys then values), so that a decode
// step streams each head's keys as one contiguous run (docs/performance-log.md#self-cache-apart);
// on a GPU device the fused QKV rows, queries included ([B][Tmax][row], each row padded to
// `row` = a multiple of kDeviceAlignFloats so that the rows of a step start aligned), which
// the QKV projection writes in place.
// A batch of decoder-only prompts of different lengths is left-aligned: row b's prompt
// fills cache positions [shift[b], Pmax), so every step writes one cache position for
// all rows at once; row b's token at cache position t sits at sequence position
// t - shift[b], and self_mask hides positions before shift[b].
struct DecoderState {
  int B = 0, Tmax = 0, len = 0, row = 0;  // row: a cache row's elements (head-major: 2 * kv_heads * Array::head_row)
  std::vector<Array> cache, cross;
  Array src_mask;   // (S, B) additive, encoder-decoder only
  Array self_mask;  // (Tmax, B): 0, or kMasked before a row's shift
  std::vector<int> shift;  // per row; all 0 unless prompts differ in length
  Array zero_mask;  // (Tmax, 1) zeros: one row's own positions (rotary attention per row)
  std::vector<uint8_t> reorder_scratch;  // beam search: the parents' cache rows (CPU)
  bool shifted() const { return std::any_of(shift.begin(), shift.end(), [](int s) { return s != 0; }); }
  bool apart() const { return !cache.empty() && cache[0].head_major_hd > 0; }  // keys and values apart from queries
  int64_t b_stride() const { return int64_t(row) * Tmax; }
};

// Fused QKV rows of B sequences (a step's new positions, or whole sequences): position t
// of sequence b at element at + t * t_stride + b * b_stride of `a`.
struct QkvRows {
  const Array& a;
  int64_t at, t_stride, b_stride;
  // (hd, heads, n, nb): positions [t0, t0 + n) of sequences [b0, b0 + nb).
  View view(int hd, int heads, int t0, int n, int b0, int nb) const {
    return view4(a, at + t0 * t_stride + b0 * b_stride, hd, heads, n, nb, t_stride, b_stride);
  }
};

// One call into a Model: its config, kernels, weight buffers and device, passed to
// every step explicitly (a Model is a value: nothing about it lives in globals).
struct Stack : DeviceContext {
  const ModelConfig& cfg;
  const KernelTable& kt;

  Stack(const DeviceContext& device, const ModelConfig& c, const KernelTable& k) : DeviceContext(device), cfg(c), kt(k) {}

  // ---- layer blocks (layers.cpp)
  // A linear's weight and bias buffers (fp32, int8 or bf16 layouts).
  std::pair<halide_buffer_t*, halide_buffer_t*> linear_args(const LinearWeights& w);
  // act: the PointwiseFn the kernel fn applies (ModelConfig::ff_activation for ff1), which
  // decides whether cuBLASLt can stand in for it (linear_on_blas).
  void linear(LinearFn fn, const char* name, View x, const LinearWeights& w, View out, const char* act = "none");
  void linear_residual(LinearResidualFn fn, const char* name, View x, const LinearWeights& w, View residual,
                       View out);
  bool linear_on_blas(View& x, const LinearWeights& w, View* residual, const char* act, View& out);
  // fn: the norm kernel of n's width (kt.layer_norm: d_model).
  void layer_norm(const Array& x, const NormWeights& n, Array& out, LayerNormFn fn = nullptr);
  // bias: a stack's relative position table (position_bias).
  void attention(AttentionFn fn, const char* name, View q, View kv, View mask, halide_buffer_t* bias, View out);
  // The decoder's self-attention of T new positions after `len` earlier ones (layers.cpp).
  static constexpr int kCausalChunk = 32;  // queries per call, causal, CPU: a multiple of this
  static int causal_chunk(int keys);       // the chunk for a call reading `keys` keys
  using KeyView = std::function<View(int keys)>;  // the keys and values of positions [0, keys)
  void decoder_self_attention(const QkvRows& q, const KeyView& keys, int len, int T, int B, const Array& mask,
                              int64_t m_stride, halide_buffer_t* bias, Array& out);
  halide_buffer_t* position_bias(const WeightVector<float>& table);
  // Validates ids and lengths, then right-pads with pad_id into a (T, B) buffer.
  IBuf pad_batch(const std::vector<Sequence>& seqs, int vocab, const std::string& what);
  // Additive key mask (T, B) for the padding pad_batch added.
  Array key_mask(const std::vector<Sequence>& seqs, int T);
  Array embed(EmbeddingFn fn, const IBuf& tokens, bool tgt, const Weights& w, int pos_offset);
  int embedding_width(bool tgt) const;
  Array embed_rows(EmbeddingFn fn, const IBuf& tokens, const Weights& w, const std::vector<int>& pos);
  void embed_into(EmbeddingFn fn, const IBuf& tokens, bool tgt, const Weights& w, int pos_offset, Array& x,
                  int64_t offset);
  Array embedding_norm(Array x, const Weights& w, bool tgt);
  // x <- norm(x + f(x)) or x + f(norm(x)) (below).
  template <typename F>
  void residual_block(Array& x, const NormWeights& n, F sublayer, const Array* normed = nullptr, bool last_row = false);
  Array parallel_input(const Array& x, const LayerWeights& L, bool last_row = false);
  void feed_forward(Array& x, const LayerWeights& L, const Array& parallel_in = Array());
  void feed_forward_rows(View h, View res, View y, int rows, const LayerWeights& L);
  int chunk_units(int units, int unit) const;
  bool gated_on_blas(View x, const LayerWeights& L, Array& gate, Array& mid);
  bool positions_in_attention() const;
  int qkv_width() const;
  // The fused QKV rows of x into out, rotary positions turned (row m at positions(m); from
  // row_positions) (layers.cpp).
  IBuf row_positions(int rows, const std::function<int(int)>& position);
  void qkv_projection(View x, const LayerWeights& L, View out, bool bf16, IBuf& positions);
  bool self_cache_bf16() const;
  // The self-attention cache's keys and values as int8 rows (halformer/kv_int8.h; the new
  // QKV rows, queries included, stay bf16: self_cache_bf16 too). CPU only.
  bool self_cache_int8() const;
  // The CPU cache's elements per position (the keys and values; int8: bytes, with the
  // heads' scales) and an element's bytes.
  int stored_kv_row() const;
  int self_cache_elem_bytes() const;
  using KeepQkv = std::function<void(const Array&)>;
  void self_attention_block(Array& x, const LayerWeights& L, const Array& mask, halide_buffer_t* bias,
                            bool decoder = false, const KeepQkv& keep = nullptr, bool last_row = false);
  void final_norm(Array& x, const NormWeights& n);
  Array cross_kv(const LayerWeights& L, const Array& memory);
  std::vector<Array> cross_kvs(const Weights& w, const Array& memory);  // cross_kv of every decoder layer
  void cross_block(Array& x, const LayerWeights& L, const Array& kv, const Array& src_mask);
  // norm, query projection, `attend` (queries -> attention output), output projection, residual
  void cross_sublayer(Array& x, const LayerWeights& L, const std::function<void(const Array& q, Array& a)>& attend);
  // The output projection: hidden rows -> raw logits.
  void generator(const Array& x, const Weights& w, Array& logits);
  // Generator + softmax / log_softmax: `logits` gets the raw generator output, `out` the head's.
  void head(const Array& x, const Weights& w, Array& logits, Array& out);
  void head_of(const Array& logits, Array& out);
  // Row-wise argmax of `rows` into `next`, which is then read on the host.
  void argmax(const Array& rows, IBuf& next);

  // ---- the decoder's self-attention cache (self_cache.cpp)
  DecoderState decoder_state(const Weights& w, int B, int Tmax, std::vector<int> shift = {});
  // Layer l's keys and values of positions [from, from + n) of rows [b, b + nb), as the
  // decoder_self_attention kernel reads them (key head h at k_head + h = heads + h).
  View cache_keys(const DecoderState& st, size_t l, int b, int nb, int from, int n);
  // The same over a head-major array of keys and values (C per position, T positions, B
  // sequences, head_major_hd set): n positions of nb sequences from element `at`.
  View head_major_keys(const Array& c, int64_t at, int n, int nb);
  // An int8 cache: the keys and values of fused QKV rows (W, T, B) quantized as the cache
  // stores them, head-major, so that attention over whole sequences reads what a decode
  // step reads (a batch gives each prompt's results alone, the engine the model's).
  Array int8_keys(const Array& qkv);
  // Sequence b's T new rows (fused QKV rows of `rows`, from element `at`, rows.C apart)
  // into layer l's cache at positions [pos, pos + T).
  void cache_store(DecoderState& st, size_t l, const Array& rows, int64_t at, int b, int pos, int T);
  // Beam search: row b continues from row parent[b].
  void reorder(DecoderState& st, const std::vector<int>& parent);
  // The key and value heads of T fused QKV rows (from element `at` of `rows`, rows.C
  // apart) into positions [pos, pos + T) of a head-major cache ([..][heads][c.T][head_row],
  // a sequence or block from element `base`): copied, or quantized into an int8 cache. The
  // decoder's cache, the engine's pool and Stack::int8_keys store through it.
  void store_positions(const Array& rows, int64_t at, Array& c, int64_t base, int pos, int T);
  // n head rows of hd features (from element `from` of `rows`, rows.C apart) into a
  // head-major cache (from `to`, Array::head_row() apart).
  void store_heads(const Array& rows, int64_t from, Array& cache, int64_t to, int hd, int n);

  // ---- stacks (stacks.cpp)
  Array run_encoder(const Weights& w, const IBuf& src, const Array& src_mask);
  Tensor to_tensor(const Array& a);
  Array decode_step(DecoderState& st, const Weights& w, const IBuf& tokens, bool last_row = false);
  Array last_rows(const Array& x, const std::vector<int>& last);
  Array last_positions(const Array& x);
  Array decoder_hidden(const Weights& w, const std::vector<Sequence>& tgt, const std::vector<Array>& cross,
                       const Array& smask, const char* what,
                       const std::function<void(size_t, const Array&)>& keep = nullptr, bool last_row = false);
  Array decoder_forward(const Weights& w, const std::vector<Sequence>& tgt, const std::vector<Array>& cross,
                        const Array& smask, const char* what, Array* last_logits = nullptr, Array* last_out = nullptr);
  Array repeat_rows(const Array& a, int k);
  Tensor encode(const Weights& w, const std::vector<Sequence>& src);
  Tensor pooled(const Weights& w, const std::vector<Sequence>& src);
  Tensor score(const Weights& w, const std::vector<Sequence>& src, const std::vector<Sequence>& tgt);
};

// x <- norm(x + f(x)) (post-norm) or x <- x + f(norm(x)) (pre-norm); `sublayer` writes
// f(input) + residual into its output buffer.
// normed: the sublayer's input already normalised (parallel_residual: the layer's input).
// last_row: only each sequence's last position goes on (the last layer of a prefill):
// the sublayer gets every row as input, but the residual and its output are (C, 1, B),
// and so is x after.
template <typename F>
void Stack::residual_block(Array& x, const NormWeights& n, F sublayer, const Array* normed, bool last_row) {
  Array last = last_row ? last_positions(x) : Array();
  const Array& res = last_row ? last : x;
  Array y(x.C, res.T, x.B, iface, false, /*zeroed=*/false);
  if (cfg.pre_norm && normed) {
    sublayer(*normed, res, y);
    x = std::move(y);
  } else if (cfg.pre_norm) {
    Array h(x.C, x.T, x.B, iface, false, /*zeroed=*/false);
    layer_norm(x, n, h);
    sublayer(h, res, y);
    x = std::move(y);
  } else {
    sublayer(x, res, y);
    if (last_row) x = Array(y.C, y.T, y.B, iface, false, /*zeroed=*/false);
    layer_norm(y, n, x);
  }
}

}  // namespace halformer
