// The architectures `halformer import MODEL.gguf` reads (gguf_internal.h): each one's
// {arch}.* keys, tensors and spec fields, as llama.cpp's convert_hf_to_gguf.py writes them
// and llama.cpp's llama-model.cpp reads them (docs/import.md, "GGUF files").
//
// llama, qwen2 and gemma are one family: RMSNorm, rotary positions, a gated feed-forward,
// grouped-query attention. llama's converter (LlamaModel.permute) reorders each head's
// attn_q / attn_k rows so that ggml's "normal" rope rotates adjacent pairs (2c, 2c + 1): a
// llama file is `rotary_layout: interleaved`, its rows used as they are. qwen2 and gemma are
// not permuted (ggml's NEOX rope: `half`). gemma (GemmaModel): no rope.freq_base (10000), no
// vocab_size, attention.key_length / value_length for the head size; its norms hold
// 1 + weight (the converter adds 1: a canonical file holds what the kernel multiplies by,
// so they are kept, with the HF import's `norm_weight_offset: 1.0`); llama.cpp scales the
// token rows by sqrt(embedding_length), runs gelu (tanh) gated by ffn_up, and reads
// token_embd as the output projection (no output.weight).
//
// gpt2 (GPT2Model): LayerNorms with biases, learned positions (position_embd), one fused
// attn_qkv (rows: q, then k, then v; the converter transposed Conv1D's [in, out]) split into
// the canonical q, k and v by rows (Q4_0 rows are independent: its blocks split as they
// are), biases on every linear, gelu (tanh; llama.cpp reads no activation), the output
// projection output.weight or token_embd.
#include <cmath>

#include "gguf_internal.h"

namespace halformer::import::detail {

namespace {

// ---------------------------------------------------------------- hyperparameters
// What every architecture has: the sizes (then its own keys), the positions, the head size.
void read_sizes(GgufImport& g) {
  const int64_t max_layers = int64_t(g.f.tensors().size());  // each layer has several tensors: bounds the checks
  g.d = g.meta.integer(g.k("embedding_length"), std::nullopt);
  g.layers = g.meta.integer(g.k("block_count"), std::nullopt, 1, max_layers);
  g.ff = g.meta.integer(g.k("feed_forward_length"), std::nullopt);
  g.h = g.meta.integer(g.k("attention.head_count"), std::nullopt);
  g.kvh = g.meta.integer(g.k("attention.head_count_kv"), g.h ? g.h : std::optional<int64_t>(1));
}
void read_context(GgufImport& g) {
  g.ctx = g.meta.integer(g.k("context_length"), std::nullopt, 1, INT64_MAX);
  g.hd = g.d && g.h && *g.d % *g.h == 0 ? *g.d / *g.h : 0;
  if (g.d && g.h && *g.d % *g.h != 0)
    g.meta.refuse(g.k("embedding_length"), "not divisible by the head count " + std::to_string(*g.h));
  if (g.h && g.kvh && *g.h % *g.kvh != 0)
    g.meta.refuse(g.k("attention.head_count_kv"), "does not divide the head count " + std::to_string(*g.h));
}
// Keys that must be the head size when present (absent: they are).
void head_size_keys(GgufImport& g, std::vector<const char*> keys) {
  for (const char* key : keys)
    if (auto v = g.meta.integer(g.k(key), g.hd); v && g.hd && *v != g.hd)
      g.meta.refuse(g.k(key),
                    "differs from the head size " + std::to_string(g.hd) +
                        " (embedding_length / head_count): partial rotary or other head widths are not supported");
}

// ---- llama, qwen2, gemma
enum class Biases { Optional, Qkv, None };  // llama: any linear's, optional; qwen2: q/k/v, required; gemma: none
struct LlamaLike {
  const char* name;
  const char *layout, *layout_note;
  Biases biases;
  bool gemma;
};
const LlamaLike kLlamaLike[] = {
    {"llama", "interleaved",
     "ggml's normal rope, pairs (2c, 2c + 1): the converter permuted attn_q / attn_k rows for it", Biases::Optional,
     false},
    {"qwen2", "half", "ggml's NEOX rope: pairs (c, c + head size / 2)", Biases::Qkv, false},
    {"gemma", "half", "ggml's NEOX rope: pairs (c, c + head size / 2)", Biases::None, true},
};
const LlamaLike& llama_like(const GgufImport& g) {
  for (const auto& l : kLlamaLike)
    if (std::string(l.name) == g.arch.name) return l;
  return kLlamaLike[0];
}

bool llama_hparams(GgufImport& g) {
  read_sizes(g);
  g.eps = g.meta.number(g.k("attention.layer_norm_rms_epsilon"), std::nullopt);
  g.theta = g.meta.number(g.k("rope.freq_base"), 10000.0);
  read_context(g);
  if (g.hd % 2)
    g.meta.problem(g.k("attention.head_count"),
                   "head size " + std::to_string(g.hd) + " is odd: rotary positions rotate pairs");
  head_size_keys(g, {"rope.dimension_count", "attention.key_length", "attention.value_length"});
  if (g.eps && !(*g.eps > 0)) g.meta.refuse(g.k("attention.layer_norm_rms_epsilon"), "must be > 0");
  if (g.theta && !(*g.theta > 1)) g.meta.refuse(g.k("rope.freq_base"), "must be > 1");
  // Scaled rotary positions (linear, YaRN, llama3's rope_freqs) change every angle.
  const auto scaling = g.meta.text(g.k("rope.scaling.type"));
  if (scaling && *scaling != "none" && *scaling != "linear")
    g.meta.refuse(g.k("rope.scaling.type"), "scaled rotary positions are not supported (none only)");
  for (const char* key : {"rope.scaling.factor", "rope.scale_linear"})
    if (auto v = g.meta.number(g.k(key), 1.0); v && *v != 1.0 && *v != 0.0)
      g.meta.refuse(g.k(key), "scaled rotary positions are not supported (1 only)");
  for (const char* key : {"expert_count", "expert_used_count"})
    if (auto v = g.meta.integer(g.k(key), 0, 0); v && *v > 0)
      g.meta.refuse(g.k(key), "a mixture of experts (Mixtral-style) is not supported");
  for (const char* key : {"tensor_data_layout", "rope.scaling.original_context_length", "rope.scaling.finetuned"})
    g.meta.seen.insert(g.k(key));  // do not change what the file computes
  return g.d && g.layers && g.ff && g.h && g.kvh && g.eps && g.theta && g.ctx;
}

// The output projection: output.weight (F32 after the import), else token_embd's rows.
void output(GgufImport& g, const std::string& e_from) {
  g.tied = !g.f.find("output.weight");
  if (!g.tied)
    g.want("output.weight", "generator.weight", {g.vocab, *g.d}, Role::Linear, true,
           e_from + ", vocabulary " + std::to_string(g.vocab));
  g.zeros("generator.bias", {g.vocab});  // the spec's output bias
}

void llama_tensors(GgufImport& g) {
  const LlamaLike& a = llama_like(g);
  const int64_t d = *g.d, ff = *g.ff, kvd = *g.kvh * g.hd;
  const std::string sd = std::to_string(d), sv = std::to_string(g.vocab), sff = std::to_string(ff);
  const std::string e_from = g.k("embedding_length") + " " + sd,
                    kv_from = std::to_string(*g.kvh) + " key/value heads of " + std::to_string(g.hd) + ", " + e_from;
  g.want("token_embd.weight", "tgt_embedding.weight", {g.vocab, d}, Role::Table, true, e_from + ", vocabulary " + sv);
  for (int64_t i = 0; i < *g.layers; ++i) {
    const std::string b = "blk." + std::to_string(i) + ".", c = "decoder." + std::to_string(i) + ".";
    g.want(b + "attn_norm.weight", c + "self_norm.weight", {d}, Role::Norm, true, e_from);
    const std::vector<std::tuple<std::string, std::string, int64_t, int64_t, std::string>> linears = {
        {"attn_q", "self_attn.q", d, d, e_from},
        {"attn_k", "self_attn.k", kvd, d, kv_from},
        {"attn_v", "self_attn.v", kvd, d, kv_from},
        {"attn_output", "self_attn.o", d, d, e_from},
        {"ffn_gate", "ff_gate", ff, d, g.k("feed_forward_length") + " " + sff + ", " + e_from},
        {"ffn_up", "ff1", ff, d, g.k("feed_forward_length") + " " + sff + ", " + e_from},
        {"ffn_down", "ff2", d, ff, e_from + ", " + g.k("feed_forward_length") + " " + sff}};
    for (const auto& [name, cn, rows, cols, from] : linears) {
      g.want(b + name + ".weight", c + cn + ".weight", {rows, cols}, Role::LayerLinear, true, from);
      const bool qkv = name == "attn_q" || name == "attn_k" || name == "attn_v";
      if (a.biases == Biases::Optional || (a.biases == Biases::Qkv && qkv))
        g.want(b + name + ".bias", c + cn + ".bias", {rows}, Role::Bias, a.biases == Biases::Qkv, from);
      else
        g.zeros(c + cn + ".bias", {rows});
    }
    g.want(b + "ffn_norm.weight", c + "ff_norm.weight", {d}, Role::Norm, true, e_from);
  }
  g.want("output_norm.weight", "decoder_norm.weight", {d}, Role::Norm, true, e_from);
  if (a.gemma && g.f.find("output.weight")) {  // llama.cpp's gemma has none: a file with one is not gemma's
    g.known.insert("output.weight");
    g.pr.add(g.f.path(), "tensor 'output.weight'",
             "llama.cpp's gemma reads token_embd as its output projection (tied) and no output.weight");
  }
  if (a.gemma) {
    g.zeros("generator.bias", {g.vocab});
    return;
  }
  output(g, e_from);
}

void llama_spec(const GgufImport& g, Model& m) {
  const LlamaLike& a = llama_like(g);
  m.set("layer", "norm_placement", "pre", "x + sublayer(rmsnorm(x))");
  m.set("layer", "norm_kind", "rms", "attn_norm, ffn_norm");
  m.set("layer", "norm_eps", format_float_literal(float32_decimal(*g.eps)), g.k("attention.layer_norm_rms_epsilon"));
  if (a.gemma)
    m.set("layer", "norm_weight_offset", "1.0",
          "Gemma's RMSNorm scales by 1 + weight: the converter stored 1 + weight in the *_norm tensors");
  m.set("layer", "final_norm", "true", "output_norm");
  if (a.gemma)
    m.set("layer", "activation", "geglu_tanh", "gelu(ffn_gate x) * ffn_up x, llama.cpp's gelu: the tanh approximation");
  else
    m.set("layer", "activation", "swiglu", "silu(ffn_gate x) * ffn_up x");
  m.set("embedding", "positions", "rotary", "rotary embedding of q and k in every layer");
  m.set("embedding", "rotary_theta", format_float_literal(float32_decimal(*g.theta)),
        g.f.has(g.k("rope.freq_base")) ? g.k("rope.freq_base") : "no rope.freq_base: 10000");
  m.set("embedding", "rotary_layout", a.layout, a.layout_note);
  if (a.gemma)
    m.set("embedding", "scale", "true", "llama.cpp's gemma: token_embd rows times sqrt(embedding_length)");
  else
    m.set("embedding", "scale", "false");
}

// ---- gpt2
bool gpt2_hparams(GgufImport& g) {
  read_sizes(g);
  g.eps = g.meta.number(g.k("attention.layer_norm_epsilon"), std::nullopt);
  read_context(g);
  head_size_keys(g, {"attention.key_length", "attention.value_length"});
  if (g.eps && !(*g.eps > 0)) g.meta.refuse(g.k("attention.layer_norm_epsilon"), "must be > 0");
  g.kv_heads_field = g.f.has(g.k("attention.head_count_kv"));
  return g.d && g.layers && g.ff && g.h && g.kvh && g.eps && g.ctx;
}

void gpt2_tensors(GgufImport& g) {
  const int64_t d = *g.d, ff = *g.ff, kvd = *g.kvh * g.hd;
  const std::string e_from = g.k("embedding_length") + " " + std::to_string(d),
                    ff_from = g.k("feed_forward_length") + " " + std::to_string(ff);
  const std::string ctx_from = g.k("context_length") + " " + std::to_string(*g.ctx) + ", " + e_from;
  g.want("token_embd.weight", "tgt_embedding.weight", {g.vocab, d}, Role::Table, true,
         e_from + ", vocabulary " + std::to_string(g.vocab));
  // One row per position of the context (llama.cpp's pos_embd): the first max_len are read.
  g.part(g.tensor("position_embd.weight", {*g.ctx, d}, true, ctx_from), "pos_embedding.weight", {g.max_len, d},
         Role::Table, 0);
  auto norm = [&](const std::string& gguf, const std::string& canonical) {
    g.want(gguf + ".weight", canonical + ".weight", {d}, Role::Norm, true, e_from);
    g.want(gguf + ".bias", canonical + ".bias", {d}, Role::Bias, true, e_from);
  };
  auto linear = [&](const std::string& gguf, const std::string& canonical, int64_t rows, int64_t cols,
                    const std::string& from) {
    g.want(gguf + ".weight", canonical + ".weight", {rows, cols}, Role::LayerLinear, true, from);
    g.want(gguf + ".bias", canonical + ".bias", {rows}, Role::Bias, true, from);
  };
  for (int64_t i = 0; i < *g.layers; ++i) {
    const std::string b = "blk." + std::to_string(i) + ".", c = "decoder." + std::to_string(i) + ".";
    norm(b + "attn_norm", c + "self_norm");
    // attn_qkv: q's d rows, then k's and v's kvd rows each (llama.cpp splits it so).
    const int64_t rows = d + 2 * kvd;
    const std::string qkv_from = e_from + ", " + std::to_string(*g.kvh) + " key/value heads of " +
                                 std::to_string(g.hd) + ": q, k and v rows";
    const TensorInfo* w = g.tensor(b + "attn_qkv.weight", {rows, d}, true, qkv_from);
    const TensorInfo* bias = g.tensor(b + "attn_qkv.bias", {rows}, true, qkv_from);
    const int64_t at[3] = {0, d, d + kvd}, n[3] = {d, kvd, kvd};
    for (int p = 0; p < 3; ++p) {
      const std::string cn = c + "self_attn." + "qkv"[p];
      g.part(w, cn + ".weight", {n[p], d}, Role::LayerLinear, at[p]);
      g.part(bias, cn + ".bias", {n[p]}, Role::Bias, at[p]);
    }
    linear(b + "attn_output", c + "self_attn.o", d, d, e_from);
    norm(b + "ffn_norm", c + "ff_norm");
    linear(b + "ffn_up", c + "ff1", ff, d, ff_from + ", " + e_from);
    linear(b + "ffn_down", c + "ff2", d, ff, e_from + ", " + ff_from);
  }
  norm("output_norm", "decoder_norm");
  output(g, e_from);
}

void gpt2_spec(const GgufImport& g, Model& m) {
  m.set("layer", "norm_placement", "pre", "x + sublayer(layernorm(x))");
  m.set("layer", "norm_kind", "standard", "attn_norm, ffn_norm: weight and bias");
  m.set("layer", "norm_eps", format_float_literal(float32_decimal(*g.eps)), g.k("attention.layer_norm_epsilon"));
  m.set("layer", "final_norm", "true", "output_norm");
  m.set("layer", "activation", "gelu_tanh", "ffn_down(gelu(ffn_up x)), llama.cpp's gelu: the tanh approximation");
  m.set("embedding", "positions", "learned", "position_embd");
  m.set("embedding", "scale", "false");
}

}  // namespace

std::string GgufImport::k(const std::string& key) const { return std::string(arch.name) + "." + key; }

const TensorInfo* GgufImport::tensor(const std::string& gguf, const std::vector<int64_t>& shape, bool required,
                                     const std::string& from_keys) {
  known.insert(gguf);
  const TensorInfo* t = f.find(gguf);
  const std::string where = "tensor " + gguf_quote(gguf);
  if (!t) {
    if (required)
      pr.add(f.path(), where, "missing (expected " + dims_str({shape.rbegin(), shape.rend()}) + ", GGUF order)");
  } else if (std::vector<int64_t>(t->dims.rbegin(), t->dims.rend()) != shape) {
    pr.add(f.path(), where,
           "dims " + dims_str(t->dims) + " disagree with the metadata: expected " +
               dims_str({shape.rbegin(), shape.rend()}) + " (GGUF order, row length first: " + from_keys + ")");
  } else if (!can_dequantize(t->type) || (t->type >= GgmlType::I8 && t->type <= GgmlType::I64)) {
    pr.add(f.path(), where,
           std::string("type ") + type_name(t->type) + " is not read by halformer import (F32, F16, BF16, " +
               "Q4_0 as they are; Q4_1, Q5_0, Q5_1, Q8_0 and the K-quants dequantized)");
  }
  return t;
}

const std::vector<GgufArch>& gguf_archs() {
  static const std::vector<GgufArch> a = {
      {"llama", "huggingface-llama", true, llama_hparams, llama_tensors, llama_spec},
      {"qwen2", "huggingface-qwen2", true, llama_hparams, llama_tensors, llama_spec},
      {"gemma", "huggingface-llama", true, llama_hparams, llama_tensors, llama_spec},
      // llama.cpp's BPE vocabularies add no bos unless tokenizer.ggml.add_bos_token says so.
      {"gpt2", "huggingface-gpt2", false, gpt2_hparams, gpt2_tensors, gpt2_spec},
  };
  return a;
}

}  // namespace halformer::import::detail
