// The spec writer: the Model's fields as YAML, section by section in the spec's order,
// each value with the comment that names where it came from (from column 29), under a
// header of comment lines. The order here is the order every imported spec has.
#include <sstream>

#include "import_internal.h"

namespace halformer::import::detail {

namespace {
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
}  // namespace

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

}  // namespace halformer::import::detail
