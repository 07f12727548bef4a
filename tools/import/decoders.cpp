// The GPT-like decoders' readers: GPT-2, GPT-J, GPT-NeoX (Pythia) and OPT, LayerNorm
// decoder-only language models; and set_causal_lm, what every decoder-only reader (the
// Llama-like ones in llama.cpp too) sets: causal attention, logits, greedy decoding and
// the token ids.

#include "import_internal.h"

namespace halformer::import::detail {

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

namespace {
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
  m.set("layer", "norm_eps", format_float_literal(*g.eps), "layer_norm_epsilon");
  m.set("layer", "final_norm", "true", "ln_f");
  if (g.dropout && *g.dropout > 0)
    m.set("layer", "dropout", format_float_literal(*g.dropout), "resid_pdrop; identity at inference");
}
}  // namespace

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
  m.set("layer", "norm_eps", format_float_literal(*eps), "layer_norm_eps");
  m.set("layer", "final_norm", "true", "final_layer_norm");
  m.set("layer", "parallel_residual", parallel ? "true" : "false",
        parallel ? "use_parallel_residual: x + attn(ln1(x)) + mlp(ln2(x))" : "use_parallel_residual false");
  m.set("embedding", "positions", "rotary", "rotary embedding of q and k in every layer");
  m.set("embedding", "rotary_dim", *rotary, "int(head size x rotary_pct " + format_float_literal(*pct) + ")");
  m.set("embedding", "rotary_theta", format_float_literal(*base), "rotary_emb_base");
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
  m.set("layer", "norm_eps", format_float_literal(1e-5), "OPT's LayerNorms (torch's default; not in config.json)");
  m.set("layer", "final_norm", pre && !removed ? "true" : "false",
        pre && !removed ? "decoder.final_layer_norm" : "no final_layer_norm after a post-norm stack");
  if (dropout && *dropout > 0) m.set("layer", "dropout", format_float_literal(*dropout), "dropout; identity at inference");
  m.set("embedding", "positions", "learned", "embed_positions");
  m.set("embedding", "position_offset", 2, "OPTLearnedPositionalEmbedding's offset");
  m.set("embedding", "scale", "false");
  m.set("embedding", "share_tgt_output", tied ? "true" : "false",
        tied ? "tie_word_embeddings: lm_head is embed_tokens" : "lm_head.weight");
  set_causal_lm(c, m, 2, 2);  // OPTConfig's
}

}  // namespace halformer::import::detail
