// The contract between a generated model (DIR/<name>_model.cpp, written by the spec
// compiler) and the generic runtime: the spec's values the runtime needs, and one
// function pointer per layer role, each an ahead-of-time compiled Halide pipeline.
// Several roles may point at the same pipeline when their baked sizes agree.
#pragma once

#include <cstdint>

struct halide_buffer_t;
struct halide_filter_metadata_t;

namespace halformer {

// Signatures of the generated pipelines (generators/*.cpp); buffers are Halide
// buffers, dims innermost first.
using EmbeddingFn = int (*)(halide_buffer_t* tokens, halide_buffer_t* type_ids, halide_buffer_t* table,
                            halide_buffer_t* pos_table, halide_buffer_t* type_table, int32_t pos_offset,
                            halide_buffer_t* out);
using LinearFn = int (*)(halide_buffer_t* x, halide_buffer_t* w, halide_buffer_t* b,
                         halide_buffer_t* out);
using LinearResidualFn = int (*)(halide_buffer_t* x, halide_buffer_t* w, halide_buffer_t* b,
                                 halide_buffer_t* residual, halide_buffer_t* out);
// position_bias: the (2M + 1, heads) relative position table of a stack (T5), read only by
// kernels built with relative_distance M > 0; any buffer for the others.
using AttentionFn = int (*)(halide_buffer_t* q, halide_buffer_t* kv, halide_buffer_t* key_mask,
                            halide_buffer_t* position_bias, halide_buffer_t* out);
using LayerNormFn = int (*)(halide_buffer_t* x, halide_buffer_t* gamma, halide_buffer_t* beta,
                            halide_buffer_t* out);
using SoftmaxFn = int (*)(halide_buffer_t* x, halide_buffer_t* out);
using ArgmaxFn = int (*)(halide_buffer_t* x, halide_buffer_t* out);
using PoolFn = int (*)(halide_buffer_t* x, halide_buffer_t* valid, halide_buffer_t* out);

enum class Arch { EncoderDecoder, Encoder, Decoder };
enum class WeightFormat { Fp32, Int8, Bf16 };
enum class HeadOutput { LogSoftmax, Softmax, Logits, Classifier, Embedding, Hidden };
// Rotary: applied to queries and keys inside the self-attention kernels (baked in).
// Relative: a bucketed bias per head added to the self-attention scores (T5), no embedding positions.
enum class PositionKind { Sinusoidal, Learned, None, SinusoidalSplit, Rotary, Relative };
enum class Preset {
  TorchTransformer,
  AnnotatedTransformer,
  HuggingfaceBert,
  HuggingfaceRoberta,
  HuggingfaceDistilbert,
  HuggingfaceGpt2,
  HuggingfaceBart,
  HuggingfaceLlama,
  HuggingfaceT5,
  HuggingfaceQwen2,
  HuggingfaceGptj,
  HuggingfaceGptNeox,
  HuggingfaceOpt,
  HuggingfaceElectra,
  HuggingfaceAlbert,
  Explicit
};

struct ModelConfig {
  const char* name;
  const char* spec_file;  // where the spec was read from at build time
  Arch arch;
  int d_model, heads, d_ff;
  int encoder_layers, decoder_layers;
  int src_vocab, tgt_vocab, max_len, type_vocab;
  bool pre_norm;        // x + f(LN(x)) instead of LN(x + f(x))
  bool final_norm;      // LN after each whole stack
  PositionKind positions;
  bool embedding_norm;  // LN after the embedding sum (BERT)
  bool share_src_tgt, share_tgt_output;
  bool causal;          // decoder self-attention
  bool padding_mask;    // mask keys equal to pad_id
  HeadOutput head;
  bool mean_pooling;    // classifier / embedding heads: mean over tokens, else the first token
  bool pooler;          // classifier: dense + tanh (BERT) or gelu (ELECTRA) before the classifier
  int num_classes;
  int pad_id, bos_id, eos_id;
  int max_new_tokens;
  bool beam;            // default decoding strategy
  int beam_size;
  double length_penalty;
  Preset preset;
  const char* preset_name;
  // explicit preset: canonical weight name -> name in the file, as {key, value} pairs
  const char* const* weight_map;  // null-terminated key/value array, or null
  // learned positions: position t reads row position_offset + t of the file's table
  // (RoBERTa: padding_idx + 1); the table has max_len + position_offset rows
  int position_offset;
  // Self-attention key/value heads (grouped-query attention: fewer than heads); the fused
  // QKV row and the KV cache hold d_model + 2 * kv_heads * head size features.
  int kv_heads;
  bool rms_norm;              // every norm is RMSNorm (gamma only)
  double norm_weight_offset;  // norms scale by offset + weight (Gemma: 1)
  bool gated_ff;              // ff1 is the gate (with the activation), ff_up the up projection
  // How linear weights are stored (docs/precision.md): int8 (generators/linear_int8.cpp)
  // quantized per channel at load, the kernels taking w as packed int8 and b as
  // (bias | scale); bf16 (linear_bf16) rounded at load, w as packed uint16 (bf16 bits).
  WeightFormat layer_weights;      // every linear of the layers, the pooler and the classifier
  WeightFormat generator_weights;  // the output projection (precision_overrides.generator)
  // The token embedding tables: fp32, or int8 rows with their scale (EmbeddingTable;
  // int8 builds, unless precision_overrides.embeddings keeps them fp32).
  WeightFormat embedding_weights;
  // int8 linears with int16 activations even on CPUs with vpdpbusd (generators/linear_int8.cpp,
  // precision_overrides.int16_activations): the packed weights' k group is then a pair.
  bool int16_activations;
  // The cross-attention keys/values stored as bf16 on the CPU (precision_overrides.kv_cache;
  // the kernels' cross_kv out_bf16 / cross_attention kv_bf16). GPU devices keep fp32.
  bool cross_kv_bf16;
  // The decoder's self-attention cache (its fused QKV rows) stored as bf16 on the CPU: the
  // kernels' qkv_cache (out_bf16) writes it, decoder_self_attention (q_bf16, kv_bf16) reads it.
  bool self_cache_bf16;
  // The reduced-precision linears multiply in AMX tiles for calls of more than 8 rows (built
  // on a host whose CPU and OS offer AMX; generators/schedules/cpu_matmul.h): Model::load
  // then needs AMX and asks Linux for the tile state.
  bool amx_tiles;
  // Relative positions (T5): each stack's self-attention adds bias[bucket(j - i)][head], a
  // table of relative_buckets rows (bidirectional buckets in the encoder, causal ones in
  // the decoder) that saturates at relative_distance; the kernels read it expanded to
  // (2 * relative_distance + 1, heads) (generators/attention.cpp).
  int relative_buckets, relative_distance;
  // The decoder's last hidden state is multiplied by this before the output projection
  // (T5 with tied embeddings: d_model^-0.5); folded into decoder_norm's gamma at load.
  double generator_input_scale;
  // Pre-norm layers as x + attn(LN1(x)) + ff(LN2(x)) (GPT-J, GPT-NeoX): the feed-forward's
  // norm reads the layer's input.
  bool parallel_residual;
  int embedding_size;  // the source tables' width; != d_model: embed_project maps them to d_model
  bool shared_layers;  // every encoder layer runs with one set of weights (ALBERT): Weights::encoder holds one
};

struct KernelTable {
  EmbeddingFn embed_src, embed_tgt;
  LinearFn qkv;                 // d -> 3d, self-attention projections
  AttentionFn encoder_self_attention, decoder_self_attention, cross_attention;
  LinearResidualFn attention_out;  // d -> d, + residual
  LinearFn cross_q;             // d -> d
  LinearFn cross_kv;            // d -> 2d (encoder memory)
  LinearFn ff1;                 // d -> d_ff, + activation
  LinearResidualFn ff2;         // d_ff -> d, + residual
  LayerNormFn layer_norm;       // d
  LinearFn generator;           // d -> tgt_vocab
  SoftmaxFn head;               // softmax / log_softmax over tgt_vocab (null for logits)
  ArgmaxFn argmax;              // over tgt_vocab
  PoolFn pool;                  // classifier / embedding heads
  LinearFn pooler;              // d -> d, tanh or gelu
  LinearFn classifier;          // d -> num_classes
  LinearResidualFn ff_up;       // gated feed-forward: (x W_up + b) * gate, d -> d_ff
  LinearFn qkv_cache;           // the decoder's QKV rows as bf16 (self_cache_bf16; else null)
  LayerNormFn embedding_norm;   // the embedding norm at embedding_size (when != d_model; else null)
  LinearFn embed_project;       // embedding_size -> d_model (when they differ; else null)
  // The metadata of one of these kernels: its Halide target string names the instruction
  // set they were all compiled for, which Model::load checks against the CPU.
  const halide_filter_metadata_t* (*metadata)();
};

// A built model as a value: what the generated <name>_model.cpp exports, under a name
// derived from the model's (extern "C" halformer_model_<name>(), see model.h), so that
// any number of models link into one program.
// The half-width M of the relative table the attention kernels read, (2M + 1, heads): the
// buckets' distance, but no more than any two positions of a max_len sequence lie apart
// (relative_distance up to 2^20 would otherwise make tables of gigabytes that no read
// reaches; the kernels clamp at M, which is then never reached).
inline int relative_table_distance(int relative_distance, int max_len) {
  const int reach = max_len > 1 ? max_len - 1 : 1;
  return relative_distance < reach ? relative_distance : reach;
}

constexpr int kDescriptorVersion = 13;  // bumped when ModelConfig / KernelTable change
struct ModelDescriptor {
  int version;              // kDescriptorVersion of the halformer that generated it
  const ModelConfig* config;
  const char* devices;      // space-separated list of the built devices
  // The kernels built for `device` ("cpu", "cuda", "opencl"), or null when the spec's
  // targets did not include it.
  const KernelTable* (*kernels_for)(const char* device);
};

}  // namespace halformer
