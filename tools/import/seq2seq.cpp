// The sequence-to-sequence readers: BART, mBART and Marian (one reader: BART's modules
// and names, with learned or sinusoidal positions, post- or pre-norm), and T5 / mT5
// (RMSNorm, relative position buckets, plain or gated feed-forward).
#include <cmath>
#include <cstdio>

#include "import_internal.h"

namespace halformer::import::detail {

namespace {
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
  m.set("layer", "norm_eps", format_float_literal(1e-5), family + "'s LayerNorms (torch's default; not in config.json)");
  m.set("layer", "final_norm", mbart ? "true" : "false", mbart ? "encoder/decoder.layer_norm" : "");
  if (dropout) m.set("layer", "dropout", format_float_literal(*dropout), "dropout; identity at inference");
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
}  // namespace

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
  m.set("layer", "norm_eps", format_float_literal(*eps), "layer_norm_epsilon");
  m.set("layer", "final_norm", "true", "encoder/decoder.final_layer_norm");
  if (dropout) m.set("layer", "dropout", format_float_literal(*dropout), "dropout_rate; identity at inference");
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

}  // namespace halformer::import::detail
