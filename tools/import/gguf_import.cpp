// `halformer import MODEL.gguf` (importer.h): a GGUF file of an architecture llama.cpp
// runs (llama, qwen2, gemma, gpt2) -> a spec and a weights file under halformer's canonical
// names (docs/import.md, "GGUF files").
//
// Design: as import_directory, every problem is collected and reported at once, and
// nothing is written until the metadata and every tensor's name, type and shape have been
// checked; the weights are then streamed out a few rows at a time (a 7B file never sits
// in memory as floats) into a temporary file renamed at the end. This file is what every
// architecture shares: the architecture, the vocabulary and token ids, unknown keys and
// tensors, what is kept and what dequantized, the spec's header and the writing; each
// architecture's keys, tensors and spec fields are in gguf_archs.cpp (gguf_internal.h).
// Q4_0 (Q8_0) layer linears are kept as their blocks when every one is Q4_0 (Q8_0):
// halformer's int4 (q8_0) is Q4_0 (Q8_0), packed_blocks.h; so is a Q8_0 output projection
// then. Everything else is widened (F16, BF16) or dequantized to F32.
#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>

#include "gguf_internal.h"
#include "gguf_tokenizer.h"
#include "importer.h"

namespace halformer::import {
using namespace detail;

namespace detail {
std::string gguf_quote(const std::string& s) {
  std::string out = "'";
  for (size_t i = 0; i < s.size() && i < 120; ++i) out += std::isprint(static_cast<unsigned char>(s[i])) ? s[i] : '?';
  return out + (s.size() > 120 ? "...'" : "'");
}
std::string dims_str(const std::vector<int64_t>& d) {
  std::string s = "[";
  for (size_t i = 0; i < d.size(); ++i) s += (i ? ", " : "") + std::to_string(d[i]);
  return s + "]";
}
double float32_decimal(double v) {
  for (int p = 1; p <= 9; ++p) {
    char buf[40];
    std::snprintf(buf, sizeof buf, "%.*g", p, v);
    const double x = std::strtod(buf, nullptr);
    if (float(x) == float(v)) return x;
  }
  return v;
}
}  // namespace detail

namespace {

// Positions the spec gets at most: the file's context_length can be 128k. Caches are
// allocated per call, but a CPU build bakes each position's rotary cos/sin into its
// attention kernels (up to 2^20 values; past that they are computed per call) and learned
// position tables are read up to max_len. The spec's comment says how to raise it.
constexpr int64_t kMaxLenCap = 4096;

std::string q(const std::string& s) { return gguf_quote(s); }
bool exact_float(GgmlType t) { return t == GgmlType::F32 || t == GgmlType::F16 || t == GgmlType::BF16; }

// One tensor of the weights file. Q4_0's (Q8_0's) blocks in a GGUF file: fp16 d, then 16
// bytes of nibbles (32 int8) for 32 weights; halformer keeps those bytes, U8 [rows][blocks
// * 16] (I8 [rows][blocks][32]), and d as an F32 scale [rows][blocks].
// `from`: Want's (the first row of src, or the first element of a vector).
constexpr int64_t kBlockWeights = 32, kScaleBytes = 2;
int64_t block_values_bytes(GgmlType t) { return t == GgmlType::Q8_0 ? 32 : 16; }
enum class Kind { Floats, Zeros, Blocks, Scales };
struct Part {
  std::string name;
  Kind kind;
  std::vector<int64_t> shape;
  const TensorInfo* src;
  int64_t from = 0;
  uint64_t bytes() const {
    uint64_t n = 1;
    for (int64_t d : shape) n *= uint64_t(d);
    return kind == Kind::Blocks ? n : 4 * n;
  }
  const char* dtype() const {
    if (kind != Kind::Blocks) return "F32";
    return src->type == GgmlType::Q8_0 ? "I8" : "U8";
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

// The weights file: a safetensors header computed up front, then every part streamed.
void write_weights(const GgufFile& f, const std::vector<Part>& parts, const std::string& path,
                   const std::map<std::string, std::string>& metadata) {
  json header = json::object();
  header["__metadata__"] = metadata;
  uint64_t offset = 0;
  for (const Part& p : parts) {
    header[p.name] = {{"dtype", p.dtype()},
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
             " holds NaN or Inf" + (per_row == t->row_length() ? "" : " (a block scale)"));
    o.write(reinterpret_cast<const char*>(buf.data()), std::streamsize(n * 4));
  };
  for (const Part& p : parts) {
    const TensorInfo* t = p.src;
    if (p.kind == Kind::Zeros) {
      buf.assign(p.bytes() / 4, 0.0f);
      o.write(reinterpret_cast<const char*>(buf.data()), std::streamsize(p.bytes()));
    } else if (p.kind == Kind::Floats && p.shape.size() == 1) {  // a vector, or part of one (gpt2's attn_qkv.bias)
      buf.resize(size_t(t->row_length()));
      f.dequantize_rows(*t, 0, 1, buf.data());
      buf.erase(buf.begin(), buf.begin() + p.from);
      floats(size_t(p.shape[0]), t, 0, t->row_length());
    } else if (p.kind == Kind::Floats) {  // ~1 MB of rows at a time, rows [from, from + shape[0])
      const int64_t chunk = std::max<int64_t>(1, (int64_t(1) << 18) / t->row_length());
      for (int64_t r = p.from; r < p.from + p.shape[0]; r += chunk) {
        const int64_t n = std::min(chunk, p.from + p.shape[0] - r);
        buf.resize(size_t(n * t->row_length()));
        f.dequantize_rows(*t, r, n, buf.data());
        floats(buf.size(), t, r, t->row_length());
      }
    } else {
      const int64_t blocks = t->row_length() / kBlockWeights, values = block_values_bytes(t->type);
      const int64_t block_bytes = kScaleBytes + values;
      for (int64_t r = p.from; r < p.from + p.shape[0]; ++r) {
        const uint8_t* row = f.row_data(*t, r);
        if (p.kind == Kind::Blocks) {
          bytes.resize(size_t(blocks * values));
          for (int64_t b = 0; b < blocks; ++b)
            std::memcpy(&bytes[size_t(b * values)], row + b * block_bytes + kScaleBytes, size_t(values));
          o.write(reinterpret_cast<const char*>(bytes.data()), std::streamsize(bytes.size()));
        } else {
          buf.resize(size_t(blocks));
          for (int64_t b = 0; b < blocks; ++b)
            buf[size_t(b)] = half_to_float(uint16_t(row[b * block_bytes] | row[b * block_bytes + 1] << 8));
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
  for (const auto& a : gguf_archs()) supported += (supported.empty() ? "" : ", ") + std::string(a.name);
  supported += " (llama covers Llama 1-2, Mistral 7B, TinyLlama, CodeLlama ...)";
  const auto arch_name = meta.text("general.architecture");
  const GgufArch* ai = nullptr;
  for (const auto& a : gguf_archs())
    if (arch_name && *arch_name == a.name) ai = &a;
  if (!f.has("general.architecture")) meta.problem("general.architecture", "missing; supported: " + supported);
  if (!ai && arch_name) meta.refuse("general.architecture", "supported: " + supported);
  if (!ai) throw ImportError(pr.list);
  const std::string arch = ai->name;
  GgufImport g{f, pr, meta, *ai};
  auto k = [&](const char* s) { return g.k(s); };

  // ---- hyperparameters (the architecture's keys)
  const bool complete = ai->hparams(g);
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
  if (!complete || !vocab || !pr.list.empty()) throw ImportError(pr.list);
  const int64_t ctx = *g.ctx;
  g.vocab = *vocab, g.max_len = std::min(ctx, kMaxLenCap);

  // ---- the tensors: names, shapes (torch order; GGUF lists them row length first), types
  ai->tensors(g);
  const std::vector<Want>& wants = g.wants;
  const bool tied = g.tied;
  for (const auto& t : f.tensors()) {
    if (g.known.count(t.name)) continue;
    if (t.name == "rope_freqs.weight" || t.name.find(".rope_freqs.") != std::string::npos)
      pr.add(path, "tensor " + q(t.name), "scaled rotary frequencies (Llama 3.1's rope scaling) are not supported");
    else
      pr.add(path, "tensor " + q(t.name),
             "not part of the " + arch + " architecture as halformer imports it (it may change the model; " +
                 std::to_string(*g.layers) + " layers by block_count)");
  }
  if (!pr.list.empty()) throw ImportError(pr.list);

  // ---- what is kept, what is dequantized: the layer linears' blocks when all are Q4_0, or
  // all Q8_0 (the spec's precision int4 / q8_0); then a Q8_0 output projection's too (the
  // output projection of those precisions is q8_0: tools/spec/spec.h output_precision).
  std::optional<GgmlType> kept;  // Q4_0 or Q8_0
  bool quantized_layers = false;  // any layer linear not F32 / F16 / BF16
  std::vector<const TensorInfo*> dequantized;
  for (const Want& w : wants) {
    if (w.role != Role::LayerLinear) continue;
    const GgmlType t = w.t->type;
    if (!kept) kept = t;
    if (t != *kept || (t != GgmlType::Q4_0 && t != GgmlType::Q8_0)) kept = GgmlType::F32;
  }
  if (kept == GgmlType::F32) kept.reset();
  const bool int4 = kept == GgmlType::Q4_0, q8_0 = kept == GgmlType::Q8_0;
  auto keeps_blocks = [&](const Want& w) {
    return kept && ((w.role == Role::LayerLinear) ||
                    (w.role == Role::Linear && w.t->type == GgmlType::Q8_0 && w.shape[1] % kBlockWeights == 0));
  };
  std::vector<Part> parts;
  bool output_blocks = false;
  for (const Want& w : wants) {
    if (!w.t) {
      parts.push_back({w.canonical, Kind::Zeros, w.shape, nullptr});
    } else if (keeps_blocks(w)) {
      const int64_t blocks = w.shape[1] / kBlockWeights;
      std::vector<int64_t> shape = {w.shape[0], blocks * 16};  // Q4_0's 16 bytes per block
      if (w.t->type == GgmlType::Q8_0) shape = {w.shape[0], blocks, kBlockWeights};
      parts.push_back({w.canonical, Kind::Blocks, shape, w.t, w.from});
      parts.push_back({w.canonical + "_scale", Kind::Scales, {w.shape[0], blocks}, w.t, w.from});
      output_blocks = output_blocks || w.role == Role::Linear;
    } else {
      parts.push_back({w.canonical, Kind::Floats, w.shape, w.t, w.from});
      if (!exact_float(w.t->type) && std::find(dequantized.begin(), dequantized.end(), w.t) == dequantized.end())
        dequantized.push_back(w.t);  // once (gpt2's attn_qkv is three parts)
    }
    quantized_layers = quantized_layers || (w.role == Role::LayerLinear && !exact_float(w.t->type));
  }
  if (!dequantized.empty())
    out.notes.push_back("dequantized to F32 (halformer keeps Q4_0 or Q8_0 layer linears as they are, when all are "
                        "Q4_0 or all Q8_0): " +
                        grouped(dequantized));

  // ---- the spec: what every architecture has, then the architecture's fields
  Model m;
  m.family = arch, m.preset = ai->preset, m.architecture = "decoder", m.d_model = *g.d, m.vocab = *vocab;
  m.set("sizes", "d_model", *g.d, k("embedding_length"));
  m.set("sizes", "heads", *g.h, k("attention.head_count") + " (head size " + std::to_string(g.hd) + ")");
  if (g.kv_heads_field)
    m.set("sizes", "kv_heads", *g.kvh,
          f.has(k("attention.head_count_kv")) ? k("attention.head_count_kv") : "one per query head");
  m.set("sizes", "d_ff", *g.ff, k("feed_forward_length"));
  m.set("sizes", "decoder_layers", *g.layers, k("block_count"));
  m.set("sizes", "tgt_vocab", *vocab, f.has(k("vocab_size")) ? k("vocab_size") : "token_embd.weight's rows");
  if (ctx > kMaxLenCap)
    m.set("sizes", "max_len", kMaxLenCap,
          k("context_length") + " " + std::to_string(ctx) + ", capped (rotary tables in the kernels grow with it): raise it " +
              "(up to " + std::to_string(ctx) + ") for longer text");
  else
    m.set("sizes", "max_len", ctx, k("context_length") + ": prompt + generated tokens");
  ai->spec(g, m);
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
  const std::string kept_type = kept ? type_name(*kept) : "", precision = int4 ? "int4" : q8_0 ? "q8_0" : "fp32";
  if (kept) {
    header.push_back("  every layer linear is " + kept_type + ": its blocks are kept as they are (precision: " + precision +
                     ";");
    header.push_back("  the output projection is q8_0, kept if Q8_0 in the file; the token table int8 at load)");
  }
  if (quantized_layers && !kept)
    header.push_back("  the layer linears are not all Q4_0 or all Q8_0: dequantized to F32, an fp32 spec (`halformer");
  if (quantized_layers && !kept) header.push_back("  build --precision int8`, `q8_0` or `int4` quantizes them at load)");
  if (!dequantized.empty()) header.push_back("  dequantized to F32: " + grouped(dequantized));
  header.push_back("  halformer build <this spec> -o DIR");
  header.push_back("  DIR/" + name + " --weights " + w_abs + " --src \"...token ids...\"");
  bool add_bos = ai->add_bos;
  try {
    if (f.has("tokenizer.ggml.add_bos_token")) add_bos = f.bool_value("tokenizer.ggml.add_bos_token");
  } catch (const GgufError&) {
  }
  if (add_bos)
    header.push_back("llama.cpp starts every prompt with bos " + std::to_string(ids["bos_token_id"]) +
                     ": give it first in --src for the same outputs");
  add_gguf_tokenizer(f, *vocab, name, w_abs, header, out);  // its files, their lines in the header
  out.yaml = write_yaml(m, name, header);
  if (kept) {
    const std::string at = "\narchitecture: decoder\n", field = "precision: " + precision;
    out.yaml.insert(out.yaml.find(at) + at.size(), field + std::string(28 - field.size(), ' ') +
                                                       "# every layer linear is " + kept_type +
                                                       " in the file: kept as it is\n");
  }
  out.family = arch, out.preset = ai->preset, out.weights = w_abs;
  out.precision = precision;

  std::map<std::string, std::string> metadata = {{"halformer.names", "canonical"},
                                                 {"halformer.model", name},
                                                 {"halformer.layers", precision},
                                                 {"halformer.generator", output_blocks ? "q8_0" : "fp32"},
                                                 {"halformer.embeddings", "fp32"},
                                                 {"halformer.imported_from", fs::path(path).filename().string()}};
  out.write_weights = [file, parts = std::move(parts), weights_out, metadata] {
    write_weights(*file, parts, weights_out, metadata);
  };
  return out;
}

}  // namespace halformer::import
