// The decoder over the paged cache (paged_decoder.h). Mirrors Stack::decode_step (its
// embedding, layer order, the last row of a prompt, the causal chunks of a prompt's queries)
// so that a sequence gets the bits it gets alone; only where keys and values are kept
// differs.
#include "paged_decoder.h"

#include <algorithm>

#include "profile.h"

namespace halformer {

int64_t PagedCache::bytes_per_block(const Stack& stack, const Weights& w) {
  return int64_t(w.decoder.size()) * kKvBlockSize * stack.stored_kv_row() * stack.self_cache_elem_bytes();
}

PagedCache::PagedCache(Stack& stack, const Weights& w, int count) : blocks(count) {
  const int hd = stack.cfg.d_model / stack.cfg.heads;
  kv_row = stack.qkv_width() - stack.cfg.heads * hd;
  block_bytes = bytes_per_block(stack, w);
  for (size_t l = 0; l < w.decoder.size(); ++l) {
    // Host memory is zeroed; device memory is not, and masked keys are still read (times a
    // zero weight), so it is uploaded as zeros.
    if (!stack.iface) {  // head by head in each block, as the decoder's own cache (stack.h DecoderState)
      if (stack.self_cache_int8())
        pool.emplace_back(stack.stored_kv_row(), kKvBlockSize, count, Array::Int8Rows{});
      else
        pool.emplace_back(kv_row, kKvBlockSize, count, nullptr, stack.self_cache_bf16());
      pool.back().head_major_hd = hd;
    } else {
      pool.push_back(stack.make_input(kv_row, kKvBlockSize, count, [](float*) {}));
    }
  }
}

namespace {

// Positions [0, n) of sequence fb of `from` into sequence tb of `to` (arrays alike but for
// their positions: cross_kv's layout, head-major on the CPU).
void copy_positions(Stack& stack, const Array& from, int fb, Array& to, int tb, int n) {
  const int C = from.C, hd = from.head_major_hd;
  const int64_t fp = int64_t(fb) * C * from.T, tp = int64_t(tb) * C * to.T;
  if (!hd)
    stack.copy_elems(from, fp, to, tp, int64_t(n) * C);
  else  // a run of n positions per head
    stack.copy_rows(from, fp, int64_t(from.T) * hd, to, tp, int64_t(to.T) * hd, n * hd, C / hd);
}

}  // namespace

void SourceSlab::place(Stack& stack, const Weights& w, int slot, const Sequence& source) {
  IBuf s = stack.pad_batch({source}, stack.cfg.src_vocab, "source");
  const std::vector<Array> src = stack.cross_kvs(w, stack.run_encoder(w, s, stack.key_mask({source}, s.dim(0).extent())));
  const int S = src.at(0).T, slots = int(len.size());
  if (S > cap) {  // grow: every placed source into arrays of the new cap
    const int grown = (S + kKvBlockSize - 1) / kKvBlockSize * kKvBlockSize;
    std::vector<Array> wider;
    for (size_t l = 0; l < src.size(); ++l) {
      const Array& like = src[l];
      // Device memory is not zeroed and masked keys are still read (times a zero weight).
      Array a = stack.iface ? stack.make_input(like.C, grown, slots, [](float*) {})
                            : Array(like.C, grown, slots, nullptr, like.bf16);
      a.head_major_hd = like.head_major_hd;
      for (int b = 0; b < slots; ++b)
        if (len[size_t(b)] > 0) copy_positions(stack, kv[l], b, a, b, len[size_t(b)]);
      wider.push_back(std::move(a));
    }
    kv = std::move(wider), cap = grown;
  }
  for (size_t l = 0; l < kv.size(); ++l) copy_positions(stack, src[l], 0, kv[l], slot, S);
  len[size_t(slot)] = S;
}

Array SourceSlab::mask(Stack& stack, int rows) const {
  return stack.make_input(cap, rows, 1, [&](float* m) {
    for (int b = 0; b < rows; ++b)
      for (int t = 0; t < cap; ++t) m[int64_t(b) * cap + t] = t < len[size_t(b)] ? 0.0f : kMasked;
  });
}

void SourceSlab::cross_block(Stack& stack, Array& x, const LayerWeights& L, size_t l, const Array& mask) const {
  const int hd = stack.cfg.d_model / stack.cfg.heads;
  const View keys = kv[l].heads(hd, x.B);  // slots [0, x.B): the rows' own
  stack.cross_sublayer(x, L, [&](const Array& q, Array& out) {
    stack.attention(stack.kt.cross_attention, "cross_attention", q.heads(hd), keys, mask.flat(),
                    stack.position_bias({}), out.heads(hd));
  });
}

Array paged_forward(Stack& stack, const Weights& w, PagedCache& cache, const IBuf& tokens, const std::vector<int>& start,
                    const std::vector<const std::vector<int>*>& tables, const std::vector<bool>& write, bool last_row,
                    const SourceSlab* sources) {
  const ModelConfig& cfg = stack.cfg;
  const int Tq = tokens.dim(0).extent(), B = tokens.dim(1).extent();
  if (Tq > 1 && B > 1) throw Error("internal: several positions of several sequences");
  const int d = cfg.d_model, H = cfg.heads, hd = d / H, W = stack.qkv_width(), kv_row = cache.kv_row;
  const int BS = kKvBlockSize;
  int keys = 0;
  for (int b = 0; b < B; ++b) keys = std::max(keys, start[size_t(b)] + Tq);
  // Each sequence's table, padded with the null block; its keys visible up to its own end.
  IBuf table((keys + BS - 1) / BS, B);
  table.fill(0);
  for (int b = 0; b < B; ++b)
    for (int n = 0; n < table.dim(0).extent() && n < int(tables[size_t(b)]->size()); ++n) table(n, b) = (*tables[size_t(b)])[size_t(n)];
  stack.upload(table);
  Array mask = stack.make_input(keys, B, 1, [&](float* m) {
    for (int b = 0; b < B; ++b)
      for (int t = 0; t < keys; ++t) m[int64_t(b) * keys + t] = t < start[size_t(b)] + Tq ? 0.0f : kMasked;
  });
  Array x = Tq > 1 ? stack.embed(stack.kt.embed_tgt, tokens, true, w, start[0])
                   : stack.embed_rows(stack.kt.embed_tgt, tokens, w, start);
  IBuf positions = stack.row_positions(Tq * B, [&](int m) { return start[size_t(m / Tq)] + m % Tq; });
  halide_buffer_t* bias = stack.position_bias(w.decoder_position_bias);
  const bool per_row = stack.positions_in_attention() && B > 1;
  if (per_row && stack.iface) throw Error("the engine's relative position biases run on the CPU only (for now)");
  const bool bf16 = stack.self_cache_bf16();
  if (sources && Tq != 1) throw Error("internal: an encoder-decoder's prompt of several tokens in the engine");
  const Array source_mask = sources ? sources->mask(stack, B) : Array();
  for (size_t l = 0; l < w.decoder.size(); ++l) {
    const auto& L = w.decoder[l];
    Array& pool = cache.pool[l];
    View pool_view = pool.heads(hd);
    auto call = [&](View q, View m, IBuf& tbl, View out) {
      KernelTimer timer("paged_self_attention", stack.iface);
      check_kernel(stack.kt.paged_self_attention(q.raw(), pool_view.raw(), m.raw(), bias, tbl.raw_buffer(), out.raw()),
                   "paged_self_attention");
    };
    auto attend = [&](View q, int n_keys, View out) { call(q, view2(mask, 0, n_keys, B, keys), table, out); };
    const bool tail = last_row && Tq > 1 && l + 1 == w.decoder.size();
    Array ff_in = stack.parallel_input(x, L, tail);
    stack.residual_block(x, L.self_norm, [&](const Array& h, const Array& res, Array& y) {
      Array qkv(W, Tq, B, stack.iface, bf16), a(d, y.T, B, stack.iface);
      stack.qkv_projection(h.flat(), L, qkv.flat(), bf16, positions);
      for (int b = 0; b < B; ++b) {
        if (!write[size_t(b)]) continue;
        for (int i = 0; i < Tq; ++i) {
          const int p = start[size_t(b)] + i;
          const int64_t block = (*tables[size_t(b)])[size_t(p / BS)], row = (int64_t(b) * Tq + i) * W;
          if (!pool.head_major_hd)  // the keys and values follow the queries in a fused row
            stack.copy_elems(qkv, row + H * hd, pool, (block * BS + p % BS) * kv_row, kv_row);
          else  // a block's heads: [block][heads][BS][head_row]
            stack.store_positions(qkv, row, pool, block * pool.C * BS, p % BS, 1);
        }
      }
      if (y.T == 1 && Tq > 1) {
        // A prompt's last position (a device view must start aligned: copied out there).
        Array last = stack.iface ? stack.last_positions(qkv) : Array();
        View q = stack.iface ? view4(last, 0, hd, H, 1, 1, W, W) : view4(qkv, int64_t(Tq - 1) * W, hd, H, 1, 1, W, W);
        attend(q, keys, a.heads(hd));
      } else if (Tq == 1 && !per_row) {
        attend(view4(qkv, 0, hd, H, 1, B, W, W), keys, view4(a, 0, hd, H, 1, B, d, d));
      } else if (Tq == 1) {
        // Relative positions: a call places its query at its last key, so each row gets its
        // own call over its own keys (as a lone sequence's step is).
        for (int b = 0; b < B; ++b) {
          if (!write[size_t(b)]) continue;
          const int n = start[size_t(b)] + 1;
          IBuf row(table.data() + int64_t(b) * table.dim(1).stride(), table.dim(0).extent(), 1);
          call(view4(qkv, int64_t(b) * W, hd, H, 1, 1, W, W), view2(mask, int64_t(b) * keys, n, 1, keys), row,
               view4(a, int64_t(b) * d, hd, H, 1, 1, d, d));
        }
      } else {
        // A prompt's queries in causal chunks, as Stack::decoder_self_attention cuts them.
        const int len = start[0], chunk = stack.iface || !cfg.causal ? Tq : Stack::causal_chunk(len + Tq);
        for (int q0 = 0, q1; q0 < Tq; q0 = q1) {
          q1 = std::min(Tq, q0 + chunk);
          if (Tq - q1 == 1) q1 = Tq;
          attend(view4(qkv, int64_t(q0) * W, hd, H, q1 - q0, 1, W, int64_t(W) * Tq), len + q1,
                 view4(a, int64_t(q0) * d, hd, H, q1 - q0, 1, d, int64_t(d) * Tq));
        }
      }
      stack.linear_residual(stack.kt.attention_out, "attention_out", a.flat(), L.attn_out, res.flat(), y.flat());
    }, nullptr, tail);
    if (sources) sources->cross_block(stack, x, L, l, source_mask);
    stack.feed_forward(x, L, ff_in);
  }
  stack.final_norm(x, w.decoder_norm);
  return x;
}

}  // namespace halformer
