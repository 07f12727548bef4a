// The naming presets: where each canonical tensor is in a file of a given naming.
//
// Every tensor the runtime needs has a canonical name (docs/weights.md), e.g.
//   src_embedding, tgt_embedding, pos_embedding, type_embedding, embedding_norm.{weight,bias}
//   embed_project.{weight,bias}   (embedding_size != d_model: tables -> d_model, ELECTRA-small)
//   encoder.N.self_attn.{q,k,v,o}.{weight,bias}   decoder.N.cross_attn.{q,k,v,o}.*
//     (layer.shared_weights: encoder.0.* alone, for every layer)
//   {encoder,decoder}.N.{ff1,ff2}.*   (gated feed-forward: ff_gate, ff1 = up, ff2 = down)
//   {encoder,decoder}.N.{self_norm,cross_norm,ff_norm}.*   (RMSNorm: .weight only)
//   encoder_norm.*  decoder_norm.*  generator.*  pooler.*  classifier.*
// A preset maps a canonical name to the name in the file, optionally as one third of a
// packed tensor (torch.nn.MultiheadAttention's in_proj_weight holds Q, K, V as rows;
// GPT-2's c_attn as columns), transposed (GPT-2's Conv1D stores [in, out]), or as zeros
// (a bias the file's module does not have). Learned positions skip the spec's
// position_offset rows (RoBERTa). All presets then share one loader that checks and packs
// (weight_load.cpp).
#include <cctype>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "halformer/error.h"
#include "weights_internal.h"

namespace halformer {
namespace weights_internal {
namespace {

// Splits "encoder.3.self_attn.q.weight" into its fields.
struct Canonical {
  std::string stack;   // "encoder" | "decoder" | "" for model-level tensors
  int layer = -1;
  std::string module;  // "self_attn.q", "ff1", "self_norm", "src_embedding", ...
  std::string param;   // "weight" | "bias"
};
Canonical parse(const std::string& c) {
  Canonical r;
  std::vector<std::string> parts;
  std::stringstream ss(c);
  for (std::string p; std::getline(ss, p, '.');) parts.push_back(p);
  r.param = parts.back();
  parts.pop_back();
  size_t i = 0;
  if ((parts[0] == "encoder" || parts[0] == "decoder") && parts.size() > 1 &&
      std::isdigit(static_cast<unsigned char>(parts[1][0]))) {
    r.stack = parts[0];
    r.layer = std::stoi(parts[1]);
    i = 2;
  }
  for (; i < parts.size(); ++i) r.module += (r.module.empty() ? "" : ".") + parts[i];
  return r;
}

int qkv_part(const std::string& proj) { return proj == "q" ? 0 : proj == "k" ? 1 : 2; }

// ---- preset: torch.nn.Transformer (tests/reference/halformer_torch's modules)
Source torch_preset(const ModelConfig& c, const Canonical& n) {
  if (n.layer < 0) {
    static const std::map<std::string, std::string> top = {
        {"src_embedding", "src_embedding"}, {"tgt_embedding", "tgt_embedding"},
        {"pos_embedding", "pos_embedding"}, {"type_embedding", "type_embedding"},
        {"embedding_norm", "embedding_norm"}, {"encoder_norm", "transformer.encoder.norm"},
        {"decoder_norm", "transformer.decoder.norm"}, {"generator", "generator"},
        {"pooler", "pooler"},               {"classifier", "classifier"},
        {"embed_project", "embed_project"}};
    return {top.at(n.module) + "." + n.param};
  }
  std::string p = "transformer." + n.stack + ".layers." + str(n.layer) + ".";
  const bool cross_layer = c.arch == Architecture::EncoderDecoder && n.stack == "decoder";
  auto attn = [&](const std::string& module, const std::string& proj) -> Source {
    if (proj == "o") return {p + module + ".out_proj." + n.param};
    return {p + module + ".in_proj_" + n.param, qkv_part(proj)};
  };
  if (n.module.rfind("self_attn.", 0) == 0) return attn("self_attn", n.module.substr(10));
  if (n.module.rfind("cross_attn.", 0) == 0) return attn("multihead_attn", n.module.substr(11));
  if (n.module == "ff1") return {p + "linear1." + n.param};
  if (n.module == "ff2") return {p + "linear2." + n.param};
  if (n.module == "self_norm") return {p + "norm1." + n.param};
  if (n.module == "cross_norm") return {p + "norm2." + n.param};
  return {p + (cross_layer ? "norm3." : "norm2.") + n.param};  // ff_norm
}

// ---- preset: The Annotated Transformer's make_model()
Source annotated_preset(const ModelConfig&, const Canonical& n) {
  const std::string param = n.param == "weight" && (n.module.find("norm") != std::string::npos) ? "a_2"
                            : n.param == "bias" && (n.module.find("norm") != std::string::npos)  ? "b_2"
                                                                                                 : n.param;
  if (n.layer < 0) {
    static const std::map<std::string, std::string> top = {
        {"src_embedding", "src_embed.0.lut"}, {"tgt_embedding", "tgt_embed.0.lut"},
        {"encoder_norm", "encoder.norm"},     {"decoder_norm", "decoder.norm"},
        {"generator", "generator.proj"}};
    auto it = top.find(n.module);
    if (it == top.end()) throw Error("preset annotated-transformer has no tensor for '" + n.module + "'");
    return {it->second + "." + param};
  }
  std::string p = n.stack + ".layers." + str(n.layer) + ".";
  static const std::map<std::string, std::string> proj = {{"q", "0"}, {"k", "1"}, {"v", "2"}, {"o", "3"}};
  if (n.module.rfind("self_attn.", 0) == 0) return {p + "self_attn.linears." + proj.at(n.module.substr(10)) + "." + param};
  if (n.module.rfind("cross_attn.", 0) == 0) return {p + "src_attn.linears." + proj.at(n.module.substr(11)) + "." + param};
  if (n.module == "ff1") return {p + "feed_forward.w_1." + param};
  if (n.module == "ff2") return {p + "feed_forward.w_2." + param};
  // Sublayer order: self-attention, [cross-attention], feed-forward.
  int sub = n.module == "self_norm" ? 0 : n.module == "cross_norm" ? 1 : (n.stack == "decoder" ? 2 : 1);
  return {p + "sublayer." + str(sub) + ".norm." + param};
}

const std::map<std::string, HfName> kBertLayer = {
    {"self_attn.q", {"attention.self.query"}}, {"self_attn.k", {"attention.self.key"}},
    {"self_attn.v", {"attention.self.value"}}, {"self_attn.o", {"attention.output.dense"}},
    {"self_norm", {"attention.output.LayerNorm"}}, {"ff1", {"intermediate.dense"}},
    {"ff2", {"output.dense"}},                 {"ff_norm", {"output.LayerNorm"}}};
const std::map<std::string, HfName> kBertModel = {
    {"src_embedding", {"embeddings.word_embeddings"}},   {"pos_embedding", {"embeddings.position_embeddings"}},
    {"type_embedding", {"embeddings.token_type_embeddings"}}, {"embedding_norm", {"embeddings.LayerNorm"}},
    {"pooler", {"pooler.dense"}}};

}  // namespace

// ---- presets: Hugging Face families (transformers' state_dict names, as saved by
// save_pretrained; the fields: HfFamily, weights_internal.h). One table per family;
// hf_preset() below is the one mapping for all.
const HfFamily& hf_family(WeightPreset p) {
  // BertModel / BertForSequenceClassification (pooler + classifier).
  static const HfFamily bert{"huggingface-bert", {"bert.", ""}, "embeddings.word_embeddings.weight",
                             kBertModel, {{"classifier", {"classifier"}}}, "encoder.layer.", kBertLayer, false,
                             {"embeddings.position_ids", "embeddings.token_type_ids"}};
  // RobertaModel / RobertaForSequenceClassification: BERT's names; the classification head's
  // dense + tanh on <s> is the pooler, its out_proj the classifier.
  static const HfFamily roberta{"huggingface-roberta", {"roberta.", ""}, "embeddings.word_embeddings.weight",
                                kBertModel, {{"pooler", {"classifier.dense"}}, {"classifier", {"classifier.out_proj"}}},
                                "encoder.layer.", kBertLayer, false,
                                {"embeddings.position_ids", "embeddings.token_type_ids"}};
  // ElectraModel / ElectraForSequenceClassification: RoBERTa's names and head (its dense,
  // + gelu here, is the pooler) under `electra.`; ELECTRA-small's narrower tables go
  // through embeddings_project.
  static const HfFamily electra = [] {
    HfFamily f = roberta;
    f.preset = "huggingface-electra";
    f.prefixes = {"electra.", ""};
    f.model["embed_project"] = {"embeddings_project"};
    return f;
  }();
  // AlbertModel / AlbertForSequenceClassification: BERT's embeddings (E wide) and head
  // under `albert.`, but `pooler` (+ tanh) is a module of its own, embedding_hidden_mapping_in
  // maps E to the layers' width, and one layer's weights serve every layer (the spec's
  // shared_weights: only layer 0 is read, albert_layer_groups.0.albert_layers.0).
  static const HfFamily albert = [] {
    HfFamily f = bert;
    f.preset = "huggingface-albert";
    f.prefixes = {"albert.", ""};
    f.model["embed_project"] = {"encoder.embedding_hidden_mapping_in"};
    f.model["pooler"] = {"pooler"};
    f.layers = "encoder.albert_layer_groups.0.albert_layers.";
    f.layer = {{"self_attn.q", {"attention.query"}}, {"self_attn.k", {"attention.key"}},
               {"self_attn.v", {"attention.value"}}, {"self_attn.o", {"attention.dense"}},
               {"self_norm", {"attention.LayerNorm"}}, {"ff1", {"ffn"}}, {"ff2", {"ffn_output"}},
               {"ff_norm", {"full_layer_layer_norm"}}};
    return f;
  }();
  // DistilBertModel: separate q/k/v linears, no token types, no pooler.
  static const HfFamily distilbert{
      "huggingface-distilbert", {"distilbert.", ""}, "embeddings.word_embeddings.weight",
      {{"src_embedding", {"embeddings.word_embeddings"}}, {"pos_embedding", {"embeddings.position_embeddings"}},
       {"embedding_norm", {"embeddings.LayerNorm"}}},
      {}, "transformer.layer.",
      {{"self_attn.q", {"attention.q_lin"}}, {"self_attn.k", {"attention.k_lin"}},
       {"self_attn.v", {"attention.v_lin"}}, {"self_attn.o", {"attention.out_lin"}},
       {"self_norm", {"sa_layer_norm"}}, {"ff1", {"ffn.lin1"}}, {"ff2", {"ffn.lin2"}},
       {"ff_norm", {"output_layer_norm"}}},
      false, {"embeddings.position_ids"}};
  // GPT2LMHeadModel: Conv1D weights [in, out]; c_attn is Q|K|V fused along its outputs;
  // lm_head has no bias (and is wte itself when tied: the spec's share_tgt_output).
  static const HfFamily gpt2{
      "huggingface-gpt2", {"transformer.", ""}, "wte.weight",
      {{"tgt_embedding", {"wte"}}, {"pos_embedding", {"wpe"}}, {"decoder_norm", {"ln_f"}}},
      {{"generator", {"lm_head", -1, false}}}, "h.",
      {{"self_attn.q", {"attn.c_attn", 0}}, {"self_attn.k", {"attn.c_attn", 1}}, {"self_attn.v", {"attn.c_attn", 2}},
       {"self_attn.o", {"attn.c_proj"}}, {"self_norm", {"ln_1"}}, {"ff1", {"mlp.c_fc"}}, {"ff2", {"mlp.c_proj"}},
       {"ff_norm", {"ln_2"}}},
      true, {"h.{N}.attn.bias", "h.{N}.attn.masked_bias"}};
  // BartForConditionalGeneration (and MarianMTModel, MBartForConditionalGeneration: the same names): one shared
  // embedding, each stack its own positions (offset 2) and layernorm_embedding; lm_head is
  // `shared` (tied), final_logits_bias [1, vocab] its bias. Marian's sinusoidal positions
  // and lack of layernorm_embedding are the spec's (nothing read).
  static const HfFamily bart{
      "huggingface-bart", {"model.", ""}, "shared.weight",
      {{"src_embedding", {"shared"}}, {"tgt_embedding", {"shared"}},
       {"pos_embedding", {"encoder.embed_positions"}}, {"tgt_pos_embedding", {"decoder.embed_positions"}},
       {"embedding_norm", {"encoder.layernorm_embedding"}}, {"tgt_embedding_norm", {"decoder.layernorm_embedding"}},
       {"encoder_norm", {"encoder.layer_norm"}}, {"decoder_norm", {"decoder.layer_norm"}}},  // mBART's final norms
      {{"generator", {"final_logits_bias", -1, true, true}}}, "{S}.layers.",
      {{"self_attn.q", {"self_attn.q_proj"}}, {"self_attn.k", {"self_attn.k_proj"}},
       {"self_attn.v", {"self_attn.v_proj"}}, {"self_attn.o", {"self_attn.out_proj"}},
       {"cross_attn.q", {"encoder_attn.q_proj"}}, {"cross_attn.k", {"encoder_attn.k_proj"}},
       {"cross_attn.v", {"encoder_attn.v_proj"}}, {"cross_attn.o", {"encoder_attn.out_proj"}},
       {"self_norm", {"self_attn_layer_norm"}}, {"cross_norm", {"encoder_attn_layer_norm"}},
       {"ff1", {"fc1"}}, {"ff2", {"fc2"}}, {"ff_norm", {"final_layer_norm"}}},
      false, {"encoder.embed_positions.weight", "decoder.embed_positions.weight"}, true};
  // LlamaForCausalLM (and LlamaModel): no biases anywhere, RMSNorm (gamma only), gated
  // MLP (gate_proj -> ff_gate, up_proj -> ff1, down_proj -> ff2); lm_head is
  // embed_tokens when tied. transformers 4.30 also saves each layer's rotary inv_freq.
  static const HfFamily llama{
      "huggingface-llama", {"model.", ""}, "embed_tokens.weight",
      {{"tgt_embedding", {"embed_tokens"}}, {"decoder_norm", {"norm", -1, false}}},
      {{"generator", {"lm_head", -1, false}}}, "layers.",
      {{"self_attn.q", {"self_attn.q_proj", -1, false}}, {"self_attn.k", {"self_attn.k_proj", -1, false}},
       {"self_attn.v", {"self_attn.v_proj", -1, false}}, {"self_attn.o", {"self_attn.o_proj", -1, false}},
       {"self_norm", {"input_layernorm", -1, false}}, {"ff_gate", {"mlp.gate_proj", -1, false}},
       {"ff1", {"mlp.up_proj", -1, false}}, {"ff2", {"mlp.down_proj", -1, false}},
       {"ff_norm", {"post_attention_layernorm", -1, false}}},
      false, {"layers.{N}.self_attn.rotary_emb.inv_freq"}};
  // T5ForConditionalGeneration (and MT5): no biases, RMSNorm, one shared embedding; each
  // block's sublayers are numbered (self-attention 0, the decoder's cross-attention 1, the
  // feed-forward last: "{F}"); the feed-forward is wi/wo, or wi_0 (gate) / wi_1 (up) / wo
  // when gated. Block 0 of each stack holds its relative position table.
  auto t5 = [](const char* name, const char* gated = nullptr) { return HfName{name, -1, false, false, gated}; };
  static const HfFamily t5_family{
      "huggingface-t5", {""}, "shared.weight",
      {{"src_embedding", t5("shared")}, {"tgt_embedding", t5("shared")},
       {"encoder_norm", t5("encoder.final_layer_norm")}, {"decoder_norm", t5("decoder.final_layer_norm")},
       {"encoder_relative_bias", t5("encoder.block.0.layer.0.SelfAttention.relative_attention_bias")},
       {"decoder_relative_bias", t5("decoder.block.0.layer.0.SelfAttention.relative_attention_bias")}},
      {{"generator", t5("lm_head")}}, "{S}.block.",
      {{"self_attn.q", t5("layer.0.SelfAttention.q")}, {"self_attn.k", t5("layer.0.SelfAttention.k")},
       {"self_attn.v", t5("layer.0.SelfAttention.v")}, {"self_attn.o", t5("layer.0.SelfAttention.o")},
       {"self_norm", t5("layer.0.layer_norm")},
       {"cross_attn.q", t5("layer.1.EncDecAttention.q")}, {"cross_attn.k", t5("layer.1.EncDecAttention.k")},
       {"cross_attn.v", t5("layer.1.EncDecAttention.v")}, {"cross_attn.o", t5("layer.1.EncDecAttention.o")},
       {"cross_norm", t5("layer.1.layer_norm")},
       {"ff_gate", t5("layer.{F}.DenseReluDense.wi_0")}, {"ff1", t5("layer.{F}.DenseReluDense.wi", "layer.{F}.DenseReluDense.wi_1")},
       {"ff2", t5("layer.{F}.DenseReluDense.wo")}, {"ff_norm", t5("layer.{F}.layer_norm")}},
      // The original checkpoints also carry a cross-attention table that T5 never reads
      // (transformers ignores it on load).
      false, {"encoder.embed_tokens.weight", "decoder.embed_tokens.weight",
              "decoder.block.0.layer.1.EncDecAttention.relative_attention_bias.weight"}};
  // Qwen2ForCausalLM: Llama's names and blocks, with biases on q, k and v (not o).
  static const HfFamily qwen2 = [] {
    HfFamily f = llama;
    f.preset = "huggingface-qwen2";
    for (const char* proj : {"self_attn.q", "self_attn.k", "self_attn.v"}) f.layer.at(proj).bias = true;
    return f;
  }();
  // GPTJForCausalLM: separate q/k/v/out projections without biases, one LayerNorm (ln_1)
  // before both sublayers of a parallel residual (the spec's self_norm and ff_norm), fc_in /
  // fc_out with biases, an untied lm_head with a bias. Older files carry the causal-mask
  // buffers.
  static const HfFamily gptj{
      "huggingface-gptj", {"transformer.", ""}, "wte.weight",
      {{"tgt_embedding", {"wte"}}, {"decoder_norm", {"ln_f"}}},
      {{"generator", {"lm_head"}}}, "h.",
      {{"self_attn.q", {"attn.q_proj", -1, false}}, {"self_attn.k", {"attn.k_proj", -1, false}},
       {"self_attn.v", {"attn.v_proj", -1, false}}, {"self_attn.o", {"attn.out_proj", -1, false}},
       {"self_norm", {"ln_1"}}, {"ff_norm", {"ln_1"}}, {"ff1", {"mlp.fc_in"}}, {"ff2", {"mlp.fc_out"}}},
      false, {"h.{N}.attn.bias", "h.{N}.attn.masked_bias"}};
  // GPTNeoXForCausalLM: query_key_value holds each head's q, k and v rows in turn
  // (per_head parts), all linears and LayerNorms with biases, embed_out untied without one;
  // 4.30 saves the attention's mask and rotary buffers.
  static const HfFamily gpt_neox{
      "huggingface-gpt-neox", {"gpt_neox.", ""}, "embed_in.weight",
      {{"tgt_embedding", {"embed_in"}}, {"decoder_norm", {"final_layer_norm"}}},
      {{"generator", {"embed_out", -1, false}}}, "layers.",
      {{"self_attn.q", {"attention.query_key_value", 0, true, false, nullptr, true}},
       {"self_attn.k", {"attention.query_key_value", 1, true, false, nullptr, true}},
       {"self_attn.v", {"attention.query_key_value", 2, true, false, nullptr, true}},
       {"self_attn.o", {"attention.dense"}}, {"self_norm", {"input_layernorm"}},
       {"ff_norm", {"post_attention_layernorm"}}, {"ff1", {"mlp.dense_h_to_4h"}}, {"ff2", {"mlp.dense_4h_to_h"}}},
      false,
      {"layers.{N}.attention.bias", "layers.{N}.attention.masked_bias", "layers.{N}.attention.rotary_emb.inv_freq"}};
  // OPTForCausalLM (and OPTModel): BART-like layer names under model.decoder, learned
  // positions from row 2 on (the spec's position_offset), the lm_head tied to embed_tokens.
  static const HfFamily opt{
      "huggingface-opt", {"model.decoder.", "decoder."}, "embed_tokens.weight",
      {{"tgt_embedding", {"embed_tokens"}}, {"pos_embedding", {"embed_positions"}},
       {"decoder_norm", {"final_layer_norm"}}},
      {{"generator", {"lm_head", -1, false}}}, "layers.",
      {{"self_attn.q", {"self_attn.q_proj"}}, {"self_attn.k", {"self_attn.k_proj"}},
       {"self_attn.v", {"self_attn.v_proj"}}, {"self_attn.o", {"self_attn.out_proj"}},
       {"self_norm", {"self_attn_layer_norm"}}, {"ff1", {"fc1"}}, {"ff2", {"fc2"}}, {"ff_norm", {"final_layer_norm"}}},
      false, {}};
  switch (p) {
    case WeightPreset::HuggingfaceOpt: return opt;
    case WeightPreset::HuggingfaceGptNeox: return gpt_neox;
    case WeightPreset::HuggingfaceGptj: return gptj;
    case WeightPreset::HuggingfaceT5: return t5_family;
    case WeightPreset::HuggingfaceQwen2: return qwen2;
    case WeightPreset::HuggingfaceLlama: return llama;
    case WeightPreset::HuggingfaceBert: return bert;
    case WeightPreset::HuggingfaceRoberta: return roberta;
    case WeightPreset::HuggingfaceElectra: return electra;
    case WeightPreset::HuggingfaceAlbert: return albert;
    case WeightPreset::HuggingfaceDistilbert: return distilbert;
    case WeightPreset::HuggingfaceGpt2: return gpt2;
    case WeightPreset::HuggingfaceBart: return bart;
    default: throw Error("internal: not a Hugging Face preset");
  }
}
// Every preset but these three is a Hugging Face family (hf_family).
bool is_hf(WeightPreset p) {
  return p != WeightPreset::TorchTransformer && p != WeightPreset::AnnotatedTransformer && p != WeightPreset::Explicit;
}

namespace {

Source hf_preset(const HfFamily& f, const std::string& prefix, const ModelConfig& c, const Canonical& n) {
  auto source = [&](const std::string& scope, const HfName& m, bool layer) {
    Source s;
    if (m.bias_tensor) {  // the canonical bias is the file's tensor `name`, [1, n]
      s.name = scope + m.name;
      s.one_row = true;
      return s;
    }
    if (n.param == "bias" && !m.bias) {
      s.zeros = true;
      return s;
    }
    std::string module = c.gated_ff && m.gated ? m.gated : m.name;
    if (const size_t at = module.find("{F}"); at != std::string::npos)  // T5: the feed-forward's sublayer
      module.replace(at, 3, n.stack == "decoder" && c.arch == Architecture::EncoderDecoder ? "2" : "1");
    s.name = scope + module + "." + n.param;
    s.part = m.part;
    if (m.per_head) s.head_rows = c.d_model / c.heads;
    s.transposed = layer && f.conv1d && n.param == "weight";
    return s;
  };
  if (n.layer < 0) {
    const bool head_reads = (c.head == HeadKind::Classifier && (n.module == "pooler" || n.module == "classifier")) ||
                            n.module == "generator";
    if (auto it = f.head.find(n.module); head_reads && it != f.head.end()) return source("", it->second, false);
    if (auto it = f.model.find(n.module); it != f.model.end()) return source(prefix, it->second, false);
    throw Error(std::string("preset ") + f.preset + " has no tensor for '" + n.module + "'");
  }
  auto it = f.layer.find(n.module);
  if (it == f.layer.end()) throw Error(std::string("preset ") + f.preset + " has no tensor for '" + n.module + "'");
  std::string layers = f.layers;
  if (const size_t at = layers.find("{S}"); at != std::string::npos) layers.replace(at, 3, n.stack);
  return source(prefix + layers + str(n.layer) + ".", it->second, true);
}

}  // namespace

Source preset_source(const ModelConfig& c, const std::string& hf_prefix, const std::map<std::string, std::string>& map,
                     const std::string& canonical) {
  if (is_hf(c.preset)) return hf_preset(hf_family(c.preset), hf_prefix, c, parse(canonical));
  if (c.preset == WeightPreset::TorchTransformer) return torch_preset(c, parse(canonical));
  if (c.preset == WeightPreset::AnnotatedTransformer) return annotated_preset(c, parse(canonical));
  auto it = map.find(canonical);  // explicit
  return {it == map.end() ? canonical : it->second};
}

}  // namespace weights_internal
}  // namespace halformer
