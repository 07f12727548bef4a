// The spec's defaults as JSON (`halformer check --print-defaults`), read from a
// default-constructed Spec (spec.h keeps the values, nowhere else), so that tools outside
// C++ (the PyTorch reference, tests/) read them instead of retyping them.
#include <sstream>

#include "output_text.h"
#include "spec.h"

namespace halformer {

namespace {

// A JSON string of one of the spec's names or keys (plain ASCII; quotes and backslashes escaped).
std::string quoted(const std::string& s) {
  std::string r = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') r += '\\';
    r += c;
  }
  return r + "\"";
}

// One JSON object, written in order, one member per line at `indent`.
class Object {
 public:
  explicit Object(int indent) : indent_(indent) {}
  Object& raw(const std::string& key, const std::string& json) {
    o_ << (n_++ ? ",\n" : "\n") << std::string(indent_ + 2, ' ') << quoted(key) << ": " << json;
    return *this;
  }
  Object& add(const std::string& key, bool v) { return raw(key, v ? "true" : "false"); }
  Object& add(const std::string& key, int64_t v) { return raw(key, std::to_string(v)); }
  Object& add(const std::string& key, double v) { return raw(key, format_float_literal(v)); }
  Object& add(const std::string& key, const char* v) { return raw(key, quoted(v)); }
  std::string str() const { return "{" + o_.str() + "\n" + std::string(indent_, ' ') + "}"; }

 private:
  std::ostringstream o_;
  int indent_, n_ = 0;
};

}  // namespace

std::string spec_defaults_json() {
  const Spec d;
  Object sizes(4), layer(4), embedding(4), attention(4), head(4), tokens(4), decoding(4), weights(4), overrides(4);
  sizes.add("encoder_layers", d.encoder_layers)
      .add("decoder_layers", d.decoder_layers)
      .add("src_vocab", d.src_vocab)
      .add("tgt_vocab", d.tgt_vocab)
      .add("type_vocab", d.type_vocab);
  layer.add("norm_placement", to_string(d.norm_placement))
      .add("norm_kind", to_string(d.norm_kind))
      .add("norm_eps", d.norm_eps)
      .add("norm_weight_offset", d.norm_weight_offset)
      .add("final_norm", d.final_norm)
      .add("parallel_residual", d.parallel_residual)
      .add("shared_weights", d.shared_weights)
      .add("activation", to_string(d.activation))
      .add("dropout", d.dropout);
  embedding.add("positions", to_string(d.positions))
      .add("scale", d.scale_embedding)
      .add("share_src_tgt", d.share_src_tgt)
      .add("share_tgt_output", d.share_tgt_output)
      .add("norm", d.embedding_norm)
      .add("position_offset", d.position_offset)
      .add("rotary_theta", d.rotary_theta)
      .add("rotary_layout", to_string(d.rotary_layout))
      .add("relative_buckets", d.relative_buckets)
      .add("relative_distance", d.relative_distance);
  attention.add("causal", d.causal).add("padding_mask", d.padding_mask).add("scaled", d.scaled);
  head.add("kind", to_string(d.head))
      .add("pooling", to_string(d.pooling))
      .add("num_classes", d.num_classes)
      .add("pooler", to_string(d.pooler))
      .add("normalize", d.normalize)
      .add("input_scale", d.input_scale);
  tokens.add("pad", d.pad_id).add("bos", d.bos_id).add("eos", d.eos_id);
  decoding.add("strategy", to_string(d.decoding))
      .add("max_new_tokens", d.max_new_tokens)
      .add("beam_size", d.beam_size)
      .add("length_penalty", d.length_penalty);
  weights.add("preset", to_string(d.preset));
  overrides.add("int16_activations", d.int16_activations);
  std::string targets;
  for (Target t : d.targets) targets += (targets.empty() ? "" : ", ") + quoted(to_string(t));

  Object defaults(2);
  defaults.raw("sizes", sizes.str())
      .raw("layer", layer.str())
      .raw("embedding", embedding.str())
      .raw("attention", attention.str())
      .raw("head", head.str())
      .raw("tokens", tokens.str())
      .raw("decoding", decoding.str())
      .raw("weights", weights.str())
      .add("precision", to_string(d.precision))
      .raw("precision_overrides", overrides.str())
      .raw("targets", "[" + targets + "]")
      .add("cuda_capability", d.cuda_capability)
      .add("tf32", d.tf32);
  // The defaults that depend on other fields (spec_validate.cpp check_sizes / check_consistency,
  // spec.h embedding_width / output_precision / table_precision / cache_precision).
  Object derived(2);
  derived.add("sizes.kv_heads", "sizes.heads")
      .add("embedding.size", "sizes.d_model")
      .add("embedding.rotary_dim", "sizes.d_model / sizes.heads")
      .add("attention.causal", "false for architecture encoder, else the default above")
      .add("decoding.max_new_tokens", "the smaller of the default above and sizes.max_len")
      .add("precision_overrides.generator", "precision")
      .add("precision_overrides.embeddings", "int8 when precision is int8, else fp32")
      .add("precision_overrides.kv_cache", "bf16 when precision is not fp32, else fp32");
  Object root(0);
  root.raw("defaults", defaults.str()).raw("derived", derived.str());
  return root.str() + "\n";
}

}  // namespace halformer
