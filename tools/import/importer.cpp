// `halformer import` (importer.h): a Hugging Face model directory -> a spec. This file is
// the import itself: it finds config.json (beside modules.json for sentence-transformers),
// picks the family from model_type and the head from architectures, runs the family's
// reader, checks every other field and the token ids, the weights, and writes the spec.
//
// A field is accepted only when it is known: mapped to the spec, known not to change the
// outputs, or refused with the reason. An unknown field is a problem too (it may change
// the model), so that a newer config never imports as a silently different model.
//
// The other files (import_internal.h lists them): families.cpp (the family table), encoders.cpp,
// decoders.cpp, llama.cpp, seq2seq.cpp (the readers), directory.cpp (files of the
// directory), yaml_writer.cpp (the spec's text).
#include "importer.h"

#include <cctype>
#include <filesystem>
#include <fstream>
#include <tuple>

#include "import_internal.h"

namespace halformer::import {

ImportError::ImportError(std::vector<std::string> p)
    : std::runtime_error(p.empty() ? "cannot import" : p.front()), problems(std::move(p)) {}

using namespace detail;

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
