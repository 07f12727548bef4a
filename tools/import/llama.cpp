// The Llama-like decoders' reader: Llama, Mistral, Qwen2 and Gemma (1), RMSNorm
// decoder-only language models with rotary positions, a gated MLP and grouped-query
// attention; one reader with the config classes' defaults per kind, and the sliding
// window (Mistral, Qwen2) mapped to a max_len within which attention is full.

#include "import_internal.h"

namespace halformer::import::detail {

namespace {
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
  m.set("layer", "norm_eps", format_float_literal(*eps), "rms_norm_eps");
  if (gemma) m.set("layer", "norm_weight_offset", "1.0", "GemmaRMSNorm scales by 1 + weight");
  m.set("layer", "final_norm", "true", "model.norm");
  m.set("embedding", "positions", "rotary", "rotary embedding of q and k in every layer");
  m.set("embedding", "rotary_theta", format_float_literal(*theta), c.has("rope_theta") ? "rope_theta" : "rope_theta default");
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
}  // namespace

void read_llama(Config& c, Model& m, Task) { read_llama_like(c, m, LlamaKind::Llama); }
void read_mistral(Config& c, Model& m, Task) { read_llama_like(c, m, LlamaKind::Mistral); }
void read_qwen2(Config& c, Model& m, Task) { read_llama_like(c, m, LlamaKind::Qwen2); }
void read_gemma(Config& c, Model& m, Task) { read_llama_like(c, m, LlamaKind::Gemma); }

}  // namespace halformer::import::detail
