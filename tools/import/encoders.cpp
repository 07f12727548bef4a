// The BERT-like encoders' readers: BERT, RoBERTa (and XLM-RoBERTa), ELECTRA, ALBERT and
// DistilBERT. All post-norm LayerNorm encoders with learned positions and an embedding
// LayerNorm; they differ in field names, position offsets, embedding widths and shared
// layer weights. The head (hidden states, classifier, sentence embedding) is set by
// importer.cpp from architectures / modules.json.

#include "import_internal.h"

namespace halformer::import::detail {

namespace {
// ---- BERT and RoBERTa: one reader, RoBERTa's positions start after padding_idx.
// act_default: hidden_act where the config has none (the family's config class default).
void read_bert_like(Config& c, Model& m, bool roberta, const char* act_default = "gelu") {
  const auto d = c.integer("hidden_size", 768), h = c.integer("num_attention_heads", 12);
  const auto ff = c.integer("intermediate_size", 3072), layers = c.integer("num_hidden_layers", 12);
  const auto vocab = c.integer("vocab_size", std::nullopt), positions = c.integer("max_position_embeddings", 512);
  const auto types = c.integer("type_vocab_size", 2, 1, 1024);
  const auto eps = c.number("layer_norm_eps", 1e-12);
  const auto dropout = c.number("hidden_dropout_prob", 0.1);
  const auto pad = c.integer("pad_token_id", roberta ? 1 : 0, 0);
  if (d && h && *d % *h != 0)
    c.refuse("hidden_size", "not divisible by num_attention_heads " + std::to_string(*h));
  if (auto pet = c.text("position_embedding_type"); pet && *pet != "absolute")
    c.refuse("position_embedding_type", "only 'absolute' (a learned position table) is supported");
  c.only("is_decoder", false, "BERT as a decoder (causal self-attention) is not supported; import an encoder");
  c.only("add_cross_attention", false, "cross-attention layers in an encoder-only model are not supported");
  c.used("use_cache");  // decoder-only option
  for (const char* k : {"attention_probs_dropout_prob", "classifier_dropout", "initializer_range"}) c.used(k);
  read_activation(c, "hidden_act", act_default, m);
  if (!d || !h || !ff || !layers || !vocab || !positions || !types || !eps || !pad) return;
  m.d_model = *d, m.vocab = *vocab;
  m.set("sizes", "d_model", *d, "hidden_size");
  m.set("sizes", "heads", *h, "num_attention_heads (head size " + std::to_string(*d / *h) + ")");
  m.set("sizes", "d_ff", *ff, "intermediate_size");
  m.set("sizes", "encoder_layers", *layers, "num_hidden_layers");
  m.set("sizes", "src_vocab", *vocab, "vocab_size");
  m.set("sizes", "type_vocab", *types, "type_vocab_size (every token gets type 0)");
  if (roberta) {
    // RoBERTa numbers real tokens from padding_idx + 1 (create_position_ids_from_input_ids).
    const int64_t offset = *pad + 1;
    if (*positions <= offset) {
      c.refuse("max_position_embeddings", "RoBERTa positions start at pad_token_id + 1 = " + std::to_string(offset) +
                                              ": the table has no room for a token");
      return;
    }
    m.set("sizes", "max_len", *positions - offset,
          "max_position_embeddings " + std::to_string(*positions) + " - (pad_token_id + 1)");
    m.set("embedding", "position_offset", offset, "positions of real tokens start at pad_token_id + 1");
  } else {
    m.set("sizes", "max_len", *positions, "max_position_embeddings");
  }
  m.set("layer", "norm_placement", "post", "LayerNorm(x + sublayer(x))");
  m.set("layer", "norm_kind", "standard");
  m.set("layer", "norm_eps", format_float_literal(*eps), "layer_norm_eps");
  m.set("layer", "final_norm", "false");
  if (dropout) m.set("layer", "dropout", format_float_literal(*dropout), "hidden_dropout_prob; identity at inference");
  m.set("embedding", "positions", "learned", "position_embedding_type 'absolute'");
  m.set("embedding", "scale", "false");
  m.set("embedding", "norm", "true", "embeddings.LayerNorm");
  m.set("tokens", "pad", *pad, "pad_token_id");
}
}  // namespace
void read_bert(Config& c, Model& m, Task) { read_bert_like(c, m, false); }
// ---- ELECTRA (the discriminator or generator's encoder): BERT's model when its embeddings
// are as wide as the layers; ELECTRA-small's narrower ones go through embeddings_project.
void read_electra(Config& c, Model& m, Task) {
  const auto d = c.integer("hidden_size", 768), e = c.integer("embedding_size", 128);
  // The pre-training heads' summary settings (ElectraForMultipleChoice); no class read here uses them.
  for (const char* k : {"summary_type", "summary_use_proj", "summary_activation", "summary_last_dropout"}) c.used(k);
  read_bert_like(c, m, false);
  if (d && e && *e != *d) {
    m.set("embedding", "size", std::to_string(*e),
          "embedding_size != hidden_size: tables and their LayerNorm this wide, then embeddings_project");
    m.table_width = *e;
  }
}
void read_roberta(Config& c, Model& m, Task) { read_bert_like(c, m, true); }
// ---- ALBERT: BERT's layers, every one with the same weights (albert_layer_groups.0.
// albert_layers.0), after tables embedding_size wide and embedding_hidden_mapping_in.
void read_albert(Config& c, Model& m, Task) {
  const auto d = c.integer("hidden_size", 4096), e = c.integer("embedding_size", 128);
  if (auto g = c.integer("num_hidden_groups", 1); g && *g != 1)
    c.refuse("num_hidden_groups", "only 1 (every layer shares one set of weights) is supported");
  if (auto i = c.integer("inner_group_num", 1); i && *i != 1)
    c.refuse("inner_group_num", "only 1 (one layer per group) is supported");
  c.used("classifier_dropout_prob");
  read_bert_like(c, m, false, "gelu_new");
  m.set("layer", "shared_weights", "true", "num_hidden_groups 1: albert_layer_groups.0.albert_layers.0 is every layer");
  if (d && e && *e == *d)
    c.refuse("embedding_size", "equal to hidden_size: embedding_hidden_mapping_in between tables and layers of one "
                               "width is not supported (embedding.size projects only to another width)");
  else if (d && e) {
    m.set("embedding", "size", std::to_string(*e), "embedding_size: tables and their LayerNorm this wide, then "
                                                   "embedding_hidden_mapping_in to hidden_size");
    m.table_width = *e;
  }
}

// ---- DistilBERT: BERT without token types or pooler; its LayerNorms' eps is fixed.
void read_distilbert(Config& c, Model& m, Task) {
  const auto d = c.integer("dim", 768), h = c.integer("n_heads", 12), ff = c.integer("hidden_dim", 3072);
  const auto layers = c.integer("n_layers", 6), vocab = c.integer("vocab_size", std::nullopt);
  const auto positions = c.integer("max_position_embeddings", 512);
  const auto dropout = c.number("dropout", 0.1);
  const auto pad = c.integer("pad_token_id", 0, 0);
  if (d && h && *d % *h != 0) c.refuse("dim", "not divisible by n_heads " + std::to_string(*h));
  read_activation(c, "activation", "gelu", m);
  // The table is in the file either way (sinusoidal_pos_embds fills it at initialisation).
  c.flag("sinusoidal_pos_embds", false);
  for (const char* k : {"attention_dropout", "qa_dropout", "seq_classif_dropout", "initializer_range"})
    c.used(k);
  if (!d || !h || !ff || !layers || !vocab || !positions || !pad) return;
  m.d_model = *d, m.vocab = *vocab;
  m.set("sizes", "d_model", *d, "dim");
  m.set("sizes", "heads", *h, "n_heads (head size " + std::to_string(*d / *h) + ")");
  m.set("sizes", "d_ff", *ff, "hidden_dim");
  m.set("sizes", "encoder_layers", *layers, "n_layers");
  m.set("sizes", "src_vocab", *vocab, "vocab_size");
  m.set("sizes", "max_len", *positions, "max_position_embeddings");
  m.set("layer", "norm_placement", "post", "sa_layer_norm / output_layer_norm after each sublayer");
  m.set("layer", "norm_kind", "standard");
  m.set("layer", "norm_eps", format_float_literal(1e-12), "DistilBERT's LayerNorms (fixed in transformers)");
  m.set("layer", "final_norm", "false");
  if (dropout) m.set("layer", "dropout", format_float_literal(*dropout), "dropout; identity at inference");
  m.set("embedding", "positions", "learned", "position_embeddings (no token types)");
  m.set("embedding", "scale", "false");
  m.set("embedding", "norm", "true", "embeddings.LayerNorm");
  m.set("tokens", "pad", *pad, "pad_token_id");
}

}  // namespace halformer::import::detail
