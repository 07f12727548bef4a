// The importer's shared vocabulary (internal to tools/import): Problems (every reason an
// import fails), Config (typed config.json reads that record what is wrong and which fields
// were looked at), Model (the spec being filled, field by field with its comment), the
// family table's entry (FamilyInfo) and the declarations of what the other files define:
// the readers of each family group (encoders.cpp, decoders.cpp, llama.cpp, seq2seq.cpp),
// the tables and helpers they share (families.cpp), the directory pieces (directory.cpp)
// and the YAML writer (yaml_writer.cpp). importer.cpp ties them together.
#pragma once

#include <nlohmann/json.hpp>

#include "output_text.h"

#include <cstdint>
#include <filesystem>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

namespace halformer::import::detail {
namespace fs = std::filesystem;
using json = nlohmann::json;

// ---------------------------------------------------------------- problems, config access
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

// Numbers are written as the spec writes them: format_float_literal (the shortest round
// trip, always with a '.').

// What the spec will say, field by field, with the comment that says where it came from.
struct Field {
  std::string value, note;
};
struct Model {
  std::string family, preset, architecture;  // architecture: "encoder" | "decoder" | "encoder_decoder"
  std::string hf_class;                      // architectures[0] (or the base model's class)
  // section -> key -> value (written in the order of yaml_writer.cpp's order())
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

// Hugging Face activation names -> the spec's (families.cpp).
std::optional<std::string> activation(const std::string& hf);
// The gated kind whose gate takes the Hugging Face activation `hf` (Llama's hidden_act,
// T5's gated-ACT).
std::optional<std::string> gated_activation(const std::string& hf);
// Sets layer.activation from the config's `key` (absent: `fallback`), or refuses it.
void read_activation(Config& c, const std::string& key, const std::string& fallback, Model& m);

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

// The family table: model_type -> preset, architecture, classes, probe tensor, reader.
const std::vector<FamilyInfo>& families();
// Families Hugging Face has that the spec language cannot express yet (issue 15).
const std::map<std::string, std::string>& planned();
// Fields every config may carry that do not change the model's outputs.
const std::set<std::string>& harmless();

// ---------------------------------------------------------------- the family readers
// encoders.cpp
void read_bert(Config& c, Model& m, Task);
void read_roberta(Config& c, Model& m, Task);  // and xlm-roberta
void read_electra(Config& c, Model& m, Task);
void read_albert(Config& c, Model& m, Task);
void read_distilbert(Config& c, Model& m, Task);
// decoders.cpp
void read_gpt2(Config& c, Model& m, Task);
void read_gptj(Config& c, Model& m, Task);
void read_gpt_neox(Config& c, Model& m, Task);
void read_opt(Config& c, Model& m, Task);
// What the decoder-only language models share (decoders.cpp; Llama-like readers too).
void set_causal_lm(Config& c, Model& m, std::optional<int64_t> bos_default, std::optional<int64_t> eos_default);
// llama.cpp
void read_llama(Config& c, Model& m, Task);
void read_mistral(Config& c, Model& m, Task);
void read_qwen2(Config& c, Model& m, Task);
void read_gemma(Config& c, Model& m, Task);
// seq2seq.cpp
void read_bart(Config& c, Model& m, Task);
void read_mbart(Config& c, Model& m, Task);
void read_marian(Config& c, Model& m, Task);
void read_t5(Config& c, Model& m, Task);  // and mt5

// ---------------------------------------------------------------- directory pieces (directory.cpp)
// A JSON file, recorded in `inputs`; nullopt (and a problem) when it cannot be read.
std::optional<json> read_json(const fs::path& p, Problems& pr, std::vector<std::string>& inputs);
// sentence-transformers: modules.json names a Transformer (the model's directory), then
// Pooling (1_Pooling/config.json) and optionally Normalize. Fills the head.
struct SentenceTransformer {
  fs::path model_dir;
  std::string note;
};
std::optional<SentenceTransformer> read_modules(const fs::path& dir, Model& m, Problems& pr,
                                                std::vector<std::string>& inputs);
// The id of a special token named in tokenizer_config.json / special_tokens_map.json,
// looked up in vocab.txt or tokenizer.json. nullopt when there is no tokenizer.
std::optional<int64_t> special_token_id(const fs::path& dir, const char* which, std::vector<std::string>& inputs);
// The weights: one float32 safetensors file whose names the family's preset knows.
// Returns its absolute path ("" when absent).
std::string check_weights(const fs::path& dir, const FamilyInfo& fam, const Model& m, Problems& pr,
                          std::vector<std::string>& inputs);

// ---------------------------------------------------------------- the writer (yaml_writer.cpp)
// The spec: `header` as comment lines, then the Model's sections in the spec's order.
std::string write_yaml(const Model& m, const std::string& name, const std::vector<std::string>& header);

}  // namespace halformer::import::detail
