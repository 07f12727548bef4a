// The directory pieces of an import: reading a JSON file, the sentence-transformers
// layout (modules.json, the Pooling module's config, Normalize), the tokenizer's special
// tokens (special_tokens_map.json / tokenizer_config.json, looked up in vocab.txt or
// tokenizer.json) and the weights file's safetensors header (present, float, named as the
// family's preset expects, its embedding the shape config.json says).
#include <fstream>
#include <string>

#include "halformer/error.h"
#include "halformer/safetensors.h"

#include "import_internal.h"

namespace halformer::import::detail {

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

}  // namespace halformer::import::detail
