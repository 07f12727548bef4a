// Shared by the weight files, not installed (the public API is halformer/weights.h):
// Source, where a canonical tensor lives in a file, as a naming preset resolves it
// (weight_presets.cpp); the Hugging Face family tables the loader also reads (scopes,
// buffers, per-stack embeddings); and LinearBuilder, which packs a linear's output
// channels into the layout its kernel reads (weight_packing.cpp).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "halformer/model_config.h"
#include "halformer/weights.h"

namespace halformer {
namespace weights_internal {

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

inline std::string str(int i) { return std::to_string(i); }

// A Hugging Face family's names (transformers' state_dict names, as saved by
// save_pretrained): the tables are hf_family's, the mapping hf_preset's (weight_presets.cpp).
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

const HfFamily& hf_family(WeightPreset p);
// Every preset but these three is a Hugging Face family (hf_family).
bool is_hf(WeightPreset p);

// Where the tensor for `canonical` is in a file of c.preset's naming (weight_presets.cpp):
// `hf_prefix` is the base model's scope a Hugging Face file uses, `map` an explicit
// preset's weights.map (canonical -> file name; unmapped names are read as they are).
Source preset_source(const ModelConfig& c, const std::string& hf_prefix, const std::map<std::string, std::string>& map,
                     const std::string& canonical);

// Fills a linear's weights one output channel at a time, straight into the format its
// kernel reads (docs/precision.md), so that loading an int8 or bf16 model never holds an
// fp32 copy of a whole matrix.
class LinearBuilder {
 public:
  LinearBuilder(int in, int out, Precision format, const WeightLayout& layout);
  int in() const { return l_.in; }
  Precision format() const { return format_; }
  // Output channel n from its fp32 values v[in].
  void channel(int n, const float* v);
  // Output channel n already quantized (int8 builds only).
  void channel_int8(int n, const int8_t* q, float scale);
  // Output channel n as Q4_0 / Q8_0 blocks (16 / 32 bytes each, the file's order) and
  // their scales (int4 / q8_0 builds only).
  void channel_blocks(int n, const uint8_t* blocks, const float* scales);
  // int4 or q8_0: weights in blocks (halformer/packed_blocks.h).
  static bool block_quantized(Precision p) { return p == Precision::Int4 || p == Precision::Q8_0; }
  LinearWeights finish(WeightVector<float> bias);

 private:
  Precision format_;
  LinearWeights l_;
  std::vector<float> scales_, sums_;
  std::vector<int8_t> channel_q_;
  std::vector<uint8_t> channel_blocks_;
  std::vector<float> channel_scales_;
};

}  // namespace weights_internal
}  // namespace halformer
