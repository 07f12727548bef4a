// `halformer import MODEL.gguf` (importer.h): a Llama-architecture GGUF file (llama,
// qwen2) -> a spec and a weights file under halformer's canonical names (docs/import.md,
// "GGUF files").
//
// Design: as import_directory, every problem is collected and reported at once, and
// nothing is written until the metadata and every tensor's name, type and shape have been
// checked; the weights are then streamed out a few rows at a time (a 7B file never sits
// in memory as floats) into a temporary file renamed at the end. Rotary: llama.cpp's
// converter (convert_hf_to_gguf.py, LlamaModel.permute) reorders each head's attn_q /
// attn_k rows so that ggml's "normal" rope rotates adjacent pairs (2c, 2c + 1); a llama
// file is therefore `rotary_layout: interleaved` with its rows used as they are. qwen2 is
// not permuted (ggml's NEOX rope: `half`). Q4_0 layer linears are kept as their blocks
// when every one is Q4_0 (halformer's int4 is Q4_0, packed_int4.h); everything else is
// widened (F16, BF16) or dequantized to F32.
#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>

#include "gguf_file.h"
#include "import_internal.h"
#include "importer.h"

namespace halformer::import {
using namespace detail;

namespace {

// Positions the spec gets at most: the file's context_length can be 128k, and a build
// plans its buffers for max_len. The spec's comment says how to raise it.
constexpr int64_t kMaxLenCap = 4096;

struct ArchInfo {
  const char* name;
  const char* preset;  // the spec's naming preset (a canonical file is read by canonical names whatever it says)
  const char *layout, *layout_note;
  bool qkv_bias;  // q/k/v biases required (qwen2); llama's biases are optional
};
const ArchInfo kArchs[] = {
    {"llama", "huggingface-llama", "interleaved",
     "ggml's normal rope, pairs (2c, 2c + 1): the converter permuted attn_q / attn_k rows for it", false},
    {"qwen2", "huggingface-qwen2", "half", "ggml's NEOX rope: pairs (c, c + head size / 2)", true},
};

std::string q(const std::string& s) {  // text from the file, for messages
  std::string out = "'";
  for (size_t i = 0; i < s.size() && i < 120; ++i) out += std::isprint(static_cast<unsigned char>(s[i])) ? s[i] : '?';
  return out + (s.size() > 120 ? "...'" : "'");
}
std::string dims_str(const std::vector<int64_t>& d) {
  std::string s = "[";
  for (size_t i = 0; i < d.size(); ++i) s += (i ? ", " : "") + std::to_string(d[i]);
  return s + "]";
}
bool exact_float(GgmlType t) { return t == GgmlType::F32 || t == GgmlType::F16 || t == GgmlType::BF16; }

// Typed metadata reads that record a problem ("FILE: key 'K': ...") instead of throwing,
// and remember which keys were looked at.
class Meta {
 public:
  Meta(const GgufFile& f, Problems& p) : f_(f), p_(p) {}
  std::set<std::string> seen;
  void problem(const std::string& key, const std::string& msg) { p_.add(f_.path(), "key " + q(key), msg); }
  void refuse(const std::string& key, const std::string& why) { problem(key, "found " + f_.show(key) + "; " + why); }
  std::optional<int64_t> integer(const std::string& key, std::optional<int64_t> fallback, int64_t lo = 1,
                                 int64_t hi = INT32_MAX) {
    return get<int64_t>(key, fallback, "an integer", [&]() -> std::optional<int64_t> {
      const int64_t v = f_.int_value(key);
      if (v >= lo && v <= hi) return v;
      refuse(key, "must be between " + std::to_string(lo) + " and " + std::to_string(hi));
      return std::nullopt;
    });
  }
  std::optional<double> number(const std::string& key, std::optional<double> fallback) {
    return get<double>(key, fallback, "a number", [&] { return f_.float_value(key); });
  }
  std::optional<std::string> text(const std::string& key) {
    return get<std::string>(key, std::nullopt, nullptr, [&] { return f_.string_value(key); });
  }

 private:
  // read() for a key that is there (a wrong type: a problem), else `fallback` (none and
  // `what` given: a problem, "required").
  template <class T, class F>
  std::optional<T> get(const std::string& key, std::optional<T> fallback, const char* what, F read) {
    seen.insert(key);
    if (!f_.has(key)) {
      if (!fallback && what) problem(key, std::string("missing (required: ") + what + ")");
      return fallback;
    }
    try {
      return read();
    } catch (const GgufError& e) {
      p_.list.push_back(e.what());
    }
    return std::nullopt;
  }
  const GgufFile& f_;
  Problems& p_;
};

// One tensor the model reads: the file's (nullptr: zeros, a bias the file lacks), its
// canonical name and its shape in torch's order ([out, in] / [n]).
enum class Role { Table, Norm, Linear, LayerLinear, Bias };
struct Want {
  std::string gguf, canonical;
  std::vector<int64_t> shape;
  Role role;
  const TensorInfo* t = nullptr;
};
// One tensor of the weights file. Q4_0's blocks in a GGUF file: fp16 d, then 16 bytes of
// nibbles for 32 weights (halformer's int4 keeps the 16 bytes, and d as an F32 scale).
constexpr int64_t kQ4Weights = 32, kQ4Bytes = 18, kQ4Nibbles = 16;
enum class Kind { Floats, Zeros, Q4Blocks, Q4Scales };
struct Part {
  std::string name;
  Kind kind;
  std::vector<int64_t> shape;
  const TensorInfo* src;
  uint64_t bytes() const {
    uint64_t n = 1;
    for (int64_t d : shape) n *= uint64_t(d);
    return kind == Kind::Q4Blocks ? n : 4 * n;
  }
};

// "0-21" / "0-3,5": sorted layer numbers as ranges.
std::string ranges(std::vector<int> v) {
  std::sort(v.begin(), v.end());
  std::string s;
  for (size_t i = 0; i < v.size();) {
    size_t j = i;
    while (j + 1 < v.size() && v[j + 1] == v[j] + 1) ++j;
    s += (s.empty() ? "" : ",") + std::to_string(v[i]) + (j > i ? "-" + std::to_string(v[j]) : "");
    i = j + 1;
  }
  return s;
}
// "Q6_K output.weight; Q8_0 blk.0-21.{attn_q.weight,ffn_down.weight}": names grouped by type
// and by the layers they repeat in.
std::string grouped(const std::vector<const TensorInfo*>& ts) {
  std::map<std::string, std::map<std::string, std::vector<int>>> by_type;  // type -> rest -> layers
  for (const TensorInfo* t : ts) {
    int layer = -1;
    std::string rest = t->name;
    if (t->name.rfind("blk.", 0) == 0) {
      const size_t dot = t->name.find('.', 4);
      layer = std::stoi(t->name.substr(4, dot - 4));
      rest = t->name.substr(dot + 1);
    }
    by_type[type_name(t->type)][rest].push_back(layer);
  }
  std::string out;
  for (const auto& [type, rests] : by_type) {
    std::map<std::string, std::vector<std::string>> by_layers;  // "0-21" -> rests ("" for none)
    for (const auto& [rest, layers] : rests) by_layers[layers[0] < 0 ? "" : ranges(layers)].push_back(rest);
    out += (out.empty() ? "" : "; ") + type + " ";
    std::string names;
    for (const auto& [r, rs] : by_layers) {
      std::string list;
      for (const auto& x : rs) list += (list.empty() ? "" : ",") + x;
      if (!r.empty()) list = "blk." + r + "." + (rs.size() > 1 ? "{" + list + "}" : list);
      names += (names.empty() ? "" : ", ") + list;
    }
    out += names;
  }
  return out;
}

// The shortest decimal that reads back as the same float32 (1e-05 for the float32 of 1e-5).
double float32_decimal(double v) {
  for (int p = 1; p <= 9; ++p) {
    char buf[40];
    std::snprintf(buf, sizeof buf, "%.*g", p, v);
    const double x = std::strtod(buf, nullptr);
    if (float(x) == float(v)) return x;
  }
  return v;
}

// The weights file: a safetensors header computed up front, then every part streamed.
void write_weights(const GgufFile& f, const std::vector<Part>& parts, const std::string& path,
                   const std::map<std::string, std::string>& metadata) {
  json header = json::object();
  header["__metadata__"] = metadata;
  uint64_t offset = 0;
  for (const Part& p : parts) {
    header[p.name] = {{"dtype", p.kind == Kind::Q4Blocks ? "U8" : "F32"},
                      {"shape", p.shape},
                      {"data_offsets", {offset, offset + p.bytes()}}};
    offset += p.bytes();
  }
  std::string h = header.dump();
  while ((h.size() + 8) % 8) h.push_back(' ');  // the data section 8-byte aligned, as write_safetensors
  const std::string tmp = path + ".tmp-import";
  std::ofstream o(tmp, std::ios::binary | std::ios::trunc);
  auto fail = [&](const std::string& what) {
    o.close();
    std::remove(tmp.c_str());
    throw ImportError({what});
  };
  if (!o) fail(path + ": cannot write: " + std::strerror(errno));
  uint8_t len[8];
  for (int i = 0; i < 8; ++i) len[i] = uint8_t(uint64_t(h.size()) >> (8 * i));
  o.write(reinterpret_cast<const char*>(len), 8).write(h.data(), std::streamsize(h.size()));
  std::vector<float> buf;
  std::vector<uint8_t> bytes;
  // buf's n floats out, rows from row0 of `per_row` each; NaN and Inf refused.
  auto floats = [&](size_t n, const TensorInfo* t, int64_t row0, int64_t per_row) {
    for (size_t i = 0; i < n; ++i)
      if (!std::isfinite(buf[i]))
        fail(f.path() + ": tensor " + q(t->name) + ": row " + std::to_string(row0 + int64_t(i) / per_row) +
             " holds NaN or Inf" + (per_row == t->row_length() ? "" : " (a Q4_0 block scale)"));
    o.write(reinterpret_cast<const char*>(buf.data()), std::streamsize(n * 4));
  };
  for (const Part& p : parts) {
    const TensorInfo* t = p.src;
    if (p.kind == Kind::Zeros) {
      buf.assign(p.bytes() / 4, 0.0f);
      o.write(reinterpret_cast<const char*>(buf.data()), std::streamsize(p.bytes()));
    } else if (p.kind == Kind::Floats) {  // ~1 MB of rows at a time
      const int64_t chunk = std::max<int64_t>(1, (int64_t(1) << 18) / t->row_length());
      for (int64_t r = 0; r < t->rows(); r += chunk) {
        const int64_t n = std::min(chunk, t->rows() - r);
        buf.resize(size_t(n * t->row_length()));
        f.dequantize_rows(*t, r, n, buf.data());
        floats(buf.size(), t, r, t->row_length());
      }
    } else {
      const int64_t blocks = t->row_length() / kQ4Weights;
      for (int64_t r = 0; r < t->rows(); ++r) {
        const uint8_t* row = f.row_data(*t, r);
        if (p.kind == Kind::Q4Blocks) {
          bytes.resize(size_t(blocks * kQ4Nibbles));
          for (int64_t b = 0; b < blocks; ++b)
            std::memcpy(&bytes[size_t(b * kQ4Nibbles)], row + b * kQ4Bytes + 2, kQ4Nibbles);
          o.write(reinterpret_cast<const char*>(bytes.data()), std::streamsize(bytes.size()));
        } else {
          buf.resize(size_t(blocks));
          for (int64_t b = 0; b < blocks; ++b)
            buf[size_t(b)] = half_to_float(uint16_t(row[b * kQ4Bytes] | row[b * kQ4Bytes + 1] << 8));
          floats(buf.size(), t, r, blocks);
        }
      }
    }
    if (!o) fail(path + ": write failed: " + std::strerror(errno));
  }
  o.close();
  if (!o || std::rename(tmp.c_str(), path.c_str()) != 0) fail(path + ": write failed: " + std::strerror(errno));
}

}  // namespace

bool is_gguf(const std::string& path) {
  std::string lower = path;
  for (char& c : lower) c = char(std::tolower(static_cast<unsigned char>(c)));
  if (lower.size() >= 5 && lower.compare(lower.size() - 5, 5, ".gguf") == 0) return true;
  std::error_code ec;
  if (!fs::is_regular_file(path, ec)) return false;
  char magic[4] = {};
  std::ifstream in(path, std::ios::binary);
  return in.read(magic, 4) && std::memcmp(magic, "GGUF", 4) == 0;
}

Imported import_gguf(const std::string& path, const std::string& name, const std::string& weights_out) {
  std::shared_ptr<GgufFile> file;
  try {
    file = std::make_shared<GgufFile>(path);
  } catch (const GgufError& e) {
    throw ImportError({e.what()});
  }
  const GgufFile& f = *file;
  Problems pr;
  Meta meta(f, pr);
  Imported out;
  out.inputs = {path};

  // ---- the architecture
  std::string supported;
  for (const auto& a : kArchs) supported += (supported.empty() ? "" : ", ") + std::string(a.name);
  supported += " (llama covers Llama 1-2, Mistral 7B, TinyLlama, CodeLlama ...)";
  const auto arch_name = meta.text("general.architecture");
  const ArchInfo* ai = nullptr;
  for (const auto& a : kArchs)
    if (arch_name && *arch_name == a.name) ai = &a;
  if (!f.has("general.architecture")) meta.problem("general.architecture", "missing; supported: " + supported);
  if (!ai && arch_name) meta.refuse("general.architecture", "supported: " + supported);
  if (!ai) throw ImportError(pr.list);
  const std::string arch = ai->name;
  auto k = [&](const char* s) { return arch + "." + s; };

  // ---- hyperparameters
  const int64_t max_layers = int64_t(f.tensors().size());  // each layer has 9 tensors: bounds the checks below
  const auto d = meta.integer(k("embedding_length"), std::nullopt),
             layers = meta.integer(k("block_count"), std::nullopt, 1, max_layers);
  const auto ff = meta.integer(k("feed_forward_length"), std::nullopt),
             h = meta.integer(k("attention.head_count"), std::nullopt);
  const auto kvh = meta.integer(k("attention.head_count_kv"), h ? h : std::optional<int64_t>(1));
  const auto eps = meta.number(k("attention.layer_norm_rms_epsilon"), std::nullopt);
  const auto theta = meta.number(k("rope.freq_base"), 10000.0);
  const auto ctx = meta.integer(k("context_length"), std::nullopt, 1, INT64_MAX);
  const int64_t hd = d && h && *d % *h == 0 ? *d / *h : 0;
  if (d && h && *d % *h != 0)
    meta.refuse(k("embedding_length"), "not divisible by the head count " + std::to_string(*h));
  if (h && kvh && *h % *kvh != 0)
    meta.refuse(k("attention.head_count_kv"), "does not divide the head count " + std::to_string(*h));
  if (hd % 2)
    meta.problem(k("attention.head_count"),
                 "head size " + std::to_string(hd) + " is odd: rotary positions rotate pairs");
  for (const char* key : {"rope.dimension_count", "attention.key_length", "attention.value_length"})
    if (auto v = meta.integer(k(key), hd); v && hd && *v != hd)
      meta.refuse(k(key),
                  "differs from the head size " + std::to_string(hd) +
                      " (embedding_length / head_count): partial rotary or other head widths are not supported");
  if (eps && !(*eps > 0)) meta.refuse(k("attention.layer_norm_rms_epsilon"), "must be > 0");
  if (theta && !(*theta > 1)) meta.refuse(k("rope.freq_base"), "must be > 1");
  // Scaled rotary positions (linear, YaRN, llama3's rope_freqs) change every angle.
  const auto scaling = meta.text(k("rope.scaling.type"));
  if (scaling && *scaling != "none" && *scaling != "linear")
    meta.refuse(k("rope.scaling.type"), "scaled rotary positions are not supported (none only)");
  for (const char* key : {"rope.scaling.factor", "rope.scale_linear"})
    if (auto v = meta.number(k(key), 1.0); v && *v != 1.0 && *v != 0.0)
      meta.refuse(k(key), "scaled rotary positions are not supported (1 only)");
  for (const char* key : {"expert_count", "expert_used_count"})
    if (auto v = meta.integer(k(key), 0, 0); v && *v > 0)
      meta.refuse(k(key), "a mixture of experts (Mixtral-style) is not supported");
  for (const char* key : {"tensor_data_layout", "rope.scaling.original_context_length", "rope.scaling.finetuned"})
    meta.seen.insert(k(key));  // do not change what the file computes
  if (auto parts = meta.integer("split.count", 1, 0); parts && *parts > 1)
    meta.refuse("split.count", "a model split over several files: merge them first (llama-gguf-split --merge)");

  // ---- the vocabulary: vocab_size, else the token table's rows
  const TensorInfo* embd = f.find("token_embd.weight");
  std::optional<int64_t> vocab;
  if (f.has(k("vocab_size")))
    vocab = meta.integer(k("vocab_size"), std::nullopt);
  else if (embd && embd->dims.size() == 2)
    vocab = embd->dims[1];
  else if (embd)
    pr.add(path, "tensor 'token_embd.weight'",
           "dims " + dims_str(embd->dims) + ": expected [embedding_length, vocabulary]");
  else
    pr.add(path, "tensor 'token_embd.weight'", "missing (the token embedding table)");
  if (vocab && f.has("tokenizer.ggml.tokens")) {
    try {
      if (int64_t(f.array_size("tokenizer.ggml.tokens")) != *vocab)
        meta.problem("tokenizer.ggml.tokens", std::to_string(f.array_size("tokenizer.ggml.tokens")) +
                                                  " tokens for a vocabulary of " + std::to_string(*vocab));
    } catch (const GgufError& e) {
      pr.list.push_back(e.what());
    }
  }
  std::map<std::string, int64_t> ids;
  for (const char* key : {"bos_token_id", "eos_token_id", "padding_token_id"}) {
    const std::string full = std::string("tokenizer.ggml.") + key;
    const bool pad = std::string(key) == "padding_token_id";
    if (pad && !f.has(full)) continue;
    if (auto v = meta.integer(full, std::nullopt, 0); v && vocab && *v >= *vocab)
      meta.refuse(full, "token id is not < the vocabulary " + std::to_string(*vocab));
    else if (v)
      ids[key] = *v;
  }
  meta.seen.insert(k("vocab_size"));
  for (const auto& key : f.keys())
    if (key.rfind(arch + ".", 0) == 0 && !meta.seen.count(key))
      meta.problem(key, "found " + f.show(key) + "; this key is not known to halformer import (it may change the " +
                            "model); docs/import.md lists the keys it reads");
  if (!d || !layers || !ff || !h || !kvh || !eps || !theta || !ctx || !vocab || !pr.list.empty())
    throw ImportError(pr.list);

  // ---- the tensors: names, shapes (torch order; GGUF lists them row length first), types
  const int64_t kvd = *kvh * hd;
  std::vector<Want> wants;
  std::set<std::string> known;
  auto want = [&](const std::string& gguf, const std::string& canonical, std::vector<int64_t> shape, Role role,
                  bool required, const std::string& from) {
    known.insert(gguf);
    Want w{gguf, canonical, shape, role, f.find(gguf)};
    const std::string where = "tensor " + q(gguf);
    if (!w.t) {
      if (required)
        pr.add(path, where, "missing (expected " + dims_str({shape.rbegin(), shape.rend()}) + ", GGUF order)");
    } else if (std::vector<int64_t>(w.t->dims.rbegin(), w.t->dims.rend()) != shape) {
      pr.add(path, where,
             "dims " + dims_str(w.t->dims) + " disagree with the metadata: expected " +
                 dims_str({shape.rbegin(), shape.rend()}) + " (GGUF order, row length first: " + from + ")");
    } else if (!can_dequantize(w.t->type) || (w.t->type >= GgmlType::I8 && w.t->type <= GgmlType::I64)) {
      pr.add(path, where,
             std::string("type ") + type_name(w.t->type) + " is not read by halformer import (F32, F16, BF16, " +
                 "Q4_0 as they are; Q4_1, Q5_0, Q5_1, Q8_0 and the K-quants dequantized)");
    }
    wants.push_back(w);
  };
  const std::string sd = std::to_string(*d), sv = std::to_string(*vocab), sff = std::to_string(*ff);
  const std::string e_from = k("embedding_length") + " " + sd,
                    kv_from = std::to_string(*kvh) + " key/value heads of " + std::to_string(hd) + ", " + e_from;
  want("token_embd.weight", "tgt_embedding.weight", {*vocab, *d}, Role::Table, true, e_from + ", vocabulary " + sv);
  for (int64_t i = 0; i < *layers; ++i) {
    const std::string b = "blk." + std::to_string(i) + ".", c = "decoder." + std::to_string(i) + ".";
    want(b + "attn_norm.weight", c + "self_norm.weight", {*d}, Role::Norm, true, e_from);
    const std::vector<std::tuple<std::string, std::string, int64_t, int64_t, std::string>> linears = {
        {"attn_q", "self_attn.q", *d, *d, e_from},
        {"attn_k", "self_attn.k", kvd, *d, kv_from},
        {"attn_v", "self_attn.v", kvd, *d, kv_from},
        {"attn_output", "self_attn.o", *d, *d, e_from},
        {"ffn_gate", "ff_gate", *ff, *d, k("feed_forward_length") + " " + sff + ", " + e_from},
        {"ffn_up", "ff1", *ff, *d, k("feed_forward_length") + " " + sff + ", " + e_from},
        {"ffn_down", "ff2", *d, *ff, e_from + ", " + k("feed_forward_length") + " " + sff}};
    for (const auto& [g, cn, rows, cols, from] : linears) {
      want(b + g + ".weight", c + cn + ".weight", {rows, cols}, Role::LayerLinear, true, from);
      const bool qkv = g == "attn_q" || g == "attn_k" || g == "attn_v";
      if (qkv || !ai->qkv_bias)  // llama: every bias optional; qwen2: q/k/v biases, no others
        want(b + g + ".bias", c + cn + ".bias", {rows}, Role::Bias, ai->qkv_bias, from);
      else
        wants.push_back({"", c + cn + ".bias", {rows}, Role::Bias, nullptr});  // zeros
    }
    want(b + "ffn_norm.weight", c + "ff_norm.weight", {*d}, Role::Norm, true, e_from);
  }
  want("output_norm.weight", "decoder_norm.weight", {*d}, Role::Norm, true, e_from);
  const bool tied = !f.find("output.weight");
  if (!tied) want("output.weight", "generator.weight", {*vocab, *d}, Role::Linear, true, e_from + ", vocabulary " + sv);
  wants.push_back({"", "generator.bias", {*vocab}, Role::Bias, nullptr});  // the spec's output bias: zeros
  for (const auto& t : f.tensors()) {
    if (known.count(t.name)) continue;
    if (t.name == "rope_freqs.weight" || t.name.find(".rope_freqs.") != std::string::npos)
      pr.add(path, "tensor " + q(t.name), "scaled rotary frequencies (Llama 3.1's rope scaling) are not supported");
    else
      pr.add(path, "tensor " + q(t.name),
             "not part of the " + arch + " architecture as halformer imports it (it may change the model; " +
                 std::to_string(*layers) + " layers by block_count)");
  }
  if (!pr.list.empty()) throw ImportError(pr.list);

  // ---- what is kept, what is dequantized
  bool int4 = true;
  bool quantized_layers = false;  // any layer linear not F32 / F16 / BF16
  std::vector<const TensorInfo*> dequantized;
  for (const Want& w : wants)
    if (w.role == Role::LayerLinear) int4 = int4 && w.t->type == GgmlType::Q4_0;
  std::vector<Part> parts;
  for (const Want& w : wants) {
    if (!w.t) {
      parts.push_back({w.canonical, Kind::Zeros, w.shape, nullptr});
    } else if (w.role == Role::LayerLinear && int4) {
      const int64_t blocks = w.shape[1] / kQ4Weights;
      parts.push_back({w.canonical, Kind::Q4Blocks, {w.shape[0], blocks * kQ4Nibbles}, w.t});
      parts.push_back({w.canonical + "_scale", Kind::Q4Scales, {w.shape[0], blocks}, w.t});
    } else {
      parts.push_back({w.canonical, Kind::Floats, w.shape, w.t});
      if (!exact_float(w.t->type)) dequantized.push_back(w.t);
    }
    quantized_layers = quantized_layers || (w.role == Role::LayerLinear && !exact_float(w.t->type));
  }
  if (!dequantized.empty())
    out.notes.push_back("dequantized to F32 (halformer keeps Q4_0 layer linears as they are, when all are Q4_0): " +
                        grouped(dequantized));

  // ---- the spec
  Model m;
  m.family = arch, m.preset = ai->preset, m.architecture = "decoder", m.d_model = *d, m.vocab = *vocab;
  m.set("sizes", "d_model", *d, k("embedding_length"));
  m.set("sizes", "heads", *h, k("attention.head_count") + " (head size " + std::to_string(hd) + ")");
  m.set("sizes", "kv_heads", *kvh,
        f.has(k("attention.head_count_kv")) ? k("attention.head_count_kv") : "one per query head");
  m.set("sizes", "d_ff", *ff, k("feed_forward_length"));
  m.set("sizes", "decoder_layers", *layers, k("block_count"));
  m.set("sizes", "tgt_vocab", *vocab, f.has(k("vocab_size")) ? k("vocab_size") : "token_embd.weight's rows");
  if (*ctx > kMaxLenCap)
    m.set("sizes", "max_len", kMaxLenCap,
          k("context_length") + " " + std::to_string(*ctx) + ", capped so that builds plan small buffers: raise it " +
              "(up to " + std::to_string(*ctx) + ") for longer text");
  else
    m.set("sizes", "max_len", *ctx, k("context_length") + ": prompt + generated tokens");
  m.set("layer", "norm_placement", "pre", "x + sublayer(rmsnorm(x))");
  m.set("layer", "norm_kind", "rms", "attn_norm, ffn_norm");
  m.set("layer", "norm_eps", format_float_literal(float32_decimal(*eps)), k("attention.layer_norm_rms_epsilon"));
  m.set("layer", "final_norm", "true", "output_norm");
  m.set("layer", "activation", "swiglu", "silu(ffn_gate x) * ffn_up x");
  m.set("embedding", "positions", "rotary", "rotary embedding of q and k in every layer");
  m.set("embedding", "rotary_theta", format_float_literal(float32_decimal(*theta)),
        f.has(k("rope.freq_base")) ? k("rope.freq_base") : "no rope.freq_base: 10000");
  m.set("embedding", "rotary_layout", ai->layout, ai->layout_note);
  m.set("embedding", "scale", "false");
  m.set("embedding", "share_tgt_output", tied ? "true" : "false",
        tied ? "no output.weight: the output projection is token_embd" : "output.weight");
  m.set("attention", "causal", "true");
  m.set("attention", "padding_mask", "true");
  m.set("head", "kind", "logits", "output (no bias)");
  m.set("decoding", "strategy", "greedy");
  const bool pad = ids.count("padding_token_id");
  m.set("tokens", "pad", pad ? ids["padding_token_id"] : ids["eos_token_id"],
        pad ? "tokenizer.ggml.padding_token_id" : "no padding_token_id: eos (padding is by length)");
  m.set("tokens", "bos", ids["bos_token_id"], "tokenizer.ggml.bos_token_id");
  m.set("tokens", "eos", ids["eos_token_id"], "tokenizer.ggml.eos_token_id: generation stops there");
  m.set("weights", "preset", ai->preset, "the file is canonical (halformer.names): read by canonical names");

  const std::string gguf_abs = fs::absolute(path).lexically_normal().string();
  const std::string w_abs = fs::absolute(weights_out).lexically_normal().string();
  std::map<std::string, int> type_counts;
  for (const auto& t : f.tensors()) ++type_counts[type_name(t.type)];
  std::string types;
  for (const auto& [t, n] : type_counts) types += (types.empty() ? "" : ", ") + t + " x" + std::to_string(n);
  std::string general;
  try {
    if (f.has("general.name")) general = ", general.name " + q(f.string_value("general.name"));
  } catch (const GgufError&) {
  }
  std::vector<std::string> header = {
      name + ": imported by `halformer import` from " + gguf_abs,
      "GGUF v" + std::to_string(f.version()) + ": general.architecture " + arch + general + "; tensors " + types,
      "Each field's comment names the GGUF key or tensor it comes from (docs/import.md, \"GGUF files\").",
      "",
      "Weights, under canonical names: " + w_abs,
  };
  if (int4)
    header.push_back("  every layer linear is Q4_0: its blocks are kept as they are (precision: int4; the output");
  if (int4) header.push_back("  projection and the token table are F32 in it, int8 at load)");
  if (quantized_layers && !int4)
    header.push_back("  the layer linears are not all Q4_0: dequantized to F32, an fp32 spec (`halformer build");
  if (quantized_layers && !int4) header.push_back("  --precision int8` or `int4` quantizes them at load)");
  if (!dequantized.empty()) header.push_back("  dequantized to F32: " + grouped(dequantized));
  header.push_back("  halformer build <this spec> -o DIR");
  header.push_back("  DIR/" + name + " --weights " + w_abs + " --src \"...token ids...\"");
  bool add_bos = true;
  try {
    if (f.has("tokenizer.ggml.add_bos_token")) add_bos = f.bool_value("tokenizer.ggml.add_bos_token");
  } catch (const GgufError&) {
  }
  if (add_bos)
    header.push_back("llama.cpp starts every prompt with bos " + std::to_string(ids["bos_token_id"]) +
                     ": give it first in --src for the same outputs");
  out.yaml = write_yaml(m, name, header);
  if (int4) {
    const std::string at = "\narchitecture: decoder\n";
    out.yaml.insert(out.yaml.find(at) + at.size(),
                    "precision: int4             # every layer linear is Q4_0 in the file: kept as it is\n");
  }
  out.family = arch, out.preset = ai->preset, out.weights = w_abs;
  out.precision = int4 ? "int4" : "fp32";

  std::map<std::string, std::string> metadata = {{"halformer.names", "canonical"},
                                                 {"halformer.model", name},
                                                 {"halformer.layers", int4 ? "int4" : "fp32"},
                                                 {"halformer.generator", "fp32"},
                                                 {"halformer.embeddings", "fp32"},
                                                 {"halformer.imported_from", fs::path(path).filename().string()}};
  out.write_weights = [file, parts = std::move(parts), weights_out, metadata] {
    write_weights(*file, parts, weights_out, metadata);
  };
  return out;
}

}  // namespace halformer::import
