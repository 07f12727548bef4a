// The contract between a generated model (DIR/<name>_model.cpp, written by the spec
// compiler) and the generic runtime: the spec's values the runtime needs, and one
// function pointer per layer role (HALFORMER_KERNEL_ROLES), each an ahead-of-time
// compiled Halide pipeline. Several roles may point at the same pipeline when their
// baked sizes agree. The enums it uses are in halformer/enums.h.
#pragma once

#include <cstdint>

#include "halformer/enums.h"

struct halide_buffer_t;
struct halide_filter_metadata_t;

namespace halformer {

// Signatures of the generated pipelines (generators/*.cpp), each written once: X(function
// type, its inputs in call order), B(name) a buffer, S(name) an int32 scalar; every
// pipeline then writes one buffer, `out`. Buffers are Halide buffers, dims innermost
// first. A generator declares the same Inputs in the same order: the runtime calls a
// pipeline by position, the tuner (tools/tune/kernel_io.cpp) by these names.
// position_bias: the (2M + 1, heads) relative position table of a stack (T5), read only by
// kernels built with relative_distance M > 0; any buffer for the others.
#define HALFORMER_KERNEL_SIGNATURES(X, B, S)                                              \
  X(EmbeddingFn, B(tokens) B(type_ids) B(table) B(pos_table) B(type_table) S(pos_offset)) \
  X(LinearFn, B(x) B(w) B(b))                                                             \
  X(LinearResidualFn, B(x) B(w) B(b) B(residual))                                         \
  X(AttentionFn, B(q) B(kv) B(key_mask) B(position_bias))                                 \
  X(PagedAttentionFn, B(q) B(kv) B(key_mask) B(position_bias) B(block_table))             \
  X(LayerNormFn, B(x) B(gamma) B(beta))                                                   \
  X(SoftmaxFn, B(x))                                                                      \
  X(ArgmaxFn, B(x))                                                                       \
  X(PoolFn, B(x) B(valid))                                                                \
  X(ConvertFn, B(x))                                                                      \
  X(GateFn, B(gate) B(up))                                                                \
  X(RotaryFn, B(x) B(positions))

// The function types: using LinearFn = int (*)(halide_buffer_t* x, halide_buffer_t* w,
// halide_buffer_t* b, halide_buffer_t* out); and so on.
#define HALFORMER_SIGNATURE_BUFFER(name) halide_buffer_t* name,
#define HALFORMER_SIGNATURE_SCALAR(name) int32_t name,
#define HALFORMER_SIGNATURE_TYPE(Fn, inputs) using Fn = int (*)(inputs halide_buffer_t* out);
HALFORMER_KERNEL_SIGNATURES(HALFORMER_SIGNATURE_TYPE, HALFORMER_SIGNATURE_BUFFER, HALFORMER_SIGNATURE_SCALAR)
#undef HALFORMER_SIGNATURE_TYPE
#undef HALFORMER_SIGNATURE_SCALAR
#undef HALFORMER_SIGNATURE_BUFFER

struct ModelConfig {
  const char* name;
  const char* spec_file;  // where the spec was read from at build time
  Architecture arch;
  int d_model, heads, d_ff;
  int encoder_layers, decoder_layers;
  int src_vocab, tgt_vocab, max_len, type_vocab;
  bool pre_norm;        // x + f(LN(x)) instead of LN(x + f(x))
  bool final_norm;      // LN after each whole stack
  Positions positions;
  bool embedding_norm;  // LN after the embedding sum (BERT)
  bool share_src_tgt, share_tgt_output;
  bool causal;          // decoder self-attention
  bool padding_mask;    // mask keys equal to pad_id
  HeadKind head;
  bool mean_pooling;    // classifier / embedding heads: mean over tokens, else the first token
  bool pooler;          // classifier: dense + tanh (BERT) or gelu (ELECTRA) before the classifier
  int num_classes;
  int pad_id, bos_id, eos_id;
  int max_new_tokens;
  bool beam;            // default decoding strategy
  int beam_size;
  double length_penalty;
  WeightPreset preset;
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
  Precision layer_weights;      // every linear of the layers, the pooler and the classifier
  Precision generator_weights;  // the output projection (precision_overrides.generator)
  // The token embedding tables: fp32, or int8 rows with their scale (EmbeddingTable;
  // int8 builds, unless precision_overrides.embeddings keeps them fp32).
  Precision embedding_weights;
  // int8 linears with int16 activations even on CPUs with vpdpbusd (generators/linear_int8.cpp,
  // precision_overrides.int16_activations): the packed weights' k group is then a pair.
  bool int16_activations;
  // The cross-attention keys/values stored as bf16 on the CPU (precision_overrides.kv_cache;
  // the kernels' cross_kv out_bf16 / cross_attention kv_bf16). GPU devices keep fp32.
  bool cross_kv_bf16;
  // The decoder's self-attention cache (its fused QKV rows) stored as bf16 on the CPU: the
  // kernels' qkv_cache (out_bf16) writes it -- rotary models: rotary_cache --, decoder_self_attention
  // (q_bf16, kv_bf16) reads it.
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
  // The PointwiseFn (generators/common.h spelling: "none", "relu", "gelu_tanh", ...) that
  // ff1 applies: a cuBLASLt matmul fuses the ones it has as epilogues (runtime/gpu_blas.h).
  const char* ff_activation;
  // CUDA: fp32 linears that go to cuBLASLt may multiply in TF32 (spec `tf32: true`; off by
  // default: TF32 keeps 10 mantissa bits of each input).
  bool tf32;
  // The decoder's self-attention cache keeps its keys and values as int8 rows on the CPU
  // (precision_overrides.kv_cache: int8; halformer/kv_int8.h): the runtime quantizes the
  // new rows (bf16, self_cache_bf16) as it stores them, decoder_self_attention and
  // paged_self_attention (kv_int8) read them. Cross-attention caches stay bf16.
  bool self_cache_int8;
};

// Halide's CUDA runtime entry points for its context and stream (halide_cuda_acquire_context,
// halide_cuda_release_context, halide_cuda_get_stream: what Halide's own CUDA calls use,
// dispatching to any handler set with halide_set_cuda_*): the generated code of a CUDA
// build puts them in its KernelTable, so that the runtime's cuBLASLt calls
// (runtime/gpu_blas.h) run in the context and on the stream of Halide's kernels without
// the runtime linking Halide's CUDA runtime itself. void* stands for CUcontext / CUstream.
struct CudaHooks {
  int (*acquire_context)(void* user_context, void** context, bool create);
  int (*release_context)(void* user_context);
  int (*get_stream)(void* user_context, void* context, void** stream);
};

// The kernel roles, described once: X(role, function type, generator, what it computes).
// KernelTable holds one pointer per role in this order (the descriptor's ABI: append
// only, and bump kDescriptorVersion); the planner (tools/spec/plan.cpp) binds roles by
// name (KernelRole) and writes DIR/<name>_model.cpp as named assignments
// (`k.qkv = ...;`), so a role renamed or removed fails to compile there, never wires a
// wrong kernel. The generator is the fp32 one; int8 / bf16 builds of the linears and
// embeddings use its _int8 / _bf16 twin (linear_int8_residual, embedding_int8, ...).
// d = d_model, hd = d_model / heads, kvh = kv_heads, V = tgt_vocab.
#define HALFORMER_KERNEL_ROLES(X)                                                                                  \
  X(embed_src, EmbeddingFn, "embedding", "source tokens -> embedding_size (positions, types, scale)")             \
  X(embed_tgt, EmbeddingFn, "embedding", "target tokens -> d")                                                    \
  X(qkv, LinearFn, "linear", "self-attention projections, d -> d + 2 * kvh * hd (queries, keys, values)")        \
  X(encoder_self_attention, AttentionFn, "attention", "the encoder's self-attention over the fused QKV rows")     \
  X(decoder_self_attention, AttentionFn, "attention", "the decoder's (causal) self-attention, cache included")    \
  X(cross_attention, AttentionFn, "attention", "decoder queries over the encoder memory's keys and values")      \
  X(attention_out, LinearResidualFn, "linear_residual", "d -> d, + residual")                                     \
  X(cross_q, LinearFn, "linear", "d -> d, cross-attention queries")                                              \
  X(cross_kv, LinearFn, "linear", "d -> 2d, cross-attention keys and values of the encoder memory")               \
  X(ff1, LinearFn, "linear", "d -> d_ff, + activation (the gate of a gated feed-forward)")                       \
  X(ff2, LinearResidualFn, "linear_residual", "d_ff -> d, + residual")                                            \
  X(layer_norm, LayerNormFn, "layernorm", "every norm at d (LayerNorm or RMSNorm)")                               \
  X(generator, LinearFn, "linear", "d -> V, the output projection")                                              \
  X(head, SoftmaxFn, "softmax", "softmax / log_softmax over V (null for logits)")                                 \
  X(argmax, ArgmaxFn, "argmax", "greedy token choice over V")                                                     \
  X(pool, PoolFn, "pooling", "one vector per sequence (classifier / embedding heads)")                            \
  X(pooler, LinearFn, "linear", "d -> d, + tanh or gelu (classifier head)")                                       \
  X(classifier, LinearFn, "linear", "d -> num_classes")                                                          \
  X(ff_up, LinearResidualFn, "linear_gated", "gated feed-forward: (x W_up + b) * gate, d -> d_ff")                \
  X(qkv_cache, LinearFn, "linear", "qkv writing bf16 rows into the decoder's cache (self_cache_bf16; else null)") \
  X(embedding_norm, LayerNormFn, "layernorm", "the embedding norm at embedding_size (when != d; else null)")      \
  X(embed_project, LinearFn, "linear", "embedding_size -> d (when they differ; else null)")                       \
  X(cast_bf16, ConvertFn, "convert", "fp32 rows -> bf16 bits, cuBLASLt's input (CUDA bf16 builds; else null)")   \
  X(gate_act, GateFn, "gate", "act(gate) * up: a gated ff's middle after cuBLASLt (CUDA; else null)")          \
  X(rotary, RotaryFn, "rotary", "rotary positions turned once in fused QKV rows (rotary models; else null)")     \
  X(rotary_cache, RotaryFn, "rotary", "the same, stored as the decoder's bf16 cache rows (else null)")          \
  X(paged_self_attention, PagedAttentionFn, "attention",                                                          \
    "the decoder's self-attention over the engine's paged cache (decoder-only models; else null)")

// Positions per block of the engine's paged key/value cache (runtime/kv_blocks.h), baked
// into paged_self_attention: vLLM's default; a block is the unit of allocation, sharing
// and preemption.
constexpr int kKvBlockSize = 16;

// One pointer per role (null where the model has none).
struct KernelTable {
#define HALFORMER_KERNEL_FIELD(role, Fn, generator, doc) Fn role;
  HALFORMER_KERNEL_ROLES(HALFORMER_KERNEL_FIELD)
#undef HALFORMER_KERNEL_FIELD
  // The metadata of one of these kernels: its Halide target string names the instruction
  // set they were all compiled for, which Model::load checks against the CPU.
  const halide_filter_metadata_t* (*metadata)();
  const CudaHooks* cuda;  // a CUDA build's runtime hooks; null for the other devices
};

// The roles as values, for the planner and the tuner; kernel_roles()[int(r)] describes r.
enum class KernelRole {
#define HALFORMER_KERNEL_ENUM(role, Fn, generator, doc) role,
  HALFORMER_KERNEL_ROLES(HALFORMER_KERNEL_ENUM)
#undef HALFORMER_KERNEL_ENUM
};
struct KernelRoleInfo {
  KernelRole role;
  const char* name;       // the KernelTable field
  const char* signature;  // the function type, e.g. "LinearFn"
  const char* generator;  // the fp32 generator (generators/*.cpp)
  const char* doc;
};
inline constexpr KernelRoleInfo kKernelRoles[] = {
#define HALFORMER_KERNEL_INFO(role, Fn, generator, doc) {KernelRole::role, #role, #Fn, generator, doc},
    HALFORMER_KERNEL_ROLES(HALFORMER_KERNEL_INFO)
#undef HALFORMER_KERNEL_INFO
};
constexpr const KernelRoleInfo& kernel_role(KernelRole r) { return kKernelRoles[int(r)]; }

// The half-width M of the relative table the attention kernels read, (2M + 1, heads): the
// buckets' distance, but no more than any two positions of a max_len sequence lie apart
// (relative_distance up to 2^20 would otherwise make tables of gigabytes that no read
// reaches; the kernels clamp at M, which is then never reached).
inline int relative_table_distance(int relative_distance, int max_len) {
  const int reach = max_len > 1 ? max_len - 1 : 1;
  return relative_distance < reach ? relative_distance : reach;
}

// Bumped when the layout of ModelConfig / KernelTable or an enum value in them changes.
constexpr int kDescriptorVersion = 17;

// A built model as a value: what the generated <name>_model.cpp exports, under a name
// derived from the model's (extern "C" halformer_model_<name>(), see model.h), so that
// any number of models link into one program.
struct ModelDescriptor {
  int version;              // kDescriptorVersion of the halformer that generated it
  const ModelConfig* config;
  const char* devices;      // space-separated list of the built devices
  // The kernels built for `device` ("cpu", "cuda", "opencl"), or null when the spec's
  // targets did not include it.
  const KernelTable* (*kernels_for)(const char* device);
};

}  // namespace halformer
