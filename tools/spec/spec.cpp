// Parsing and validation of the YAML model spec (see spec.h and docs/spec.md).
//
// Layout of this file:
//   1. enum name tables (shared by to_string and the parser), schema, limits
//   2. Context: collects diagnostics, remembers which fields were written and which failed
//   3. typed conversions of one YAML node (integer, number, bool, enum) with diagnostics
//   4. Section: one YAML mapping; reports duplicate/unknown keys up front, then hands out
//      typed values by key
//   5. one reader per spec section, then the cross-field checks
//   6. file loading (missing file, directory, empty, binary, syntax errors)
//   7. check_supported, to_string, Diagnostic::str
#include "spec.h"

#include <yaml-cpp/eventhandler.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <utility>

namespace halformer {
namespace {

// ---------------------------------------------------------------- 1. names, schema, limits
template <class E>
using Names = std::vector<std::pair<E, const char*>>;

const Names<Architecture>& names(Architecture) {
  static const Names<Architecture> n{{Architecture::EncoderDecoder, "encoder_decoder"},
                                     {Architecture::Encoder, "encoder"},
                                     {Architecture::Decoder, "decoder"}};
  return n;
}
const Names<NormPlacement>& names(NormPlacement) {
  static const Names<NormPlacement> n{{NormPlacement::Post, "post"}, {NormPlacement::Pre, "pre"}};
  return n;
}
const Names<NormKind>& names(NormKind) {
  static const Names<NormKind> n{{NormKind::Standard, "standard"}, {NormKind::Annotated, "annotated"}, {NormKind::Rms, "rms"}};
  return n;
}
const Names<Activation>& names(Activation) {
  static const Names<Activation> n{
      {Activation::Relu, "relu"}, {Activation::Gelu, "gelu"}, {Activation::GeluTanh, "gelu_tanh"},
      {Activation::Silu, "silu"}, {Activation::Swiglu, "swiglu"}, {Activation::Geglu, "geglu"},
      {Activation::GegluTanh, "geglu_tanh"}};
  return n;
}
const Names<RotaryLayout>& names(RotaryLayout) {
  static const Names<RotaryLayout> n{{RotaryLayout::Half, "half"}, {RotaryLayout::Interleaved, "interleaved"}};
  return n;
}
const Names<Positions>& names(Positions) {
  static const Names<Positions> n{
      {Positions::Sinusoidal, "sinusoidal"}, {Positions::Learned, "learned"}, {Positions::None, "none"},
      {Positions::SinusoidalSplit, "sinusoidal_split"}, {Positions::Rotary, "rotary"},
      {Positions::Relative, "relative"}};
  return n;
}
const Names<HeadKind>& names(HeadKind) {
  static const Names<HeadKind> n{{HeadKind::LogSoftmax, "log_softmax"}, {HeadKind::Softmax, "softmax"},
                                 {HeadKind::Logits, "logits"},          {HeadKind::Classifier, "classifier"},
                                 {HeadKind::Embedding, "embedding"},    {HeadKind::Hidden, "hidden"}};
  return n;
}
const Names<Pooling>& names(Pooling) {
  static const Names<Pooling> n{{Pooling::Cls, "cls"}, {Pooling::Mean, "mean"}};
  return n;
}
const Names<Pooler>& names(Pooler) {
  static const Names<Pooler> n{{Pooler::None, "none"}, {Pooler::DenseTanh, "dense_tanh"}, {Pooler::DenseGelu, "dense_gelu"}};
  return n;
}
const Names<DecodeStrategy>& names(DecodeStrategy) {
  static const Names<DecodeStrategy> n{{DecodeStrategy::Greedy, "greedy"}, {DecodeStrategy::Beam, "beam"}};
  return n;
}
const Names<WeightPreset>& names(WeightPreset) {
  static const Names<WeightPreset> n{{WeightPreset::TorchTransformer, "torch.nn.Transformer"},
                                     {WeightPreset::AnnotatedTransformer, "annotated-transformer"},
                                     {WeightPreset::HuggingfaceBert, "huggingface-bert"},
                                     {WeightPreset::HuggingfaceRoberta, "huggingface-roberta"},
                                     {WeightPreset::HuggingfaceDistilbert, "huggingface-distilbert"},
                                     {WeightPreset::HuggingfaceElectra, "huggingface-electra"},
                                     {WeightPreset::HuggingfaceAlbert, "huggingface-albert"},
                                     {WeightPreset::HuggingfaceGpt2, "huggingface-gpt2"},
                                     {WeightPreset::HuggingfaceBart, "huggingface-bart"},
                                     {WeightPreset::HuggingfaceLlama, "huggingface-llama"},
                                     {WeightPreset::HuggingfaceT5, "huggingface-t5"},
                                     {WeightPreset::HuggingfaceQwen2, "huggingface-qwen2"},
                                     {WeightPreset::HuggingfaceGptj, "huggingface-gptj"},
                                     {WeightPreset::HuggingfaceGptNeox, "huggingface-gpt-neox"},
                                     {WeightPreset::HuggingfaceOpt, "huggingface-opt"},
                                     {WeightPreset::Explicit, "explicit"}};
  return n;
}
const Names<Precision>& names(Precision) {
  static const Names<Precision> n{{Precision::Fp32, "fp32"}, {Precision::Bf16, "bf16"}, {Precision::Int8, "int8"}};
  return n;
}
const Names<Target>& names(Target) {
  static const Names<Target> n{{Target::Host, "host"}, {Target::Cuda, "cuda"}, {Target::OpenCL, "opencl"}};
  return n;
}

template <class E>
const char* name_of(E v) {
  for (const auto& [e, n] : names(E{}))
    if (e == v) return n;
  return "?";
}

// Known keys per section ("" is the top level), in documentation order.
const std::map<std::string, std::vector<std::string>>& schema() {
  static const std::map<std::string, std::vector<std::string>> s{
      {"",
       {"name", "architecture", "sizes", "layer", "embedding", "attention", "head", "tokens", "decoding", "weights",
        "precision", "precision_overrides", "targets", "cuda_capability", "schedule", "tuning"}},
      {"precision_overrides", {"generator", "embeddings", "int16_activations", "kv_cache"}},
      {"sizes",
       {"d_model", "heads", "d_ff", "encoder_layers", "decoder_layers", "src_vocab", "tgt_vocab", "max_len",
        "type_vocab", "kv_heads"}},
      {"layer",
       {"norm_placement", "norm_kind", "norm_eps", "norm_weight_offset", "final_norm", "parallel_residual", "shared_weights",
        "activation", "dropout"}},
      {"embedding",
       {"positions", "scale", "share_src_tgt", "share_tgt_output", "norm", "size", "position_offset", "rotary_dim",
        "rotary_theta", "rotary_layout", "relative_buckets", "relative_distance"}},
      {"attention", {"causal", "padding_mask", "scaled"}},
      {"head", {"kind", "pooling", "num_classes", "pooler", "normalize", "input_scale"}},
      {"tokens", {"pad", "bos", "eos"}},
      {"decoding", {"strategy", "max_new_tokens", "beam_size", "length_penalty"}},
      {"weights", {"preset", "map"}},
      {"tuning", {"db", "seq_lens", "batch_sizes"}},
  };
  return s;
}

constexpr int64_t kInt32Max = 2147483647;
constexpr int64_t kMaxDModel = 65536, kMaxHeads = 1024, kMaxDff = 1 << 20, kMaxLayers = 1024;
constexpr int64_t kMaxVocab = 10000000, kMaxLen = 1 << 20, kMaxTypeVocab = 1024, kMaxBeam = 1024;
constexpr double kMaxWeightGiB = 64.0;
constexpr size_t kMaxFileBytes = 1 << 20;

size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diag = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diag + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diag = up;
    }
  }
  return row[b.size()];
}

// " (did you mean 'x'?)" for the closest candidate within edit distance 2, else "".
std::string closest(const std::string& word, const std::vector<std::string>& candidates) {
  std::string best;
  size_t best_d = 3;
  for (const auto& c : candidates) {
    size_t d = edit_distance(word, c);
    if (d < best_d) best_d = d, best = c;
  }
  return best.empty() ? "" : " (did you mean '" + best + "'?)";
}

std::string join(const std::vector<std::string>& v) {
  std::string s;
  for (const auto& x : v) s += (s.empty() ? "" : ", ") + x;
  return s;
}

// How a found value is shown in messages.
std::string describe(const YAML::Node& n) {
  if (!n.IsDefined() || n.IsNull()) return "nothing";
  if (n.IsMap()) return "a mapping";
  if (n.IsSequence()) return "a sequence";
  if (n.Tag() != "?") return "the quoted string '" + n.Scalar() + "'";
  return "'" + n.Scalar() + "'";
}

std::string fmt(double v) {
  std::ostringstream os;
  os << v;
  return os.str();
}

// ---------------------------------------------------------------- 2. Context
struct Loc {
  int line = 0, column = 0;
};
Loc loc_of(const YAML::Mark& m) { return m.is_null() ? Loc{} : Loc{m.line + 1, m.column + 1}; }

struct Context {
  std::string file;
  Spec& spec;
  std::vector<Diagnostic> diags;
  std::set<std::string> failed;  // fields reported as wrong: their value was not stored

  void error(Loc at, const std::string& field, const std::string& message) {
    diags.push_back({file, at.line, at.column, field, message});
    failed.insert(field);
  }
  bool present(const std::string& field) const { return spec.locations.count(field) > 0; }
  // Written by the user and valid.
  bool given(const std::string& field) const { return present(field) && !failed.count(field); }
  bool any_failed(const std::string& prefix) const {
    auto it = failed.lower_bound(prefix);
    return it != failed.end() && it->compare(0, prefix.size(), prefix) == 0;
  }
  // Where a field was written, else where its nearest enclosing section was, else nowhere.
  Loc where(std::string field) const { return locate(spec, std::move(field)); }
  static Loc locate(const Spec& spec, std::string field) {
    for (;;) {
      auto it = spec.locations.find(field);
      if (it != spec.locations.end()) return {it->second.first, it->second.second};
      size_t dot = field.rfind('.');
      if (dot == std::string::npos) return {};
      field.resize(dot);
    }
  }
};

// ---------------------------------------------------------------- 3. typed conversions
// Each reports its own diagnostic at `at` for `field` and returns nullopt on failure.
std::optional<int64_t> to_int(Context& cx, const YAML::Node& n, Loc at, const std::string& field, int64_t lo,
                              int64_t hi) {
  const std::string s = n.IsScalar() && n.Tag() == "?" ? n.Scalar() : "";
  const size_t sign = s.size() > 1 && (s[0] == '-' || s[0] == '+') ? 1 : 0;
  if (s.empty() || !std::all_of(s.begin() + sign, s.end(), [](char c) { return c >= '0' && c <= '9'; })) {
    cx.error(at, field, "expected an integer, found " + describe(n));
    return std::nullopt;
  }
  int64_t v = 0;
  if (std::from_chars(s.data() + sign, s.data() + s.size(), v).ec != std::errc() || v > kInt32Max) {
    cx.error(at, field, "found " + s + ", which does not fit in a 32-bit integer (largest is 2147483647)");
    return std::nullopt;
  }
  if (s[0] == '-') v = -v;
  if (v < lo || v > hi) {
    std::string range = hi == kInt32Max ? (lo == 1 ? "> 0" : ">= " + std::to_string(lo))
                                        : "between " + std::to_string(lo) + " and " + std::to_string(hi);
    cx.error(at, field, "must be " + range + ", found " + std::to_string(v));
    return std::nullopt;
  }
  return v;
}

std::optional<double> to_number(Context& cx, const YAML::Node& n, Loc at, const std::string& field) {
  std::string s = n.IsScalar() && n.Tag() == "?" ? n.Scalar() : "";
  if (!s.empty() && s[0] == '+') s.erase(0, 1);
  double v = 0;
  auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (s.empty() || ec != std::errc() || end != s.data() + s.size() || !std::isfinite(v)) {
    cx.error(at, field, "expected a finite number, found " + describe(n));
    return std::nullopt;
  }
  return v;
}

std::optional<bool> to_bool(Context& cx, const YAML::Node& n, Loc at, const std::string& field) {
  const std::string s = n.IsScalar() && n.Tag() == "?" ? n.Scalar() : "";
  if (s == "true" || s == "True" || s == "TRUE") return true;
  if (s == "false" || s == "False" || s == "FALSE") return false;
  cx.error(at, field, "expected true/false, found " + describe(n));
  return std::nullopt;
}

template <class E>
std::optional<E> to_enum(Context& cx, const YAML::Node& n, Loc at, const std::string& field, const std::string& what) {
  std::vector<std::string> allowed;
  for (const auto& [value, name] : names(E{})) {
    if (n.IsScalar() && n.Scalar() == name) return value;
    allowed.push_back(name);
  }
  std::string msg =
      n.IsScalar() && !n.Scalar().empty()
          ? "unknown " + what + " '" + n.Scalar() + "'; allowed: " + join(allowed) + closest(n.Scalar(), allowed)
          : std::string(std::strchr("aeiou", what[0]) ? "expected an " : "expected a ") + what + ", found " +
                describe(n) + "; allowed: " + join(allowed);
  cx.error(at, field, msg);
  return std::nullopt;
}

// ---------------------------------------------------------------- 4. Section
// One YAML mapping. The constructor reports non-scalar keys, duplicate keys and (unless
// the section is free-form) unknown keys, and records where every key's value is.
class Section {
 public:
  struct Entry {
    std::string key;
    YAML::Node key_node, value;
    Loc at;      // of the value; of the key when the value was omitted ("key:")
    Loc key_at;  // of the key
  };

  Section(Context& cx, const YAML::Node& node, Loc at, std::string path, bool free_form = false)
      : cx_(cx), at_(at), path_(std::move(path)) {
    if (!node.IsDefined() || node.IsNull()) return;  // absent or empty: all defaults
    if (!node.IsMap()) {
      cx_.error(at, path_, "expected a mapping, found " + describe(node));
      return;
    }
    const auto known = schema().find(path_);
    for (auto it = node.begin(); it != node.end(); ++it) {
      const Loc key_at = loc_of(it->first.Mark());
      if (!it->first.IsScalar()) {
        cx_.error(key_at, path_, "expected a plain key, found " + describe(it->first));
        continue;
      }
      const std::string key = it->first.Scalar();
      if (const Entry* first = entry(key)) {
        cx_.error(key_at, field(key),
                  "duplicate key '" + key + "' (first written at line " +
                      std::to_string(loc_of(first->key_node.Mark()).line) + ")");
        continue;
      }
      if (!free_form && known != schema().end() &&
          std::find(known->second.begin(), known->second.end(), key) == known->second.end()) {
        cx_.error(key_at, field(key), "unknown key '" + key + "'" + hint(key, known->second));
        continue;
      }
      const Loc value_at = it->second.IsNull() ? key_at : loc_of(it->second.Mark());
      entries_.push_back({key, it->first, it->second, value_at, key_at});
      cx_.spec.locations[field(key)] = {value_at.line, value_at.column};
    }
  }

  const std::vector<Entry>& entries() const { return entries_; }
  const Entry* entry(const std::string& key) const {
    for (const auto& e : entries_)
      if (e.key == key) return &e;
    return nullptr;
  }
  bool has(const std::string& key) const { return entry(key) != nullptr; }
  std::string field(const std::string& key) const { return path_.empty() ? key : path_ + "." + key; }
  Loc at(const std::string& key) const { return has(key) ? entry(key)->at : at_; }
  Context& context() { return cx_; }

  void error(const std::string& key, const std::string& message) { cx_.error(at(key), field(key), message); }
  void require(const std::string& key, const std::string& what) {
    if (!has(key)) cx_.error(at_, field(key), "missing required key '" + key + "' (" + what + ")");
  }
  // Nested section; absent or null gives an empty section located at this key.
  Section section(const std::string& key, bool free_form = false) {
    const Entry* e = entry(key);
    return Section(cx_, e ? e->value : YAML::Node(), at(key), field(key), free_form);
  }

  // Typed readers: store into `out` and return true when the key is present and valid.
  bool read(const std::string& key, int64_t& out, int64_t lo, int64_t hi = kInt32Max) {
    return assign(key, out, [&](const Entry& e) { return to_int(cx_, e.value, e.at, field(key), lo, hi); });
  }
  bool read(const std::string& key, double& out) {
    return assign(key, out, [&](const Entry& e) { return to_number(cx_, e.value, e.at, field(key)); });
  }
  bool read(const std::string& key, bool& out) {
    return assign(key, out, [&](const Entry& e) { return to_bool(cx_, e.value, e.at, field(key)); });
  }
  bool read(const std::string& key, std::string& out) {
    return assign(key, out, [&](const Entry& e) -> std::optional<std::string> {
      if (e.value.IsScalar()) return e.value.Scalar();
      cx_.error(e.at, field(key), "expected a string, found " + describe(e.value));
      return std::nullopt;
    });
  }
  template <class E>
  bool read(const std::string& key, E& out, const std::string& what) {
    return assign(key, out, [&](const Entry& e) { return to_enum<E>(cx_, e.value, e.at, field(key), what); });
  }
  // A number checked by `allowed`, which returns "" when the value is fine, else the allowed range.
  template <class Check>
  bool read(const std::string& key, double& out, Check allowed) {
    double v = 0;
    if (!read(key, v)) return false;
    if (std::string range = allowed(v); !range.empty()) {
      error(key, "must be " + range + ", found " + fmt(v));
      return false;
    }
    return out = v, true;
  }

 private:
  template <class T, class Convert>
  bool assign(const std::string& key, T& out, Convert convert) {
    const Entry* e = entry(key);
    if (!e) return false;
    auto v = convert(*e);
    if (!v) return false;
    out = *v;
    return true;
  }
  // A close known key, or the section where this key belongs.
  std::string hint(const std::string& key, const std::vector<std::string>& known) const {
    if (std::string h = closest(key, known); !h.empty()) return h;
    for (const auto& [section, keys] : schema())
      if (section != path_ && std::find(keys.begin(), keys.end(), key) != keys.end())
        return " (did you mean '" + (section.empty() ? key : section + "." + key) + "'?)";
    return "";
  }

  Context& cx_;
  Loc at_;  // of the mapping itself, for missing keys
  std::string path_;
  std::vector<Entry> entries_;  // first occurrence of each accepted key, in file order
};

// ---------------------------------------------------------------- 5. section readers
void read_sizes(Section s, Spec& spec) {
  if (s.context().failed.count("sizes")) return;  // not a mapping: already reported
  for (const char* key : {"d_model", "heads", "d_ff", "max_len"}) s.require(key, "an integer > 0");
  s.read("d_model", spec.d_model, 1, kMaxDModel);
  s.read("heads", spec.heads, 1, kMaxHeads);
  s.read("d_ff", spec.d_ff, 1, kMaxDff);
  s.read("max_len", spec.max_len, 1, kMaxLen);
  s.read("encoder_layers", spec.encoder_layers, 0, kMaxLayers);
  s.read("decoder_layers", spec.decoder_layers, 0, kMaxLayers);
  s.read("src_vocab", spec.src_vocab, 0, kMaxVocab);
  s.read("tgt_vocab", spec.tgt_vocab, 0, kMaxVocab);
  s.read("type_vocab", spec.type_vocab, 0, kMaxTypeVocab);
  s.read("kv_heads", spec.kv_heads, 1, kMaxHeads);
}

void read_layer(Section s, Spec& spec) {
  s.read("norm_placement", spec.norm_placement, "norm placement");
  s.read("norm_kind", spec.norm_kind, "norm kind");
  s.read("norm_eps", spec.norm_eps, [](double v) { return v > 0 && v < 1 ? "" : "> 0 and < 1"; });
  s.read("norm_weight_offset", spec.norm_weight_offset,
         [](double v) { return std::isfinite(v) && std::abs(v) <= 16 ? "" : "a number between -16 and 16"; });
  s.read("final_norm", spec.final_norm);
  s.read("parallel_residual", spec.parallel_residual);
  s.read("shared_weights", spec.shared_weights);
  s.read("activation", spec.activation, "activation");
  s.read("dropout", spec.dropout, [](double v) { return v >= 0 && v < 1 ? "" : ">= 0 and < 1"; });
}

void read_embedding(Section s, Spec& spec) {
  s.read("positions", spec.positions, "positions kind");
  s.read("scale", spec.scale_embedding);
  s.read("share_src_tgt", spec.share_src_tgt);
  s.read("share_tgt_output", spec.share_tgt_output);
  s.read("norm", spec.embedding_norm);
  s.read("size", spec.embedding_size, 1, kMaxDModel);
  s.read("position_offset", spec.position_offset, 0, kMaxLen);
  s.read("rotary_dim", spec.rotary_dim, 2, kMaxDModel);
  s.read("rotary_theta", spec.rotary_theta,
         [](double v) { return std::isfinite(v) && v > 1 && v <= 1e12 ? "" : "> 1 and <= 1e12"; });
  s.read("rotary_layout", spec.rotary_layout, "rotary layout");
  s.read("relative_buckets", spec.relative_buckets, 4, 1024);
  s.read("relative_distance", spec.relative_distance, 1, kMaxLen);
}

void read_head(Section s, Spec& spec) {
  s.read("kind", spec.head, "head kind");
  s.read("pooling", spec.pooling, "pooling");
  s.read("num_classes", spec.num_classes, 1, kMaxVocab);
  s.read("pooler", spec.pooler, "pooler");
  s.read("normalize", spec.normalize);
  s.read("input_scale", spec.input_scale,
         [](double v) { return std::isfinite(v) && v > 0 && v <= 1e6 ? "" : "> 0 and <= 1e6"; });
}

void read_decoding(Section s, Spec& spec) {
  s.read("strategy", spec.decoding, "decoding strategy");
  s.read("max_new_tokens", spec.max_new_tokens, 1);
  s.read("beam_size", spec.beam_size, 1, kMaxBeam);
  s.read("length_penalty", spec.length_penalty, [](double v) { return v >= 0 ? "" : ">= 0"; });
}

void read_weights(Section s, Spec& spec) {
  s.read("preset", spec.preset, "weight preset");
  Section map = s.section("map", /*free_form=*/true);
  for (const auto& e : map.entries()) {
    if (e.value.IsScalar())
      spec.weight_map[e.key] = e.value.Scalar();
    else
      map.error(e.key, "expected a file name, found " + describe(e.value));
  }
}

void read_targets(Section& top, Spec& spec) {
  const Section::Entry* e = top.entry("targets");
  if (!e) return;
  Context& cx = top.context();
  if (!e->value.IsSequence() || e->value.size() == 0) {
    cx.error(e->at, "targets",
             "expected a non-empty sequence such as [host, cuda], found " +
                 (e->value.IsSequence() ? std::string("an empty one") : describe(e->value)));
    return;
  }
  std::vector<Target> targets;
  for (const auto& item : e->value) {
    const Loc at = loc_of(item.Mark());
    auto t = to_enum<Target>(cx, item, at, "targets", "target");
    if (t && std::find(targets.begin(), targets.end(), *t) != targets.end())
      cx.error(at, "targets", std::string("duplicate target '") + name_of(*t) + "'");
    else if (t)
      targets.push_back(*t);
  }
  if (!cx.failed.count("targets")) spec.targets = targets;
}

void read_schedule(Section s, Spec& spec) {
  for (const auto& e : s.entries()) {
    const size_t dot = e.key.find('.');
    if (dot == std::string::npos || dot == 0 || dot + 1 == e.key.size())
      s.context().error(e.key_at, s.field(e.key),
                        "schedule key '" + e.key + "' must have the form '<layer kind>.<knob>', e.g. 'linear.tile_m'");
    else if (!e.value.IsScalar())
      s.error(e.key, "expected a scalar value, found " + describe(e.value));
    else
      spec.schedule[e.key] = e.value.Scalar();
  }
}

// Stored for the tuner and the build (docs/tuning.md).
void read_tuning(Section s, Spec& spec) {
  s.read("db", spec.tuning_db);
  for (const char* key : {"seq_lens", "batch_sizes"}) {
    const Section::Entry* e = s.entry(key);
    if (!e) continue;
    if (!e->value.IsSequence()) {
      s.error(key, "expected a sequence of integers > 0, found " + describe(e->value));
      continue;
    }
    auto& list = std::string(key) == "seq_lens" ? spec.tuning_seq_lens : spec.tuning_batch_sizes;
    for (const auto& item : e->value)
      if (auto v = to_int(s.context(), item, loc_of(item.Mark()), s.field(key), 1, kInt32Max)) list.push_back(*v);
  }
}

// ---------------------------------------------------------------- 5b. cross-field checks
void check_sizes(Context& cx, Spec& s) {
  if (cx.given("sizes.d_model") && cx.given("sizes.heads") && s.d_model % s.heads != 0)
    cx.error(cx.where("sizes.d_model"), "sizes.d_model",
             "d_model " + std::to_string(s.d_model) + " is not divisible by heads " + std::to_string(s.heads) +
                 " (remainder " + std::to_string(s.d_model % s.heads) + "); each head gets d_model / heads features");
  if (!cx.present("sizes.kv_heads") && cx.given("sizes.heads")) s.kv_heads = s.heads;
  if (cx.given("sizes.kv_heads") && cx.given("sizes.heads") && s.heads % s.kv_heads != 0)
    cx.error(cx.where("sizes.kv_heads"), "sizes.kv_heads",
             "kv_heads " + std::to_string(s.kv_heads) + " does not divide heads " + std::to_string(s.heads) +
                 "; each key/value head serves heads / kv_heads query heads");
  // Rotary positions: the rotated features per head (default: all of them).
  if (cx.given("sizes.d_model") && cx.given("sizes.heads") && s.d_model % s.heads == 0) {
    const int64_t hd = s.d_model / s.heads;
    if (!cx.present("embedding.rotary_dim")) s.rotary_dim = hd;
    if (cx.given("embedding.rotary_dim") && (s.rotary_dim > hd || s.rotary_dim % 2 != 0))
      cx.error(cx.where("embedding.rotary_dim"), "embedding.rotary_dim",
               "rotary_dim " + std::to_string(s.rotary_dim) + " must be even and <= the head size " +
                   std::to_string(hd) + " (d_model / heads)");
  }
  if (cx.any_failed("architecture")) return;
  const std::string arch = name_of(s.architecture);
  auto need = [&](const char* key, int64_t value) {
    const std::string f = std::string("sizes.") + key;
    if (!cx.present(f))
      cx.error(cx.where("sizes"), f,
               std::string("missing required key '") + key + "' (an integer > 0 for architecture '" + arch + "')");
    else if (cx.given(f) && value == 0)
      cx.error(cx.where(f), f, "must be > 0 for architecture '" + arch + "', found 0");
  };
  auto forbid = [&](const char* key, int64_t value, const char* missing_part) {
    const std::string f = std::string("sizes.") + key;
    if (cx.given(f) && value > 0)
      cx.error(cx.where(f), f,
               "contradiction: architecture '" + arch + "' has no " + missing_part + ", but " + key + " is " +
                   std::to_string(value) + " (remove it or set it to 0)");
  };
  if (s.architecture != Architecture::Decoder) {
    need("encoder_layers", s.encoder_layers);
    need("src_vocab", s.src_vocab);
  } else {
    forbid("encoder_layers", s.encoder_layers, "encoder");
    forbid("src_vocab", s.src_vocab, "encoder");
  }
  if (s.architecture != Architecture::Encoder) {
    need("decoder_layers", s.decoder_layers);
    need("tgt_vocab", s.tgt_vocab);
  } else {
    forbid("decoder_layers", s.decoder_layers, "decoder");
  }
}

// fp32 weight bytes, roughly: embeddings + attention/FFN matrices + output projection.
void check_memory(Context& cx, const Spec& s) {
  if (cx.any_failed("sizes") || cx.any_failed("head") || s.d_model <= 0) return;
  const double d = double(s.d_model), ff = double(s.d_ff);
  const double embed = d * (double(s.src_vocab) + (s.share_src_tgt ? 0.0 : double(s.tgt_vocab)) + double(s.type_vocab) +
                            (s.positions == Positions::Learned ? 2.0 * double(s.max_len) : 0.0));
  const double layers =
      double(s.encoder_layers) * (4 * d * d + 2 * d * ff) + double(s.decoder_layers) * (8 * d * d + 2 * d * ff);
  const bool vocab_head = s.head == HeadKind::LogSoftmax || s.head == HeadKind::Softmax || s.head == HeadKind::Logits;
  const double output = vocab_head && !s.share_tgt_output ? d * double(s.tgt_vocab)
                        : s.head == HeadKind::Classifier  ? d * double(s.num_classes)
                                                          : 0.0;
  const double gib = 4.0 * (embed + layers + output) / double(1ull << 30);
  if (gib > kMaxWeightGiB)
    cx.error(cx.where("sizes"), "sizes",
             "needs " + std::to_string(int64_t(std::ceil(gib))) + " GiB of fp32 weights, more than the " +
                 std::to_string(int64_t(kMaxWeightGiB)) + " GiB limit (embeddings " +
                 fmt(std::round(4 * embed / (1 << 30))) + " GiB, layers " + fmt(std::round(4 * layers / (1 << 30))) +
                 " GiB, output " + fmt(std::round(4 * output / (1 << 30))) + " GiB)");
}

void check_consistency(Context& cx, Spec& s, bool have_sizes) {
  if (have_sizes) {
    check_memory(cx, s);  // first: only unreadable sizes stop it, not the contradictions below
    check_sizes(cx, s);
  }
  if (cx.any_failed("architecture")) return;
  const std::string arch = name_of(s.architecture);
  const bool has_decoder = s.architecture != Architecture::Encoder;
  const auto contradiction = [&](const std::string& field, const std::string& msg) {
    cx.error(cx.present(field) ? cx.where(field) : cx.where("architecture"), field, "contradiction: " + msg);
  };

  // head
  if (!cx.any_failed("head.kind")) {
    const std::string kind = name_of(s.head);
    const std::string which = cx.present("head.kind") ? "head '" + kind + "'" : "the default head '" + kind + "'";
    const bool vocab_head = s.head == HeadKind::LogSoftmax || s.head == HeadKind::Softmax || s.head == HeadKind::Logits;
    if (vocab_head && !has_decoder)
      contradiction("head.kind", which + " predicts target tokens and needs a decoder; architecture '" + arch +
                                     "' has none (use classifier, embedding or hidden)");
    if ((s.head == HeadKind::Classifier || s.head == HeadKind::Embedding) && s.architecture != Architecture::Encoder)
      contradiction("head.kind", which + " is only for architecture 'encoder', not '" + arch + "'");
    if (s.head == HeadKind::Classifier && !cx.present("head.num_classes"))
      cx.error(cx.where("head"), "head.num_classes",
               "missing required key 'num_classes' (an integer > 0 for head 'classifier')");
    if (s.head != HeadKind::Classifier && cx.present("head.num_classes"))
      contradiction("head.num_classes", "num_classes applies only to head 'classifier', not " + which);
    if (s.head != HeadKind::Classifier && cx.present("head.pooler"))
      contradiction("head.pooler", "pooler applies only to head 'classifier', not " + which);
    if (s.head != HeadKind::Embedding && cx.present("head.normalize"))
      contradiction("head.normalize", "normalize applies only to head 'embedding', not " + which);
    if (s.head != HeadKind::Classifier && s.head != HeadKind::Embedding && cx.present("head.pooling"))
      contradiction("head.pooling", "pooling applies only to heads 'classifier' and 'embedding', not " + which);
  }

  // attention and embedding
  if (s.architecture == Architecture::Encoder) {
    if (cx.given("attention.causal") && s.causal)
      contradiction("attention.causal",
                    "causal: true has no meaning for architecture 'encoder' (there is no decoder self-attention)");
    if (!cx.present("attention.causal")) s.causal = false;
    if (cx.given("embedding.share_tgt_output") && s.share_tgt_output)
      contradiction("embedding.share_tgt_output",
                    "architecture 'encoder' has no target embedding or output projection to share");
  }
  if (cx.given("embedding.position_offset") && s.position_offset > 0 && !cx.any_failed("embedding.positions") &&
      s.positions != Positions::Learned)
    contradiction("embedding.position_offset",
                  "position_offset " + std::to_string(s.position_offset) +
                      " shifts rows of a learned position table; positions are '" + name_of(s.positions) + "'");
  if (!cx.any_failed("embedding.positions") && s.positions != Positions::Rotary)
    for (const char* name : {"rotary_dim", "rotary_theta", "rotary_layout"})
      if (const std::string key = std::string("embedding.") + name; cx.given(key))
        contradiction(key, std::string(name) + " applies only to positions 'rotary'; positions are '" +
                               name_of(s.positions) + "'");
  if (!cx.any_failed("embedding.positions") && s.positions != Positions::Relative)
    for (const char* name : {"relative_buckets", "relative_distance"})
      if (const std::string key = std::string("embedding.") + name; cx.given(key))
        contradiction(key, std::string(name) + " applies only to positions 'relative'; positions are '" +
                               name_of(s.positions) + "'");
  // The buckets are exact up to buckets / 4 (bidirectional) or / 2, then logarithmic up to
  // the distance, which must lie beyond the exact range.
  if (s.positions == Positions::Relative && !cx.any_failed("embedding.relative_buckets") &&
      !cx.any_failed("embedding.relative_distance") && s.relative_distance <= s.relative_buckets / 2)
    contradiction(cx.given("embedding.relative_distance") ? "embedding.relative_distance" : "embedding.relative_buckets",
                  "relative_distance " + std::to_string(s.relative_distance) + " must exceed relative_buckets / 2 = " +
                      std::to_string(s.relative_buckets / 2) + " (the buckets are exact up to there, logarithmic beyond)");
  if (cx.given("layer.parallel_residual") && s.parallel_residual && !cx.any_failed("layer.norm_placement") &&
      s.norm_placement != NormPlacement::Pre)
    contradiction("layer.parallel_residual",
                  "parallel_residual adds both sublayers to the layer's input, which needs norm_placement 'pre'");
  if (cx.given("head.input_scale") && s.input_scale != 1.0 && !cx.any_failed("architecture") &&
      (s.architecture == Architecture::Encoder || !s.final_norm))
    contradiction("head.input_scale",
                  s.architecture == Architecture::Encoder
                      ? std::string("input_scale scales the decoder's output before the output projection; architecture "
                                    "'encoder' has none")
                      : std::string("input_scale is folded into the decoder's final norm: it needs layer.final_norm: true"));
  if (cx.given("layer.norm_weight_offset") && s.norm_weight_offset != 0 && !cx.any_failed("layer.norm_kind") &&
      s.norm_kind != NormKind::Rms)
    contradiction("layer.norm_weight_offset", "norm_weight_offset applies only to norm_kind 'rms'; norm_kind is '" +
                                                  std::string(name_of(s.norm_kind)) + "'");
  if (cx.given("embedding.share_src_tgt") && s.share_src_tgt) {
    if (s.architecture != Architecture::EncoderDecoder)
      contradiction("embedding.share_src_tgt",
                    "share_src_tgt needs both a source and a target embedding (architecture 'encoder_decoder'), not '" +
                        arch + "'");
    else if (cx.given("sizes.src_vocab") && cx.given("sizes.tgt_vocab") && s.src_vocab != s.tgt_vocab)
      contradiction("embedding.share_src_tgt", "share_src_tgt needs src_vocab == tgt_vocab, found " +
                                                   std::to_string(s.src_vocab) + " and " + std::to_string(s.tgt_vocab));
  }

  // tokens: ids must index the vocabularies they are looked up in
  auto bad_id = [&](const char* key, int64_t id, const char* vocab) {
    const std::string f = std::string("tokens.") + key, v = std::string("sizes.") + vocab;
    const int64_t size = std::string(vocab) == "src_vocab" ? s.src_vocab : s.tgt_vocab;
    if (cx.any_failed(f) || !cx.given(v) || size == 0 || id < size) return false;
    cx.error(cx.where(f), f,
             std::string(key) + " id " + std::to_string(id) + " is not a valid token: must be < " + vocab + " " +
                 std::to_string(size));
    return true;
  };
  if (!bad_id("pad", s.pad_id, "src_vocab")) bad_id("pad", s.pad_id, "tgt_vocab");
  const char* out_vocab = cx.given("sizes.tgt_vocab") && s.tgt_vocab > 0 ? "tgt_vocab" : "src_vocab";
  bad_id("bos", s.bos_id, out_vocab);
  bad_id("eos", s.eos_id, out_vocab);

  // decoding
  if (cx.given("sizes.max_len")) {
    if (!cx.present("decoding.max_new_tokens"))
      s.max_new_tokens = std::min(s.max_new_tokens, s.max_len);
    else if (cx.given("decoding.max_new_tokens") && s.max_new_tokens > s.max_len)
      cx.error(
          cx.where("decoding.max_new_tokens"), "decoding.max_new_tokens",
          "must be <= sizes.max_len (" + std::to_string(s.max_len) + "), found " + std::to_string(s.max_new_tokens));
  }
  if (cx.given("decoding.beam_size") && s.beam_size > 1 && !cx.any_failed("decoding.strategy") &&
      s.decoding == DecodeStrategy::Greedy)
    contradiction("decoding.beam_size",
                  "beam_size " + std::to_string(s.beam_size) + " needs strategy 'beam', but strategy is 'greedy'");

  // weights
  if (!cx.any_failed("weights.preset")) {
    if (s.preset == WeightPreset::Explicit && s.weight_map.empty() && !cx.any_failed("weights.map"))
      cx.error(cx.where("weights.map"), "weights.map",
               "preset 'explicit' needs a non-empty map of canonical weight name -> tensor name");
    if (s.preset != WeightPreset::Explicit && cx.present("weights.map"))
      contradiction("weights.map",
                    std::string("map is only used with preset 'explicit', not '") + name_of(s.preset) + "'");
  }
}

// ---------------------------------------------------------------- 6. loading
// File order; diagnostics without a line last.
void sort_by_position(std::vector<Diagnostic>& diags) {
  std::stable_sort(diags.begin(), diags.end(), [](const Diagnostic& a, const Diagnostic& b) {
    auto key = [](const Diagnostic& d) { return std::make_pair(d.line == 0 ? INT32_MAX : d.line, d.column); };
    return key(a) < key(b);
  });
}

ParseResult fail(const std::string& file, Loc at, const std::string& message) {
  ParseResult r;
  r.diagnostics.push_back({file, at.line, at.column, "", message});
  return r;
}

// Where the text stops being UTF-8 text (NUL and other control bytes count as binary).
std::optional<size_t> first_bad_byte(const std::string& t) {
  for (size_t i = 0; i < t.size();) {
    const unsigned char c = static_cast<unsigned char>(t[i]);
    if (c < 0x80) {
      if ((c < 0x20 && c != '\t' && c != '\n' && c != '\r') || c == 0x7f) return i;
      ++i;
      continue;
    }
    const size_t len = (c & 0xe0) == 0xc0 ? 2 : (c & 0xf0) == 0xe0 ? 3 : (c & 0xf8) == 0xf0 ? 4 : 0;
    if (len == 0 || c == 0xc0 || c == 0xc1 || c > 0xf4 || i + len > t.size()) return i;
    for (size_t k = 1; k < len; ++k)
      if ((static_cast<unsigned char>(t[i + k]) & 0xc0) != 0x80) return i;
    i += len;
  }
  return std::nullopt;
}

// Where the first documents of the text start (at most 3), from yaml-cpp's event parser.
// Not YAML::LoadAll: in yaml-cpp 0.7 it never returns on a stray ',' (jbeder/yaml-cpp#1040):
// the parser keeps starting empty documents at the same token. Here that is a syntax error.
class DocumentStarts : public YAML::EventHandler {
 public:
  std::vector<YAML::Mark> marks;
  void OnDocumentStart(const YAML::Mark& m) override { marks.push_back(m); }
  void OnDocumentEnd() override {}
  void OnNull(const YAML::Mark&, YAML::anchor_t) override {}
  void OnAlias(const YAML::Mark&, YAML::anchor_t) override {}
  void OnScalar(const YAML::Mark&, const std::string&, YAML::anchor_t, const std::string&) override {}
  void OnSequenceStart(const YAML::Mark&, const std::string&, YAML::anchor_t, YAML::EmitterStyle::value) override {}
  void OnSequenceEnd() override {}
  void OnMapStart(const YAML::Mark&, const std::string&, YAML::anchor_t, YAML::EmitterStyle::value) override {}
  void OnMapEnd() override {}
};

std::vector<YAML::Mark> document_starts(const std::string& text) {
  std::istringstream in(text);
  YAML::Parser parser(in);
  DocumentStarts starts;
  auto& m = starts.marks;
  while (m.size() < 3 && parser.HandleNextDocument(starts)) {
    if (m.size() >= 2 && m[m.size() - 1].pos == m[m.size() - 2].pos) {
      const size_t pos = static_cast<size_t>(m.back().pos);
      throw YAML::ParserException(m.back(), "unexpected '" + std::string(1, pos < text.size() ? text[pos] : '?') + "'");
    }
  }
  return m;
}

// yaml-cpp's message for tab indentation does not mention tabs.
std::string tab_hint(const std::string& text, const YAML::Mark& m) {
  if (m.is_null()) return "";
  size_t start = 0;
  for (int line = 0; line < m.line && start != std::string::npos; ++line) {
    start = text.find('\n', start);
    if (start != std::string::npos) ++start;
  }
  for (size_t i = start; i != std::string::npos && i < text.size() && (text[i] == ' ' || text[i] == '\t'); ++i)
    if (text[i] == '\t') return " (this line is indented with a tab; YAML allows only spaces)";
  return "";
}

ParseResult parse_root(const YAML::Node& root, const std::string& file) {
  Spec spec;
  spec.file = file;
  Context cx{file, spec, {}, {}};
  Section top(cx, root, loc_of(root.Mark()), "");

  top.require("name", "letters, digits, '_' and '-'");
  if (std::string name; top.read("name", name)) {
    const bool ok = !name.empty() && std::all_of(name.begin(), name.end(), [](char c) {
      return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-';
    });
    if (ok)
      spec.name = name;
    else
      top.error("name", "'" + name + "' is not a valid name: use only letters, digits, '_' and '-'");
  }
  top.require("architecture", "encoder_decoder, encoder or decoder");
  top.read("architecture", spec.architecture, "architecture");
  top.require("sizes", "a mapping with d_model, heads, d_ff, max_len, ...");
  if (top.has("sizes")) read_sizes(top.section("sizes"), spec);
  const bool have_sizes = top.has("sizes") && !cx.failed.count("sizes");  // present and a mapping
  read_layer(top.section("layer"), spec);
  read_embedding(top.section("embedding"), spec);
  Section attention = top.section("attention");
  attention.read("causal", spec.causal);
  attention.read("padding_mask", spec.padding_mask);
  attention.read("scaled", spec.scaled);
  read_head(top.section("head"), spec);
  Section tokens = top.section("tokens");
  tokens.read("pad", spec.pad_id, 0);
  tokens.read("bos", spec.bos_id, 0);
  tokens.read("eos", spec.eos_id, 0);
  read_decoding(top.section("decoding"), spec);
  read_weights(top.section("weights"), spec);
  top.read("precision", spec.precision, "precision");
  Section overrides = top.section("precision_overrides");
  if (overrides.has("generator")) {
    Precision p = spec.precision;
    overrides.read("generator", p, "precision");
    spec.generator_precision = p;
  }
  if (overrides.has("embeddings")) {
    Precision p = spec.precision;
    overrides.read("embeddings", p, "precision");
    spec.embedding_precision = p;
  }
  overrides.read("int16_activations", spec.int16_activations);
  if (overrides.has("kv_cache")) {
    Precision p = spec.precision;
    overrides.read("kv_cache", p, "precision");
    spec.kv_cache_precision = p;
  }
  read_targets(top, spec);
  top.read("cuda_capability", spec.cuda_capability, 50, 120);
  read_schedule(top.section("schedule", /*free_form=*/true), spec);
  read_tuning(top.section("tuning"), spec);

  check_consistency(cx, spec, have_sizes);

  ParseResult r;
  r.diagnostics = std::move(cx.diags);
  sort_by_position(r.diagnostics);
  if (r.diagnostics.empty()) r.spec = std::move(spec);
  return r;
}

}  // namespace

ParseResult parse_spec_string(const std::string& text, const std::string& file) {
  try {
    if (text.size() > kMaxFileBytes)
      return fail(file, {},
                  "file is " + std::to_string(text.size()) + " bytes; a spec is a small YAML text file (limit " +
                      std::to_string(kMaxFileBytes) + " bytes)");
    if (auto bad = first_bad_byte(text)) {
      const size_t line_start = text.rfind('\n', *bad) == std::string::npos ? 0 : text.rfind('\n', *bad) + 1;
      const int line = 1 + static_cast<int>(std::count(text.begin(), text.begin() + *bad, '\n'));
      char hex[8];
      std::snprintf(hex, sizeof hex, "0x%02x", static_cast<unsigned char>(text[*bad]));
      return fail(file, {line, static_cast<int>(*bad - line_start) + 1},
                  std::string("not a YAML text file: found byte ") + hex +
                      ", which UTF-8 YAML text cannot contain (binary file?)");
    }
    const std::vector<YAML::Mark> docs = document_starts(text);
    if (docs.size() > 1)
      return fail(file, loc_of(docs[1]), "a second YAML document starts here; a spec file holds exactly one");
    const YAML::Node root = YAML::Load(text);
    if (root.IsNull())
      return fail(file, {}, "empty spec: expected a mapping with at least 'name', 'architecture' and 'sizes'");
    if (!root.IsMap())
      return fail(
          file, loc_of(root.Mark()),
          "expected a mapping of sections (name, architecture, sizes, ...) at the top level, found " + describe(root));
    return parse_root(root, file);
  } catch (const YAML::Exception& e) {  // ParserException and the rest: syntax errors
    return fail(file, loc_of(e.mark), "YAML syntax error: " + e.msg + tab_hint(text, e.mark));
  } catch (const std::exception& e) {
    return fail(file, {}, std::string("cannot parse: ") + e.what());
  }
}

ParseResult parse_spec_file(const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::file_status st = fs::status(path, ec);
  if (!fs::exists(st)) return fail(path, {}, "cannot open spec file: no such file");
  if (fs::is_directory(st)) return fail(path, {}, "cannot read spec file: it is a directory");
  if (!fs::is_regular_file(st)) return fail(path, {}, "cannot read spec file: not a regular file");
  std::ifstream in(path, std::ios::binary);
  if (!in) return fail(path, {}, std::string("cannot open spec file: ") + std::strerror(errno));
  std::ostringstream text;
  text << in.rdbuf();
  if (in.bad()) return fail(path, {}, std::string("cannot read spec file: ") + std::strerror(errno));
  return parse_spec_string(text.str(), path);
}

// ---------------------------------------------------------------- 7. check_supported
namespace {
// The architecture a preset's files hold (nullopt: the preset is not tied to one).
std::optional<Architecture> preset_architecture(WeightPreset p) {
  switch (p) {
    case WeightPreset::HuggingfaceBert:
    case WeightPreset::HuggingfaceRoberta:
    case WeightPreset::HuggingfaceDistilbert:
    case WeightPreset::HuggingfaceElectra:
    case WeightPreset::HuggingfaceAlbert: return Architecture::Encoder;
    case WeightPreset::AnnotatedTransformer:
    case WeightPreset::HuggingfaceBart:
    case WeightPreset::HuggingfaceT5: return Architecture::EncoderDecoder;
    case WeightPreset::HuggingfaceGpt2:
    case WeightPreset::HuggingfaceLlama:
    case WeightPreset::HuggingfaceQwen2:
    case WeightPreset::HuggingfaceGptj:
    case WeightPreset::HuggingfaceGptNeox:
    case WeightPreset::HuggingfaceOpt: return Architecture::Decoder;
    case WeightPreset::TorchTransformer:
    case WeightPreset::Explicit: return std::nullopt;
  }
  return std::nullopt;
}
}  // namespace

std::vector<Diagnostic> check_supported(const Spec& s) {
  std::vector<Diagnostic> out;
  auto unsupported = [&](const std::string& field, const std::string& what) {
    const Loc at = Context::locate(s, field);
    out.push_back({s.file, at.line, at.column, field, what + " is not supported yet (planned; see docs/spec.md)"});
  };
  auto quoted = [](const char* n) { return std::string("'") + n + "'"; };
  if (s.head == HeadKind::Hidden && s.architecture != Architecture::Encoder)
    unsupported("head.kind", "head kind 'hidden' for architecture " + quoted(name_of(s.architecture)));
  if (s.decoding == DecodeStrategy::Beam && s.architecture != Architecture::EncoderDecoder)
    unsupported("decoding.strategy", "beam search for architecture " + quoted(name_of(s.architecture)));
  if (const auto family = preset_architecture(s.preset); family && s.architecture != *family)
    unsupported("weights.preset",
                "preset " + quoted(name_of(s.preset)) + " for architecture " + quoted(name_of(s.architecture)));
  if (s.preset == WeightPreset::HuggingfaceAlbert && !s.shared_weights && s.encoder_layers > 1)
    unsupported("layer.shared_weights", "false with preset 'huggingface-albert' (its files hold one layer's weights, "
                                        "which every layer runs with: set shared_weights: true)");
  if (is_gated(s.activation) && s.preset != WeightPreset::HuggingfaceLlama && s.preset != WeightPreset::HuggingfaceT5 &&
      s.preset != WeightPreset::HuggingfaceQwen2 && s.preset != WeightPreset::Explicit)
    unsupported("layer.activation", "gated activation " + quoted(name_of(s.activation)) + " with preset " +
                                         quoted(name_of(s.preset)) + " (its files have no gate projection; use "
                                         "'huggingface-llama', 'huggingface-qwen2', 'huggingface-t5' or 'explicit')");
  if (s.positions == Positions::Relative && s.preset != WeightPreset::HuggingfaceT5 &&
      s.preset != WeightPreset::Explicit)
    unsupported("embedding.positions", "positions 'relative' with preset " + quoted(name_of(s.preset)) +
                                           " (its files have no relative tables; use 'huggingface-t5' or 'explicit')");
  if (s.embedding_size != 0 && s.embedding_size != s.d_model && s.architecture != Architecture::Encoder)
    unsupported("embedding.size", "size " + std::to_string(s.embedding_size) + " != d_model " +
                                      std::to_string(s.d_model) + " (an embedding projection) for architecture " +
                                      quoted(name_of(s.architecture)) + " (encoder only)");
  if (s.shared_weights && s.architecture != Architecture::Encoder)
    unsupported("layer.shared_weights", "layers sharing one set of weights for architecture " +
                                            quoted(name_of(s.architecture)) + " (encoder only)");
  if (s.parallel_residual && s.architecture == Architecture::EncoderDecoder)
    unsupported("layer.parallel_residual", "parallel_residual in an encoder-decoder (its cross-attention)");
  if (s.kv_heads != s.heads && s.architecture == Architecture::EncoderDecoder)
    unsupported("sizes.kv_heads", "grouped-query attention (kv_heads " + std::to_string(s.kv_heads) +
                                      " != heads) in an encoder-decoder (its cross-attention)");
  // int8 kernels are CPU only (generators/linear_int8.cpp); bf16 ones run on GPUs too
  // (generators/linear.cpp: bf16 weights widened to fp32 there).
  const Precision p = Precision::Int8;
  for (Target t : s.targets)
    if ((s.precision == p || s.output_precision() == p || s.table_precision() == p) && t != Target::Host)
      unsupported("targets", std::string("precision '") + name_of(p) + "' with target '" + name_of(t) + "' (" +
                                 name_of(p) + " kernels are CPU only)");
  if (s.table_precision() == Precision::Bf16)
    unsupported("precision_overrides.embeddings", "'bf16' (embedding tables are fp32 or int8)");
  if (s.cache_precision() == Precision::Int8)
    unsupported("precision_overrides.kv_cache", "'int8' (attention caches are fp32 or bf16)");
  if (std::find(s.targets.begin(), s.targets.end(), Target::Host) == s.targets.end())
    unsupported("targets", "a target list without 'host' (the CPU build is the reference and the fallback-free default)");
  sort_by_position(out);
  return out;
}

const char* to_string(Architecture v) { return name_of(v); }
const char* to_string(NormPlacement v) { return name_of(v); }
const char* to_string(NormKind v) { return name_of(v); }
const char* to_string(Activation v) { return name_of(v); }
const char* to_string(Positions v) { return name_of(v); }
const char* to_string(HeadKind v) { return name_of(v); }
const char* to_string(Pooling v) { return name_of(v); }
const char* to_string(Pooler v) { return name_of(v); }
const char* to_string(DecodeStrategy v) { return name_of(v); }
const char* to_string(WeightPreset v) { return name_of(v); }
const char* to_string(Precision v) { return name_of(v); }
std::optional<Precision> parse_precision(const std::string& text) {
  for (const auto& [e, n] : names(Precision{}))
    if (text == n) return e;
  return std::nullopt;
}
const char* to_string(Target v) { return name_of(v); }
const char* to_string(RotaryLayout v) { return name_of(v); }

Activation gate_activation(Activation a) {
  switch (a) {
    case Activation::Swiglu: return Activation::Silu;
    case Activation::Geglu: return Activation::Gelu;
    case Activation::GegluTanh: return Activation::GeluTanh;
    default: return a;
  }
}
bool is_gated(Activation a) { return gate_activation(a) != a; }

std::string Diagnostic::str() const {
  std::string s = file;
  if (line > 0) s += ":" + std::to_string(line) + (column > 0 ? ":" + std::to_string(column) : "");
  s += ": error: ";
  if (!field.empty()) s += field + ": ";
  return s + message;
}

}  // namespace halformer
