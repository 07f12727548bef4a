// The checks between fields, once every section is read (check_consistency): sizes that must
// divide, the sizes each architecture needs or has no use for, the fp32 weight memory limit,
// fields that contradict the architecture, head or positions, token ids beyond their
// vocabulary, decoding limits. Also fills the defaults that depend on other fields
// (kv_heads, rotary_dim, causal, max_new_tokens).
#include <cmath>

#include "spec_internal.h"

namespace halformer::spec_internal {

namespace {
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
  const std::string arch = enum_name(s.architecture);
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
}  // namespace

void check_consistency(Context& cx, Spec& s, bool have_sizes) {
  if (have_sizes) {
    check_memory(cx, s);  // first: only unreadable sizes stop it, not the contradictions below
    check_sizes(cx, s);
  }
  if (cx.any_failed("architecture")) return;
  const std::string arch = enum_name(s.architecture);
  const bool has_decoder = s.architecture != Architecture::Encoder;
  const auto contradiction = [&](const std::string& field, const std::string& msg) {
    cx.error(cx.present(field) ? cx.where(field) : cx.where("architecture"), field, "contradiction: " + msg);
  };

  // head
  if (!cx.any_failed("head.kind")) {
    const std::string kind = enum_name(s.head);
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
                      " shifts rows of a learned position table; positions are '" + enum_name(s.positions) + "'");
  if (!cx.any_failed("embedding.positions") && s.positions != Positions::Rotary)
    for (const char* name : {"rotary_dim", "rotary_theta", "rotary_layout"})
      if (const std::string key = std::string("embedding.") + name; cx.given(key))
        contradiction(key, std::string(name) + " applies only to positions 'rotary'; positions are '" +
                               enum_name(s.positions) + "'");
  if (!cx.any_failed("embedding.positions") && s.positions != Positions::Relative)
    for (const char* name : {"relative_buckets", "relative_distance"})
      if (const std::string key = std::string("embedding.") + name; cx.given(key))
        contradiction(key, std::string(name) + " applies only to positions 'relative'; positions are '" +
                               enum_name(s.positions) + "'");
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
                                                  std::string(enum_name(s.norm_kind)) + "'");
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
                    std::string("map is only used with preset 'explicit', not '") + enum_name(s.preset) + "'");
  }
}

}  // namespace halformer::spec_internal
