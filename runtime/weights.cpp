// Weight loading through naming presets.
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
// position_offset rows (RoBERTa). All presets then share one loader that checks and packs.
#include "halformer/weights.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <deque>
#include <set>
#include <sstream>

#include "halformer/error.h"
#include "halformer/packed_layout.h"
#include "halformer/safetensors.h"

namespace halformer {
namespace {

// Floating-point dtypes a checkpoint may store (many Hugging Face files are F16 or BF16):
// widened to fp32 as they are read, exactly (every F16 and BF16 value is an fp32 value).
enum class FloatKind { None, F32, F16, BF16 };
FloatKind float_kind(const std::string& dtype) {
  if (dtype == "F32") return FloatKind::F32;
  if (dtype == "F16") return FloatKind::F16;
  if (dtype == "BF16") return FloatKind::BF16;
  return FloatKind::None;
}

float half_to_float(uint16_t h) {
  const uint32_t sign = uint32_t(h & 0x8000) << 16, exp = (h >> 10) & 0x1f, mant = h & 0x3ff;
  uint32_t bits;
  if (exp == 0x1f) {
    bits = sign | 0x7f800000u | (mant << 13);  // inf / nan
  } else if (exp != 0) {
    bits = sign | ((exp + 112) << 23) | (mant << 13);  // normal: rebias 15 -> 127
  } else {
    float f = std::ldexp(float(mant), -24);  // zero or subnormal: mant * 2^-24
    std::memcpy(&bits, &f, 4);
    bits |= sign;
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

// n values of `kind` at `src` (any alignment) -> fp32 at `dst`.
void to_f32(FloatKind kind, const uint8_t* src, size_t n, float* dst) {
  if (kind == FloatKind::F32) {
    std::memcpy(dst, src, n * sizeof(float));
    return;
  }
  for (size_t i = 0; i < n; ++i) {
    uint16_t v;
    std::memcpy(&v, src + 2 * i, 2);
    dst[i] = kind == FloatKind::BF16 ? from_bf16(v) : half_to_float(v);
  }
}

struct Source {
  std::string name;  // in the file
  int part = -1;     // 0, 1, 2: that third of a packed tensor's outputs; -1: the whole tensor
  // The file stores the weight as [in, out] (GPT-2's Conv1D), not torch.nn.Linear's
  // [out, in]: read transposed (a packed tensor is then [in, 3 * out]).
  bool transposed = false;
  int64_t row_offset = 0;  // rows of the file's tensor before the first one read (learned positions)
  bool zeros = false;      // not in the file: zeros (a bias the family's module does not have)
  bool one_row = false;    // a 1-D tensor stored as [1, n] (BART's final_logits_bias)
  // > 0: the parts interleave per head, head_rows rows each (GPT-NeoX's query_key_value:
  // head h's q, k, v rows in turn): output r of `part` is file row
  // (r / head_rows) * 3 * head_rows + part * head_rows + r % head_rows.
  int head_rows = 0;
};

std::string str(int i) { return std::to_string(i); }

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

// ---- preset: torch.nn.Transformer (tools/halformer_torch.py's modules)
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
  const bool cross_layer = c.arch == Arch::EncoderDecoder && n.stack == "decoder";
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

// ---- presets: Hugging Face families (transformers' state_dict names, as saved by
// save_pretrained). One table per family; hf_preset() below is the one mapping for all.
struct HfName {
  const char* name;  // module name in the file
  int part = -1;     // that third of a fused Q|K|V tensor (GPT-2's c_attn)
  bool bias = true;  // false: the module has no bias; the canonical bias reads as zeros
  // The file's tensor for the canonical bias is `name` itself, stored [1, n] (BART's
  // final_logits_bias as the generator's bias).
  bool bias_tensor = false;
  const char* gated = nullptr;  // the module's name when the feed-forward is gated (T5: wi -> wi_1)
  bool per_head = false;        // `part` of a Q|K|V tensor interleaved per head (Source::head_rows)
};
struct HfFamily {
  const char* preset;
  // Scopes of the base model in the file, tried in order; the first under which `probe`
  // exists is used ("bert." in BertForSequenceClassification, "" in BertModel).
  std::vector<std::string> prefixes;
  const char* probe;
  std::map<std::string, HfName> model;  // model-level canonical modules, under the prefix
  // Task-head modules (outside the prefix), used by heads that read them: classifier
  // (pooler, classifier) and the decoder's output projection (generator).
  std::map<std::string, HfName> head;
  const char* layers;                   // "encoder.layer." + N + "." under the prefix ("{S}": the stack)
  std::map<std::string, HfName> layer;  // per-layer canonical modules
  bool conv1d = false;                  // layer weights stored [in, out] (GPT-2's Conv1D): transposed at load
  // Buffers the file may carry that no spec reads, under the prefix; "{N}" stands for
  // each layer's index. (A base model's pooler is accepted where the head does not use it.)
  std::vector<std::string> unused;
  // Each stack has its own position table and embedding norm (tgt_pos_embedding,
  // tgt_embedding_norm: BART, Marian).
  bool per_stack_embeddings = false;
};

const std::map<std::string, HfName> kBertLayer = {
    {"self_attn.q", {"attention.self.query"}}, {"self_attn.k", {"attention.self.key"}},
    {"self_attn.v", {"attention.self.value"}}, {"self_attn.o", {"attention.output.dense"}},
    {"self_norm", {"attention.output.LayerNorm"}}, {"ff1", {"intermediate.dense"}},
    {"ff2", {"output.dense"}},                 {"ff_norm", {"output.LayerNorm"}}};
const std::map<std::string, HfName> kBertModel = {
    {"src_embedding", {"embeddings.word_embeddings"}},   {"pos_embedding", {"embeddings.position_embeddings"}},
    {"type_embedding", {"embeddings.token_type_embeddings"}}, {"embedding_norm", {"embeddings.LayerNorm"}},
    {"pooler", {"pooler.dense"}}};

const HfFamily& hf_family(Preset p) {
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
    case Preset::HuggingfaceOpt: return opt;
    case Preset::HuggingfaceGptNeox: return gpt_neox;
    case Preset::HuggingfaceGptj: return gptj;
    case Preset::HuggingfaceT5: return t5_family;
    case Preset::HuggingfaceQwen2: return qwen2;
    case Preset::HuggingfaceLlama: return llama;
    case Preset::HuggingfaceBert: return bert;
    case Preset::HuggingfaceRoberta: return roberta;
    case Preset::HuggingfaceElectra: return electra;
    case Preset::HuggingfaceAlbert: return albert;
    case Preset::HuggingfaceDistilbert: return distilbert;
    case Preset::HuggingfaceGpt2: return gpt2;
    case Preset::HuggingfaceBart: return bart;
    default: throw Error("internal: not a Hugging Face preset");
  }
}
// Every preset but these three is a Hugging Face family (hf_family).
bool is_hf(Preset p) {
  return p != Preset::TorchTransformer && p != Preset::AnnotatedTransformer && p != Preset::Explicit;
}

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
      module.replace(at, 3, n.stack == "decoder" && c.arch == Arch::EncoderDecoder ? "2" : "1");
    s.name = scope + module + "." + n.param;
    s.part = m.part;
    if (m.per_head) s.head_rows = c.d_model / c.heads;
    s.transposed = layer && f.conv1d && n.param == "weight";
    return s;
  };
  if (n.layer < 0) {
    const bool head_reads = (c.head == HeadOutput::Classifier && (n.module == "pooler" || n.module == "classifier")) ||
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

// Fills a linear's weights one output channel at a time, straight into the format its
// kernel reads (docs/precision.md), so that loading an int8 or bf16 model never holds an
// fp32 copy of a whole matrix.
class LinearBuilder {
 public:
  LinearBuilder(int in, int out, WeightFormat format, const WeightLayout& layout) : format_(format) {
    l_.in = in;
    l_.out = out;
    l_.bf16_pairs = format == WeightFormat::Bf16 && layout.bf16_pairs;
    l_.int8_group = layout.int8_group;
    const int panel = l_.panel = format == WeightFormat::Bf16 ? layout.bf16_panel() : layout.panel;
    if (format == WeightFormat::Int8) {
      l_.q.assign(packed_int8_size(in, out, l_.int8_group), 0);
      scales_.assign(size_t(out), 0.0f);
      if (l_.int8_group == kInt8Quad) sums_.assign(size_t(out), 0.0f);
      channel_q_.resize(size_t(in));
    } else if (format == WeightFormat::Bf16) {
      l_.h.assign(packed_bf16_size(in, out, panel, l_.bf16_pairs), 0);
    } else {
      l_.w.assign(packed_size(in, out, panel), 0.0f);
    }
  }
  int in() const { return l_.in; }
  WeightFormat format() const { return format_; }
  // Output channel n from its fp32 values v[in].
  void channel(int n, const float* v) {
    if (format_ == WeightFormat::Int8) {
      channel_int8(n, channel_q_.data(), quantize_row_int8(v, l_.in, channel_q_.data()));
    } else if (format_ == WeightFormat::Bf16) {
      for (int k = 0; k < l_.in; ++k) l_.h[packed_bf16_index(l_.in, n, k, l_.panel, l_.bf16_pairs)] = to_bf16(v[k]);
    } else {
      pack_rows(v, 1, l_.in, n, l_.panel, l_.w.data());
    }
  }
  // Output channel n already quantized (int8 builds only).
  void channel_int8(int n, const int8_t* q, float scale) {
    put_int8_channel(l_.q.data(), l_.in, n, q, l_.int8_group);
    scales_[size_t(n)] = scale;
    if (!sums_.empty()) sums_[size_t(n)] = int8_channel_sum(q, l_.in);
  }
  LinearWeights finish(WeightVector<float> bias) {
    l_.b = std::move(bias);
    l_.b.insert(l_.b.end(), scales_.begin(), scales_.end());  // int8: (bias | scale [| sum])
    l_.b.insert(l_.b.end(), sums_.begin(), sums_.end());
    return std::move(l_);
  }

 private:
  WeightFormat format_;
  LinearWeights l_;
  std::vector<float> scales_, sums_;
  std::vector<int8_t> channel_q_;
};

class Loader {
 public:
  Loader(const ModelConfig& c, const std::string& path, const WeightLayout& layout)
      : c_(c), file_(path), layout_(layout) {
    if (is_hf(c.preset)) {  // the base model's scope: the first prefix the file has the probe under
      const HfFamily& f = hf_family(c.preset);
      hf_prefix_ = f.prefixes.back();
      for (const auto& p : f.prefixes)
        if (file_.find(p + f.probe)) {
          hf_prefix_ = p;
          break;
        }
    }
    if (c.preset == Preset::Explicit && c.weight_map)
      for (const char* const* kv = c.weight_map; *kv; kv += 2) map_[kv[0]] = kv[1];
    auto names = file_.metadata().find("halformer.names");
    canonical_ = names != file_.metadata().end() && names->second == "canonical";
  }

  Source resolve(const std::string& canonical) {
    if (canonical_) return {canonical};  // save_weights' file: no preset, no offsets
    Source s = resolve_name(canonical);
    if (canonical == "pos_embedding.weight" || canonical == "tgt_pos_embedding.weight")
      s.row_offset = c_.position_offset;
    return s;
  }

  // Calls row(r, data, cols) for each row r of the tensor for `canonical` with `shape`
  // (rows = shape[0], row-major floats, cols per row), then drops the tensor's pages of
  // the mapped file. Returns false, recording the problem, when the file does not have
  // it as expected.
  template <typename RowFn>
  bool read_rows(const std::string& canonical, std::vector<int64_t> shape, RowFn row) {
    Source src = resolve(canonical);
    size_t n = 1;
    for (int64_t d : shape) n *= static_cast<size_t>(d);
    const int64_t rows = shape.empty() ? 1 : shape[0];
    const size_t cols = n / size_t(std::max<int64_t>(rows, 1));
    std::vector<float> buf(cols);  // the file's floats need not be 4-byte aligned
    if (src.zeros) {
      for (int64_t r = 0; r < rows; ++r) row(int(r), buf.data(), cols);
      return true;
    }
    const int parts = src.part >= 0 ? 3 : 1;
    std::vector<int64_t> file_shape = shape;
    if (src.transposed && shape.size() == 2)
      file_shape = {shape[1], shape[0] * parts};
    else if (!file_shape.empty())
      file_shape[0] = file_shape[0] * parts + src.row_offset;
    if (src.one_row) file_shape.insert(file_shape.begin(), 1);
    const bool first_use = used_.insert(src.name).second;  // a packed tensor is read 3 times
    const TensorInfo* t = file_.find(src.name);
    // With an explicit map, say which canonical tensor the file name was mapped from.
    std::string label = c_.preset == Preset::Explicit && src.name != canonical ? src.name + " (" + canonical + ")"
                                                                                : src.name;
    const FloatKind kind = t ? float_kind(t->dtype) : FloatKind::None;
    if (!first_use && (!t || kind == FloatKind::None || t->shape != file_shape)) return false;  // reported once
    if (!t) {
      missing_.push_back(label + " " + shape_str(file_shape));
      return false;
    }
    if (kind == FloatKind::None || t->shape != file_shape) {
      mismatched_.push_back(label + ": expected F32 (or F16 / BF16) " + shape_str(file_shape) + ", found " + t->dtype +
                            " " + shape_str(t->shape));
      return false;
    }
    const size_t esize = kind == FloatKind::F32 ? 4 : 2;
    bool finite = true;
    auto emit = [&](int64_t r) {
      for (float x : buf) finite = finite && std::isfinite(x);
      row(int(r), buf.data(), cols);
    };
    if (src.transposed && shape.size() == 2) {
      // [in, parts * out] in the file: output r of this part is column part * out + r.
      std::vector<float> all(size_t(t->numel()));
      to_f32(kind, t->data, all.size(), all.data());
      file_.release(t->data, all.size() * esize);
      const size_t width = size_t(file_shape[1]), first = size_t(std::max(src.part, 0)) * size_t(rows);
      for (int64_t r = 0; r < rows; ++r) {
        for (size_t i = 0; i < cols; ++i) buf[i] = all[i * width + first + size_t(r)];
        emit(r);
      }
    } else if (src.head_rows > 0) {  // rows gathered from the per-head blocks, the tensor released at the end
      const size_t hr = size_t(src.head_rows), row_bytes = cols * esize;
      for (int64_t r = 0; r < rows; ++r) {
        const size_t file_row = size_t(r) / hr * 3 * hr + size_t(src.part) * hr + size_t(r) % hr;
        to_f32(kind, t->data + file_row * row_bytes, cols, buf.data());
        emit(r);
      }
      if (src.part == 2) file_.release(t->data, t->bytes);
    } else {
      const size_t skip = (src.part >= 0 ? size_t(src.part) * n : 0) + size_t(src.row_offset) * cols;
      const uint8_t* data = t->data + skip * esize;
      const size_t row_bytes = cols * esize, chunk = size_t(4) << 20;
      size_t released = 0;  // bytes of the tensor whose pages were dropped
      for (int64_t r = 0; r < rows; ++r) {
        to_f32(kind, data + size_t(r) * row_bytes, cols, buf.data());
        emit(r);
        // Drop pages as the rows are consumed, so that even the largest tensor (an
        // embedding table) is never resident twice.
        const size_t done = size_t(r + 1) * row_bytes;
        if (done - released >= chunk) file_.release(data + released, done - released), released = done;
      }
      file_.release(data + released, n * esize - released);
    }
    if (!finite) nonfinite_.push_back(label);
    return true;
  }

  // The tensor for `canonical` with `shape` (row-major floats), or zeros and a recorded
  // problem.
  WeightVector<float> take(const std::string& canonical, std::vector<int64_t> shape) {
    size_t n = 1;
    for (int64_t d : shape) n *= static_cast<size_t>(d);
    WeightVector<float> v(n, 0.0f);
    read_rows(canonical, shape,
              [&](int r, const float* row, size_t cols) { std::copy_n(row, cols, v.data() + size_t(r) * cols); });
    return v;
  }

  // A file tensor that a tied spec reads under another name: accepted, not required.
  void alias(const std::string& canonical) { used_.insert(resolve(canonical).name); }
  void ignore(const std::string& file_name) { used_.insert(file_name); }
  // Tensors of a Hugging Face family's files that no spec reads (buffers), accepted.
  void ignore_family_buffers(int layers) {
    if (!is_hf(c_.preset)) return;
    for (const std::string& u : hf_family(c_.preset).unused) {
      const size_t at = u.find("{N}");
      if (at == std::string::npos) ignore(hf_prefix_ + u);
      for (int i = 0; i < layers && at != std::string::npos; ++i)
        ignore(hf_prefix_ + std::string(u).replace(at, 3, str(i)));
    }
  }

  // A linear's weight rows (torch layout [out][in], `rows` of them from output n0) into
  // `lb`: float rows from any file; I8 rows with their scales from a canonical file.
  void weight_rows(LinearBuilder& lb, const std::string& canonical, int n0, int rows) {
    const int in = lb.in();
    if (int8_rows(canonical, rows, in, lb.format() == WeightFormat::Int8,
                  [&](int r, const int8_t* q, float scale) { lb.channel_int8(n0 + r, q, scale); }))
      return;
    read_rows(canonical, {rows, in}, [&](int r, const float* row, size_t) { lb.channel(n0 + r, row); });
  }
  // Linear with torch layout [out][in] -> the format and packed layout its kernel reads.
  LinearWeights linear(const std::string& prefix, int in, int out, WeightFormat format) {
    return projections(prefix, {""}, in, {out}, format);
  }
  // Concatenation of several projections' outputs (outs[i] each, input d), e.g. Q | K | V
  // (K and V narrower with grouped-query attention); proj "" is `prefix` itself.
  LinearWeights projections(const std::string& prefix, const std::vector<std::string>& projs, int d,
                            const std::vector<int>& outs, WeightFormat format) {
    int total = 0;
    for (int o : outs) total += o;
    LinearBuilder lb(d, total, format, layout_);
    WeightVector<float> bias;
    for (size_t i = 0, n0 = 0; i < projs.size(); n0 += size_t(outs[i]), ++i) {
      const std::string p = projs[i].empty() ? prefix : prefix + "." + projs[i];
      weight_rows(lb, p + ".weight", int(n0), outs[i]);
      WeightVector<float> b = take(p + ".bias", {outs[i]});
      bias.insert(bias.end(), b.begin(), b.end());
    }
    return lb.finish(std::move(bias));
  }
  // A token table [vocab][d] in `format`; with `shared`, also the output projection that
  // shares it (share_tgt_output), from the same rows.
  EmbeddingTable table(const std::string& canonical, int vocab, int d, WeightFormat format, LinearBuilder* shared) {
    EmbeddingTable t;
    const bool int8 = format == WeightFormat::Int8;
    const size_t stride = size_t(d) + kInt8RowScaleBytes;
    if (int8)
      t.q.assign(size_t(vocab) * stride, 0);
    else
      t.f.assign(size_t(vocab) * d, 0.0f);
    // From a canonical file's I8 rows: a table that is int8 and a projection that is
    // int8 too (its channels are the same quantized rows).
    const bool shared_ok = !shared || shared->format() == WeightFormat::Int8;
    if (int8_rows(canonical, vocab, d, int8 && shared_ok, [&](int r, const int8_t* q, float scale) {
          put_int8_table_row(t.q.data() + size_t(r) * stride, d, q, scale);
          if (shared) shared->channel_int8(r, q, scale);
        }))
      return t;
    std::vector<int8_t> q(int8 ? size_t(d) : 0);
    read_rows(canonical, {vocab, d}, [&](int r, const float* row, size_t) {
      if (!int8) {
        std::copy_n(row, d, t.f.data() + size_t(r) * d);
        if (shared) shared->channel(r, row);
        return;
      }
      const float scale = quantize_row_int8(row, d, q.data());
      put_int8_table_row(t.q.data() + size_t(r) * stride, d, q.data(), scale);
      if (!shared) return;
      if (shared->format() == WeightFormat::Int8)
        shared->channel_int8(r, q.data(), scale);  // the same quantized row
      else
        shared->channel(r, row);
    });
    return t;
  }
  // RMSNorm: gamma only (offset + weight), beta zeros; else weight and bias. A canonical
  // file holds the gamma the kernel multiplies by (offset already added).
  // `scale` multiplies gamma (and beta) after the offset: generator_input_scale, folded
  // into the decoder's final norm; a canonical file holds the scaled values.
  NormWeights norm(const std::string& prefix, int d, double scale = 1.0) {
    NormWeights n{take(prefix + ".weight", {d}),
                  c_.rms_norm ? WeightVector<float>(size_t(d), 0.0f) : take(prefix + ".bias", {d})};
    if (canonical_) return n;
    for (float& g : n.gamma) g = float((double(g) + (c_.rms_norm ? c_.norm_weight_offset : 0.0)) * scale);
    if (scale != 1.0)
      for (float& b : n.beta) b = float(double(b) * scale);
    return n;
  }

  // The I8 rows [rows][cols] of a canonical file's tensor for `canonical` and its F32
  // "_scale" [rows], through row(r, q, scale). Returns false (nothing read) when the file
  // stores that tensor otherwise; records a problem when it is I8 but malformed or the
  // model does not read it as int8 (`accepted` false).
  template <typename RowFn>
  bool int8_rows(const std::string& canonical, int rows, int cols, bool accepted, RowFn row) {
    const TensorInfo* t = canonical_ ? file_.find(canonical) : nullptr;
    if (!t || t->dtype != "I8") return false;
    used_.insert(canonical);
    const std::string scale_name = canonical + "_scale";
    const TensorInfo* s = file_.find(scale_name);
    used_.insert(scale_name);
    const std::vector<int64_t> shape{rows, cols}, scale_shape{rows};
    if (!accepted) {
      mismatched_.push_back(canonical + ": I8 (quantized by halformer quantize), but this model reads it as " +
                            "floats: quantize for this build's precision, or use the original weights");
      return true;
    }
    if (t->shape != shape) {
      mismatched_.push_back(canonical + ": expected I8 " + shape_str(shape) + ", found I8 " + shape_str(t->shape));
      return true;
    }
    if (!s) {
      missing_.push_back(scale_name + " F32 " + shape_str(scale_shape) + " (the scales of the I8 " + canonical + ")");
      return true;
    }
    if (s->dtype != "F32" || s->shape != scale_shape) {
      mismatched_.push_back(scale_name + ": expected F32 " + shape_str(scale_shape) + ", found " + s->dtype + " " +
                            shape_str(s->shape));
      return true;
    }
    bool valid = true;
    for (int r = 0; r < rows; ++r) {
      float scale;
      std::memcpy(&scale, s->data + size_t(r) * 4, 4);
      valid = valid && std::isfinite(scale) && scale >= 0.0f;
      row(r, reinterpret_cast<const int8_t*>(t->data) + size_t(r) * cols, scale);
    }
    if (!valid) nonfinite_.push_back(scale_name + " (scales must be finite and >= 0)");
    file_.release(t->data, t->bytes);
    return true;
  }

  void check() const {
    std::vector<std::string> unexpected;
    for (const auto& [name, info] : file_.tensors())
      if (!used_.count(name)) unexpected.push_back(name + " " + shape_str(info.shape));
    if (missing_.empty() && mismatched_.empty() && unexpected.empty() && nonfinite_.empty()) return;
    std::ostringstream msg;
    msg << file_.path() << ": weights do not match the spec (naming preset " << c_.preset_name << ")";
    auto list = [&](const char* title, const std::vector<std::string>& items) {
      if (items.empty()) return;
      msg << "\n  " << title << " (" << items.size() << "):";
      for (size_t i = 0; i < items.size() && i < 20; ++i) msg << "\n    " << items[i];
      if (items.size() > 20) msg << "\n    ... and " << items.size() - 20 << " more";
    };
    list("missing", missing_);
    list("wrong dtype or shape", mismatched_);
    list("unexpected (not used by this spec)", unexpected);
    list("containing NaN or Inf", nonfinite_);
    throw Error(msg.str());
  }

  const SafetensorsFile& file() const { return file_; }

 private:
  static std::string shape_str(const std::vector<int64_t>& s) {
    std::string r = "[";
    for (size_t i = 0; i < s.size(); ++i) r += (i ? ", " : "") + std::to_string(s[i]);
    return r + "]";
  }
  Source resolve_name(const std::string& canonical) {
    if (is_hf(c_.preset)) return hf_preset(hf_family(c_.preset), hf_prefix_, c_, parse(canonical));
    if (c_.preset == Preset::TorchTransformer) return torch_preset(c_, parse(canonical));
    if (c_.preset == Preset::AnnotatedTransformer) return annotated_preset(c_, parse(canonical));
    auto it = map_.find(canonical);  // explicit
    return {it == map_.end() ? canonical : it->second};
  }

  const ModelConfig& c_;
  SafetensorsFile file_;
  const WeightLayout layout_;  // fp32 / bf16 linears: the packed layout
  std::string hf_prefix_;
  std::map<std::string, std::string> map_;
  std::set<std::string> used_;
  std::vector<std::string> missing_, mismatched_, nonfinite_;
  bool canonical_ = false;  // a file written by save_weights
};

LayerWeights load_layer(Loader& ld, const ModelConfig& c, const std::string& stack, int i) {
  const int d = c.d_model;
  const WeightFormat f = c.layer_weights;
  const std::string p = stack + "." + str(i) + ".";
  LayerWeights L;
  const int kvd = c.kv_heads * (d / c.heads);
  L.qkv = ld.projections(p + "self_attn", {"q", "k", "v"}, d, {d, kvd, kvd}, f);
  L.attn_out = ld.linear(p + "self_attn.o", d, d, f);
  if (stack == "decoder" && c.arch == Arch::EncoderDecoder) {
    L.cross_q = ld.projections(p + "cross_attn", {"q"}, d, {d}, f);
    L.cross_kv = ld.projections(p + "cross_attn", {"k", "v"}, d, {d, d}, f);
    L.cross_out = ld.linear(p + "cross_attn.o", d, d, f);
    L.cross_norm = ld.norm(p + "cross_norm", d);
  }
  if (c.gated_ff) L.ff_gate = ld.linear(p + "ff_gate", d, c.d_ff, f);
  L.ff1 = ld.linear(p + "ff1", d, c.d_ff, f);
  L.ff2 = ld.linear(p + "ff2", c.d_ff, d, f);
  L.self_norm = ld.norm(p + "self_norm", d);
  L.ff_norm = ld.norm(p + "ff_norm", d);
  return L;
}

}  // namespace

Weights load_weights(const ModelConfig& c, const std::string& path, const WeightLayout& target_layout) {
  WeightLayout layout = target_layout;
  if (c.int16_activations) layout.int8_group = kInt8Pair;  // the kernels' form, not the target's
  Loader ld(c, path, layout);
  const int d = c.d_model;
  const bool enc = c.arch != Arch::Decoder, dec = c.arch != Arch::Encoder;
  Weights w;
  // The output projection that shares the target table is filled from its rows.
  std::unique_ptr<LinearBuilder> shared;
  if (dec && c.share_tgt_output) shared = std::make_unique<LinearBuilder>(d, c.tgt_vocab, c.generator_weights, layout);
  const WeightFormat tf = c.embedding_weights;
  // The tables (and their norm) are e wide: d, except where an encoder-only model's
  // embedding.size differs (then a projection follows, ELECTRA-small).
  const int e = c.embedding_size;
  if (enc)
    w.src_embedding = ld.table("src_embedding.weight", c.src_vocab, e, tf, c.share_src_tgt ? shared.get() : nullptr);
  if (dec) {
    if (c.share_src_tgt)
      ld.alias("tgt_embedding.weight");  // tgt_table() is the source table
    else
      w.tgt_embedding = ld.table("tgt_embedding.weight", c.tgt_vocab, d, tf, shared.get());
  }
  const bool per_stack = is_hf(c.preset) && hf_family(c.preset).per_stack_embeddings;
  if (c.positions == PositionKind::Learned) {
    w.positions = ld.take("pos_embedding.weight", {c.max_len, e});
    if (per_stack && dec) w.tgt_positions = ld.take("tgt_pos_embedding.weight", {c.max_len, d});
  }
  if (c.type_vocab > 0) w.token_types = ld.take("type_embedding.weight", {c.type_vocab, e});
  if (c.embedding_norm) {
    w.embedding_norm = ld.norm("embedding_norm", e);
    if (per_stack && dec) w.tgt_embedding_norm = ld.norm("tgt_embedding_norm", d);
  }
  if (e != d) w.embed_project = ld.linear("embed_project", e, d, c.layer_weights);
  // Shared layers (ALBERT): the one set, encoder.0.*, that every layer runs with.
  const int encoder_sets = c.shared_layers ? 1 : c.encoder_layers;
  for (int i = 0; i < encoder_sets && enc; ++i) w.encoder.push_back(load_layer(ld, c, "encoder", i));
  for (int i = 0; i < c.decoder_layers && dec; ++i) w.decoder.push_back(load_layer(ld, c, "decoder", i));
  if (c.final_norm) {
    if (enc) w.encoder_norm = ld.norm("encoder_norm", d);
    if (dec) w.decoder_norm = ld.norm("decoder_norm", d, c.generator_input_scale);
  }
  if (c.positions == PositionKind::Relative) {
    auto stack = [&](const char* name, bool bidirectional, WeightVector<float>& bias, WeightVector<float>& table) {
      bias = ld.take(std::string(name) + "_relative_bias.weight", {c.relative_buckets, c.heads});
      table = relative_position_table(bias, c.heads, bidirectional, c.relative_buckets, c.relative_distance,
                                      relative_table_distance(c.relative_distance, c.max_len));
    };
    if (enc) stack("encoder", true, w.encoder_relative_bias, w.encoder_position_bias);
    // T5: bidirectional buckets where every key is visible, causal ones under a causal mask.
    if (dec) stack("decoder", !c.causal, w.decoder_relative_bias, w.decoder_position_bias);
  }
  if (dec) {
    if (shared) {
      w.generator = shared->finish(ld.take("generator.bias", {c.tgt_vocab}));
      ld.alias("generator.weight");
    } else {
      w.generator = ld.linear("generator", d, c.tgt_vocab, c.generator_weights);
    }
  }
  if (c.head == HeadOutput::Classifier) {
    if (c.pooler) w.pooler = ld.linear("pooler", d, d, c.layer_weights);
    w.classifier = ld.linear("classifier", d, c.num_classes, c.layer_weights);
  } else if (is_hf(c.preset) && hf_family(c.preset).model.count("pooler")) {
    ld.alias("pooler.weight");  // BertModel always carries a pooler; only classifiers use it
    ld.alias("pooler.bias");
  }
  // Buffers that some presets' state_dicts carry: accepted, not used.
  ld.ignore("src_embed.1.pe");
  ld.ignore("tgt_embed.1.pe");
  ld.ignore_family_buffers(std::max(c.encoder_layers, c.decoder_layers));
  ld.check();
  return w;
}

namespace {

// Collects canonical tensors for save_weights, owning the bytes they are written from.
class CanonicalWriter {
 public:
  explicit CanonicalWriter(const ModelConfig& c) : c_(c) {}

  void floats(const std::string& name, const WeightVector<float>& v, std::vector<int64_t> shape) {
    tensors_.push_back({name, "F32", std::move(shape), v.data()});
  }
  void norm(const std::string& prefix, const NormWeights& n) {
    floats(prefix + ".weight", n.gamma, {int64_t(n.gamma.size())});
    if (!c_.rms_norm) floats(prefix + ".bias", n.beta, {int64_t(n.beta.size())});
  }
  // `d`: the table's width (the source table's is embedding_size).
  void table(const std::string& name, const EmbeddingTable& t, int vocab, int d) {
    if (!t.int8()) return floats(name, t.f, {vocab, d});
    std::vector<uint8_t> q(size_t(vocab) * d), scales(size_t(vocab) * sizeof(float));
    const size_t stride = size_t(d) + kInt8RowScaleBytes;
    for (int r = 0; r < vocab; ++r) {
      std::memcpy(q.data() + size_t(r) * d, t.q.data() + r * stride, size_t(d));
      std::memcpy(scales.data() + size_t(r) * 4, t.q.data() + r * stride + d, 4);
    }
    add(name, "I8", {vocab, d}, std::move(q));
    add(name + "_scale", "F32", {vocab}, std::move(scales));
  }
  // Rows [n0, n0 + rows) of a loaded linear as `prefix`.weight [rows][in] (+ _scale) and
  // `prefix`.bias, in the format the linear is stored in.
  void linear(const std::string& prefix, const LinearWeights& l, int n0, int rows) {
    const int in = l.in;
    const size_t esize = l.int8() ? 1 : l.bf16() ? 2 : 4;
    std::vector<uint8_t> w(size_t(rows) * in * esize);
    for (int r = 0; r < rows; ++r)
      for (int k = 0; k < in; ++k) {
        const int n = n0 + r;
        uint8_t* dst = w.data() + (size_t(r) * in + k) * esize;
        if (l.int8())
          std::memcpy(dst, &l.q[packed_int8_index(in, n, k, l.int8_group)], 1);
        else if (l.bf16())
          std::memcpy(dst, &l.h[packed_bf16_index(in, n, k, l.panel, l.bf16_pairs)], 2);
        else
          std::memcpy(dst, &l.w[packed_index(in, n, k, l.panel)], 4);
      }
    add(prefix + ".weight", l.int8() ? "I8" : l.bf16() ? "BF16" : "F32", {rows, in}, std::move(w));
    std::vector<float> bias(l.b.begin() + n0, l.b.begin() + n0 + rows);
    if (l.int8()) {
      std::vector<float> scales(l.b.begin() + l.out + n0, l.b.begin() + l.out + n0 + rows);
      owned_floats(prefix + ".weight_scale", std::move(scales));
    }
    owned_floats(prefix + ".bias", std::move(bias));
  }
  // A concatenated projection split back into its parts (outs[i] rows each).
  void projections(const std::string& prefix, const std::vector<std::string>& projs, const LinearWeights& l,
                   const std::vector<int>& outs) {
    for (size_t i = 0, n0 = 0; i < projs.size(); n0 += size_t(outs[i]), ++i)
      linear(prefix + "." + projs[i], l, int(n0), outs[i]);
  }
  void layer(const std::string& stack, int i, const LayerWeights& L) {
    const int d = c_.d_model, kvd = c_.kv_heads * (d / c_.heads);
    const std::string p = stack + "." + std::to_string(i) + ".";
    projections(p + "self_attn", {"q", "k", "v"}, L.qkv, {d, kvd, kvd});
    linear(p + "self_attn.o", L.attn_out, 0, d);
    if (stack == "decoder" && c_.arch == Arch::EncoderDecoder) {
      projections(p + "cross_attn", {"q"}, L.cross_q, {d});
      projections(p + "cross_attn", {"k", "v"}, L.cross_kv, {d, d});
      linear(p + "cross_attn.o", L.cross_out, 0, d);
      norm(p + "cross_norm", L.cross_norm);
    }
    if (c_.gated_ff) linear(p + "ff_gate", L.ff_gate, 0, c_.d_ff);
    linear(p + "ff1", L.ff1, 0, c_.d_ff);
    linear(p + "ff2", L.ff2, 0, d);
    norm(p + "self_norm", L.self_norm);
    norm(p + "ff_norm", L.ff_norm);
  }
  void write(const std::string& path, const std::map<std::string, std::string>& metadata) const {
    write_safetensors(path, tensors_, metadata);
  }
  void owned_floats(const std::string& name, std::vector<float> v) {
    const int64_t n = int64_t(v.size());
    owned_f_.push_back(std::move(v));
    tensors_.push_back({name, "F32", {n}, owned_f_.back().data()});
  }

 private:
  void add(const std::string& name, const char* dtype, std::vector<int64_t> shape, std::vector<uint8_t> bytes) {
    owned_.push_back(std::move(bytes));
    tensors_.push_back({name, dtype, std::move(shape), owned_.back().data()});
  }
  const ModelConfig& c_;
  std::vector<NamedTensor> tensors_;
  std::deque<std::vector<uint8_t>> owned_;  // deque: pointers into it stay valid
  std::deque<std::vector<float>> owned_f_;
};

}  // namespace

int relative_position_bucket(int r, bool bidirectional, int buckets, int distance) {
  int bucket = 0;
  if (bidirectional) {
    buckets /= 2;
    if (r > 0) bucket += buckets;
    r = std::abs(r);
  } else {
    r = std::max(-r, 0);
  }
  const int exact = buckets / 2;
  if (r < exact) return bucket + r;
  // transformers: exact + (log(r / exact) / log(distance / exact) * (buckets - exact)).long(),
  // each step a float32 tensor op (the Python float divisor rounded to float32).
  const float ratio = std::log(float(r) / float(exact)) / float(std::log(double(distance) / double(exact)));
  const int large = exact + int(ratio * float(buckets - exact));
  return bucket + std::min(large, buckets - 1);
}

WeightVector<float> relative_position_table(const WeightVector<float>& bias, int heads, bool bidirectional,
                                            int buckets, int distance, int half) {
  const int width = 2 * half + 1;
  WeightVector<float> table(size_t(width) * heads);
  for (int r = -half; r <= half; ++r) {
    const int k = relative_position_bucket(r, bidirectional, buckets, distance);
    for (int h = 0; h < heads; ++h) table[size_t(h) * width + size_t(r + half)] = bias[size_t(k) * heads + h];
  }
  return table;
}

const char* weight_format_name(WeightFormat f) {
  return f == WeightFormat::Int8 ? "int8" : f == WeightFormat::Bf16 ? "bf16" : "fp32";
}

void save_weights(const ModelConfig& c, const Weights& w, const std::string& path) {
  CanonicalWriter out(c);
  const int d = c.d_model;
  const bool enc = c.arch != Arch::Decoder, dec = c.arch != Arch::Encoder;
  if (enc) out.table("src_embedding.weight", w.src_embedding, c.src_vocab, c.embedding_size);
  if (dec && !c.share_src_tgt) out.table("tgt_embedding.weight", w.tgt_embedding, c.tgt_vocab, c.d_model);
  const int e = c.embedding_size;
  if (!w.positions.empty()) out.floats("pos_embedding.weight", w.positions, {c.max_len, e});
  if (!w.tgt_positions.empty()) out.floats("tgt_pos_embedding.weight", w.tgt_positions, {c.max_len, d});
  if (!w.token_types.empty()) out.floats("type_embedding.weight", w.token_types, {c.type_vocab, e});
  if (c.embedding_norm) out.norm("embedding_norm", w.embedding_norm);
  if (!w.tgt_embedding_norm.gamma.empty()) out.norm("tgt_embedding_norm", w.tgt_embedding_norm);
  if (e != d) out.linear("embed_project", w.embed_project, 0, d);
  for (size_t i = 0; i < w.encoder.size(); ++i) out.layer("encoder", int(i), w.encoder[i]);
  for (size_t i = 0; i < w.decoder.size(); ++i) out.layer("decoder", int(i), w.decoder[i]);
  if (c.final_norm) {
    if (enc) out.norm("encoder_norm", w.encoder_norm);
    if (dec) out.norm("decoder_norm", w.decoder_norm);
  }
  if (!w.encoder_relative_bias.empty())
    out.floats("encoder_relative_bias.weight", w.encoder_relative_bias, {c.relative_buckets, c.heads});
  if (!w.decoder_relative_bias.empty())
    out.floats("decoder_relative_bias.weight", w.decoder_relative_bias, {c.relative_buckets, c.heads});
  if (dec) {
    if (c.share_tgt_output)  // the weight is the target table's
      out.owned_floats("generator.bias", {w.generator.b.begin(), w.generator.b.begin() + c.tgt_vocab});
    else
      out.linear("generator", w.generator, 0, c.tgt_vocab);
  }
  if (c.head == HeadOutput::Classifier) {
    if (c.pooler) out.linear("pooler", w.pooler, 0, d);
    out.linear("classifier", w.classifier, 0, c.num_classes);
  }
  out.write(path, {{"halformer.names", "canonical"},
                   {"halformer.model", c.name},
                   {"halformer.layers", weight_format_name(c.layer_weights)},
                   {"halformer.generator", weight_format_name(c.generator_weights)},
                   {"halformer.embeddings", weight_format_name(c.embedding_weights)}});
}

}  // namespace halformer
