// The spec's sections -> Spec: the schema (the known keys of each section), one reader per
// section storing each valid value and reporting each wrong one (through Section,
// spec_internal.h), and parse_root, which reads the sections in documentation order and
// then runs the cross-field checks (spec_validate.cpp).
#include <algorithm>
#include <cctype>
#include <cmath>

#include "spec_internal.h"

namespace halformer::spec_internal {

// Known keys per section ("" is the top level), in documentation order.
const std::map<std::string, std::vector<std::string>>& schema() {
  static const std::map<std::string, std::vector<std::string>> s{
      {"",
       {"name", "architecture", "sizes", "layer", "embedding", "attention", "head", "tokens", "decoding", "weights",
        "precision", "precision_overrides", "targets", "cuda_capability", "tf32", "schedule", "tuning"}},
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

// ---------------------------------------------------------------- one reader per section
namespace {
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
      cx.error(at, "targets", std::string("duplicate target '") + enum_name(*t) + "'");
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
}  // namespace

// ---------------------------------------------------------------- the whole spec
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
  top.read("tf32", spec.tf32);
  if (spec.tf32 && !spec.has_target(Target::Cuda))
    cx.error(cx.where("tf32"), "tf32", "applies to CUDA builds only: add cuda to targets, or remove tf32");
  else if (spec.tf32 && spec.precision != Precision::Fp32 && spec.output_precision() != Precision::Fp32)
    cx.error(cx.where("tf32"), "tf32",
             std::string("applies to fp32 linears, and this spec's are all ") + to_string(spec.precision) +
                 ": remove tf32");
  read_schedule(top.section("schedule", /*free_form=*/true), spec);
  read_tuning(top.section("tuning"), spec);

  check_consistency(cx, spec, have_sizes);

  ParseResult r;
  r.diagnostics = std::move(cx.diags);
  sort_by_position(r.diagnostics);
  if (r.diagnostics.empty()) r.spec = std::move(spec);
  return r;
}

}  // namespace halformer::spec_internal
