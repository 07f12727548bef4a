// The planner: a validated Spec lowered to the pipelines its model needs (which generator,
// with which GeneratorParams, bound to which KernelTable role), the ModelConfig its model
// bakes in, and the generated files of DIR (plan.cmake, <name>_model.cpp, <name>.h, the
// binary's main and the library's entry point). See plan.h.
#include "plan.h"

#include "halformer/amx.h"  // amx_usable_here: ModelConfig::amx_tiles
#include "halformer/kv_int8.h"
#include "output_text.h"

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <sstream>
#include <stdexcept>

namespace halformer {

// Halide 21 emits PTX for these compute capabilities only. A newer GPU (sm_89, sm_90,
// ...) runs the PTX of the highest one below it: the driver compiles PTX forward, and
// the build's ptxas check assembles it for the spec's own capability.
int halide_ptx_capability(int64_t capability) {
  static const int known[] = {86, 80, 75, 70, 61, 50, 35, 32, 30};
  for (int c : known)
    if (c <= capability) return c;
  return 30;
}
namespace {

// Features of the decoder's fused self-attention row: H query heads, kv_heads key and as many
// value heads.
int64_t qkv_width(const Spec& s) { return s.d_model + 2 * s.kv_heads * (s.d_model / s.heads); }

std::string c_identifier(const std::string& s) {
  std::string r;
  for (char c : s) r += std::isalnum(static_cast<unsigned char>(c)) ? c : '_';
  if (r.empty() || std::isdigit(static_cast<unsigned char>(r[0]))) r = "m_" + r;
  return r;
}

class Planner {
 public:
  explicit Planner(const Spec& s) : spec_(s) {
    plan_.name = s.name;
    plan_.cname = c_identifier(s.name);
    for (Target t : s.targets) {
      if (t == Target::Host) plan_.variants.push_back({"cpu", "host"});
      if (t == Target::Cuda)
        plan_.variants.push_back(
            {"cuda", "host-cuda-cuda_capability_" + std::to_string(halide_ptx_capability(s.cuda_capability))});
      if (t == Target::OpenCL) plan_.variants.push_back({"opencl", "host-opencl"});
    }
  }

  // Adds (or reuses) the pipeline for `generator` with `params` and binds it to `role`.
  void bind(KernelRole role_id, const std::string& generator, const std::string& label,
            std::vector<std::pair<std::string, std::string>> params) {
    const std::string role = kernel_role(role_id).name;
    // Spec-level schedule overrides "<generator>.<knob>: value" become GeneratorParams.
    for (const auto& [key, value] : spec_.schedule) {
      auto dot = key.find('.');
      std::string kind = key.substr(0, dot);
      if (kind == generator || kind == linear_family(generator))
        params.emplace_back(key.substr(dot + 1), value);
    }
    for (const auto& k : plan_.kernels) {
      if (k.generator == generator && k.params == params) {
        plan_.roles[role] = k.function;
        return;
      }
    }
    PlannedKernel k{plan_.cname + "_" + label, generator, std::move(params)};
    for (const auto& other : plan_.kernels)
      if (other.function == k.function) k.function += "_" + std::to_string(plan_.kernels.size());
    plan_.roles[role] = k.function;
    plan_.kernels.push_back(std::move(k));
  }

  // "linear_residual" -> "linear", "linear_int8_gated" -> "linear_int8": the kind whose
  // schedule knobs ("linear.tile_m") a variant shares; other generators: "".
  static std::string linear_family(const std::string& generator) {
    for (const char* f : {"linear_int8", "linear_int4", "linear_q8_0", "linear_bf16"})
      if (generator.rfind(f, 0) == 0) return f;
    if (generator.rfind("linear", 0) == 0) return "linear";
    return "";
  }

  // The role's generator (the role table: "linear", "linear_residual" (+ residual) or
  // "linear_gated" (* gate)) or, by the role's precision, its int8 / bf16 twin
  // (linear_int8_residual, ...). act: the PointwiseFn applied to the output ("none", ...).
  // bf16_out: the output stored as bf16 bits (the CPU kernels; linear's out_bf16).
  void linear(KernelRole role, int64_t in, int64_t out, const char* act, bool bf16_out = false) {
    std::string gen = kernel_role(role).generator;
    const Precision p = role == KernelRole::generator ? spec_.output_precision() : spec_.precision;
    if (p != Precision::Fp32) gen.insert(6, std::string("_") + to_string(p));
    std::string label = gen + "_" + std::to_string(in) + "x" + std::to_string(out) +
                        (std::string(act) == "none" ? "" : std::string("_") + act) + (bf16_out ? "_out_bf16" : "");
    std::vector<std::pair<std::string, std::string>> params = {
        {"in_features", std::to_string(in)}, {"out_features", std::to_string(out)}, {"activation", act}};
    if (p == Precision::Int8 && spec_.int16_activations) params.emplace_back("int16_activations", "true");
    if (bf16_out) {
      params.emplace_back("out_bf16", "true");
      add_half(params);
    }
    bind(role, gen, label + half_suffix(bf16_out), std::move(params));
  }

  // Self-attention (self = true) reads a fused row of H query and kv_heads key and value
  // heads, the rotary positions already applied (rotary()); cross-attention plain heads.
  // kv_bf16 / q_bf16: keys and values / queries read as bf16 bits (the CPU kernels;
  // attention's kv_bf16 and q_bf16).
  // block_size > 0: over the engine's paged cache (generators/attention.cpp block_size).
  // kv_int8: keys and values as int8 rows (an int8 self-attention cache; attention's kv_int8).
  void attention(KernelRole role, int q_head, int k_head, int v_head, bool causal, bool self,
                 bool kv_bf16 = false, bool q_bf16 = false, int block_size = 0, bool kv_int8 = false) {
    const int64_t H = spec_.heads;
    const int64_t group = self ? H / spec_.kv_heads : 1;
    const bool relative = self && spec_.positions == Positions::Relative;  // T5: a bias per distance
    std::string label = "attention_" + std::to_string(q_head) + "_" + std::to_string(k_head) + "_" +
                        std::to_string(v_head) + (causal ? "_causal" : "") +
                        (relative ? "_relative" : "") + (spec_.scaled ? "" : "_unscaled") +
                        (kv_bf16 ? "_kv_bf16" : "") + (kv_int8 ? "_kv_int8" : "") + (q_bf16 ? "_q_bf16" : "") +
                        half_suffix(kv_bf16) +
                        (block_size > 0 ? "_paged" + std::to_string(block_size) : "");
    std::vector<std::pair<std::string, std::string>> params = {{"heads", std::to_string(H)},
                                                               {"head_dim", std::to_string(spec_.d_model / H)},
                                                               {"q_head", std::to_string(q_head)},
                                                               {"k_head", std::to_string(k_head)},
                                                               {"v_head", std::to_string(v_head)},
                                                               {"causal", causal ? "true" : "false"}};
    // GPU builds: whole score rows in shared memory where they fit at max_len, else key tiles
    // (generators/attention.cpp gpu_key_tile); CPU-only specs keep their parameters.
    if (spec_.has_target(Target::Cuda) || spec_.has_target(Target::OpenCL))
      params.emplace_back("max_keys", std::to_string(spec_.max_len));
    if (kv_bf16) params.emplace_back("kv_bf16", "true");
    if (kv_int8) params.emplace_back("kv_int8", "true");
    if (q_bf16) params.emplace_back("q_bf16", "true");
    if (kv_bf16) add_half(params);
    // The CPU's cross-attention cache is stored head by head (Model::cross_kv): contiguous
    // streams, which the decode path's software prefetches only slowed.
    if (!self) params.emplace_back("decode_prefetch", "0");
    if (group > 1) params.emplace_back("kv_group", std::to_string(group));
    if (relative)  // the table's half-width (model_config.h)
      params.emplace_back("relative_distance", std::to_string(relative_table_distance(int(spec_.relative_distance),
                                                                                       int(spec_.max_len))));
    if (!spec_.scaled) params.emplace_back("scale", "1");
    if (block_size > 0) params.emplace_back("block_size", std::to_string(block_size));
    bind(role, kernel_role(role).generator, label, std::move(params));
  }

  // Rotary positions turned once in the fused QKV rows (generators/rotary.cpp), before
  // attention reads them or the decoder's cache stores them; bf16_out: into a bf16 cache.
  void rotary(KernelRole role, bool bf16_out) {
    const int64_t H = spec_.heads, hd = spec_.d_model / H;
    const int64_t width = qkv_width(spec_);
    std::vector<std::pair<std::string, std::string>> params = {
        {"channels", std::to_string(width)},
        {"heads", std::to_string(H + spec_.kv_heads)},  // the queries and the keys
        {"head_dim", std::to_string(hd)},
        {"rotary_dim", std::to_string(spec_.rotary_dim)},
        {"rotary_theta", format_float(spec_.rotary_theta)},
        {"rotary_interleaved", spec_.rotary_layout == RotaryLayout::Interleaved ? "true" : "false"},
        {"rotary_positions", std::to_string(spec_.max_len)}};
    if (bf16_out) {
      params.emplace_back("out_bf16", "true");
      add_half(params);
    }
    bind(role, kernel_role(role).generator,
         "rotary_" + std::to_string(width) + (bf16_out ? "_out_bf16" : "") + half_suffix(bf16_out),
         std::move(params));
  }

  // The kernels that write or read a 16-bit cache: half=fp16 for an fp16 cache
  // (generators/common.h to_half_bits), named in the label.
  void add_half(std::vector<std::pair<std::string, std::string>>& params) const {
    if (spec_.cache_precision() == Precision::Fp16) params.emplace_back("half", "fp16");
  }
  std::string half_suffix(bool half) const {
    return half && spec_.cache_precision() == Precision::Fp16 ? "_fp16" : "";
  }

  void embedding(KernelRole role, int64_t vocab) {
    const bool int8 = spec_.table_precision() == Precision::Int8;
    const std::string gen = std::string(kernel_role(role).generator) + (int8 ? "_int8" : "");
    // The source tables are embedding_width() wide (a projection follows where that is not d_model).
    const bool src = role == KernelRole::embed_src;
    const int64_t channels = src ? spec_.embedding_width() : spec_.d_model;
    bind(role, gen, gen + "_" + std::to_string(vocab) +
             (channels != spec_.d_model ? "x" + std::to_string(channels) : ""),
         {{"channels", std::to_string(channels)},
          {"vocab", std::to_string(vocab)},
          {"max_len", std::to_string(spec_.max_len)},
          {"scale", spec_.scale_embedding ? "true" : "false"},
          // Rotary and relative positions are applied in attention: the embedding adds none.
          {"positions", spec_.positions == Positions::Rotary || spec_.positions == Positions::Relative
                            ? "none" : to_string(spec_.positions)},
          {"type_vocab", std::to_string(src ? spec_.type_vocab : 0)}});
  }

  Plan build() {
    const Spec& s = spec_;
    const int H = int(s.heads);
    const bool enc = s.architecture != Architecture::Decoder;
    const bool dec = s.architecture != Architecture::Encoder;
    if (enc) embedding(KernelRole::embed_src, s.src_vocab);
    if (dec) embedding(KernelRole::embed_tgt, s.tgt_vocab);
    const int KVH = int(s.kv_heads);
    const int64_t qkv_width = halformer::qkv_width(s);
    linear(KernelRole::qkv, s.d_model, qkv_width, "none");
    // A bf16 cache (ModelConfig::self_cache_bf16): the decoder's fused QKV rows, queries
    // included, are stored as bf16 by their own projection (qkv_cache) and read as such.
    // An int8 cache (ModelConfig::self_cache_int8): the same rows, their keys and values
    // stored (and read) as int8 rows; the cross-attention cache stays bf16.
    const bool bf16_cache = s.half_cache(), int8 = s.int8_cache();
    if (enc) attention(KernelRole::encoder_self_attention, 0, H, H + KVH, false, true);
    if (dec)
      attention(KernelRole::decoder_self_attention, 0, H, H + KVH, s.causal, true, bf16_cache && !int8, bf16_cache, 0,
                int8);
    // The same over the engine's paged cache, whose rows hold the keys and values only
    // (runtime/kv_blocks.h).
    if (dec)
      attention(KernelRole::paged_self_attention, 0, 0, KVH, s.causal, true, bf16_cache && !int8, bf16_cache,
                kKvBlockSize, int8);
    // Rotary models: the QKV rows in fp32, then turned (and, into a bf16 cache, rounded) once.
    const bool rotary_rows = s.positions == Positions::Rotary;
    if (rotary_rows) rotary(KernelRole::rotary, false);
    if (rotary_rows && dec && bf16_cache) rotary(KernelRole::rotary_cache, true);
    if (!rotary_rows && dec && bf16_cache) linear(KernelRole::qkv_cache, s.d_model, qkv_width, "none", true);
    if (enc && dec) {
      // The cross-attention keys/values in the cache's precision (ModelConfig::cross_kv_bf16).
      attention(KernelRole::cross_attention, 0, 0, H, false, false, bf16_cache);
      linear(KernelRole::cross_q, s.d_model, s.d_model, "none");
      linear(KernelRole::cross_kv, s.d_model, 2 * s.d_model, "none", bf16_cache);
    }
    linear(KernelRole::attention_out, s.d_model, s.d_model, "none");
    // Gated feed-forward: ff1 is the gate (with the activation), ff_up multiplies by it.
    linear(KernelRole::ff1, s.d_model, s.d_ff, to_string(gate_activation(s.activation)));
    if (is_gated(s.activation)) linear(KernelRole::ff_up, s.d_model, s.d_ff, "none");
    linear(KernelRole::ff2, s.d_ff, s.d_model, "none");
    bind(KernelRole::layer_norm, "layernorm", "layernorm_" + std::to_string(s.d_model),
         {{"channels", std::to_string(s.d_model)},
          {"eps", format_float(s.norm_eps)},
          {"kind", to_string(s.norm_kind)}});
    if (s.embedding_width() != s.d_model) {  // ELECTRA-small: norm at the tables' width, then d_model
      const int64_t e = s.embedding_width();
      if (s.embedding_norm)
        bind(KernelRole::embedding_norm, "layernorm", "layernorm_" + std::to_string(e),
             {{"channels", std::to_string(e)}, {"eps", format_float(s.norm_eps)}, {"kind", to_string(s.norm_kind)}});
      linear(KernelRole::embed_project, e, s.d_model, "none");
    }
    if (dec) {
      linear(KernelRole::generator, s.d_model, s.tgt_vocab, "none");
      if (s.head == HeadKind::LogSoftmax || s.head == HeadKind::Softmax)
        bind(KernelRole::head, "softmax", std::string(to_string(s.head)) + "_" + std::to_string(s.tgt_vocab),
             {{"classes", std::to_string(s.tgt_vocab)}, {"kind", to_string(s.head)}});
      bind(KernelRole::argmax, "argmax", "argmax_" + std::to_string(s.tgt_vocab),
           {{"classes", std::to_string(s.tgt_vocab)}});
    }
    if (s.head == HeadKind::Classifier || s.head == HeadKind::Embedding) {
      bool normalize = s.head == HeadKind::Embedding && s.normalize;
      bind(KernelRole::pool, "pooling", std::string("pool_") + to_string(s.pooling) + (normalize ? "_l2" : ""),
           {{"channels", std::to_string(s.d_model)},
            {"kind", to_string(s.pooling)},
            {"normalize", normalize ? "true" : "false"}});
    }
    // CUDA bf16 builds: the many-row linears multiply on tensor cores through cuBLASLt
    // (runtime/gpu_blas.h), whose bf16 input this kernel makes from the fp32 activations.
    const bool cuda = s.has_target(Target::Cuda);
    if (cuda && (s.precision == Precision::Bf16 || s.output_precision() == Precision::Bf16))
      bind(KernelRole::cast_bf16, "convert", "cast_bf16", {});
    // and a gated feed-forward's two projections there, whose activation this kernel applies.
    if (cuda && is_gated(s.activation)) {
      const std::string act = to_string(gate_activation(s.activation));
      bind(KernelRole::gate_act, "gate", "gate_" + act, {{"activation", act}});
    }
    if (s.head == HeadKind::Classifier) {
      if (s.pooler != Pooler::None)
        linear(KernelRole::pooler, s.d_model, s.d_model, s.pooler == Pooler::DenseTanh ? "tanh" : "gelu");
      linear(KernelRole::classifier, s.d_model, s.num_classes, "none");
    }
    return plan_;
  }

  // Numbers in GeneratorParams and the generated C++: 9 significant digits, as these
  // files have always had them. TODO(issue 40): the shortest round trip (format_number(v))
  // would keep a double such as T5's input_scale d^-0.5 exact, but changes its bits.
  static std::string format_float(double v) { return format_number(v, 9); }

 private:
  const Spec& spec_;
  Plan plan_;
};

// A C++ string literal of any bytes (control characters as octal escapes), so a
// user's path or weight name can never inject code into the generated file.
std::string cpp_string(const std::string& s) {
  std::string r = "\"";
  for (unsigned char c : s) {
    if (c == '"' || c == '\\') {
      r += '\\';
      r += char(c);
    } else if (c < 0x20 || c == 0x7f) {
      char esc[5];
      std::snprintf(esc, sizeof esc, "\\%03o", c);
      r += esc;
    } else {
      r += char(c);
    }
  }
  return r + "\"";
}

// Text for a one-line comment: control characters (a newline would end the comment
// and inject lines) become '?'.
std::string comment_text(const std::string& s) {
  std::string r = s;
  for (char& c : r)
    if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) c = '?';
  return r;
}

// A CMake quoted argument: backslash, quote, $ and ; escaped, control characters refused.
std::string cmake_string(const std::string& s) {
  std::string r = "\"";
  for (char c : s) {
    if (static_cast<unsigned char>(c) < 0x20) throw std::runtime_error("path contains a control character: " + comment_text(s));
    if (c == '\\' || c == '"' || c == '$' || c == ';') r += '\\';
    r += c;
  }
  return r + "\"";
}

}  // namespace

Plan make_plan(const Spec& spec) { return Planner(spec).build(); }

std::string memory_summary(const Spec& s) {
  if (s.architecture == Architecture::Encoder) return "";
  // The CPU's cache holds each layer's keys and values (runtime/stack.h DecoderState).
  const int64_t kv_features = qkv_width(s) - s.d_model, hd = s.d_model / s.heads;
  const int64_t elem = s.half_cache() ? 2 : 4;  // int8: the cross-attention cache's bf16
  // int8: each head's row with its scale (halformer/kv_int8.h).
  const int64_t per_position =
      s.decoder_layers * (s.int8_cache() ? kv_int8_bytes(int(kv_features), int(hd)) : kv_features * elem);
  const bool cross = s.architecture == Architecture::EncoderDecoder;
  const int64_t cross_per_position = cross ? s.decoder_layers * 2 * s.d_model * elem : 0;
  auto size = [](double bytes) {
    std::ostringstream o;
    o << std::fixed << std::setprecision(1);
    if (bytes >= double(1 << 30)) o << bytes / double(1 << 30) << " GiB";
    else if (bytes >= double(1 << 20)) o << bytes / double(1 << 20) << " MiB";
    else o << bytes / 1024.0 << " KiB";
    return o.str();
  };
  std::ostringstream o;
  o << "key/value cache per sequence: " << size(double(per_position)) << " per position ("
    << s.decoder_layers << " layers x " << kv_features << " " << enum_name(s.cache_precision()) << " features"
    << (s.int8_cache() ? " and a scale per head" : "") << ": the keys and values of "
    << s.kv_heads << " heads), " << size(double(per_position) * double(s.max_len))
    << " at max_len " << s.max_len;
  if (cross)
    o << "; cross-attention " << size(double(cross_per_position)) << " per source position, "
      << size(double(cross_per_position) * double(s.max_len)) << " at max_len";
  o << "; allocated per call for the prompt and its new tokens";
  return o.str();
}

std::unique_ptr<SpecModelConfig> model_config(const Spec& s) {
  auto r = std::make_unique<SpecModelConfig>();
  auto str = [&](const std::string& v) { return r->strings.emplace_back(v).c_str(); };
  for (const auto& [k, v] : s.weight_map) r->weight_map.push_back(str(k)), r->weight_map.push_back(str(v));
  r->weight_map.push_back(nullptr);
  ModelConfig& c = r->config;
  c.name = str(s.name);
  c.spec_file = str(s.file);
  c.arch = s.architecture;
  c.d_model = int(s.d_model), c.heads = int(s.heads), c.d_ff = int(s.d_ff);
  c.encoder_layers = int(s.encoder_layers), c.decoder_layers = int(s.decoder_layers);
  c.src_vocab = int(s.src_vocab), c.tgt_vocab = int(s.tgt_vocab), c.max_len = int(s.max_len);
  c.type_vocab = int(s.type_vocab);
  c.pre_norm = s.norm_placement == NormPlacement::Pre;
  c.final_norm = s.final_norm;
  c.positions = s.positions;
  c.embedding_norm = s.embedding_norm;
  c.share_src_tgt = s.share_src_tgt, c.share_tgt_output = s.share_tgt_output;
  c.causal = s.causal, c.padding_mask = s.padding_mask;
  c.head = s.head;
  c.mean_pooling = s.pooling == Pooling::Mean;
  c.pooler = s.pooler != Pooler::None;
  c.num_classes = int(s.num_classes);
  c.pad_id = int(s.pad_id), c.bos_id = int(s.bos_id), c.eos_id = int(s.eos_id);
  c.max_new_tokens = int(s.max_new_tokens);
  c.beam = s.decoding == DecodeStrategy::Beam;
  c.beam_size = int(s.beam_size);
  c.length_penalty = s.length_penalty;
  c.preset = s.preset;
  c.preset_name = str(to_string(s.preset));
  c.weight_map = s.preset == WeightPreset::Explicit ? r->weight_map.data() : nullptr;
  c.position_offset = int(s.position_offset);
  c.kv_heads = int(s.kv_heads);
  c.rms_norm = s.norm_kind == NormKind::Rms;
  c.norm_weight_offset = s.norm_weight_offset;
  c.gated_ff = is_gated(s.activation);
  c.layer_weights = s.precision;
  c.generator_weights = s.output_precision();
  c.embedding_weights = s.table_precision();
  c.int16_activations = s.int16_activations;
  c.cross_kv_bf16 = s.architecture == Architecture::EncoderDecoder && s.half_cache();
  c.self_cache_bf16 = s.architecture != Architecture::Encoder && s.half_cache();
  c.self_cache_int8 = s.architecture != Architecture::Encoder && s.int8_cache();
  // The kernels for this host use AMX tiles where its CPU and OS offer them (the generators
  // ask the same, schedules/cpu_matmul.h amx_tiles).
  c.amx_tiles = s.precision != Precision::Fp32 && amx_usable_here();
  const bool relative = s.positions == Positions::Relative;
  c.relative_buckets = relative ? int(s.relative_buckets) : 0;
  c.relative_distance = relative ? int(s.relative_distance) : 0;
  c.generator_input_scale = s.input_scale;
  c.parallel_residual = s.parallel_residual;
  c.embedding_size = int(s.embedding_width());
  c.shared_layers = s.shared_weights;
  c.ff_activation = str(to_string(gate_activation(s.activation)));
  c.tf32 = s.tf32;
  return r;
}

void write_plan(const Spec& spec, const Plan& plan, const std::string& dir) {
  namespace fs = std::filesystem;
  fs::create_directories(dir);

  std::ostringstream cm;
  cm << "# Generated by `halformer plan` from " << comment_text(spec.file) << " -- do not edit.\n";
  cm << "set(HALFORMER_PLAN_NAME " << plan.name << ")\n";
  cm << "set(HALFORMER_PLAN_VARIANTS";
  for (const auto& [device, target] : plan.variants) cm << " " << device;
  cm << ")\n";
  for (const auto& [device, target] : plan.variants)
    cm << "set(HALFORMER_PLAN_TARGET_" << device << " " << target << ")\n";
  // The GPU the spec names (sm_<N>), which may be newer than the PTX's own target.
  cm << "set(HALFORMER_PLAN_CUDA_SM " << spec.cuda_capability << ")\n";
  // The longest sequence: the extent the build's ptxas check launches kernels at.
  cm << "set(HALFORMER_PLAN_MAX_LEN " << spec.max_len << ")\n";
  cm << "set(HALFORMER_PLAN_KERNELS";
  for (const auto& k : plan.kernels) cm << " " << k.function;
  cm << ")\n";
  for (const auto& k : plan.kernels) {
    cm << "set(HALFORMER_PLAN_" << k.function << "_GENERATOR " << k.generator << ")\n";
    cm << "set(HALFORMER_PLAN_" << k.function << "_PARAMS";
    for (const auto& [key, value] : k.params) cm << " " << key << "=" << value;
    // Autoscheduler plugins from a tuning database (the generator reads `-p` among its params).
    if (!k.plugins.empty()) {
      cm << " -p ";
      for (size_t i = 0; i < k.plugins.size(); ++i) cm << (i ? "," : "") << "\"" << k.plugins[i] << "\"";
    }
    cm << ")\n";
  }
  // A changed tuning database re-plans (and rebuilds only the kernels whose choice changed).
  if (!plan.tuning_db.empty())
    cm << "set_property(DIRECTORY APPEND PROPERTY CMAKE_CONFIGURE_DEPENDS " << cmake_string(plan.tuning_db) << ")\n";
  write_if_changed(fs::path(dir) / "plan.cmake", cm.str());

  std::ostringstream c;
  c << "// Generated by `halformer plan` from " << comment_text(spec.file) << " -- do not edit.\n";
  c << "#include <string>\n\n#include \"halformer/model_config.h\"\n";
  // Kernel function of `fn` in a device variant: the CPU build keeps the plain name.
  auto variant_fn = [](const std::string& fn, const std::string& device) {
    return device == "cpu" ? fn : fn + "_" + device;
  };
  for (const auto& [device, target] : plan.variants)
    for (const auto& k : plan.kernels) c << "#include \"" << variant_fn(k.function, device) << ".h\"\n";
  // The config is model_config(spec) (what `halformer quantize` uses too), written out.
  const auto owned = model_config(spec);
  const ModelConfig& cfg = owned->config;
  auto b = [](bool v) { return v ? "true" : "false"; };
  // An enum value by number, its spelling in the spec beside it: the numbers are those of
  // halformer/enums.h, which this file is compiled with.
  auto en = [](const char* type, auto v) {
    return std::string("halformer::") + type + "(" + std::to_string(int(v)) + ") /*" + enum_name(v) + "*/";
  };
  if (cfg.weight_map) {
    c << "\nstatic const char* const kWeightMap[] = {\n";
    for (const char* const* kv = cfg.weight_map; *kv; kv += 2) c << "    " << cpp_string(kv[0]) << ", " << cpp_string(kv[1]) << ",\n";
    c << "    nullptr};\n";
  }
  c << "\nstatic const halformer::ModelConfig kConfig = {\n"
    << "      " << cpp_string(cfg.name) << ", " << cpp_string(cfg.spec_file) << ",\n"
    << "      " << en("Architecture", cfg.arch) << ",\n"
    << "      /*d_model*/ " << cfg.d_model << ", /*heads*/ " << cfg.heads << ", /*d_ff*/ " << cfg.d_ff << ",\n"
    << "      /*encoder_layers*/ " << cfg.encoder_layers << ", /*decoder_layers*/ " << cfg.decoder_layers << ",\n"
    << "      /*src_vocab*/ " << cfg.src_vocab << ", /*tgt_vocab*/ " << cfg.tgt_vocab << ", /*max_len*/ " << cfg.max_len
    << ", /*type_vocab*/ " << cfg.type_vocab << ",\n"
    << "      /*pre_norm*/ " << b(cfg.pre_norm) << ", /*final_norm*/ " << b(cfg.final_norm) << ",\n"
    << "      " << en("Positions", cfg.positions) << ",\n"
    << "      /*embedding_norm*/ " << b(cfg.embedding_norm) << ", /*share_src_tgt*/ " << b(cfg.share_src_tgt)
    << ", /*share_tgt_output*/ " << b(cfg.share_tgt_output) << ",\n"
    << "      /*causal*/ " << b(cfg.causal) << ", /*padding_mask*/ " << b(cfg.padding_mask) << ",\n"
    << "      " << en("HeadKind", cfg.head) << ",\n"
    << "      /*mean_pooling*/ " << b(cfg.mean_pooling) << ", /*pooler*/ " << b(cfg.pooler)
    << ", /*num_classes*/ " << cfg.num_classes << ",\n"
    << "      /*pad*/ " << cfg.pad_id << ", /*bos*/ " << cfg.bos_id << ", /*eos*/ " << cfg.eos_id
    << ", /*max_new_tokens*/ " << cfg.max_new_tokens << ",\n"
    << "      /*beam*/ " << b(cfg.beam) << ", /*beam_size*/ " << cfg.beam_size
    << ", /*length_penalty*/ " << Planner::format_float(cfg.length_penalty) << ",\n"
    << "      " << en("WeightPreset", cfg.preset) << ", " << cpp_string(cfg.preset_name) << ",\n"
    << "      " << (cfg.weight_map ? "kWeightMap" : "nullptr") << ",\n"
    << "      /*position_offset*/ " << cfg.position_offset << ",\n"
    << "      /*kv_heads*/ " << cfg.kv_heads << ", /*rms_norm*/ " << b(cfg.rms_norm)
    << ", /*norm_weight_offset*/ " << Planner::format_float(cfg.norm_weight_offset) << ", /*gated_ff*/ "
    << b(cfg.gated_ff) << ",\n"
    << "      /*layer_weights*/ " << en("Precision", cfg.layer_weights)
    << ", /*generator_weights*/ " << en("Precision", cfg.generator_weights) << ",\n"
    << "      /*embedding_weights*/ " << en("Precision", cfg.embedding_weights)
    << ", /*int16_activations*/ " << b(cfg.int16_activations) << ",\n"
    << "      /*cross_kv_bf16*/ " << b(cfg.cross_kv_bf16) << ", /*self_cache_bf16*/ " << b(cfg.self_cache_bf16)
    << ", /*amx_tiles*/ " << b(cfg.amx_tiles) << ",\n      /*relative_buckets*/ " << cfg.relative_buckets << ", /*relative_distance*/ " << cfg.relative_distance
    << ", /*generator_input_scale*/ " << Planner::format_float(cfg.generator_input_scale)
    << ", /*parallel_residual*/ " << b(cfg.parallel_residual) << ", /*embedding_size*/ " << cfg.embedding_size
    << ", /*shared_layers*/ " << b(cfg.shared_layers) << ",\n      /*ff_activation*/ "
    << cpp_string(cfg.ff_activation) << ", /*tf32*/ " << b(cfg.tf32) << ", /*self_cache_int8*/ "
    << b(cfg.self_cache_int8) << "};\n\n";
  // A CUDA build hands the runtime Halide's CUDA runtime hooks (model_config.h CudaHooks).
  if (spec.has_target(Target::Cuda))
    c << "extern \"C\" int halide_cuda_acquire_context(void*, void**, bool);\n"
      << "extern \"C\" int halide_cuda_release_context(void*);\n"
      << "extern \"C\" int halide_cuda_get_stream(void*, void*, void**);\n"
      << "static const halformer::CudaHooks kCudaHooks = {halide_cuda_acquire_context, halide_cuda_release_context,\n"
      << "                                                halide_cuda_get_stream};\n\n";
  // Each device's KernelTable, filled by name (model_config.h HALFORMER_KERNEL_ROLES): a
  // role renamed or removed there fails to compile here; roles not bound stay null.
  for (const auto& [device, target] : plan.variants) {
    c << "static halformer::KernelTable make_kernels_" << device << "() {\n"
      << "  halformer::KernelTable k{};\n";
    for (const KernelRoleInfo& role : kKernelRoles) {
      auto it = plan.roles.find(role.name);
      if (it != plan.roles.end() && !it->second.empty())
        c << "  k." << role.name << " = " << variant_fn(it->second, device) << ";\n";
    }
    c << "  k.metadata = " << variant_fn(plan.kernels.front().function, device) << "_metadata;\n"
      << (device == "cuda" ? "  k.cuda = &kCudaHooks;\n" : "")
      << "  return k;\n}\n";
  }
  c << "\nstatic const halformer::KernelTable* kernels_for(const char* device) {\n"
    << "  const std::string d = device;\n";
  for (const auto& [device, target] : plan.variants)
    c << "  if (d == \"" << device << "\") {\n    static const halformer::KernelTable k = make_kernels_" << device
      << "();\n    return &k;\n  }\n";
  c << "  return nullptr;\n}\n\n";
  std::string devices;
  for (size_t i = 0; i < plan.variants.size(); ++i) devices += (i ? " " : "") + plan.variants[i].first;
  const std::string entry = "halformer_model_" + plan.cname;
  c << "extern \"C\" const halformer::ModelDescriptor* " << entry << "() {\n"
    << "  static const halformer::ModelDescriptor descriptor = {halformer::kDescriptorVersion, &kConfig, "
    << cpp_string(devices) << ", kernels_for};\n"
    << "  return &descriptor;\n}\n";
  write_if_changed(fs::path(dir) / (plan.name + "_model.cpp"), c.str());

  // The model's public header: its descriptor, for programs that link lib<name>.a.
  std::ostringstream h;
  h << "// Generated by `halformer plan` from " << comment_text(spec.file) << " -- do not edit.\n"
    << "// The model " << comment_text(plan.name) << " as a value: halformer::Model::load(*" << entry
    << "(), weights).\n#pragma once\n\n#include \"halformer/model.h\"\n\n"
    << "extern \"C\" const halformer::ModelDescriptor* " << entry << "();\n";
  write_if_changed(fs::path(dir) / (plan.name + ".h"), h.str());

  // The inference binary's main().
  std::ostringstream m;
  m << "// Generated by `halformer plan` from " << comment_text(spec.file) << " -- do not edit.\n"
    << "#include \"halformer/cli.h\"\n\nextern \"C\" const halformer::ModelDescriptor* " << entry << "();\n\n"
    << "int main(int argc, char** argv) { return halformer::run_cli(*" << entry << "(), argc, argv); }\n";
  write_if_changed(fs::path(dir) / (plan.name + "_main.cpp"), m.str());

  // The shared library's one fixed entry point (what Python's halformer.Model opens).
  std::ostringstream e;
  e << "// Generated by `halformer plan` from " << comment_text(spec.file) << " -- do not edit.\n"
    << "#include \"halformer/model_config.h\"\n\nextern \"C\" const halformer::ModelDescriptor* " << entry
    << "();\n\nextern \"C\" __attribute__((visibility(\"default\"))) const halformer::ModelDescriptor* "
    << "halformer_model_descriptor() {\n  return " << entry << "();\n}\n";
  write_if_changed(fs::path(dir) / (plan.name + "_entry.cpp"), e.str());
}

}  // namespace halformer
