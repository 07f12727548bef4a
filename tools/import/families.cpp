// The family table and what every family reader shares: model_type -> preset,
// architecture, task classes, probe tensor and reader (families()); the families planned
// but not expressible yet; the config fields known not to change the outputs (harmless());
// and the Hugging Face activation names (numbers: format_float_literal, tools/spec/output_text.h).
// Adding a family: its reader in the file of its group, one row here (docs/import.md).
#include "import_internal.h"
#include "output_text.h"

namespace halformer::import::detail {

// ---------------------------------------------------------------- helpers of the readers

// Hugging Face activation names -> the spec's.
std::optional<std::string> activation(const std::string& hf) {
  static const std::map<std::string, std::string> m = {
      {"gelu", "gelu"}, {"gelu_new", "gelu_tanh"}, {"gelu_pytorch_tanh", "gelu_tanh"}, {"relu", "relu"},
      {"silu", "silu"}, {"swish", "silu"}, {"relu2", "relu2"}};
  auto it = m.find(hf);
  if (it == m.end()) return std::nullopt;
  return it->second;
}
// The gated kind whose gate takes the Hugging Face activation `hf` (Llama's hidden_act,
// T5's gated-ACT).
std::optional<std::string> gated_activation(const std::string& hf) {
  static const std::map<std::string, std::string> m = {
      {"silu", "swiglu"}, {"swish", "swiglu"}, {"gelu", "geglu"}, {"gelu_new", "geglu_tanh"},
      {"gelu_pytorch_tanh", "geglu_tanh"}};
  auto it = m.find(hf);
  if (it == m.end()) return std::nullopt;
  return it->second;
}
void read_activation(Config& c, const std::string& key, const std::string& fallback, Model& m) {
  const std::string act = c.text(key).value_or(fallback);
  if (auto a = activation(act))
    m.set("layer", "activation", *a, key + " '" + act + "'");
  else if (c.has(key))
    c.refuse(key, "supported: gelu (erf), gelu_new / gelu_pytorch_tanh (tanh approximation), relu, relu2, "
              "silu / swish");
}

// ---------------------------------------------------------------- the family table
const std::vector<FamilyInfo>& families() {
  static const std::vector<FamilyInfo> f = {
      {"bert", "huggingface-bert", "encoder",
       {{"BertModel", Task::Base}, {"BertForSequenceClassification", Task::SequenceClassification}},
       "embeddings.word_embeddings.weight", read_bert},
      {"roberta", "huggingface-roberta", "encoder",
       {{"RobertaModel", Task::Base}, {"RobertaForSequenceClassification", Task::SequenceClassification}},
       "embeddings.word_embeddings.weight", read_roberta},
      // XLM-RoBERTa: RoBERTa's model and names (its own model_type and classes).
      {"xlm-roberta", "huggingface-roberta", "encoder",
       {{"XLMRobertaModel", Task::Base}, {"XLMRobertaForSequenceClassification", Task::SequenceClassification}},
       "embeddings.word_embeddings.weight", read_roberta},
      {"electra", "huggingface-electra", "encoder",
       {{"ElectraModel", Task::Base}, {"ElectraForSequenceClassification", Task::SequenceClassification}},
       "embeddings.word_embeddings.weight", read_electra},
      {"albert", "huggingface-albert", "encoder",
       {{"AlbertModel", Task::Base}, {"AlbertForSequenceClassification", Task::SequenceClassification}},
       "embeddings.word_embeddings.weight", read_albert},
      {"distilbert", "huggingface-distilbert", "encoder", {{"DistilBertModel", Task::Base}},
       "embeddings.word_embeddings.weight", read_distilbert},
      {"gpt2", "huggingface-gpt2", "decoder", {{"GPT2LMHeadModel", Task::Base}}, "wte.weight", read_gpt2},
      {"gptj", "huggingface-gptj", "decoder", {{"GPTJForCausalLM", Task::Base}}, "wte.weight", read_gptj},
      {"opt", "huggingface-opt", "decoder", {{"OPTForCausalLM", Task::Base}}, "embed_tokens.weight", read_opt},
      {"gpt_neox", "huggingface-gpt-neox", "decoder", {{"GPTNeoXForCausalLM", Task::Base}}, "embed_in.weight",
       read_gpt_neox},
      {"llama", "huggingface-llama", "decoder", {{"LlamaForCausalLM", Task::Base}}, "embed_tokens.weight",
       read_llama},
      {"mistral", "huggingface-llama", "decoder", {{"MistralForCausalLM", Task::Base}}, "embed_tokens.weight",
       read_mistral},
      {"qwen2", "huggingface-qwen2", "decoder", {{"Qwen2ForCausalLM", Task::Base}}, "embed_tokens.weight",
       read_qwen2},
      {"gemma", "huggingface-llama", "decoder", {{"GemmaForCausalLM", Task::Base}}, "embed_tokens.weight",
       read_gemma},
      {"bart", "huggingface-bart", "encoder_decoder", {{"BartForConditionalGeneration", Task::Base}}, "shared.weight",
       read_bart},
      {"marian", "huggingface-bart", "encoder_decoder", {{"MarianMTModel", Task::Base}}, "shared.weight", read_marian},
      {"mbart", "huggingface-bart", "encoder_decoder", {{"MBartForConditionalGeneration", Task::Base}}, "shared.weight",
       read_mbart},
      // T5WithLMHeadModel: the class's old name, still in the original t5-small ... t5-11b configs.
      {"t5", "huggingface-t5", "encoder_decoder",
       {{"T5ForConditionalGeneration", Task::Base}, {"T5WithLMHeadModel", Task::Base}}, "shared.weight", read_t5},
      {"mt5", "huggingface-t5", "encoder_decoder", {{"MT5ForConditionalGeneration", Task::Base}}, "shared.weight",
       read_t5},
  };
  return f;
}

// Families Hugging Face has that the spec language cannot express yet (issue 15).
const std::map<std::string, std::string>& planned() {
  static const std::map<std::string, std::string> p = {
      {"gemma2", "logit soft-capping, sliding-window layers, a query scale of its own"},
  };
  return p;
}

// ---------------------------------------------------------------- fields that do not change the outputs
// PretrainedConfig's own fields (transformers 4.30) and metadata. Generation defaults are
// listed too: they set Hugging Face's generate() defaults, not the model; halformer's
// decoding comes from the spec and the binary's options.
const std::set<std::string>& harmless() {
  static const std::set<std::string> s = {
      "_name_or_path", "_commit_hash", "architectures", "model_type", "transformers_version", "torch_dtype",
      "id2label", "label2id", "num_labels", "problem_type", "finetuning_task", "tokenizer_class", "prefix",
      "task_specific_params", "output_attentions", "output_hidden_states", "output_scores", "return_dict",
      "return_dict_in_generate", "torchscript", "use_bfloat16", "tf_legacy_loss", "chunk_size_feed_forward",
      "tie_encoder_decoder", "cross_attention_hidden_size", "decoder_start_token_id", "sep_token_id",
      "gradient_checkpointing", "output_past",
      // generation defaults
      "bad_words_ids", "begin_suppress_tokens", "diversity_penalty", "do_sample", "early_stopping",
      "encoder_no_repeat_ngram_size", "exponential_decay_length_penalty", "forced_bos_token_id",
      "forced_eos_token_id", "length_penalty", "max_length", "min_length", "no_repeat_ngram_size",
      "num_beam_groups", "num_beams", "num_return_sequences", "remove_invalid_values", "repetition_penalty",
      "suppress_tokens", "temperature", "top_k", "top_p", "typical_p"};
  return s;
}

}  // namespace halformer::import::detail
