// Loading (load_weights): reads a safetensors file through the spec's naming preset
// (weight_presets.cpp) or by canonical name (a file save_weights wrote), widens F16 / BF16
// to fp32, checks every tensor (present, dtype, shape, finite; nothing unexpected) and
// reports all problems in one Error, and packs linears (weight_packing.cpp) and tables
// into the formats the kernels read. Also T5's relative position buckets, expanded at
// load into the attention kernels' table.
#include "halformer/weights.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <memory>
#include <set>
#include <sstream>

#include "halformer/error.h"
#include "halformer/packed_blocks.h"
#include "halformer/packed_layout.h"
#include "halformer/safetensors.h"
#include "weights_internal.h"

namespace halformer {

using weights_internal::HfFamily;
using weights_internal::hf_family;
using weights_internal::is_hf;
using weights_internal::LinearBuilder;
using weights_internal::preset_source;
using weights_internal::Source;
using weights_internal::str;

namespace {

// Floating-point dtypes a checkpoint may store (many Hugging Face files are F16 or BF16):
// widened to fp32 as they are read, exactly (every F16 and BF16 value is an fp32 value).
enum class FloatKind { None, F32, F16, BF16 };
FloatKind float_kind(const std::string& dtype) {
  if (dtype == "F32") return FloatKind::F32;
  if (dtype == "F16") return FloatKind::F16;
  if (dtype == "BF16") return FloatKind::BF16;
  return FloatKind::None;
}

float half_to_float(uint16_t h) {
  const uint32_t sign = uint32_t(h & 0x8000) << 16, exp = (h >> 10) & 0x1f, mant = h & 0x3ff;
  uint32_t bits;
  if (exp == 0x1f) {
    bits = sign | 0x7f800000u | (mant << 13);  // inf / nan
  } else if (exp != 0) {
    bits = sign | ((exp + 112) << 23) | (mant << 13);  // normal: rebias 15 -> 127
  } else {
    float f = std::ldexp(float(mant), -24);  // zero or subnormal: mant * 2^-24
    std::memcpy(&bits, &f, 4);
    bits |= sign;
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

// n values of `kind` at `src` (any alignment) -> fp32 at `dst`.
void to_f32(FloatKind kind, const uint8_t* src, size_t n, float* dst) {
  if (kind == FloatKind::F32) {
    std::memcpy(dst, src, n * sizeof(float));
    return;
  }
  for (size_t i = 0; i < n; ++i) {
    uint16_t v;
    std::memcpy(&v, src + 2 * i, 2);
    dst[i] = kind == FloatKind::BF16 ? from_bf16(v) : half_to_float(v);
  }
}

class Loader {
 public:
  Loader(const ModelConfig& c, const std::string& path, const WeightLayout& layout)
      : c_(c), file_(path), layout_(layout) {
    if (is_hf(c.preset)) {  // the base model's scope: the first prefix the file has the probe under
      const HfFamily& f = hf_family(c.preset);
      hf_prefix_ = f.prefixes.back();
      for (const auto& p : f.prefixes)
        if (file_.find(p + f.probe)) {
          hf_prefix_ = p;
          break;
        }
    }
    if (c.preset == WeightPreset::Explicit && c.weight_map)
      for (const char* const* kv = c.weight_map; *kv; kv += 2) map_[kv[0]] = kv[1];
    auto names = file_.metadata().find("halformer.names");
    canonical_ = names != file_.metadata().end() && names->second == "canonical";
  }

  Source resolve(const std::string& canonical) {
    if (canonical_) return {canonical};  // save_weights' file: no preset, no offsets
    Source s = resolve_name(canonical);
    if (canonical == "pos_embedding.weight" || canonical == "tgt_pos_embedding.weight")
      s.row_offset = c_.position_offset;
    return s;
  }

  // Calls row(r, data, cols) for each row r of the tensor for `canonical` with `shape`
  // (rows = shape[0], row-major floats, cols per row), then drops the tensor's pages of
  // the mapped file. Returns false, recording the problem, when the file does not have
  // it as expected.
  template <typename RowFn>
  bool read_rows(const std::string& canonical, std::vector<int64_t> shape, RowFn row) {
    Source src = resolve(canonical);
    size_t n = 1;
    for (int64_t d : shape) n *= static_cast<size_t>(d);
    const int64_t rows = shape.empty() ? 1 : shape[0];
    const size_t cols = n / size_t(std::max<int64_t>(rows, 1));
    std::vector<float> buf(cols);  // the file's floats need not be 4-byte aligned
    if (src.zeros) {
      for (int64_t r = 0; r < rows; ++r) row(int(r), buf.data(), cols);
      return true;
    }
    const int parts = src.part >= 0 ? 3 : 1;
    std::vector<int64_t> file_shape = shape;
    if (src.transposed && shape.size() == 2)
      file_shape = {shape[1], shape[0] * parts};
    else if (!file_shape.empty())
      file_shape[0] = file_shape[0] * parts + src.row_offset;
    if (src.one_row) file_shape.insert(file_shape.begin(), 1);
    const bool first_use = used_.insert(src.name).second;  // a packed tensor is read 3 times
    const TensorInfo* t = file_.find(src.name);
    // With an explicit map, say which canonical tensor the file name was mapped from.
    std::string label = c_.preset == WeightPreset::Explicit && src.name != canonical ? src.name + " (" + canonical + ")"
                                                                                : src.name;
    const FloatKind kind = t ? float_kind(t->dtype) : FloatKind::None;
    if (!first_use && (!t || kind == FloatKind::None || t->shape != file_shape)) return false;  // reported once
    if (!t) {
      missing_.push_back(label + " " + shape_str(file_shape));
      return false;
    }
    if (kind == FloatKind::None || t->shape != file_shape) {
      mismatched_.push_back(label + ": expected F32 (or F16 / BF16) " + shape_str(file_shape) + ", found " + t->dtype +
                            " " + shape_str(t->shape));
      return false;
    }
    const size_t esize = kind == FloatKind::F32 ? 4 : 2;
    bool finite = true;
    auto emit = [&](int64_t r) {
      for (float x : buf) finite = finite && std::isfinite(x);
      row(int(r), buf.data(), cols);
    };
    if (src.transposed && shape.size() == 2) {
      // [in, parts * out] in the file: output r of this part is column part * out + r.
      std::vector<float> all(size_t(t->numel()));
      to_f32(kind, t->data, all.size(), all.data());
      file_.release(t->data, all.size() * esize);
      const size_t width = size_t(file_shape[1]), first = size_t(std::max(src.part, 0)) * size_t(rows);
      for (int64_t r = 0; r < rows; ++r) {
        for (size_t i = 0; i < cols; ++i) buf[i] = all[i * width + first + size_t(r)];
        emit(r);
      }
    } else if (src.head_rows > 0) {  // rows gathered from the per-head blocks, the tensor released at the end
      const size_t hr = size_t(src.head_rows), row_bytes = cols * esize;
      for (int64_t r = 0; r < rows; ++r) {
        const size_t file_row = size_t(r) / hr * 3 * hr + size_t(src.part) * hr + size_t(r) % hr;
        to_f32(kind, t->data + file_row * row_bytes, cols, buf.data());
        emit(r);
      }
      if (src.part == 2) file_.release(t->data, t->bytes);
    } else {
      const size_t skip = (src.part >= 0 ? size_t(src.part) * n : 0) + size_t(src.row_offset) * cols;
      const uint8_t* data = t->data + skip * esize;
      const size_t row_bytes = cols * esize, chunk = size_t(4) << 20;
      size_t released = 0;  // bytes of the tensor whose pages were dropped
      for (int64_t r = 0; r < rows; ++r) {
        to_f32(kind, data + size_t(r) * row_bytes, cols, buf.data());
        emit(r);
        // Drop pages as the rows are consumed, so that even the largest tensor (an
        // embedding table) is never resident twice.
        const size_t done = size_t(r + 1) * row_bytes;
        if (done - released >= chunk) file_.release(data + released, done - released), released = done;
      }
      file_.release(data + released, n * esize - released);
    }
    if (!finite) nonfinite_.push_back(label);
    return true;
  }

  // The tensor for `canonical` with `shape` (row-major floats), or zeros and a recorded
  // problem.
  WeightVector<float> take(const std::string& canonical, std::vector<int64_t> shape) {
    size_t n = 1;
    for (int64_t d : shape) n *= static_cast<size_t>(d);
    WeightVector<float> v(n, 0.0f);
    read_rows(canonical, shape,
              [&](int r, const float* row, size_t cols) { std::copy_n(row, cols, v.data() + size_t(r) * cols); });
    return v;
  }

  // A file tensor that a tied spec reads under another name: accepted, not required.
  void alias(const std::string& canonical) { used_.insert(resolve(canonical).name); }
  void ignore(const std::string& file_name) { used_.insert(file_name); }
  // Tensors of a Hugging Face family's files that no spec reads (buffers), accepted.
  void ignore_family_buffers(int layers) {
    if (!is_hf(c_.preset)) return;
    for (const std::string& u : hf_family(c_.preset).unused) {
      const size_t at = u.find("{N}");
      if (at == std::string::npos) ignore(hf_prefix_ + u);
      for (int i = 0; i < layers && at != std::string::npos; ++i)
        ignore(hf_prefix_ + std::string(u).replace(at, 3, str(i)));
    }
  }

  // A linear's weight rows (torch layout [out][in], `rows` of them from output n0) into
  // `lb`: float rows from any file; I8 rows with their scales from a canonical file.
  void weight_rows(LinearBuilder& lb, const std::string& canonical, int n0, int rows) {
    const int in = lb.in();
    if (int8_rows(canonical, rows, in, lb.format() == Precision::Int8,
                  [&](int r, const int8_t* q, float scale) { lb.channel_int8(n0 + r, q, scale); }))
      return;
    for (Precision p : {Precision::Int4, Precision::Q8_0})
      if (block_rows(p, canonical, rows, in, lb.format() == p,
                     [&](int r, const uint8_t* blocks, const float* scales) { lb.channel_blocks(n0 + r, blocks, scales); }))
        return;
    read_rows(canonical, {rows, in}, [&](int r, const float* row, size_t) { lb.channel(n0 + r, row); });
  }
  // Linear with torch layout [out][in] -> the format and packed layout its kernel reads.
  LinearWeights linear(const std::string& prefix, int in, int out, Precision format) {
    return projections(prefix, {""}, in, {out}, format);
  }
  // Concatenation of several projections' outputs (outs[i] each, input d), e.g. Q | K | V
  // (K and V narrower with grouped-query attention); proj "" is `prefix` itself.
  LinearWeights projections(const std::string& prefix, const std::vector<std::string>& projs, int d,
                            const std::vector<int>& outs, Precision format) {
    int total = 0;
    for (int o : outs) total += o;
    LinearBuilder lb(d, total, format, layout_);
    WeightVector<float> bias;
    for (size_t i = 0, n0 = 0; i < projs.size(); n0 += size_t(outs[i]), ++i) {
      const std::string p = projs[i].empty() ? prefix : prefix + "." + projs[i];
      weight_rows(lb, p + ".weight", int(n0), outs[i]);
      WeightVector<float> b = take(p + ".bias", {outs[i]});
      bias.insert(bias.end(), b.begin(), b.end());
    }
    return lb.finish(std::move(bias));
  }
  // A token table [vocab][d] in `format`; with `shared`, also the output projection that
  // shares it (share_tgt_output), from the same rows.
  EmbeddingTable table(const std::string& canonical, int vocab, int d, Precision format, LinearBuilder* shared) {
    EmbeddingTable t;
    const bool int8 = format == Precision::Int8;
    const size_t stride = size_t(d) + kInt8RowScaleBytes;
    if (int8)
      t.q.assign(size_t(vocab) * stride, 0);
    else
      t.f.assign(size_t(vocab) * d, 0.0f);
    // From a canonical file's I8 rows: a table that is int8, and a projection whose
    // channels are the same quantized rows (int8), or those rows' values (else).
    std::vector<float> values(shared ? size_t(d) : 0);
    if (int8_rows(canonical, vocab, d, int8, [&](int r, const int8_t* q, float scale) {
          put_int8_table_row(t.q.data() + size_t(r) * stride, d, q, scale);
          if (shared && shared->format() == Precision::Int8) return shared->channel_int8(r, q, scale);
          for (int k = 0; shared && k < d; ++k) values[size_t(k)] = float(q[k]) * scale;
          if (shared) shared->channel(r, values.data());
        }))
      return t;
    std::vector<int8_t> q(int8 ? size_t(d) : 0);
    read_rows(canonical, {vocab, d}, [&](int r, const float* row, size_t) {
      if (!int8) {
        std::copy_n(row, d, t.f.data() + size_t(r) * d);
        if (shared) shared->channel(r, row);
        return;
      }
      const float scale = quantize_row_int8(row, d, q.data());
      put_int8_table_row(t.q.data() + size_t(r) * stride, d, q.data(), scale);
      if (!shared) return;
      if (shared->format() == Precision::Int8)
        shared->channel_int8(r, q.data(), scale);  // the same quantized row
      else
        shared->channel(r, row);
    });
    return t;
  }
  // RMSNorm: gamma only (offset + weight), beta zeros; else weight and bias. A canonical
  // file holds the gamma the kernel multiplies by (offset already added).
  // `scale` multiplies gamma (and beta) after the offset: generator_input_scale, folded
  // into the decoder's final norm; a canonical file holds the scaled values.
  NormWeights norm(const std::string& prefix, int d, double scale = 1.0) {
    NormWeights n{take(prefix + ".weight", {d}),
                  c_.rms_norm ? WeightVector<float>(size_t(d), 0.0f) : take(prefix + ".bias", {d})};
    if (canonical_) return n;
    for (float& g : n.gamma) g = float((double(g) + (c_.rms_norm ? c_.norm_weight_offset : 0.0)) * scale);
    if (scale != 1.0)
      for (float& b : n.beta) b = float(double(b) * scale);
    return n;
  }

  // The I8 rows [rows][cols] of a canonical file's tensor for `canonical` and its F32
  // "_scale" [rows], through row(r, q, scale). Returns false (nothing read) when the file
  // stores that tensor otherwise; records a problem when it is I8 but malformed or the
  // model does not read it as int8 (`accepted` false).
  template <typename RowFn>
  bool int8_rows(const std::string& canonical, int rows, int cols, bool accepted, RowFn row) {
    auto valid = [](float s) { return std::isfinite(s) && s >= 0.0f; };
    return quantized_rows(canonical, "I8", "int8", {rows, cols}, {rows}, accepted, valid, "finite and >= 0",
                          [&](int r, const uint8_t* q, const float* scale) {
                            row(r, reinterpret_cast<const int8_t*>(q), *scale);
                          });
  }
  // The block rows of a canonical file's tensor (halformer/packed_blocks.h), `p` int4 or
  // q8_0: int4 U8 [rows][blocks * 16], each block's 16 bytes in Q4_0's order; q8_0 I8
  // [rows][blocks][32], Q8_0's values; and the F32 "_scale" [rows][blocks], through
  // row(r, blocks, scales). As int8_rows otherwise; the scales may be negative (Q4_0), and
  // are fp16 values (the kernels keep them as fp16: packed_blocks.h).
  template <typename RowFn>
  bool block_rows(Precision p, const std::string& canonical, int rows, int cols, bool accepted, RowFn row) {
    const int64_t B = k_blocks(cols);
    auto valid = [](float s) { return std::isfinite(s) && fp16_exact(s); };
    if (p == Precision::Q8_0)
      return quantized_rows(canonical, "I8", "q8_0", {rows, B, kBlockK}, {rows, B}, accepted, valid,
                            "finite fp16 values", row);
    return quantized_rows(canonical, "U8", "int4", {rows, B * kInt4BlockBytes}, {rows, B}, accepted, valid,
                          "finite fp16 values", row);
  }
  // What int8_rows and block_rows share: the tensor `dtype` of `shape`'s rank (int8's I8
  // rows are 2-D, q8_0's 3-D) and its F32 "_scale" of scale_shape (one row per output
  // channel), each row through row(r, bytes, scales).
  template <typename RowFn>
  bool quantized_rows(const std::string& canonical, const char* dtype, const char* precision,
                      const std::vector<int64_t>& shape, const std::vector<int64_t>& scale_shape, bool accepted,
                      bool (*valid_scale)(float), const char* scale_rule, RowFn row) {
    const TensorInfo* t = canonical_ ? file_.find(canonical) : nullptr;
    if (!t || t->dtype != dtype || t->shape.size() != shape.size()) return false;
    used_.insert(canonical);
    const std::string scale_name = canonical + "_scale";
    const TensorInfo* s = file_.find(scale_name);
    used_.insert(scale_name);
    if (!accepted) {
      mismatched_.push_back(canonical + ": " + dtype + " (" + precision + ", quantized by halformer quantize or " +
                            "imported), but this model does not read it as " + precision +
                            ": quantize for this build's precision, or use the original weights");
      return true;
    }
    if (t->shape != shape) {
      mismatched_.push_back(canonical + ": expected " + dtype + " " + shape_str(shape) + ", found " + dtype + " " +
                            shape_str(t->shape));
      return true;
    }
    if (!s) {
      missing_.push_back(scale_name + " F32 " + shape_str(scale_shape) + " (the scales of the " + dtype + " " +
                         canonical + ")");
      return true;
    }
    if (s->dtype != "F32" || s->shape != scale_shape) {
      mismatched_.push_back(scale_name + ": expected F32 " + shape_str(scale_shape) + ", found " + s->dtype + " " +
                            shape_str(s->shape));
      return true;
    }
    const size_t per_row = scale_shape.size() > 1 ? size_t(scale_shape[1]) : 1;
    size_t row_bytes = 1;
    for (size_t i = 1; i < shape.size(); ++i) row_bytes *= size_t(shape[i]);
    std::vector<float> scales(per_row);
    bool valid = true;
    for (int64_t r = 0; r < shape[0]; ++r) {
      std::memcpy(scales.data(), s->data + size_t(r) * per_row * 4, per_row * 4);
      for (float v : scales) valid = valid && valid_scale(v);
      row(int(r), reinterpret_cast<const uint8_t*>(t->data) + size_t(r) * row_bytes, scales.data());
    }
    if (!valid) nonfinite_.push_back(scale_name + " (scales must be " + scale_rule + ")");
    file_.release(t->data, t->bytes);
    return true;
  }

  void check() const {
    std::vector<std::string> unexpected;
    for (const auto& [name, info] : file_.tensors())
      if (!used_.count(name)) unexpected.push_back(name + " " + shape_str(info.shape));
    if (missing_.empty() && mismatched_.empty() && unexpected.empty() && nonfinite_.empty()) return;
    std::ostringstream msg;
    msg << file_.path() << ": weights do not match the spec (naming preset " << c_.preset_name << ")";
    auto list = [&](const char* title, const std::vector<std::string>& items) {
      if (items.empty()) return;
      msg << "\n  " << title << " (" << items.size() << "):";
      for (size_t i = 0; i < items.size() && i < 20; ++i) msg << "\n    " << items[i];
      if (items.size() > 20) msg << "\n    ... and " << items.size() - 20 << " more";
    };
    list("missing", missing_);
    list("wrong dtype or shape", mismatched_);
    list("unexpected (not used by this spec)", unexpected);
    list("containing NaN or Inf", nonfinite_);
    throw Error(msg.str());
  }

  const SafetensorsFile& file() const { return file_; }

 private:
  static std::string shape_str(const std::vector<int64_t>& s) {
    std::string r = "[";
    for (size_t i = 0; i < s.size(); ++i) r += (i ? ", " : "") + std::to_string(s[i]);
    return r + "]";
  }
  Source resolve_name(const std::string& canonical) { return preset_source(c_, hf_prefix_, map_, canonical); }

  const ModelConfig& c_;
  SafetensorsFile file_;
  const WeightLayout layout_;  // fp32 / bf16 linears: the packed layout
  std::string hf_prefix_;
  std::map<std::string, std::string> map_;
  std::set<std::string> used_;
  std::vector<std::string> missing_, mismatched_, nonfinite_;
  bool canonical_ = false;  // a file written by save_weights
};

LayerWeights load_layer(Loader& ld, const ModelConfig& c, const std::string& stack, int i) {
  const int d = c.d_model;
  const Precision f = c.layer_weights;
  const std::string p = stack + "." + str(i) + ".";
  LayerWeights L;
  const int kvd = c.kv_heads * (d / c.heads);
  L.qkv = ld.projections(p + "self_attn", {"q", "k", "v"}, d, {d, kvd, kvd}, f);
  L.attn_out = ld.linear(p + "self_attn.o", d, d, f);
  if (stack == "decoder" && c.arch == Architecture::EncoderDecoder) {
    L.cross_q = ld.projections(p + "cross_attn", {"q"}, d, {d}, f);
    L.cross_kv = ld.projections(p + "cross_attn", {"k", "v"}, d, {d, d}, f);
    L.cross_out = ld.linear(p + "cross_attn.o", d, d, f);
    L.cross_norm = ld.norm(p + "cross_norm", d);
  }
  if (c.gated_ff) L.ff_gate = ld.linear(p + "ff_gate", d, c.d_ff, f);
  L.ff1 = ld.linear(p + "ff1", d, c.d_ff, f);
  L.ff2 = ld.linear(p + "ff2", c.d_ff, d, f);
  L.self_norm = ld.norm(p + "self_norm", d);
  L.ff_norm = ld.norm(p + "ff_norm", d);
  return L;
}

}  // namespace

Weights load_weights(const ModelConfig& c, const std::string& path, const WeightLayout& target_layout) {
  WeightLayout layout = target_layout;
  if (c.int16_activations) layout.int8_group = kInt8Pair;  // the kernels' form, not the target's
  Loader ld(c, path, layout);
  const int d = c.d_model;
  const bool enc = c.arch != Architecture::Decoder, dec = c.arch != Architecture::Encoder;
  Weights w;
  // The output projection that shares the target table is filled from its rows.
  std::unique_ptr<LinearBuilder> shared;
  if (dec && c.share_tgt_output) shared = std::make_unique<LinearBuilder>(d, c.tgt_vocab, c.generator_weights, layout);
  const Precision tf = c.embedding_weights;
  // The tables (and their norm) are e wide: d, except where an encoder-only model's
  // embedding.size differs (then a projection follows, ELECTRA-small).
  const int e = c.embedding_size;
  if (enc)
    w.src_embedding = ld.table("src_embedding.weight", c.src_vocab, e, tf, c.share_src_tgt ? shared.get() : nullptr);
  if (dec) {
    if (c.share_src_tgt)
      ld.alias("tgt_embedding.weight");  // tgt_table() is the source table
    else
      w.tgt_embedding = ld.table("tgt_embedding.weight", c.tgt_vocab, d, tf, shared.get());
  }
  const bool per_stack = is_hf(c.preset) && hf_family(c.preset).per_stack_embeddings;
  if (c.positions == Positions::Learned) {
    w.positions = ld.take("pos_embedding.weight", {c.max_len, e});
    if (per_stack && dec) w.tgt_positions = ld.take("tgt_pos_embedding.weight", {c.max_len, d});
  }
  if (c.type_vocab > 0) w.token_types = ld.take("type_embedding.weight", {c.type_vocab, e});
  if (c.embedding_norm) {
    w.embedding_norm = ld.norm("embedding_norm", e);
    if (per_stack && dec) w.tgt_embedding_norm = ld.norm("tgt_embedding_norm", d);
  }
  if (e != d) w.embed_project = ld.linear("embed_project", e, d, c.layer_weights);
  // Shared layers (ALBERT): the one set, encoder.0.*, that every layer runs with.
  const int encoder_sets = c.shared_layers ? 1 : c.encoder_layers;
  for (int i = 0; i < encoder_sets && enc; ++i) w.encoder.push_back(load_layer(ld, c, "encoder", i));
  for (int i = 0; i < c.decoder_layers && dec; ++i) w.decoder.push_back(load_layer(ld, c, "decoder", i));
  if (c.final_norm) {
    if (enc) w.encoder_norm = ld.norm("encoder_norm", d);
    if (dec) w.decoder_norm = ld.norm("decoder_norm", d, c.generator_input_scale);
  }
  if (c.positions == Positions::Relative) {
    auto stack = [&](const char* name, bool bidirectional, WeightVector<float>& bias, WeightVector<float>& table) {
      bias = ld.take(std::string(name) + "_relative_bias.weight", {c.relative_buckets, c.heads});
      table = relative_position_table(bias, c.heads, bidirectional, c.relative_buckets, c.relative_distance,
                                      relative_table_distance(c.relative_distance, c.max_len));
    };
    if (enc) stack("encoder", true, w.encoder_relative_bias, w.encoder_position_bias);
    // T5: bidirectional buckets where every key is visible, causal ones under a causal mask.
    if (dec) stack("decoder", !c.causal, w.decoder_relative_bias, w.decoder_position_bias);
  }
  if (dec) {
    if (shared) {
      w.generator = shared->finish(ld.take("generator.bias", {c.tgt_vocab}));
      ld.alias("generator.weight");
    } else {
      w.generator = ld.linear("generator", d, c.tgt_vocab, c.generator_weights);
    }
  }
  if (c.head == HeadKind::Classifier) {
    if (c.pooler) w.pooler = ld.linear("pooler", d, d, c.layer_weights);
    w.classifier = ld.linear("classifier", d, c.num_classes, c.layer_weights);
  } else if (is_hf(c.preset) && hf_family(c.preset).model.count("pooler")) {
    ld.alias("pooler.weight");  // BertModel always carries a pooler; only classifiers use it
    ld.alias("pooler.bias");
  }
  // Buffers that some presets' state_dicts carry: accepted, not used.
  ld.ignore("src_embed.1.pe");
  ld.ignore("tgt_embed.1.pe");
  ld.ignore_family_buffers(std::max(c.encoder_layers, c.decoder_layers));
  ld.check();
  return w;
}

int relative_position_bucket(int r, bool bidirectional, int buckets, int distance) {
  int bucket = 0;
  if (bidirectional) {
    buckets /= 2;
    if (r > 0) bucket += buckets;
    r = std::abs(r);
  } else {
    r = std::max(-r, 0);
  }
  const int exact = buckets / 2;
  if (r < exact) return bucket + r;
  // transformers: exact + (log(r / exact) / log(distance / exact) * (buckets - exact)).long(),
  // each step a float32 tensor op (the Python float divisor rounded to float32).
  const float ratio = std::log(float(r) / float(exact)) / float(std::log(double(distance) / double(exact)));
  const int large = exact + int(ratio * float(buckets - exact));
  return bucket + std::min(large, buckets - 1);
}

WeightVector<float> relative_position_table(const WeightVector<float>& bias, int heads, bool bidirectional,
                                            int buckets, int distance, int half) {
  const int width = 2 * half + 1;
  WeightVector<float> table(size_t(width) * heads);
  for (int r = -half; r <= half; ++r) {
    const int k = relative_position_bucket(r, bidirectional, buckets, distance);
    for (int h = 0; h < heads; ++h) table[size_t(h) * width + size_t(r + half)] = bias[size_t(k) * heads + h];
  }
  return table;
}

}  // namespace halformer
