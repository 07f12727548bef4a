// What the GGUF import's two files share (internal to tools/import): gguf_import.cpp reads
// what every architecture has (the architecture, the vocabulary, the token ids, unknown
// keys and tensors), decides what is kept and what dequantized, writes the spec's header
// and the weights; gguf_archs.cpp maps each architecture's keys and tensors (llama, qwen2,
// gemma, gpt2) through the GgufArch table. Meta reads typed metadata recording problems;
// GgufImport is one import in progress: the hyperparameters read, the tensors wanted.
#pragma once

#include <optional>
#include <set>
#include <string>
#include <vector>

#include "gguf_file.h"
#include "import_internal.h"

namespace halformer::import::detail {

std::string gguf_quote(const std::string& s);           // text from the file, for messages: 'text'
std::string dims_str(const std::vector<int64_t>& d);    // "[64, 300]"
double float32_decimal(double v);                        // the shortest decimal of the same float32

// Typed metadata reads that record a problem ("FILE: key 'K': ...") instead of throwing,
// and remember which keys were looked at.
class Meta {
 public:
  Meta(const GgufFile& f, Problems& p) : f_(f), p_(p) {}
  std::set<std::string> seen;
  void problem(const std::string& key, const std::string& msg) { p_.add(f_.path(), "key " + gguf_quote(key), msg); }
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

// One tensor of the canonical file: from the file's tensor `t` (nullptr: zeros, a bias the
// file lacks), its canonical name and its shape in torch's order ([out, in] / [n]). A part
// of the file's tensor (GPT-2's fused attn_qkv, a capped position table) starts at `from`:
// its first row for a matrix, its first element for a vector.
enum class Role { Table, Norm, Linear, LayerLinear, Bias };
struct Want {
  std::string gguf, canonical;
  std::vector<int64_t> shape;
  Role role;
  const TensorInfo* t = nullptr;
  int64_t from = 0;
};

struct GgufArch;
struct GgufImport {
  const GgufFile& f;
  Problems& pr;
  Meta& meta;
  const GgufArch& arch;
  std::string k(const std::string& key) const;  // "{arch}.key"

  // The hyperparameters (GgufArch::hparams), the vocabulary and max_len (the import's).
  std::optional<int64_t> d, layers, ff, h, kvh, ctx;
  std::optional<double> eps, theta;
  int64_t hd = 0, vocab = 0, max_len = 0;
  bool kv_heads_field = true;  // the spec says kv_heads (GPT-2: only when the file has head_count_kv)
  bool tied = true;            // no output.weight: the output projection is token_embd

  // The tensors (GgufArch::tensors), in the canonical file's order, and every GGUF name read.
  std::vector<Want> wants;
  std::set<std::string> known;
  // The file's tensor `gguf`, checked: present (or not `required`), dims `shape` (torch
  // order; `from_keys` names the keys they come from), a type the import reads. Problems
  // are recorded once per tensor; returns it (nullptr when absent).
  const TensorInfo* tensor(const std::string& gguf, const std::vector<int64_t>& shape, bool required,
                           const std::string& from_keys);
  // `canonical` from the whole of `gguf` (checked as tensor() does).
  void want(const std::string& gguf, const std::string& canonical, const std::vector<int64_t>& shape, Role role,
            bool required, const std::string& from_keys) {
    wants.push_back({gguf, canonical, shape, role, tensor(gguf, shape, required, from_keys)});
  }
  // `canonical` of `shape` from part of `t` (already checked), starting at `from`.
  void part(const TensorInfo* t, const std::string& canonical, const std::vector<int64_t>& shape, Role role,
            int64_t from) {
    wants.push_back({t ? t->name : "", canonical, shape, role, t, from});
  }
  void zeros(const std::string& canonical, const std::vector<int64_t>& shape) {
    wants.push_back({"", canonical, shape, Role::Bias, nullptr});
  }
};

// An architecture: its name (general.architecture), the spec's preset, llama.cpp's
// default for tokenizer.ggml.add_bos_token, and its three steps. hparams reads the
// {arch}.* keys into GgufImport (false: a required one is missing or unusable; problems
// recorded); tensors lists the tensors (after the vocabulary and max_len are known); spec
// sets the spec's fields that are the architecture's (the rest: gguf_import.cpp).
struct GgufArch {
  const char* name;
  const char* preset;
  bool add_bos;
  bool (*hparams)(GgufImport&);
  void (*tensors)(GgufImport&);
  void (*spec)(const GgufImport&, Model&);
};
// llama, qwen2, gemma, gpt2 (gguf_archs.cpp).
const std::vector<GgufArch>& gguf_archs();

}  // namespace halformer::import::detail
