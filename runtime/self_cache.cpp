// The decoder's self-attention cache (see DecoderState in stack.h): made for a call, views
// of its keys and values for the attention kernel, new rows stored into it, and rows
// reordered for beam search.
#include <cstring>
#include <string>

#include "halformer/kv_int8.h"
#include "halformer/packed_layout.h"
#include "stack.h"

namespace halformer {

DecoderState Stack::decoder_state(const Weights& w, int B, int Tmax, std::vector<int> shift) {
  DecoderState st;
  st.B = B, st.Tmax = Tmax;
  st.shift = shift.empty() ? std::vector<int>(B, 0) : std::move(shift);
  st.self_mask = make_input(Tmax, B, 1, [&](float* m) {
    for (int b = 0; b < B; ++b) std::fill_n(m + int64_t(b) * Tmax, st.shift[b], kMasked);
  });
  if (st.shifted() && positions_in_attention()) st.zero_mask = make_input(Tmax, 1, 1, [](float*) {});
  const int hd = cfg.d_model / cfg.heads, w3 = qkv_width();
  const bool int8 = self_cache_int8();
  st.row = iface ? int((w3 + kDeviceAlignFloats - 1) / kDeviceAlignFloats * kDeviceAlignFloats) : stored_kv_row();
  const double bytes = double(w.decoder.size()) * st.row * double(Tmax) * B * self_cache_elem_bytes();
  if (!iface)
    refuse_beyond_memory(bytes, "the key/value cache for " + std::to_string(B) + " sequence(s) of " +
                                    std::to_string(Tmax) + " positions",
                         "fewer sequences per call, or shorter prompts / --max-new-tokens");
  for (size_t l = 0; l < w.decoder.size(); ++l) {
    if (int8)
      st.cache.emplace_back(st.row, Tmax, B, Array::Int8Rows{});
    else
      st.cache.emplace_back(st.row, Tmax, B, iface, self_cache_bf16());
    if (!iface) st.cache.back().head_major_hd = hd;
  }
  return st;
}

View Stack::cache_keys(const DecoderState& st, size_t l, int b, int nb, int from, int n) {
  const Array& c = st.cache[l];
  const int hd = cfg.d_model / cfg.heads;
  const int64_t at = int64_t(b) * st.b_stride();
  if (!c.head_major_hd)
    return view4(c, at + int64_t(from) * st.row, hd, qkv_width() / hd, n, nb, st.row, st.b_stride());
  return head_major_keys(c, at + int64_t(from) * c.head_row(), n, nb);
}

View Stack::head_major_keys(const Array& c, int64_t at, int n, int nb) {
  // Head slots [heads, heads + 2 * kv_heads) of the kernel's view are the array's [0, 2 * kv_heads).
  const int r = c.head_row();
  halide_dimension_t dims[4] = {{0, r, 1},
                                {cfg.heads, c.C / r, int32_t(int64_t(c.T) * r)},
                                {0, n, r},
                                {0, nb, int32_t(int64_t(c.C) * c.T)}};
  return make_view(c, at, 4, dims);
}

Array Stack::int8_keys(const Array& qkv) {
  Array c(stored_kv_row(), qkv.T, qkv.B, Array::Int8Rows{});
  c.head_major_hd = cfg.d_model / cfg.heads;
  for (int b = 0; b < qkv.B; ++b) store_positions(qkv, int64_t(b) * qkv.T * qkv.C, c, int64_t(b) * c.C * c.T, 0, qkv.T);
  return c;
}

void Stack::cache_store(DecoderState& st, size_t l, const Array& rows, int64_t at, int b, int pos, int T) {
  Array& c = st.cache[l];
  const int64_t base = int64_t(b) * st.b_stride();
  if (!c.head_major_hd) return copy_rows(rows, at, rows.C, c, base + int64_t(pos) * st.row, st.row, qkv_width(), T);
  store_positions(rows, at, c, base, pos, T);
}

void Stack::store_positions(const Array& rows, int64_t at, Array& c, int64_t base, int pos, int T) {
  const int hd = c.head_major_hd, r = c.head_row();
  for (int s = 0; s < c.C / r; ++s)  // the key and value heads follow the queries in a fused row
    store_heads(rows, at + cfg.d_model + int64_t(s) * hd, c, base + (int64_t(s) * c.T + pos) * r, hd, T);
}

void Stack::store_heads(const Array& rows, int64_t from, Array& cache, int64_t to, int hd, int n) {
  if (!cache.int8) return copy_rows(rows, from, rows.C, cache, to, hd, hd, n);
  const int r = cache.head_row();
  const uint16_t* bits = rows.bf16 ? rows.bits() + from : nullptr;
  const float* floats = rows.bf16 ? nullptr : rows.host() + from;
  int8_t* first = cache.bytes() + to;
  for (int t = 0; t < n; ++t) {
    const int64_t at = int64_t(t) * rows.C;
    int8_t* row = first + int64_t(t) * r;
    if (bits)
      quantize_kv_row(hd, [&](int f) { return from_bf16(bits[at + f]); }, row);
    else
      quantize_kv_row(hd, [&](int f) { return floats[at + f]; }, row);
  }
}

// Beam search: row b continues from row parent[b].
void Stack::reorder(DecoderState& st, const std::vector<int>& parent) {
  bool moved = false;
  for (int b = 0; b < st.B; ++b) moved |= parent[b] != b;
  if (!moved) return;
  const int64_t bstride = st.b_stride();
  // A row's used positions: one run on a device (fused rows), a run per head on the CPU.
  const int head_row = st.apart() ? st.cache[0].head_row() : 0, runs = head_row ? st.row / head_row : 1;
  const int64_t run = int64_t(st.len) * (head_row ? head_row : st.row), gap = int64_t(st.Tmax) * head_row;
  for (auto& c : st.cache) {
    if (!iface) {
      // The used positions of every parent row, set aside once, then copied into the rows
      // that change (a copy of the whole cache per layer and step, allocated afresh, was
      // most of a beam step's host time).
      const size_t elem = c.elem_bytes(), piece = size_t(run) * elem, used = piece * runs;
      uint8_t* data = c.host_bytes();
      auto at = [&](int b, int r) { return data + size_t(b * bstride + r * gap) * elem; };
      st.reorder_scratch.resize(size_t(st.B) * used);
      uint8_t* scratch = st.reorder_scratch.data();
      for (int b = 0; b < st.B; ++b)
        if (parent[b] != b)
          for (int r = 0; r < runs; ++r) std::memcpy(scratch + parent[b] * used + r * piece, at(parent[b], r), piece);
      for (int b = 0; b < st.B; ++b)
        if (parent[b] != b)
          for (int r = 0; r < runs; ++r) std::memcpy(at(b, r), scratch + parent[b] * used + r * piece, piece);
      continue;
    }
    // Device: gather the rows into a fresh cache, device to device.
    Array fresh(c.C, c.T, c.B, iface);
    for (int b = 0; b < st.B; ++b) copy_elems(c, parent[b] * bstride, fresh, b * bstride, run);
    c = std::move(fresh);
  }
}

}  // namespace halformer
