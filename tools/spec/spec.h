// The model spec: what a user writes in YAML, parsed and validated into one C++ struct.
//
// Design: parsing and validation report *every* problem they find (not just the first),
// each with file:line:column, the field's dotted path, what was found and what is
// allowed. A spec that is valid but asks for something not implemented yet gets a
// "not supported yet" diagnostic from check_supported(), never a silent fallback.
#pragma once

#include <algorithm>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "halformer/enums.h"

namespace halformer {

// The enums shared with the generators and the runtime (Architecture, NormKind,
// Positions, HeadKind, Pooling, WeightPreset, Precision) and their spellings are in
// halformer/enums.h; these are the spec's own.
enum class NormPlacement { Post, Pre };  // LayerNorm(x + f(x))  vs  x + f(LayerNorm(x))
// Plain kinds: act(x W1) W2, each named as the generators' PointwiseFn (generators/common.h),
// which the planner passes on by name. Gated kinds (swiglu, geglu, geglu_tanh):
// act(x W_gate) * (x W_up), then W_down.
enum class Activation { Relu, Gelu, GeluTanh, Silu, Relu2, Swiglu, Geglu, GegluTanh };
enum class RotaryLayout { Half, Interleaved };  // pairs (c, c + R/2) | (2c, 2c + 1)
enum class Pooler { None, DenseTanh, DenseGelu };  // BERT's (tanh) or ELECTRA's (gelu) pooler before a classifier
enum class DecodeStrategy { Greedy, Beam };
enum class Target { Host, Cuda, OpenCL };
// Their spellings in the spec (spec_names.cpp); enum_name() (halformer/enums.h) reads them.
EnumNames<NormPlacement> enum_names(NormPlacement);
EnumNames<Activation> enum_names(Activation);
EnumNames<RotaryLayout> enum_names(RotaryLayout);
EnumNames<Pooler> enum_names(Pooler);
EnumNames<DecodeStrategy> enum_names(DecodeStrategy);
EnumNames<Target> enum_names(Target);

struct Diagnostic {
  std::string file;
  int line = 0;    // 1-based; 0 when the problem has no single location (e.g. empty file)
  int column = 0;  // 1-based
  std::string field;    // dotted path, e.g. "sizes.d_model"
  std::string message;  // what was found and what is allowed
  // "file:line:column: error: field: message"
  std::string str() const;
};

struct Spec {
  std::string file;  // path the spec was read from (for messages)
  std::string name;  // [A-Za-z0-9_-]+, names the binary and library

  Architecture architecture = Architecture::EncoderDecoder;

  // sizes
  int64_t d_model = 0, heads = 0, d_ff = 0;
  int64_t encoder_layers = 0, decoder_layers = 0;  // 0 for the absent stack
  int64_t src_vocab = 0, tgt_vocab = 0;            // tgt_vocab for decoder/output side
  int64_t max_len = 0;                             // longest source or target sequence
  int64_t type_vocab = 0;                          // token types (BERT); 0 = none
  int64_t kv_heads = 0;  // key/value heads of self-attention (grouped-query); 0 until parsed = heads

  // residual + norm
  NormPlacement norm_placement = NormPlacement::Post;
  NormKind norm_kind = NormKind::Standard;
  double norm_eps = 1e-5;
  double norm_weight_offset = 0.0;  // norms scale by offset + weight (Gemma's RMSNorm: 1)
  bool final_norm = false;  // a LayerNorm after each whole stack
  // x + attn(LN1(x)) + ff(LN2(x)): the feed-forward reads the layer's input, not the
  // attention's output (GPT-J, GPT-NeoX); pre-norm only
  bool parallel_residual = false;
  // Every encoder layer runs with the same weights, one set in the file (ALBERT); encoder only
  bool shared_weights = false;
  Activation activation = Activation::Relu;
  double dropout = 0.0;  // identity at inference; recorded for documentation only

  // embedding
  Positions positions = Positions::Sinusoidal;
  bool scale_embedding = true;  // multiply token embeddings by sqrt(d_model)
  bool share_src_tgt = false;   // one table for source and target tokens
  bool share_tgt_output = false;  // output projection reuses the target embedding
  bool embedding_norm = false;  // LayerNorm after the embedding sum (BERT)
  // Width of the embedding tables (and their norm) when narrower or wider than d_model: a
  // linear `embed_project` maps them to d_model (ELECTRA-small); 0 = d_model.
  int64_t embedding_size = 0;
  int64_t embedding_width() const { return embedding_size ? embedding_size : d_model; }
  int64_t position_offset = 0;  // learned positions: t reads table row offset + t (RoBERTa: pad + 1)
  // rotary positions (applied to queries and keys in self-attention)
  int64_t rotary_dim = 0;  // features rotated per head; 0 until parsed = head size
  double rotary_theta = 10000.0;
  RotaryLayout rotary_layout = RotaryLayout::Half;
  // relative positions (T5): buckets of the bias table, distance at which they saturate
  int64_t relative_buckets = 32;
  int64_t relative_distance = 128;

  // attention
  bool causal = true;        // causal mask in decoder self-attention
  bool padding_mask = true;  // key padding masks built from tokens.pad
  bool scaled = true;        // scores times 1 / sqrt(head size) (T5: false)

  // head
  HeadKind head = HeadKind::LogSoftmax;
  Pooling pooling = Pooling::Cls;  // classifier / embedding heads
  int64_t num_classes = 0;         // classifier head
  Pooler pooler = Pooler::None;    // classifier head: dense + tanh (or gelu) on the pooled vector first
  bool normalize = false;          // embedding head: L2-normalise the pooled vector
  double input_scale = 1.0;        // the decoder's last hidden state times this before the output projection (T5 tied: d^-0.5)

  // special tokens
  int64_t pad_id = 0, bos_id = 1, eos_id = 2;

  // decoding
  DecodeStrategy decoding = DecodeStrategy::Greedy;
  int64_t max_new_tokens = 64;
  int64_t beam_size = 1;
  double length_penalty = 1.0;

  // weights
  WeightPreset preset = WeightPreset::TorchTransformer;
  std::map<std::string, std::string> weight_map;  // explicit: canonical name -> file name

  Precision precision = Precision::Fp32;
  // precision_overrides.generator: the output projection's own precision (absent: precision;
  // q8_0 in an int4 build)
  std::optional<Precision> generator_precision;
  // int4 builds keep the output projection at 8 bits in blocks (as llama.cpp's Q4_0 files
  // keep theirs at 6 or 8 bits): the logits' error is what greedy tokens see first.
  Precision output_precision() const {
    return generator_precision.value_or(precision == Precision::Int4 ? Precision::Q8_0 : precision);
  }
  // precision_overrides.embeddings: the token tables' (fp32 or int8; absent: int8 in an int8,
  // q8_0 or int4 build, else fp32)
  std::optional<Precision> embedding_precision;
  // precision_overrides.int16_activations: int8 linears keep int16 activations (vpmaddwd)
  // even where the CPU could multiply uint8 ones (vpdpbusd): accuracy over speed
  bool int16_activations = false;
  Precision table_precision() const {
    const bool quantized = precision == Precision::Int8 || precision == Precision::Q8_0 || precision == Precision::Int4;
    return embedding_precision.value_or(quantized ? Precision::Int8 : Precision::Fp32);
  }
  // precision_overrides.kv_cache: the attention caches' (fp32, bf16, fp16 or int8; absent:
  // bf16 in a reduced-precision build, else fp32). int8: the self-attention cache's keys and
  // values (halformer/kv_int8.h); its new rows and the cross-attention cache are bf16.
  std::optional<Precision> kv_cache_precision;
  Precision cache_precision() const {
    return kv_cache_precision.value_or(precision == Precision::Fp32 ? Precision::Fp32 : Precision::Bf16);
  }
  // The caches' rows are 16-bit (bf16 or fp16; int8: bf16 before they are stored): the
  // kernels' *_bf16 flags and `half` format.
  bool half_cache() const { return cache_precision() != Precision::Fp32; }
  // The self-attention cache's keys and values stored as int8 rows (kv_cache: int8).
  bool int8_cache() const { return cache_precision() == Precision::Int8; }
  std::vector<Target> targets = {Target::Host};
  bool has_target(Target t) const { return std::find(targets.begin(), targets.end(), t) != targets.end(); }
  int64_t cuda_capability = 80;
  // fp32 linears on cuBLASLt (CUDA) may multiply in TF32: off unless the spec says so.
  bool tf32 = false;

  // schedule knob overrides, "<layer kind>.<knob>" -> value, e.g. "linear.tile_m": "4"
  std::map<std::string, std::string> schedule;

  // tuning: read by `halformer tune` and `halformer build` (docs/tuning.md)
  std::string tuning_db;                // database path as written (relative to the spec's directory)
  std::vector<int64_t> tuning_seq_lens;     // empty: the tuner's default (128)
  std::vector<int64_t> tuning_batch_sizes;  // empty: the tuner's default (1)

  // Where each field was written: dotted path (e.g. "sizes.d_model", "layer") ->
  // (line, column), 1-based. A field missing here took its default. Used to place
  // diagnostics (check_supported) on the line the user wrote.
  std::map<std::string, std::pair<int, int>> locations;
};

struct ParseResult {
  std::optional<Spec> spec;  // set only when there are no diagnostics
  std::vector<Diagnostic> diagnostics;
  bool ok() const { return spec.has_value() && diagnostics.empty(); }
};

// Reads and validates a spec file. Never throws; every problem becomes a Diagnostic.
ParseResult parse_spec_file(const std::string& path);
// Same, from text; `file` is used in messages.
ParseResult parse_spec_string(const std::string& text, const std::string& file);

// Diagnostics for values that are valid in the schema but not implemented yet
// (message contains "not supported yet"). Empty when the spec can be built.
std::vector<Diagnostic> check_supported(const Spec& spec);

// The defaults of every optional field, as JSON (`halformer check --print-defaults`):
// {"defaults": {section: {key: value}, ...}, "derived": {"section.key": rule}}, the values
// taken from Spec's member initializers above (spec_defaults.cpp).
std::string spec_defaults_json();

// Names for enums, as written in YAML (e.g. "encoder_decoder", "gelu_tanh").
const char* to_string(Architecture);
const char* to_string(NormPlacement);
const char* to_string(NormKind);
const char* to_string(Activation);
const char* to_string(Positions);
const char* to_string(HeadKind);
const char* to_string(Pooling);
const char* to_string(Pooler);
const char* to_string(DecodeStrategy);
const char* to_string(WeightPreset);
const char* to_string(Precision);
// "fp32" | "bf16" | "int8" (the spec's spelling); nullopt for anything else.
std::optional<Precision> parse_precision(const std::string&);
const char* to_string(Target);
const char* to_string(RotaryLayout);

// Gated feed-forward (swiglu, geglu, geglu_tanh) and the activation of its gate.
bool is_gated(Activation);
Activation gate_activation(Activation);
}  // namespace halformer
