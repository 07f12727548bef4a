// `halformer import` (importer.h): config.json + the safetensors header -> a spec.
//
// Layout of this file:
//   1. problems and config.json access (typed reads that record what is wrong)
//   2. the families: one reader per model_type, filling one Model (spec terms + comments)
//   3. the fields every config may carry that do not change the model's outputs
//   4. directory-level pieces: sentence-transformers modules, tokenizer special tokens,
//      the safetensors header
//   5. the YAML writer and import_directory()
//
// A field is accepted only when it is known: mapped to the spec, known not to change the
// outputs, or refused with the reason. An unknown field is a problem too (it may change
// the model), so that a newer config never imports as a silently different model.
#include "importer.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <sstream>
#include <tuple>

#include "halformer/error.h"
#include "halformer/safetensors.h"

namespace halformer::import {

ImportError::ImportError(std::vector<std::string> p)
    : std::runtime_error(p.empty() ? "cannot import" : p.front()), problems(std::move(p)) {}

namespace {
namespace fs = std::filesystem;
using json = nlohmann::json;

// ---------------------------------------------------------------- 1. problems, config access
struct Problems {
  std::vector<std::string> list;
  void add(const std::string& file, const std::string& field, const std::string& message) {
    list.push_back(file + ": " + (field.empty() ? "" : field + ": ") + message);
  }
};

// config.json (or a module config) with reads that record a problem for a missing field,
// a wrong type or a value out of range, and remember which fields were looked at.
class Config {
 public:
  Config(json j, std::string file, Problems& problems) : j_(std::move(j)), file_(std::move(file)), p_(problems) {}

  const std::string& file() const { return file_; }
  bool has(const std::string& k) const { return j_.contains(k) && !j_.at(k).is_null(); }
  std::string show(const std::string& k) const { return j_.contains(k) ? j_.at(k).dump() : "nothing"; }
  const json& raw() const { return j_; }
  void used(const std::string& k) { seen_.insert(k); }
  bool seen(const std::string& k) const { return seen_.count(k) > 0; }

  void problem(const std::string& k, const std::string& message) { p_.add(file_, k, message); }
  // The field holds a value the spec cannot express.
  void refuse(const std::string& k, const std::string& why) { problem(k, "found " + show(k) + "; " + why); }

  // An integer in [lo, hi]; absent: `fallback` (nullopt fallback: a problem, "required").
  std::optional<int64_t> integer(const std::string& k, std::optional<int64_t> fallback, int64_t lo = 1,
                                 int64_t hi = INT32_MAX) {
    used(k);
    if (!has(k)) {
      if (!fallback) problem(k, "missing (required: an integer)");
      return fallback;
    }
    const json& v = j_.at(k);
    if (!v.is_number_integer()) return refuse(k, "expected an integer"), std::nullopt;
    const int64_t x = v.get<int64_t>();
    if (x < lo || x > hi)
      return refuse(k, "must be between " + std::to_string(lo) + " and " + std::to_string(hi)), std::nullopt;
    return x;
  }
  std::optional<double> number(const std::string& k, std::optional<double> fallback) {
    used(k);
    if (!has(k)) {
      if (!fallback) problem(k, "missing (required: a number)");
      return fallback;
    }
    if (!j_.at(k).is_number()) return refuse(k, "expected a number"), std::nullopt;
    return j_.at(k).get<double>();
  }
  bool flag(const std::string& k, bool fallback) {
    used(k);
    if (!has(k)) return fallback;
    if (!j_.at(k).is_boolean()) return refuse(k, "expected true or false"), fallback;
    return j_.at(k).get<bool>();
  }
  std::optional<std::string> text(const std::string& k) {
    used(k);
    if (!has(k)) return std::nullopt;
    if (!j_.at(k).is_string()) return refuse(k, "expected a string"), std::nullopt;
    return j_.at(k).get<std::string>();
  }
  // A boolean that the spec can express only with the value `supported`.
  void only(const std::string& k, bool supported, const std::string& why) {
    if (flag(k, supported) != supported) refuse(k, why);
  }

 private:
  json j_;
  std::string file_;
  Problems& p_;
  std::set<std::string> seen_;
};

std::string fmt_number(double v) {
  char buf[64];
  auto [end, ec] = std::to_chars(buf, buf + sizeof buf, v);  // shortest round trip
  std::string s(buf, ec == std::errc() ? end : buf);
  // YAML 1.1 readers (PyYAML) take "1e-12" for a string: write "1.0e-12".
  if (s.find('e') != std::string::npos && s.find('.') == std::string::npos) s.insert(s.find('e'), ".0");
  if (s.find_first_of(".e") == std::string::npos) s += ".0";
  return s;
}

// ---------------------------------------------------------------- 2. families
// What the spec will say, field by field, with the comment that says where it came from.
struct Field {
  std::string value, note;
};
struct Model {
  std::string family, preset, architecture;  // architecture: "encoder" | "decoder"
  std::string hf_class;                      // architectures[0] (or the base model's class)
  // section -> key -> value (written in the order of kOrder below)
  std::map<std::string, std::map<std::string, Field>> spec;
  int64_t vocab = 0, d_model = 0;
  int64_t table_width = 0;  // the embedding table's, where not d_model (embedding.size)
  void set(const std::string& section, const std::string& key, const std::string& value, const std::string& note = "") {
    spec[section][key] = {value, note};
  }
  void set(const std::string& section, const std::string& key, int64_t value, const std::string& note = "") {
    set(section, key, std::to_string(value), note);
  }
};

// Hugging Face activation names -> the spec's.
std::optional<std::string> activation(const std::string& hf) {
  static const std::map<std::string, std::string> m = {
      {"gelu", "gelu"}, {"gelu_new", "gelu_tanh"}, {"gelu_pytorch_tanh", "gelu_tanh"}, {"relu", "relu"},
      {"silu", "silu"}, {"swish", "silu"}};
  auto it = m.find(hf);
  if (it == m.end()) return std::nullopt;
  return it->second;
}
// The gated kind whose gate takes the Hugging Face activation `hf` (Llama's hidden_act,
// T5's gated-ACT).
std::optional<std::string> gated_activation(const std::string& hf) {
  static const std::map<std::string, std::string> m = {
      {"silu", "swiglu"}, {"swish", "swiglu"}, {"gelu", "geglu"}, {"gelu_new", "geglu_tanh"},
      {"gelu_pytorch_tanh", "geglu_tanh"}};
  auto it = m.find(hf);
  if (it == m.end()) return std::nullopt;
  return it->second;
}
void read_activation(Config& c, const std::string& key, const std::string& fallback, Model& m) {
  const std::string act = c.text(key).value_or(fallback);
  if (auto a = activation(act))
    m.set("layer", "activation", *a, key + " '" + act + "'");
  else if (c.has(key))
    c.refuse(key, "supported: gelu (erf), gelu_new / gelu_pytorch_tanh (tanh approximation), relu, silu / swish");
}

// Head of a task class: classifier head (pooler + linear) or the base model's outputs.
enum class Task { Base, SequenceClassification };
struct FamilyInfo {
  const char* model_type;
  const char* preset;
  const char* architecture;
  std::map<std::string, Task> classes;  // config.json architectures[0] -> what it computes
  const char* probe;                    // a tensor name (after any prefix) every checkpoint has
  void (*read)(Config&, Model&, Task);
};

// ---- BERT and RoBERTa: one reader, RoBERTa's positions start after padding_idx.
// act_default: hidden_act where the config has none (the family's config class default).
void read_bert_like(Config& c, Model& m, bool roberta, const char* act_default = "gelu") {
  const auto d = c.integer("hidden_size", 768), h = c.integer("num_attention_heads", 12);
  const auto ff = c.integer("intermediate_size", 3072), layers = c.integer("num_hidden_layers", 12);
  const auto vocab = c.integer("vocab_size", std::nullopt), positions = c.integer("max_position_embeddings", 512);
  const auto types = c.integer("type_vocab_size", 2, 1, 1024);
  const auto eps = c.number("layer_norm_eps", 1e-12);
  const auto dropout = c.number("hidden_dropout_prob", 0.1);
  const auto pad = c.integer("pad_token_id", roberta ? 1 : 0, 0);
  if (d && h && *d % *h != 0)
    c.refuse("hidden_size", "not divisible by num_attention_heads " + std::to_string(*h));
  if (auto pet = c.text("position_embedding_type"); pet && *pet != "absolute")
    c.refuse("position_embedding_type", "only 'absolute' (a learned position table) is supported");
  c.only("is_decoder", false, "BERT as a decoder (causal self-attention) is not supported; import an encoder");
  c.only("add_cross_attention", false, "cross-attention layers in an encoder-only model are not supported");
  c.used("use_cache");  // decoder-only option
  for (const char* k : {"attention_probs_dropout_prob", "classifier_dropout", "initializer_range"}) c.used(k);
  read_activation(c, "hidden_act", act_default, m);
  if (!d || !h || !ff || !layers || !vocab || !positions || !types || !eps || !pad) return;
  m.d_model = *d, m.vocab = *vocab;
  m.set("sizes", "d_model", *d, "hidden_size");
  m.set("sizes", "heads", *h, "num_attention_heads (head size " + std::to_string(*d / *h) + ")");
  m.set("sizes", "d_ff", *ff, "intermediate_size");
  m.set("sizes", "encoder_layers", *layers, "num_hidden_layers");
  m.set("sizes", "src_vocab", *vocab, "vocab_size");
  m.set("sizes", "type_vocab", *types, "type_vocab_size (every token gets type 0)");
  if (roberta) {
    // RoBERTa numbers real tokens from padding_idx + 1 (create_position_ids_from_input_ids).
    const int64_t offset = *pad + 1;
    if (*positions <= offset) {
      c.refuse("max_position_embeddings", "RoBERTa positions start at pad_token_id + 1 = " + std::to_string(offset) +
                                              ": the table has no room for a token");
      return;
    }
    m.set("sizes", "max_len", *positions - offset,
          "max_position_embeddings " + std::to_string(*positions) + " - (pad_token_id + 1)");
    m.set("embedding", "position_offset", offset, "positions of real tokens start at pad_token_id + 1");
  } else {
    m.set("sizes", "max_len", *positions, "max_position_embeddings");
  }
  m.set("layer", "norm_placement", "post", "LayerNorm(x + sublayer(x))");
  m.set("layer", "norm_kind", "standard");
  m.set("layer", "norm_eps", fmt_number(*eps), "layer_norm_eps");
  m.set("layer", "final_norm", "false");
  if (dropout) m.set("layer", "dropout", fmt_number(*dropout), "hidden_dropout_prob; identity at inference");
  m.set("embedding", "positions", "learned", "position_embedding_type 'absolute'");
  m.set("embedding", "scale", "false");
  m.set("embedding", "norm", "true", "embeddings.LayerNorm");
  m.set("tokens", "pad", *pad, "pad_token_id");
}
void read_bert(Config& c, Model& m, Task) { read_bert_like(c, m, false); }
// ---- ELECTRA (the discriminator or generator's encoder): BERT's model when its embeddings
// are as wide as the layers; ELECTRA-small's narrower ones go through embeddings_project.
void read_electra(Config& c, Model& m, Task) {
  const auto d = c.integer("hidden_size", 768), e = c.integer("embedding_size", 128);
  // The pre-training heads' summary settings (ElectraForMultipleChoice); no class read here uses them.
  for (const char* k : {"summary_type", "summary_use_proj", "summary_activation", "summary_last_dropout"}) c.used(k);
  read_bert_like(c, m, false);
  if (d && e && *e != *d) {
    m.set("embedding", "size", std::to_string(*e),
          "embedding_size != hidden_size: tables and their LayerNorm this wide, then embeddings_project");
    m.table_width = *e;
  }
}
void read_roberta(Config& c, Model& m, Task) { read_bert_like(c, m, true); }
// ---- ALBERT: BERT's layers, every one with the same weights (albert_layer_groups.0.
// albert_layers.0), after tables embedding_size wide and embedding_hidden_mapping_in.
void read_albert(Config& c, Model& m, Task) {
  const auto d = c.integer("hidden_size", 4096), e = c.integer("embedding_size", 128);
  if (auto g = c.integer("num_hidden_groups", 1); g && *g != 1)
    c.refuse("num_hidden_groups", "only 1 (every layer shares one set of weights) is supported");
  if (auto i = c.integer("inner_group_num", 1); i && *i != 1)
    c.refuse("inner_group_num", "only 1 (one layer per group) is supported");
  c.used("classifier_dropout_prob");
  read_bert_like(c, m, false, "gelu_new");
  m.set("layer", "shared_weights", "true", "num_hidden_groups 1: albert_layer_groups.0.albert_layers.0 is every layer");
  if (d && e && *e == *d)
    c.refuse("embedding_size", "equal to hidden_size: embedding_hidden_mapping_in between tables and layers of one "
                               "width is not supported (embedding.size projects only to another width)");
  else if (d && e) {
    m.set("embedding", "size", std::to_string(*e), "embedding_size: tables and their LayerNorm this wide, then "
                                                   "embedding_hidden_mapping_in to hidden_size");
    m.table_width = *e;
  }
}

// ---- DistilBERT: BERT without token types or pooler; its LayerNorms' eps is fixed.
void read_distilbert(Config& c, Model& m, Task) {
  const auto d = c.integer("dim", 768), h = c.integer("n_heads", 12), ff = c.integer("hidden_dim", 3072);
  const auto layers = c.integer("n_layers", 6), vocab = c.integer("vocab_size", std::nullopt);
  const auto positions = c.integer("max_position_embeddings", 512);
  const auto dropout = c.number("dropout", 0.1);
  const auto pad = c.integer("pad_token_id", 0, 0);
  if (d && h && *d % *h != 0) c.refuse("dim", "not divisible by n_heads " + std::to_string(*h));
  read_activation(c, "activation", "gelu", m);
  // The table is in the file either way (sinusoidal_pos_embds fills it at initialisation).
  c.flag("sinusoidal_pos_embds", false);
  for (const char* k : {"attention_dropout", "qa_dropout", "seq_classif_dropout", "initializer_range"})
    c.used(k);
  if (!d || !h || !ff || !layers || !vocab || !positions || !pad) return;
  m.d_model = *d, m.vocab = *vocab;
  m.set("sizes", "d_model", *d, "dim");
  m.set("sizes", "heads", *h, "n_heads (head size " + std::to_string(*d / *h) + ")");
  m.set("sizes", "d_ff", *ff, "hidden_dim");
  m.set("sizes", "encoder_layers", *layers, "n_layers");
  m.set("sizes", "src_vocab", *vocab, "vocab_size");
  m.set("sizes", "max_len", *positions, "max_position_embeddings");
  m.set("layer", "norm_placement", "post", "sa_layer_norm / output_layer_norm after each sublayer");
  m.set("layer", "norm_kind", "standard");
  m.set("layer", "norm_eps", fmt_number(1e-12), "DistilBERT's LayerNorms (fixed in transformers)");
  m.set("layer", "final_norm", "false");
  if (dropout) m.set("layer", "dropout", fmt_number(*dropout), "dropout; identity at inference");
  m.set("embedding", "positions", "learned", "position_embeddings (no token types)");
  m.set("embedding", "scale", "false");
  m.set("embedding", "norm", "true", "embeddings.LayerNorm");
  m.set("tokens", "pad", *pad, "pad_token_id");
}

// What the decoder-only language models share: causal self-attention over right-padded
// prompts, logits from lm_head, greedy decoding, and their token ids. Without a pad
// token, eos stands in: padding is known by length.
void set_causal_lm(Config& c, Model& m, std::optional<int64_t> bos_default, std::optional<int64_t> eos_default) {
  m.set("attention", "causal", "true");
  m.set("attention", "padding_mask", "true");
  m.set("head", "kind", "logits", "lm_head outputs (no bias)");
  m.set("decoding", "strategy", "greedy");
  const auto bos = c.integer("bos_token_id", bos_default, 0), eos = c.integer("eos_token_id", eos_default, 0);
  const auto pad = c.has("pad_token_id") ? c.integer("pad_token_id", std::nullopt, 0) : eos;
  if (!bos || !eos || !pad) return;
  m.set("tokens", "pad", *pad,
        c.has("pad_token_id") ? "pad_token_id" : "no pad_token_id: eos_token_id (padding is by length)");
  m.set("tokens", "bos", *bos, "bos_token_id");
  m.set("tokens", "eos", *eos, "eos_token_id: generation stops there");
}

// The GPT-2 style size fields (GPT-2, GPT-J): n_embd, n_head, n_layer, vocab_size,
// n_positions, n_inner (null: 4 * n_embd), layer_norm_epsilon, resid_pdrop.
struct GptSizes {
  std::optional<int64_t> d, h, layers, vocab, positions, ff;
  std::optional<double> eps, dropout;
  bool ok() const { return d && h && layers && vocab && positions && ff && eps; }
};
GptSizes read_gpt_sizes(Config& c, int64_t d, int64_t h, int64_t layers, std::optional<int64_t> vocab,
                        int64_t positions, double dropout) {
  GptSizes g;
  g.d = c.integer("n_embd", d), g.h = c.integer("n_head", h), g.layers = c.integer("n_layer", layers);
  g.vocab = c.integer("vocab_size", vocab), g.positions = c.integer("n_positions", positions);
  g.eps = c.number("layer_norm_epsilon", 1e-5), g.dropout = c.number("resid_pdrop", dropout);
  c.used("n_inner");
  if (!c.has("n_inner"))
    g.ff = g.d ? std::optional<int64_t>(4 * *g.d) : std::nullopt;  // null: 4 * n_embd
  else
    g.ff = c.integer("n_inner", std::nullopt, 1, 1 << 20);
  if (g.d && g.h && *g.d % *g.h != 0) c.refuse("n_embd", "not divisible by n_head " + std::to_string(*g.h));
  return g;
}
// Their spec fields (g.ok()): sizes, a pre-norm LayerNorm stack with ln_f.
void set_gpt_sizes(Config& c, Model& m, const GptSizes& g, const std::string& norm_note) {
  m.d_model = *g.d, m.vocab = *g.vocab;
  m.set("sizes", "d_model", *g.d, "n_embd");
  m.set("sizes", "heads", *g.h, "n_head (head size " + std::to_string(*g.d / *g.h) + ")");
  m.set("sizes", "d_ff", *g.ff, c.has("n_inner") ? "n_inner" : "n_inner null: 4 * n_embd");
  m.set("sizes", "decoder_layers", *g.layers, "n_layer");
  m.set("sizes", "tgt_vocab", *g.vocab, "vocab_size");
  m.set("sizes", "max_len", *g.positions, "n_positions: prompt + generated tokens");
  m.set("layer", "norm_placement", "pre", norm_note);
  m.set("layer", "norm_kind", "standard");
  m.set("layer", "norm_eps", fmt_number(*g.eps), "layer_norm_epsilon");
  m.set("layer", "final_norm", "true", "ln_f");
  if (g.dropout && *g.dropout > 0)
    m.set("layer", "dropout", fmt_number(*g.dropout), "resid_pdrop; identity at inference");
}

// ---- GPT-2: decoder-only, pre-norm, final ln_f, logits from the (tied) lm_head.
void read_gpt2(Config& c, Model& m, Task) {
  const GptSizes g = read_gpt_sizes(c, 768, 12, 12, std::nullopt, 1024, 0.1);
  read_activation(c, "activation_function", "gelu_new", m);
  const bool scaled = c.flag("scale_attn_weights", true);
  c.only("scale_attn_by_inverse_layer_idx", false, "scores scaled by 1/(layer index + 1) are not supported");
  c.only("reorder_and_upcast_attn", false, "the reordered, upcast attention computation is not supported");
  c.only("add_cross_attention", false, "GPT-2 with cross-attention layers is not supported");
  const bool tied = c.flag("tie_word_embeddings", true);
  // Old configs' n_ctx is not read by transformers (n_positions sizes the model).
  for (const char* k : {"embd_pdrop", "attn_pdrop", "initializer_range", "use_cache", "n_ctx", "summary_activation",
                        "summary_first_dropout", "summary_proj_to_labels", "summary_type", "summary_use_proj"})
    c.used(k);
  if (!g.ok()) return;
  set_gpt_sizes(c, m, g, "x + sublayer(ln(x))");
  if (!scaled) m.set("attention", "scaled", "false", "scale_attn_weights false: scores q.k");
  m.set("embedding", "positions", "learned", "wpe");
  m.set("embedding", "scale", "false");
  m.set("embedding", "share_tgt_output", tied ? "true" : "false",
        tied ? "tie_word_embeddings: lm_head is wte" : "tie_word_embeddings false: lm_head.weight");
  set_causal_lm(c, m, std::nullopt, std::nullopt);  // GPT-2's ids are required
}

// ---- GPT-J: decoder-only, one LayerNorm before a parallel residual (attention and MLP
// both read ln_1(x) and add to x), rotary positions on the first rotary_dim features of
// each head in pairs (2c, 2c + 1), no attention biases, an untied lm_head with a bias.
void read_gptj(Config& c, Model& m, Task) {
  const GptSizes g = read_gpt_sizes(c, 4096, 16, 28, 50400, 2048, 0.0);
  const auto d = g.d, h = g.h;
  // rotary_dim null rotates with n_embd's frequencies, which transformers only runs with one head.
  c.used("rotary_dim");
  std::optional<int64_t> rotary;
  if (!c.has("rotary_dim"))
    c.problem("rotary_dim", "null (or missing): rotary positions over the whole width are not supported; give an even "
                            "number of features per head");
  else
    rotary = c.integer("rotary_dim", std::nullopt, 2);
  if (rotary && d && h && (*rotary % 2 != 0 || *rotary > *d / *h))
    c.refuse("rotary_dim", "must be even and at most the head size " + std::to_string(*d / *h));
  read_activation(c, "activation_function", "gelu_new", m);
  const bool tied = c.flag("tie_word_embeddings", false);
  if (tied) c.refuse("tie_word_embeddings", "GPT-J's lm_head has a bias of its own; a tied one is not supported");
  for (const char* k : {"embd_pdrop", "attn_pdrop", "initializer_range", "use_cache"}) c.used(k);
  if (!g.ok() || !rotary || tied) return;
  set_gpt_sizes(c, m, g, "ln_1 before the sublayers");
  m.set("layer", "parallel_residual", "true", "x + attn(ln_1(x)) + mlp(ln_1(x))");
  m.set("embedding", "positions", "rotary", "rotary embedding of q and k in every layer");
  m.set("embedding", "rotary_dim", *rotary, "rotary_dim: the first features of each head");
  m.set("embedding", "rotary_layout", "interleaved", "rotate_every_two: pairs (2c, 2c + 1)");
  m.set("embedding", "scale", "false");
  m.set("embedding", "share_tgt_output", "false", "lm_head.weight and lm_head.bias");
  set_causal_lm(c, m, 50256, 50256);  // GPTJConfig's
  m.set("head", "kind", "logits", "lm_head outputs (with its bias)");
}

// ---- GPT-NeoX (Pythia): decoder-only, pre-norm LayerNorms, a parallel residual (or not:
// use_parallel_residual), rotary positions on the first rotary_pct of each head (half-split
// pairs within them), biases everywhere but embed_out, untied embed_out.
void read_gpt_neox(Config& c, Model& m, Task) {
  const auto d = c.integer("hidden_size", 6144), h = c.integer("num_attention_heads", 64);
  const auto layers = c.integer("num_hidden_layers", 44), ff = c.integer("intermediate_size", 24576, 1, 1 << 20);
  const auto vocab = c.integer("vocab_size", 50432), positions = c.integer("max_position_embeddings", 2048);
  const auto eps = c.number("layer_norm_eps", 1e-5), pct = c.number("rotary_pct", 0.25);
  const auto base = c.number("rotary_emb_base", 10000.0);
  if (d && h && *d % *h != 0) c.refuse("hidden_size", "not divisible by num_attention_heads " + std::to_string(*h));
  std::optional<int64_t> rotary;  // set when rotary_pct gives a usable feature count
  if (pct && d && h) {
    // transformers: int(head_size * rotary_pct) features, rounded down
    const int64_t n = int64_t(double(*d / *h) * *pct);
    if (!(*pct > 0 && *pct <= 1) || n < 2 || n % 2 != 0)
      c.refuse("rotary_pct", "gives " + std::to_string(n) + " rotated features of the head size " +
                                 std::to_string(*d / *h) + "; the spec needs an even number >= 2");
    else
      rotary = n;
  }
  const bool base_ok = base && *base > 1;
  if (base && !base_ok) c.refuse("rotary_emb_base", "must be > 1");
  c.used("rope_scaling");
  if (c.has("rope_scaling")) c.refuse("rope_scaling", "scaled rotary positions are not supported (null only)");
  c.only("attention_bias", true, "q/k/v/o projections without biases are not what preset huggingface-gpt-neox reads");
  read_activation(c, "hidden_act", "gelu", m);
  const bool parallel = c.flag("use_parallel_residual", true);
  const bool tied = c.flag("tie_word_embeddings", false);
  if (tied) c.refuse("tie_word_embeddings", "an embed_out tied to embed_in is not supported by preset huggingface-gpt-neox");
  for (const char* k : {"initializer_range", "use_cache", "classifier_dropout", "attention_dropout", "hidden_dropout"})
    c.used(k);
  if (!d || !h || !layers || !ff || !vocab || !positions || !eps || !rotary || !base_ok || tied) return;
  m.d_model = *d, m.vocab = *vocab;
  m.set("sizes", "d_model", *d, "hidden_size");
  m.set("sizes", "heads", *h, "num_attention_heads (head size " + std::to_string(*d / *h) + ")");
  m.set("sizes", "d_ff", *ff, "intermediate_size");
  m.set("sizes", "decoder_layers", *layers, "num_hidden_layers");
  m.set("sizes", "tgt_vocab", *vocab, "vocab_size");
  m.set("sizes", "max_len", *positions, "max_position_embeddings: prompt + generated tokens");
  m.set("layer", "norm_placement", "pre", "input_layernorm / post_attention_layernorm before the sublayers");
  m.set("layer", "norm_kind", "standard");
  m.set("layer", "norm_eps", fmt_number(*eps), "layer_norm_eps");
  m.set("layer", "final_norm", "true", "final_layer_norm");
  m.set("layer", "parallel_residual", parallel ? "true" : "false",
        parallel ? "use_parallel_residual: x + attn(ln1(x)) + mlp(ln2(x))" : "use_parallel_residual false");
  m.set("embedding", "positions", "rotary", "rotary embedding of q and k in every layer");
  m.set("embedding", "rotary_dim", *rotary, "int(head size x rotary_pct " + fmt_number(*pct) + ")");
  m.set("embedding", "rotary_theta", fmt_number(*base), "rotary_emb_base");
  m.set("embedding", "rotary_layout", "half", "rotate_half within the rotated features");
  m.set("embedding", "scale", "false");
  m.set("embedding", "share_tgt_output", "false", "embed_out.weight");
  set_causal_lm(c, m, 0, 2);  // GPTNeoXConfig's
}

// ---- OPT: decoder-only, pre-norm (do_layer_norm_before; false: post-norm without a final
// norm, OPT-350m), learned positions from row 2 on, ReLU, biases everywhere, lm_head tied
// to embed_tokens. A word_embed_proj_dim other than hidden_size (project_in / project_out)
// is refused.
void read_opt(Config& c, Model& m, Task) {
  const auto d = c.integer("hidden_size", 768), h = c.integer("num_attention_heads", 12);
  const auto layers = c.integer("num_hidden_layers", 12), ff = c.integer("ffn_dim", 3072, 1, 1 << 20);
  const auto vocab = c.integer("vocab_size", 50272), positions = c.integer("max_position_embeddings", 2048);
  const auto dropout = c.number("dropout", 0.1);
  if (d && h && *d % *h != 0) c.refuse("hidden_size", "not divisible by num_attention_heads " + std::to_string(*h));
  if (c.has("word_embed_proj_dim") && d) {
    const auto proj = c.integer("word_embed_proj_dim", std::nullopt);
    if (proj && *proj != *d)
      c.refuse("word_embed_proj_dim", "differs from hidden_size " + std::to_string(*d) +
                                          ": embeddings projected in and out (project_in / project_out) are not supported");
  }
  c.used("word_embed_proj_dim");
  const bool pre = c.flag("do_layer_norm_before", true), removed = c.flag("_remove_final_layer_norm", false);
  c.only("enable_bias", true, "linears without biases are not what preset huggingface-opt reads");
  c.only("layer_norm_elementwise_affine", true, "LayerNorms without weight and bias are not supported");
  read_activation(c, "activation_function", "relu", m);
  const bool tied = c.flag("tie_word_embeddings", true);
  for (const char* k : {"attention_dropout", "layerdrop", "init_std", "use_cache"}) c.used(k);
  if (!d || !h || !layers || !ff || !vocab || !positions) return;
  m.d_model = *d, m.vocab = *vocab;
  m.set("sizes", "d_model", *d, "hidden_size");
  m.set("sizes", "heads", *h, "num_attention_heads (head size " + std::to_string(*d / *h) + ")");
  m.set("sizes", "d_ff", *ff, "ffn_dim");
  m.set("sizes", "decoder_layers", *layers, "num_hidden_layers");
  m.set("sizes", "tgt_vocab", *vocab, "vocab_size");
  m.set("sizes", "max_len", *positions, "max_position_embeddings (the table has 2 more rows)");
  m.set("layer", "norm_placement", pre ? "pre" : "post", pre ? "do_layer_norm_before" : "do_layer_norm_before false");
  m.set("layer", "norm_kind", "standard");
  m.set("layer", "norm_eps", fmt_number(1e-5), "OPT's LayerNorms (torch's default; not in config.json)");
  m.set("layer", "final_norm", pre && !removed ? "true" : "false",
        pre && !removed ? "decoder.final_layer_norm" : "no final_layer_norm after a post-norm stack");
  if (dropout && *dropout > 0) m.set("layer", "dropout", fmt_number(*dropout), "dropout; identity at inference");
  m.set("embedding", "positions", "learned", "embed_positions");
  m.set("embedding", "position_offset", 2, "OPTLearnedPositionalEmbedding's offset");
  m.set("embedding", "scale", "false");
  m.set("embedding", "share_tgt_output", tied ? "true" : "false",
        tied ? "tie_word_embeddings: lm_head is embed_tokens" : "lm_head.weight");
  set_causal_lm(c, m, 2, 2);  // OPTConfig's
}

// ---- Llama: decoder-only, pre-norm RMSNorm, rotary positions (half-split), gated MLP,
// grouped-query attention, no biases; logits from lm_head (embed_tokens when tied).
// Mistral: the same model and names, with sliding-window attention; Qwen2: the same with
// biases on q, k and v (preset huggingface-qwen2), its window optional. A window W
// shorter than the positions caps max_len at W: up to W tokens every key is in every
// query's window, so the model computes what full attention computes; longer sequences
// are refused by the binary (by length), never attended differently. Gemma (1): Llama's
// names with embeddings scaled by sqrt(hidden_size), RMSNorm scaling by 1 + weight, the
// tanh GeGLU, a tied lm_head.
enum class LlamaKind { Llama, Mistral, Qwen2, Gemma };
void read_llama_like(Config& c, Model& m, LlamaKind kind) {
  // The config classes' defaults (LlamaConfig, MistralConfig, Qwen2Config, GemmaConfig).
  const bool mistral = kind == LlamaKind::Mistral, qwen2 = kind == LlamaKind::Qwen2, gemma = kind == LlamaKind::Gemma;
  const int64_t d_default = gemma ? 3072 : 4096, ff_default = mistral ? 14336 : qwen2 ? 22016 : gemma ? 24576 : 11008;
  const int64_t vocab_default = qwen2 ? 151936 : gemma ? 256000 : 32000;
  const int64_t pos_default = mistral ? 4096 * 32 : qwen2 ? 32768 : gemma ? 8192 : 2048;
  const auto d = c.integer("hidden_size", d_default), h = c.integer("num_attention_heads", gemma ? 16 : 32);
  const auto layers = c.integer("num_hidden_layers", gemma ? 28 : 32);
  const auto ff = c.integer("intermediate_size", ff_default, 1, 1 << 20);
  const auto vocab = c.integer("vocab_size", vocab_default), positions = c.integer("max_position_embeddings", pos_default);
  const auto kvh = c.integer("num_key_value_heads", mistral ? std::optional<int64_t>(8) : h, 1, 1024);
  const auto eps = c.number("rms_norm_eps", 1e-6), theta = c.number("rope_theta", 10000.0);
  if (d && h && *d % *h != 0) c.refuse("hidden_size", "not divisible by num_attention_heads " + std::to_string(*h));
  if (h && kvh && *h % *kvh != 0)
    c.refuse("num_key_value_heads", "does not divide num_attention_heads " + std::to_string(*h));
  if ((c.has("head_dim") || gemma) && d && h) {  // GemmaConfig's head_dim defaults to 256
    const auto hd = c.integer("head_dim", gemma ? std::optional<int64_t>(256) : std::nullopt);
    if (hd && *hd != *d / *h)
      c.refuse("head_dim", "differs from hidden_size / num_attention_heads = " + std::to_string(*d / *h) +
                               "; the spec's head size is d_model / heads");
  }
  c.used("rope_scaling");
  if (c.has("rope_scaling")) c.refuse("rope_scaling", "scaled rotary positions are not supported (null only)");
  if (theta && !(*theta > 1)) c.refuse("rope_theta", "must be > 1");
  if (!qwen2) {
    c.only("attention_bias", false, "q/k/v/o projections with biases are not supported by preset huggingface-llama");
    c.only("mlp_bias", false, "MLP projections with biases are not supported by preset huggingface-llama");
  }
  // The attention window (Mistral: sliding_window, null for none; Qwen2: only with
  // use_sliding_window, in the layers from max_window_layers on).
  // Newer configs also list each layer's kind (layer_types): any sliding layer means a window.
  std::optional<int64_t> window;
  bool windowed = mistral || (qwen2 && c.flag("use_sliding_window", false));
  c.used("layer_types");
  if (c.has("layer_types")) {
    const json& types = c.raw().at("layer_types");
    bool ok = types.is_array();
    for (const auto& t : ok ? types : json::array()) {
      ok = ok && t.is_string() && (t == "full_attention" || t == "sliding_attention");
      windowed = windowed || (ok && t == "sliding_attention");
    }
    if (!ok) c.refuse("layer_types", "expected a list of \"full_attention\" / \"sliding_attention\"");
  }
  // Qwen2 slides only in the layers from max_window_layers on (transformers' layer_types).
  if (qwen2 && windowed && !c.has("layer_types")) {
    const auto from = c.integer("max_window_layers", 28, 0);
    if (from && layers && *from >= *layers) windowed = false;
  }
  if (qwen2) c.used("max_window_layers");
  if (mistral || qwen2) {
    c.used("sliding_window");
    if (windowed && c.has("sliding_window")) window = c.integer("sliding_window", std::nullopt);
  }
  // Gated MLP: act(gate_proj x) * up_proj x. Gemma: hidden_activation, and where it is
  // null transformers uses the tanh approximation whatever hidden_act says.
  std::string act = c.text("hidden_act").value_or(gemma ? "gelu_pytorch_tanh" : "silu");
  std::string act_key = "hidden_act";
  if (gemma) {
    const auto hidden_activation = c.text("hidden_activation");
    act = hidden_activation.value_or("gelu_pytorch_tanh");
    act_key = hidden_activation ? "hidden_activation" : "hidden_activation null (hidden_act ignored)";
  }
  if (auto g = gated_activation(act))
    m.set("layer", "activation", *g, act_key + " '" + act + "': act(gate_proj x) * up_proj x");
  else
    c.refuse(gemma ? "hidden_activation" : "hidden_act",  // the field the activation came from
             "supported for the gated MLP: silu / swish (SwiGLU), gelu, gelu_new / gelu_pytorch_tanh (GeGLU)");
  const bool tied = c.flag("tie_word_embeddings", gemma);
  // Tensor parallel slices of pretraining (pretraining_tp) compute the same products.
  for (const char* k : {"initializer_range", "use_cache", "pretraining_tp", "attention_dropout"}) c.used(k);
  if (!d || !h || !layers || !vocab || !positions || !eps || !ff || !kvh || !theta) return;
  if (windowed && !window && c.has("sliding_window")) return;  // a bad sliding_window: reported
  m.d_model = *d, m.vocab = *vocab;
  m.set("sizes", "d_model", *d, "hidden_size");
  m.set("sizes", "heads", *h, "num_attention_heads (head size " + std::to_string(*d / *h) + ")");
  m.set("sizes", "kv_heads", *kvh,
        c.has("num_key_value_heads") ? "num_key_value_heads" : "no num_key_value_heads: one per query head");
  m.set("sizes", "d_ff", *ff, "intermediate_size");
  m.set("sizes", "decoder_layers", *layers, "num_hidden_layers");
  m.set("sizes", "tgt_vocab", *vocab, "vocab_size");
  if (window && *window < *positions)
    m.set("sizes", "max_len", *window,
          "sliding_window (max_position_embeddings " + std::to_string(*positions) +
              "): within the window attention is full; prompt + generated tokens");
  else
    m.set("sizes", "max_len", *positions, "max_position_embeddings: prompt + generated tokens");
  m.set("layer", "norm_placement", "pre", "x + sublayer(rmsnorm(x))");
  m.set("layer", "norm_kind", "rms", gemma ? "GemmaRMSNorm" : "LlamaRMSNorm");
  m.set("layer", "norm_eps", fmt_number(*eps), "rms_norm_eps");
  if (gemma) m.set("layer", "norm_weight_offset", "1.0", "GemmaRMSNorm scales by 1 + weight");
  m.set("layer", "final_norm", "true", "model.norm");
  m.set("embedding", "positions", "rotary", "rotary embedding of q and k in every layer");
  m.set("embedding", "rotary_theta", fmt_number(*theta), c.has("rope_theta") ? "rope_theta" : "rope_theta default");
  m.set("embedding", "rotary_layout", "half", "rotate_half: pairs (c, c + head size / 2)");
  m.set("embedding", "scale", gemma ? "true" : "false", gemma ? "Gemma: embeddings times sqrt(hidden_size)" : "");
  m.set("embedding", "share_tgt_output", tied ? "true" : "false",
        tied ? "tie_word_embeddings: lm_head is embed_tokens" : "lm_head.weight");
  if (qwen2)
    set_causal_lm(c, m, std::nullopt, std::nullopt);  // Qwen2Config has no default ids
  else if (gemma)
    set_causal_lm(c, m, 2, 1);  // GemmaConfig's (pad 0 below)
  else
    set_causal_lm(c, m, 1, 2);  // LlamaConfig's and MistralConfig's
}
void read_llama(Config& c, Model& m, Task) { read_llama_like(c, m, LlamaKind::Llama); }
void read_mistral(Config& c, Model& m, Task) { read_llama_like(c, m, LlamaKind::Mistral); }
void read_qwen2(Config& c, Model& m, Task) { read_llama_like(c, m, LlamaKind::Qwen2); }
void read_gemma(Config& c, Model& m, Task) { read_llama_like(c, m, LlamaKind::Gemma); }

// ---- BART: an encoder-decoder, post-norm, one shared embedding (tied lm_head), learned
// positions offset by 2 per stack, layernorm_embedding per stack, final_logits_bias.
// Marian: the same modules and names, but sinusoidal positions in its half-split layout
// (not in the file), no layernorm_embedding, swish, the decoder starting with pad.
// mBART: BART's modules and names, pre-norm layers and a LayerNorm after each stack
// (encoder/decoder.layer_norm); the decoder starts with decoder_start_token_id, else bos.
void read_bart_like(Config& c, Model& m, bool marian, bool mbart = false) {
  const auto d = c.integer("d_model", 1024), vocab = c.integer("vocab_size", std::nullopt);
  const auto eh = c.integer("encoder_attention_heads", 16), dh = c.integer("decoder_attention_heads", 16);
  const auto ef = c.integer("encoder_ffn_dim", 4096), df = c.integer("decoder_ffn_dim", 4096);
  const auto el = c.integer("encoder_layers", 12), dl = c.integer("decoder_layers", 12);
  const auto positions = c.integer("max_position_embeddings", 1024);
  const auto dropout = c.number("dropout", 0.1);
  const bool scale = c.flag("scale_embedding", false);
  if (eh && dh && *eh != *dh)
    c.refuse("decoder_attention_heads", "differs from encoder_attention_heads " + std::to_string(*eh) +
                                            "; the spec has one head count for both stacks");
  if (ef && df && *ef != *df)
    c.refuse("decoder_ffn_dim", "differs from encoder_ffn_dim " + std::to_string(*ef) +
                                    "; the spec has one d_ff for both stacks");
  if (d && eh && *d % *eh != 0) c.refuse("d_model", "not divisible by encoder_attention_heads " + std::to_string(*eh));
  const std::string family = marian ? "Marian" : mbart ? "mBART" : "BART";
  read_activation(c, "activation_function", "gelu", m);
  c.only("is_encoder_decoder", true, family + " is an encoder-decoder");
  c.only("tie_word_embeddings", true, "an lm_head separate from the shared embedding is not supported");
  // Fields of older configs that transformers 4.30's BART / Marian no longer read: accepted
  // at the values that describe the model transformers builds, refused otherwise.
  c.only("add_bias_logits", false, "transformers ignores it; a checkpoint that needs it is not " + family);
  c.only("add_final_layer_norm", mbart,
         mbart ? "mBART has a LayerNorm after each stack" : "a LayerNorm after each stack (mBART) is not what " + family + " computes");
  c.only("normalize_before", mbart,
         mbart ? "mBART's layers are pre-norm" : "pre-norm layers (mBART) are not what " + family + " computes");
  c.only("normalize_embedding", !marian,
         marian ? "Marian has no layernorm_embedding" : "BART always applies layernorm_embedding");
  c.only("static_position_embeddings", marian,
         marian ? "Marian's positions are sinusoidal" : "sinusoidal positions are not what BART computes");
  if (marian) {
    c.only("share_encoder_decoder_embeddings", true,
           "separate source and target embeddings (encoder/decoder.embed_tokens) are not supported");
    if (auto dv = c.integer("decoder_vocab_size", std::nullopt, 1); dv && vocab && *dv != *vocab)
      c.refuse("decoder_vocab_size", "differs from vocab_size " + std::to_string(*vocab) +
                                         "; only one shared vocabulary is supported");
    // Marian's decoder starts with decoder_start_token_id; bos_token_id and
    // extra_pos_embeddings are not read by transformers' MarianMTModel.
    for (const char* k : {"bos_token_id", "extra_pos_embeddings"}) c.used(k);
  }
  // num_hidden_layers is encoder_layers (an alias); layerdrop is training only.
  for (const char* k : {"num_hidden_layers", "encoder_layerdrop", "decoder_layerdrop", "attention_dropout",
                        "activation_dropout", "init_std", "classifier_dropout", "use_cache", "classif_dropout"})
    c.used(k);
  const auto pad = c.integer("pad_token_id", marian ? std::optional<int64_t>() : 1, 0);
  const auto eos = c.integer("eos_token_id", marian ? 0 : 2, 0);
  // generate() starts with decoder_start_token_id, else (mBART) bos_token_id.
  const auto bos = mbart ? c.integer("bos_token_id", 0, 0) : std::optional<int64_t>(0);
  const auto start = c.integer("decoder_start_token_id", marian ? pad : mbart ? bos : std::optional<int64_t>(2), 0);
  if (!d || !eh || !ef || !el || !dl || !vocab || !positions || !pad || !eos || !start) return;
  m.d_model = *d, m.vocab = *vocab;
  m.set("sizes", "d_model", *d, "d_model");
  m.set("sizes", "heads", *eh, "encoder/decoder_attention_heads (head size " + std::to_string(*d / *eh) + ")");
  m.set("sizes", "d_ff", *ef, "encoder/decoder_ffn_dim");
  m.set("sizes", "encoder_layers", *el, "encoder_layers");
  m.set("sizes", "decoder_layers", *dl, "decoder_layers");
  m.set("sizes", "src_vocab", *vocab, "vocab_size");
  m.set("sizes", "tgt_vocab", *vocab, "vocab_size (one shared table)");
  m.set("sizes", "max_len", *positions, "max_position_embeddings (each stack's table has 2 more rows)");
  m.set("layer", "norm_placement", mbart ? "pre" : "post", mbart ? "x + sublayer(LayerNorm(x))" : "LayerNorm(x + sublayer(x))");
  m.set("layer", "norm_kind", "standard");
  m.set("layer", "norm_eps", fmt_number(1e-5), family + "'s LayerNorms (torch's default; not in config.json)");
  m.set("layer", "final_norm", mbart ? "true" : "false", mbart ? "encoder/decoder.layer_norm" : "");
  if (dropout) m.set("layer", "dropout", fmt_number(*dropout), "dropout; identity at inference");
  if (marian) {
    m.set("embedding", "positions", "sinusoidal_split", "MarianSinusoidalPositionalEmbedding: sin half, cos half");
  } else {
    m.set("embedding", "positions", "learned", "encoder/decoder.embed_positions, one table per stack");
    m.set("embedding", "position_offset", 2, "the learned positional embedding's offset");
  }
  m.set("embedding", "scale", scale ? "true" : "false", "scale_embedding: times sqrt(d_model)");
  m.set("embedding", "share_src_tgt", "true", "model.shared");
  m.set("embedding", "share_tgt_output", "true", "lm_head is model.shared; final_logits_bias its bias");
  if (marian)
    m.set("embedding", "norm", "false", "no layernorm_embedding");
  else
    m.set("embedding", "norm", "true", "encoder/decoder.layernorm_embedding, one per stack");
  m.set("attention", "causal", "true", "decoder self-attention");
  m.set("attention", "padding_mask", "true", "padding known by length, like an attention mask");
  m.set("head", "kind", "logits", "lm_head(x) + final_logits_bias");
  m.set("decoding", "strategy", "greedy");
  m.set("tokens", "pad", *pad, "pad_token_id");
  m.set("tokens", "bos", *start,
        c.has("decoder_start_token_id") || !mbart ? "decoder_start_token_id: the decoder's first token"
                                                   : "no decoder_start_token_id: bos_token_id starts the decoder");
  m.set("tokens", "eos", *eos, "eos_token_id: generation stops there");
}
void read_bart(Config& c, Model& m, Task) { read_bart_like(c, m, false); }
void read_mbart(Config& c, Model& m, Task) { read_bart_like(c, m, false, true); }
void read_marian(Config& c, Model& m, Task) { read_bart_like(c, m, true); }

// ---- T5 (and mT5): an encoder-decoder, pre-norm RMSNorm (T5LayerNorm) with a final norm
// per stack, relative position buckets (a table per stack, in block 0), unscaled
// attention, no biases, one shared embedding; relu or gated ("gated-gelu") feed-forward.
// Tied embeddings: lm_head is `shared` and the decoder output is scaled by d_model^-0.5.
void read_t5(Config& c, Model& m, Task) {
  const auto d = c.integer("d_model", 512), kv = c.integer("d_kv", 64), ff = c.integer("d_ff", 2048);
  const auto h = c.integer("num_heads", 8), el = c.integer("num_layers", 6);
  const auto dl = c.has("num_decoder_layers") ? c.integer("num_decoder_layers", std::nullopt) : el;
  c.used("num_decoder_layers");
  const auto vocab = c.integer("vocab_size", 32128);
  const auto buckets = c.integer("relative_attention_num_buckets", 32, 4, 1024);
  const auto distance = c.integer("relative_attention_max_distance", 128);
  const auto positions = c.integer("n_positions", 512);
  const auto eps = c.number("layer_norm_epsilon", 1e-6), dropout = c.number("dropout_rate", 0.1);
  if (d && h && kv && *h * *kv != *d)
    c.refuse("d_kv", "num_heads x d_kv = " + std::to_string(*h * *kv) + " differs from d_model " + std::to_string(*d) +
                         "; the spec's attention width is d_model (head size d_model / heads)");
  if (buckets && distance && *distance <= *buckets / 2)
    c.refuse("relative_attention_max_distance",
             "must exceed relative_attention_num_buckets / 2 = " + std::to_string(*buckets / 2));
  c.only("is_encoder_decoder", true, "T5 is an encoder-decoder (T5EncoderModel is not supported)");
  // feed_forward_proj: "ACT" (wi, wo) or "gated-ACT" (act(wi_0 x) * wi_1 x, then wo);
  // transformers stores what it derives from it as dense_act_fn / is_gated_act.
  const std::string proj = c.text("feed_forward_proj").value_or("relu");
  const bool gated = proj.rfind("gated-", 0) == 0;
  const std::string act = gated ? proj.substr(6) : proj;
  // transformers maps "gated-gelu" to gelu_new (tanh).
  const std::string dense_act = proj == "gated-gelu" ? "gelu_new" : act;
  if (gated) {
    if (auto g = gated_activation(dense_act))
      m.set("layer", "activation", *g, "feed_forward_proj '" + proj + "': act(wi_0 x) * wi_1 x, then wo");
    else
      c.refuse("feed_forward_proj", "supported: relu, gelu, gelu_new, silu, gated-gelu, gated-gelu_new, gated-silu");
  } else if (auto a = activation(act)) {
    m.set("layer", "activation", *a, "feed_forward_proj '" + proj + "': wo(act(wi x))");
  } else {
    c.refuse("feed_forward_proj", "supported: relu, gelu, gelu_new, silu, gated-gelu, gated-gelu_new, gated-silu");
  }
  if (auto fn = c.text("dense_act_fn"); fn && *fn != dense_act)
    c.refuse("dense_act_fn", "differs from what feed_forward_proj '" + proj + "' gives ('" + dense_act + "')");
  if (c.has("is_gated_act") && c.flag("is_gated_act", gated) != gated)
    c.refuse("is_gated_act", "differs from feed_forward_proj '" + proj + "'");
  c.used("is_gated_act");
  const bool tied = c.flag("tie_word_embeddings", m.family != "mt5");  // MT5Config's default: untied
  for (const char* k : {"initializer_factor", "use_cache", "classifier_dropout"}) c.used(k);
  const auto pad = c.integer("pad_token_id", 0, 0), eos = c.integer("eos_token_id", 1, 0);
  const auto start = c.integer("decoder_start_token_id", pad, 0);
  if (!d || !kv || !ff || !h || !el || !dl || !vocab || !buckets || !distance || !positions || !eps || !pad || !eos ||
      !start)
    return;
  m.d_model = *d, m.vocab = *vocab;
  m.set("sizes", "d_model", *d, "d_model");
  m.set("sizes", "heads", *h, "num_heads (head size d_kv " + std::to_string(*kv) + ")");
  m.set("sizes", "d_ff", *ff, "d_ff");
  m.set("sizes", "encoder_layers", *el, "num_layers");
  m.set("sizes", "decoder_layers", *dl, c.has("num_decoder_layers") ? "num_decoder_layers" : "num_layers");
  m.set("sizes", "src_vocab", *vocab, "vocab_size");
  m.set("sizes", "tgt_vocab", *vocab, "vocab_size (one shared table)");
  m.set("sizes", "max_len", *positions,
        c.has("n_positions") ? "n_positions (relative positions have no table limit)"
                             : "no n_positions: 512 (relative positions have no table limit)");
  m.set("layer", "norm_placement", "pre", "x + sublayer(layer_norm(x))");
  m.set("layer", "norm_kind", "rms", "T5LayerNorm: no centring, no bias");
  m.set("layer", "norm_eps", fmt_number(*eps), "layer_norm_epsilon");
  m.set("layer", "final_norm", "true", "encoder/decoder.final_layer_norm");
  if (dropout) m.set("layer", "dropout", fmt_number(*dropout), "dropout_rate; identity at inference");
  m.set("embedding", "positions", "relative", "relative_attention_bias of block 0, shared by the stack's layers");
  m.set("embedding", "relative_buckets", *buckets, "relative_attention_num_buckets");
  m.set("embedding", "relative_distance", *distance, "relative_attention_max_distance");
  m.set("embedding", "scale", "false");
  m.set("embedding", "share_src_tgt", "true", "shared");
  m.set("embedding", "share_tgt_output", tied ? "true" : "false",
        tied ? "tie_word_embeddings: lm_head is shared" : "tie_word_embeddings false: lm_head.weight");
  m.set("attention", "causal", "true", "decoder self-attention");
  m.set("attention", "padding_mask", "true", "padding known by length, like an attention mask");
  m.set("attention", "scaled", "false", "T5 does not scale scores by 1/sqrt(head size)");
  m.set("head", "kind", "logits", "lm_head (no bias)");
  if (tied) {
    char buf[64];
    std::snprintf(buf, sizeof buf, "%.17g", 1.0 / std::sqrt(double(*d)));
    m.set("head", "input_scale", buf, "tied embeddings: the decoder output times d_model^-0.5");
  }
  m.set("decoding", "strategy", "greedy");
  m.set("tokens", "pad", *pad, "pad_token_id");
  m.set("tokens", "bos", *start, "decoder_start_token_id: the decoder's first token");
  m.set("tokens", "eos", *eos, "eos_token_id: generation stops there");
}

const std::vector<FamilyInfo>& families() {
  static const std::vector<FamilyInfo> f = {
      {"bert", "huggingface-bert", "encoder",
       {{"BertModel", Task::Base}, {"BertForSequenceClassification", Task::SequenceClassification}},
       "embeddings.word_embeddings.weight", read_bert},
      {"roberta", "huggingface-roberta", "encoder",
       {{"RobertaModel", Task::Base}, {"RobertaForSequenceClassification", Task::SequenceClassification}},
       "embeddings.word_embeddings.weight", read_roberta},
      // XLM-RoBERTa: RoBERTa's model and names (its own model_type and classes).
      {"xlm-roberta", "huggingface-roberta", "encoder",
       {{"XLMRobertaModel", Task::Base}, {"XLMRobertaForSequenceClassification", Task::SequenceClassification}},
       "embeddings.word_embeddings.weight", read_roberta},
      {"electra", "huggingface-electra", "encoder",
       {{"ElectraModel", Task::Base}, {"ElectraForSequenceClassification", Task::SequenceClassification}},
       "embeddings.word_embeddings.weight", read_electra},
      {"albert", "huggingface-albert", "encoder",
       {{"AlbertModel", Task::Base}, {"AlbertForSequenceClassification", Task::SequenceClassification}},
       "embeddings.word_embeddings.weight", read_albert},
      {"distilbert", "huggingface-distilbert", "encoder", {{"DistilBertModel", Task::Base}},
       "embeddings.word_embeddings.weight", read_distilbert},
      {"gpt2", "huggingface-gpt2", "decoder", {{"GPT2LMHeadModel", Task::Base}}, "wte.weight", read_gpt2},
      {"gptj", "huggingface-gptj", "decoder", {{"GPTJForCausalLM", Task::Base}}, "wte.weight", read_gptj},
      {"opt", "huggingface-opt", "decoder", {{"OPTForCausalLM", Task::Base}}, "embed_tokens.weight", read_opt},
      {"gpt_neox", "huggingface-gpt-neox", "decoder", {{"GPTNeoXForCausalLM", Task::Base}}, "embed_in.weight",
       read_gpt_neox},
      {"llama", "huggingface-llama", "decoder", {{"LlamaForCausalLM", Task::Base}}, "embed_tokens.weight",
       read_llama},
      {"mistral", "huggingface-llama", "decoder", {{"MistralForCausalLM", Task::Base}}, "embed_tokens.weight",
       read_mistral},
      {"qwen2", "huggingface-qwen2", "decoder", {{"Qwen2ForCausalLM", Task::Base}}, "embed_tokens.weight",
       read_qwen2},
      {"gemma", "huggingface-llama", "decoder", {{"GemmaForCausalLM", Task::Base}}, "embed_tokens.weight",
       read_gemma},
      {"bart", "huggingface-bart", "encoder_decoder", {{"BartForConditionalGeneration", Task::Base}}, "shared.weight",
       read_bart},
      {"marian", "huggingface-bart", "encoder_decoder", {{"MarianMTModel", Task::Base}}, "shared.weight", read_marian},
      {"mbart", "huggingface-bart", "encoder_decoder", {{"MBartForConditionalGeneration", Task::Base}}, "shared.weight",
       read_mbart},
      // T5WithLMHeadModel: the class's old name, still in the original t5-small ... t5-11b configs.
      {"t5", "huggingface-t5", "encoder_decoder",
       {{"T5ForConditionalGeneration", Task::Base}, {"T5WithLMHeadModel", Task::Base}}, "shared.weight", read_t5},
      {"mt5", "huggingface-t5", "encoder_decoder", {{"MT5ForConditionalGeneration", Task::Base}}, "shared.weight",
       read_t5},
  };
  return f;
}

// Families Hugging Face has that the spec language cannot express yet (issue 15).
const std::map<std::string, std::string>& planned() {
  static const std::map<std::string, std::string> p = {
      {"gemma2", "logit soft-capping, sliding-window layers, a query scale of its own"},
  };
  return p;
}

// ---------------------------------------------------------------- 3. fields that do not change the outputs
// PretrainedConfig's own fields (transformers 4.30) and metadata. Generation defaults are
// listed too: they set Hugging Face's generate() defaults, not the model; halformer's
// decoding comes from the spec and the binary's options.
const std::set<std::string>& harmless() {
  static const std::set<std::string> s = {
      "_name_or_path", "_commit_hash", "architectures", "model_type", "transformers_version", "torch_dtype",
      "id2label", "label2id", "num_labels", "problem_type", "finetuning_task", "tokenizer_class", "prefix",
      "task_specific_params", "output_attentions", "output_hidden_states", "output_scores", "return_dict",
      "return_dict_in_generate", "torchscript", "use_bfloat16", "tf_legacy_loss", "chunk_size_feed_forward",
      "tie_encoder_decoder", "cross_attention_hidden_size", "decoder_start_token_id", "sep_token_id",
      "gradient_checkpointing", "output_past",
      // generation defaults
      "bad_words_ids", "begin_suppress_tokens", "diversity_penalty", "do_sample", "early_stopping",
      "encoder_no_repeat_ngram_size", "exponential_decay_length_penalty", "forced_bos_token_id",
      "forced_eos_token_id", "length_penalty", "max_length", "min_length", "no_repeat_ngram_size",
      "num_beam_groups", "num_beams", "num_return_sequences", "remove_invalid_values", "repetition_penalty",
      "suppress_tokens", "temperature", "top_k", "top_p", "typical_p"};
  return s;
}

// ---------------------------------------------------------------- 4. directory pieces
std::optional<json> read_json(const fs::path& p, Problems& pr, std::vector<std::string>& inputs) {
  std::ifstream in(p, std::ios::binary);
  if (!in) {
    pr.add(p.string(), "", "cannot open");
    return std::nullopt;
  }
  inputs.push_back(p.string());
  try {
    return json::parse(in);
  } catch (const json::exception& e) {
    pr.add(p.string(), "", std::string("not valid JSON: ") + e.what());
    return std::nullopt;
  }
}

// sentence-transformers: modules.json names a Transformer (the model's directory), then
// Pooling (1_Pooling/config.json) and optionally Normalize. Fills the head.
struct SentenceTransformer {
  fs::path model_dir;
  std::string note;
};
std::optional<SentenceTransformer> read_modules(const fs::path& dir, Model& m, Problems& pr,
                                                std::vector<std::string>& inputs) {
  const fs::path file = dir / "modules.json";
  auto modules = read_json(file, pr, inputs);
  if (!modules) return std::nullopt;
  if (!modules->is_array() || modules->empty()) {
    pr.add(file.string(), "", "expected a list of modules");
    return std::nullopt;
  }
  SentenceTransformer st{dir, ""};
  bool transformer = false, pooling = false, normalize = false;
  for (size_t i = 0; i < modules->size(); ++i) {
    const json& mod = (*modules)[i];
    const std::string type = mod.value("type", ""), path = mod.value("path", "");
    const std::string field = "[" + std::to_string(i) + "].type";
    if (type == "sentence_transformers.models.Transformer" && i == 0) {
      transformer = true;
      st.model_dir = dir / path;
    } else if (type == "sentence_transformers.models.Pooling" && transformer && !pooling) {
      pooling = true;
      const fs::path pooling_file = dir / path / "config.json";
      Config pc(read_json(pooling_file, pr, inputs).value_or(json::object()), pooling_file.string(), pr);
      std::vector<std::string> on;
      for (const char* mode : {"pooling_mode_cls_token", "pooling_mode_mean_tokens", "pooling_mode_max_tokens",
                               "pooling_mode_mean_sqrt_len_tokens", "pooling_mode_weightedmean_tokens",
                               "pooling_mode_lasttoken"})
        if (pc.flag(mode, false)) on.push_back(mode);
      if (on.size() != 1 || (on[0] != "pooling_mode_cls_token" && on[0] != "pooling_mode_mean_tokens")) {
        for (const auto& mode : on)
          if (mode != "pooling_mode_cls_token" && mode != "pooling_mode_mean_tokens")
            pc.refuse(mode, "only CLS or mean pooling is supported");
        if (on.size() > 1) pr.add(pc.file(), "", "more than one pooling mode is on; the spec pools one way");
        if (on.empty()) pr.add(pc.file(), "", "no pooling mode is on");
      } else {
        m.set("head", "pooling", on[0] == "pooling_mode_cls_token" ? "cls" : "mean", path + "/config.json: " + on[0]);
      }
      if (pc.has("include_prompt") && !pc.flag("include_prompt", true))
        pc.refuse("include_prompt", "pooling that leaves out a prompt is not supported");
    } else if (type == "sentence_transformers.models.Normalize" && pooling && !normalize) {
      normalize = true;
    } else {
      pr.add(file.string(), field,
             "found \"" + type + "\"; supported: Transformer, then Pooling (CLS or mean), then optionally Normalize");
    }
  }
  if (!transformer || !pooling) {
    pr.add(file.string(), "", "a sentence-transformers model needs a Transformer module followed by a Pooling module");
    return std::nullopt;
  }
  m.set("head", "kind", "embedding", "sentence-transformers: modules.json");
  m.set("head", "normalize", normalize ? "true" : "false", normalize ? "2_Normalize: L2" : "no Normalize module");
  return st;
}

// The id of a special token named in tokenizer_config.json / special_tokens_map.json,
// looked up in vocab.txt or tokenizer.json. nullopt when there is no tokenizer.
std::optional<int64_t> special_token_id(const fs::path& dir, const char* which, std::vector<std::string>& inputs) {
  std::string token;
  for (const char* f : {"special_tokens_map.json", "tokenizer_config.json"}) {
    std::ifstream in(dir / f);
    if (!in || !token.empty()) continue;
    try {
      json j = json::parse(in);
      inputs.push_back((dir / f).string());
      if (j.contains(which) && j[which].is_string()) token = j[which];
      if (j.contains(which) && j[which].is_object() && j[which].contains("content")) token = j[which]["content"];
    } catch (const json::exception&) {
    }
  }
  if (token.empty()) return std::nullopt;
  if (std::ifstream vocab(dir / "vocab.txt"); vocab) {
    inputs.push_back((dir / "vocab.txt").string());
    std::string line;
    for (int64_t id = 0; std::getline(vocab, line); ++id) {
      if (!line.empty() && line.back() == '\r') line.pop_back();
      if (line == token) return id;
    }
  }
  if (std::ifstream tj(dir / "tokenizer.json"); tj) {
    try {
      json j = json::parse(tj);
      inputs.push_back((dir / "tokenizer.json").string());
      for (const auto& a : j.value("added_tokens", json::array()))
        if (a.value("content", "") == token && a.contains("id")) return a["id"].get<int64_t>();
      const json& v = j["model"]["vocab"];
      if (v.is_object() && v.contains(token)) return v[token].get<int64_t>();
    } catch (const json::exception&) {
    }
  }
  return std::nullopt;
}

// The weights: one float32 safetensors file whose names the family's preset knows.
std::string check_weights(const fs::path& dir, const FamilyInfo& fam, const Model& m, Problems& pr,
                          std::vector<std::string>& inputs) {
  const fs::path file = dir / "model.safetensors";
  std::error_code ec;
  if (!fs::exists(file, ec)) {
    if (fs::exists(dir / "model.safetensors.index.json", ec))
      pr.add(file.string(), "", "absent: the checkpoint is sharded (model.safetensors.index.json); halformer reads "
                                "one file: save it with save_pretrained(..., max_shard_size=\"100GB\")");
    else if (fs::exists(dir / "pytorch_model.bin", ec))
      pr.add(file.string(), "", "absent: only pytorch_model.bin is there; save the model with "
                                "save_pretrained(..., safe_serialization=True)");
    else
      pr.add(file.string(), "", "absent: a Hugging Face model directory has config.json and model.safetensors");
    return "";
  }
  inputs.push_back(file.string());
  try {
    SafetensorsFile st(file.string());
    std::vector<std::string> not_f32;
    const TensorInfo* embedding = nullptr;
    std::string probe_name;
    for (const auto& [name, info] : st.tensors()) {
      // The loader widens F16 and BF16 to fp32; F64 and F8_* it does not read (I64 buffers
      // are not weights).
      const bool floats = info.dtype.find('F') != std::string::npos;
      if (floats && info.dtype != "F32" && info.dtype != "F16" && info.dtype != "BF16")
        not_f32.push_back(name + " (" + info.dtype + ")");
      const std::string probe = fam.probe;
      if (!embedding && (name == probe || (name.size() > probe.size() &&
                                           name.compare(name.size() - probe.size() - 1, std::string::npos,
                                                        "." + probe) == 0)))
        embedding = &info, probe_name = name;
    }
    if (!not_f32.empty())
      pr.add(file.string(), "",
             std::to_string(not_f32.size()) + " tensors are not F32, F16 or BF16, e.g. " + not_f32.front() +
                 "; save with model.float().save_pretrained(...)");
    if (!embedding)
      pr.add(file.string(), "", std::string("no tensor named ") + fam.probe + " (under any prefix): not a " +
                                    fam.model_type + " checkpoint");
    else if (const int64_t width = m.table_width ? m.table_width : m.d_model;
             m.vocab > 0 && width > 0 && embedding->shape != std::vector<int64_t>{m.vocab, width})
      pr.add(file.string(), probe_name,
             "has shape [" + std::to_string(embedding->shape.empty() ? 0 : embedding->shape[0]) + ", " +
                 std::to_string(embedding->shape.size() > 1 ? embedding->shape[1] : 0) + "], but config.json says [" +
                 std::to_string(m.vocab) + ", " + std::to_string(width) + "] (vocab_size, " +
                 (m.table_width ? "embedding_size" : "hidden size") + ")");
  } catch (const Error& e) {
    pr.add(file.string(), "", std::string("cannot read the safetensors header: ") + e.what());
  }
  return fs::absolute(file).lexically_normal().string();
}

// ---------------------------------------------------------------- 5. writer, import_directory
const std::vector<std::pair<std::string, std::vector<std::string>>>& order() {
  static const std::vector<std::pair<std::string, std::vector<std::string>>> o = {
      {"sizes", {"d_model", "heads", "kv_heads", "d_ff", "encoder_layers", "decoder_layers", "src_vocab", "tgt_vocab", "type_vocab",
                 "max_len"}},
      {"layer", {"norm_placement", "norm_kind", "norm_eps", "norm_weight_offset", "final_norm", "parallel_residual",
                 "shared_weights", "activation", "dropout"}},
      {"embedding", {"positions", "position_offset", "rotary_dim", "rotary_theta", "rotary_layout", "relative_buckets",
                     "relative_distance", "scale", "share_src_tgt", "share_tgt_output", "norm", "size"}},
      {"attention", {"causal", "padding_mask", "scaled"}},
      {"head", {"kind", "pooling", "pooler", "num_classes", "normalize", "input_scale"}},
      {"tokens", {"pad", "bos", "eos"}},
      {"decoding", {"strategy"}},
      {"weights", {"preset"}},
  };
  return o;
}

std::string write_yaml(const Model& m, const std::string& name, const std::vector<std::string>& header) {
  std::ostringstream y;
  for (const auto& line : header) y << "#" << (line.empty() ? "" : " ") << line << "\n";
  y << "name: " << name << "\narchitecture: " << m.architecture << "\n";
  for (const auto& [section, keys] : order()) {
    auto s = m.spec.find(section);
    if (s == m.spec.end()) continue;
    y << "\n" << section << ":\n";
    for (const auto& key : keys) {
      auto f = s->second.find(key);
      if (f == s->second.end()) continue;
      std::string line = "  " + key + ": " + f->second.value;
      if (!f->second.note.empty())  // comments from column 29, or one space after a long line
        line += std::string(line.size() < 27 ? 28 - line.size() : 1, ' ') + "# " + f->second.note;
      y << line << "\n";
    }
  }
  y << "\ntargets: [host]\n";
  return y.str();
}

}  // namespace

std::string name_from_path(const std::string& path) {
  std::string stem = fs::path(path).stem().string(), out;
  for (char c : stem) out += (std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-') ? c : '-';
  return out.empty() ? "imported" : out;
}

Imported import_directory(const std::string& dir_arg, const std::string& name) {
  Problems pr;
  Imported out;
  const fs::path dir = dir_arg;
  std::error_code ec;
  if (!fs::is_directory(dir, ec))
    throw ImportError({dir_arg + ": not a directory (give a Hugging Face model directory)"});
  Model m;

  // sentence-transformers layout: the model may sit in a subdirectory; the head is its pooling.
  fs::path model_dir = dir;
  const bool sentence_transformers = fs::exists(dir / "modules.json", ec);
  if (sentence_transformers) {
    auto st = read_modules(dir, m, pr, out.inputs);
    if (!st) throw ImportError(pr.list);
    model_dir = st->model_dir;
  }
  const fs::path config_file = model_dir / "config.json";
  if (!fs::exists(config_file, ec))
    throw ImportError({config_file.string() + ": no such file (a Hugging Face model directory has config.json and "
                                              "model.safetensors)"});
  auto j = read_json(config_file, pr, out.inputs);
  if (!j) throw ImportError(pr.list);
  if (!j->is_object()) throw ImportError({config_file.string() + ": expected a JSON object"});
  Config c(*j, config_file.string(), pr);

  // model_type -> family
  const std::string model_type = c.text("model_type").value_or("");
  const FamilyInfo* fam = nullptr;
  for (const auto& f : families())
    if (model_type == f.model_type) fam = &f;
  if (!fam) {
    std::string supported;
    for (const auto& f : families()) supported += (supported.empty() ? "" : ", ") + std::string(f.model_type);
    auto p = planned().find(model_type);
    if (!c.has("model_type"))
      c.problem("model_type", "missing; supported: " + supported);
    else
      c.refuse("model_type", (p != planned().end() ? "not supported yet (needs " + p->second + "); " : "") +
                                 "supported: " + supported);
    throw ImportError(pr.list);
  }
  m.family = fam->model_type, m.preset = fam->preset, m.architecture = fam->architecture;

  // architectures -> task head
  Task task = Task::Base;
  m.hf_class = fam->classes.begin()->first;
  for (const auto& [cls, t] : fam->classes)
    if (t == Task::Base) m.hf_class = cls;
  if (c.has("architectures")) {
    const json& a = c.raw().at("architectures");
    std::string classes;
    for (const auto& [cls, t] : fam->classes) classes += (classes.empty() ? "" : ", ") + cls;
    if (!a.is_array() || a.size() != 1 || !a[0].is_string())
      c.refuse("architectures", "expected one class name; supported: " + classes);
    else if (auto it = fam->classes.find(a[0].get<std::string>()); it == fam->classes.end())
      c.refuse("architectures", "supported for model_type '" + model_type + "': " + classes +
                                    (model_type == "distilbert" && a[0] == "DistilBertForSequenceClassification"
                                         ? " (its head is dense + ReLU, which the spec's pooler cannot express)"
                                         : ""));
    else
      m.hf_class = it->first, task = it->second;
  }
  if (sentence_transformers && task != Task::Base)
    c.refuse("architectures", "sentence-transformers reads the base model: expected " + m.hf_class);

  fam->read(c, m, task);

  // The head of an encoder: sentence embedding (set above), classifier, or hidden states.
  if (m.architecture == "encoder" && !sentence_transformers) {
    if (task == Task::SequenceClassification) {
      int64_t classes = 0;
      if (c.has("id2label") && c.raw().at("id2label").is_object()) classes = int64_t(c.raw().at("id2label").size());
      const std::string from = c.has("num_labels") ? "num_labels" : classes > 0 ? "id2label entries"
                                                                                : "no id2label: transformers' default";
      // Neither written: transformers' default of 2 labels.
      if (auto n = c.integer("num_labels", classes > 0 ? classes : 2, 1, 1 << 20)) classes = *n;
      if (classes > 0) {
        m.set("head", "kind", "classifier", m.hf_class);
        m.set("head", "pooling", "cls", "the first token");
        if (m.family == "electra")
          m.set("head", "pooler", "dense_gelu", "classifier.dense + gelu");
        else
          m.set("head", "pooler", "dense_tanh",
                m.preset == std::string("huggingface-roberta")  ? "classifier.dense + tanh"
                : m.preset == std::string("huggingface-albert") ? "pooler + tanh"
                                                                : "pooler.dense + tanh");
        m.set("head", "num_classes", classes, from);
      }
    } else {
      m.set("head", "kind", "hidden", m.hf_class + ": last_hidden_state (dump: encoder_output)");
    }
  }
  if (m.architecture == "encoder") {
    m.set("attention", "causal", "false");
    m.set("attention", "padding_mask", "true", "padding known by length, like an attention mask");
  }

  // Token ids the spec needs (encoders: the tokenizer's [CLS]/[SEP] or <s>/</s> as bos/eos).
  if (m.architecture == "encoder") {
    for (const auto& [key, field, special] : std::vector<std::tuple<std::string, std::string, const char*>>{
             {"bos", "bos_token_id", "cls_token"}, {"eos", "eos_token_id", "sep_token"}}) {
      if (c.has(field)) {
        if (auto v = c.integer(field, std::nullopt, 0)) m.set("tokens", key, *v, field);
      } else if (auto id = special_token_id(model_dir, special, out.inputs)) {
        m.set("tokens", key, *id, std::string("the tokenizer's ") + special);
      }
    }
  }
  for (const char* k : {"bos_token_id", "eos_token_id", "pad_token_id"}) c.used(k);
  if (m.vocab > 0)
    for (const auto& [key, field] : std::vector<std::pair<std::string, std::string>>{
             {"pad", "pad_token_id"}, {"bos", "bos_token_id"}, {"eos", "eos_token_id"}}) {
      auto t = m.spec["tokens"].find(key);
      if (t == m.spec["tokens"].end() || std::stoll(t->second.value) < m.vocab) continue;
      pr.add(c.file(), c.has(field) ? field : key,
             "token id " + t->second.value + " is not < vocab_size " + std::to_string(m.vocab));
    }

  // Every other field must be one that does not change the outputs.
  for (const auto& [key, value] : c.raw().items()) {
    if (c.seen(key) || harmless().count(key)) continue;
    if (key == "is_decoder" && m.architecture == "decoder") continue;  // GPT-2 is one; transformers ignores it
    if (key == "is_decoder" || key == "is_encoder_decoder" || key == "add_cross_attention") {
      if (value.is_boolean() && !value.get<bool>()) continue;
      c.refuse(key, "a decoder / encoder-decoder / cross-attention variant of this family is not supported");
    } else if (key == "pruned_heads") {
      if (value.is_object() && value.empty()) continue;
      c.refuse(key, "pruned attention heads (layers of different widths) are not supported");
    } else if (key == "tie_word_embeddings" && m.architecture == "encoder") {
      continue;  // an encoder has no output projection
    } else {
      c.problem(key, "found " + value.dump() + "; this field is not known to halformer import (it may change the "
                                               "model); docs/import.md lists the fields it reads");
    }
  }

  out.family = m.family, out.preset = m.preset;
  out.weights = check_weights(model_dir, *fam, m, pr, out.inputs);
  if (!pr.list.empty()) throw ImportError(pr.list);
  m.set("weights", "preset", m.preset, "names of " + m.hf_class + "'s state_dict, read as is");

  std::vector<std::string> header = {
      name + ": imported by `halformer import` from " + fs::absolute(dir).lexically_normal().string(),
      "config.json: model_type " + model_type + ", " + m.hf_class +
          (c.has("transformers_version") ? ", saved by transformers " + c.raw().value("transformers_version", "") : ""),
      "Each field's comment names the config.json field it comes from (docs/import.md).",
      "",
      "Weights, read as is: " + out.weights,
      "  halformer build <this spec> -o DIR",
      "  DIR/" + name + " --weights " + out.weights + " --src \"...token ids...\"",
  };
  // Generation defaults that change generate()'s tokens but are not applied (docs/import.md).
  for (const char* k : {"forced_bos_token_id", "forced_eos_token_id"})
    if (m.architecture == "encoder_decoder" && c.has(k))
      header.push_back(std::string(k) + " " + c.raw().at(k).dump() +
                       " (a generate() default) is not applied: halformer never forces a token");
  if (fs::exists(model_dir / "vocab.txt", ec) && m.architecture == "encoder")
    header.push_back("  DIR/" + name + " --weights " + out.weights + " --vocab " +
                     fs::absolute(model_dir / "vocab.txt").lexically_normal().string() + " --text \"...\"");
  if (sentence_transformers) {
    header.insert(header.begin() + 2, "sentence-transformers modules: " + (dir / "modules.json").string());
    std::ifstream sb(model_dir / "sentence_bert_config.json");
    try {
      const json j = sb ? json::parse(sb) : json();
      if (j.is_object() && j.contains("max_seq_length") && j["max_seq_length"].is_number_integer()) {
        const std::string n = std::to_string(j["max_seq_length"].get<int64_t>());
        header.push_back("sentence-transformers truncates texts at " + n +
                         " tokens (sentence_bert_config.json): add --max-length " + n + " to --text runs");
      }
    } catch (const json::exception&) {
    }
  }
  out.yaml = write_yaml(m, name, header);
  return out;
}

}  // namespace halformer::import
