// Kernel I/O for the tuner (kernel_io.h): what each kernel reads and writes for one
// tuning shape, by its signature, and the random buffers the tuner feeds it.
#include "kernel_io.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>

#include "halformer/kv_int8.h"
#include "halformer/packed_layout.h"

namespace halformer::tune {

using namespace Halide;

namespace {

// A buffer of the spec's extents, laid out in its storage order.
template <typename T>
Buffer<T> allocate(const InputSpec& spec) {
  return spec.storage_order.empty() ? Buffer<T>(spec.extents) : Buffer<T>(spec.extents, spec.storage_order);
}

int geti(const std::vector<std::pair<std::string, std::string>>& p, const std::string& k, int fallback) {
  for (const auto& [name, v] : p)
    if (name == k) return std::stoi(v);
  return fallback;
}
// A boolean GeneratorParam set to "true" (absent: false).
bool getb(const std::vector<std::pair<std::string, std::string>>& p, const std::string& k) {
  for (const auto& [name, v] : p)
    if (name == k) return v == "true";
  return false;
}

// One struct per signature with an InputSpec per input, named as the signature names it
// (HALFORMER_KERNEL_SIGNATURES), so that a renamed input fails to compile here; named()
// keys them by name for IoPlan (LinearFn's goes unused: see linear_inputs).
#define HALFORMER_TUNE_INPUT_MEMBER(name) InputSpec name;
#define HALFORMER_TUNE_INPUT_ENTRY(name) {#name, in.name},
#define HALFORMER_TUNE_INPUTS(Fn, members) \
  struct Fn##Inputs {                      \
    members                                \
  };
#define HALFORMER_TUNE_NAMED(Fn, entries) \
  [[maybe_unused]] std::map<std::string, InputSpec> named(const Fn##Inputs& in) { return {entries}; }
HALFORMER_KERNEL_SIGNATURES(HALFORMER_TUNE_INPUTS, HALFORMER_TUNE_INPUT_MEMBER, HALFORMER_TUNE_INPUT_MEMBER)
HALFORMER_KERNEL_SIGNATURES(HALFORMER_TUNE_NAMED, HALFORMER_TUNE_INPUT_ENTRY, HALFORMER_TUNE_INPUT_ENTRY)
#undef HALFORMER_TUNE_NAMED
#undef HALFORMER_TUNE_INPUTS
#undef HALFORMER_TUNE_INPUT_ENTRY
#undef HALFORMER_TUNE_INPUT_MEMBER

InputSpec uniform(std::vector<int> extents, float scale = 1) {
  InputSpec i;
  i.extents = std::move(extents);
  i.scale = scale;
  return i;
}

// The linears (x (K, M), w packed, b, residual (N, M)); the weights' storage follows the
// generator, the fp32 one or its int8 / bf16 twin (tools/spec/plan.cpp). A plain linear
// (LinearFn) is planned with the residual too, which it never reads: its random inputs
// are then drawn in the same sequence as a residual linear's.
LinearResidualFnInputs linear_inputs(const PlannedKernel& k, int M, const Halide::Target& target) {
  const auto& p = k.params;
  const int K = geti(p, "in_features", 64), N = geti(p, "out_features", 64);
  LinearResidualFnInputs in;
  in.x = uniform({K, M});
  if (reads_packed_panels(k.generator)) {
    const halformer::WeightLayout layout = halformer::weight_layout(target.to_string());  // packed_layout.h
    const int panel = layout.panel, panels = halformer::panel_count(N, panel);
    in.w = uniform({panel, K, panels}, 1.0f / std::sqrt(float(K)));
    if (k.generator.rfind("linear_bf16", 0) == 0) {
      in.w.kind = InputSpec::Bf16;
      const halformer::Bf16WeightShape s = halformer::bf16_weight_shape(K, N, layout.bf16_panel(), layout.bf16_pairs);
      in.w.extents = {s.pair, s.panel, s.rows()};
      in.w.bf16_type = halformer::bf16_weight_type(layout.bf16_pairs);
    }
    in.b = uniform({N}, 0.1f);
  } else {  // linear_int8 (halformer/packed_layout.h)
    in.w.kind = InputSpec::Int8;
    const int G = halformer::int8_group(target.to_string(), getb(p, "int16_activations"));
    in.w.extents = {G, halformer::kInt8Panel, halformer::int8_groups(K, G) * halformer::int8_panel_count(N)};
    // bias | per-channel scale (| channel sum, quads) (signed here: any values work)
    in.b = uniform({N, halformer::int8_bias_columns(G)}, 0.1f);
  }
  in.residual = uniform({N, M});
  return in;
}

}  // namespace

Signature signature(KernelRole r) {
  switch (r) {
#define HALFORMER_TUNE_ROLE_SIGNATURE(role, Fn, generator, doc) \
  case KernelRole::role:                                       \
    return Signature::Fn;
    HALFORMER_KERNEL_ROLES(HALFORMER_TUNE_ROLE_SIGNATURE)
#undef HALFORMER_TUNE_ROLE_SIGNATURE
  }
  throw std::logic_error("unknown kernel role " + std::to_string(int(r)));
}

bool reads_packed_panels(const std::string& generator) {
  return generator.rfind("linear", 0) == 0 && generator.rfind("linear_int8", 0) != 0;
}

IoPlan io_plan(const PlannedKernel& k, Signature signature, const Shape& s, const Halide::Target& target) {
  const auto& p = k.params;
  const int B = s.batch, M = int(s.rows());
  const int T = s.phase == "decode" ? 1 : s.seq;  // new positions
  IoPlan io;
  switch (signature) {
    case Signature::LinearFn:
    case Signature::LinearResidualFn: {
      const int N = geti(p, "out_features", 64);
      io.inputs = named(linear_inputs(k, M, target));
      io.out_extents = {N, M};
      break;
    }
    case Signature::AttentionFn: {
      const int H = geti(p, "heads", 4), D = geti(p, "head_dim", 16);
      const int qh = geti(p, "q_head", 0), kh = geti(p, "k_head", H), vh = geti(p, "v_head", 2 * H);
      const int Tk = s.seq;
      const int kv_ext = std::max(kh, vh) + H;
      const int q_ext = kh > 0 ? std::max({qh, kh, vh}) + H : qh + H;  // self: one fused QKV buffer
      AttentionFnInputs in;
      in.q = uniform({D, q_ext, T, B});
      in.kv = uniform({D, kv_ext, Tk, B});
      if (q_ext == kv_ext && T == Tk) in.kv.alias = "q";
      // kv_bf16 (a bf16 cache's keys and values): bf16 bits on the CPU; GPU kernels keep fp32.
      // q_bf16 (a bf16 self-attention cache): the queries too.
      if (getb(p, "kv_bf16") && !target.has_gpu_feature()) in.kv.kind = InputSpec::Bf16;
      // kv_int8 (an int8 self-attention cache): int8 rows, each with its scale, apart from
      // the queries' rows.
      if (getb(p, "kv_int8") && !target.has_gpu_feature())
        in.kv.kind = InputSpec::KvInt8, in.kv.extents[0] = halformer::kv_int8_row_bytes(D), in.kv.alias.clear();
      if (getb(p, "q_bf16") && !target.has_gpu_feature()) in.q.kind = InputSpec::Bf16;
      // Cross-attention (its own key/value buffer, keys from head 0): the CPU runtime stores
      // that cache head by head (Model::cross_kv), [sequence][head][position][features].
      if (kh == 0 && !target.has_gpu_feature()) in.kv.storage_order = {0, 2, 1, 3};
      in.key_mask.kind = InputSpec::Mask;
      in.key_mask.extents = {Tk, B};
      // Relative position bias (T5): a (2M + 1, heads) table; 1 x 1, unread, without one.
      const int R = geti(p, "relative_distance", 0);
      in.position_bias = R > 0 ? uniform({2 * R + 1, H}) : uniform({1, 1});
      io.inputs = named(in);
      io.out_extents = {D, H, T, B};
      break;
    }
    case Signature::PagedAttentionFn:  // the engine's: the decoder self-attention's schedule, not tuned alone
      throw std::logic_error("the paged self-attention is not tuned on its own");
    case Signature::LayerNormFn: {
      const int C = geti(p, "channels", 64);
      LayerNormFnInputs in;
      in.x = uniform({C, M}, 2);
      in.gamma = uniform({C});
      in.beta = uniform({C});
      io.inputs = named(in);
      io.out_extents = {C, M};
      break;
    }
    case Signature::EmbeddingFn: {
      // embedding_int8's tables (int8 rows and their scale) are not synthesised.
      if (k.generator != "embedding")
        throw std::runtime_error("the tuner does not know the input shapes of generator '" + k.generator + "'");
      const int C = geti(p, "channels", 64), V = geti(p, "vocab", 16), L = geti(p, "max_len", 64);
      const int TV = std::max(1, geti(p, "type_vocab", 0));
      EmbeddingFnInputs in;
      in.tokens.kind = InputSpec::Tokens;
      in.tokens.extents = {T, B};
      in.tokens.range = V;
      in.type_ids = in.tokens;
      in.type_ids.range = TV;
      in.table = uniform({C, V});
      in.pos_table = uniform({C, L});
      in.type_table = uniform({C, TV});
      in.pos_offset.kind = InputSpec::Scalar;
      in.pos_offset.scalar = s.phase == "decode" ? std::min(s.seq, L) - 1 : 0;
      io.inputs = named(in);
      io.out_extents = {C, T, B};
      break;
    }
    case Signature::SoftmaxFn: {
      const int V = geti(p, "classes", 16);
      SoftmaxFnInputs in;
      in.x = uniform({V, M}, 4);
      io.inputs = named(in);
      io.out_extents = {V, M};
      break;
    }
    case Signature::ArgmaxFn: {
      const int V = geti(p, "classes", 16);
      ArgmaxFnInputs in;
      in.x = uniform({V, M}, 4);
      io.inputs = named(in);
      io.out_extents = {M};
      break;
    }
    case Signature::ConvertFn: {  // cast_bf16: linear inputs (d_model or d_ff wide)
      const int C = geti(p, "channels", 64);
      ConvertFnInputs in;
      in.x = uniform({C, M});
      io.inputs = named(in);
      io.out_extents = {C, M};
      break;
    }
    case Signature::GateFn: {  // gate_act: (N, M) elementwise
      const int C = geti(p, "channels", 64);
      GateFnInputs in;
      in.gate = uniform({C, M});
      in.up = uniform({C, M});
      io.inputs = named(in);
      io.out_extents = {C, M};
      break;
    }
    case Signature::RotaryFn: {  // rotary: fused QKV rows and each row's position
      const int C = geti(p, "channels", 64), L = std::max(1, geti(p, "rotary_positions", 0));
      RotaryFnInputs in;
      in.x = uniform({C, M});
      in.positions.kind = InputSpec::Tokens;
      in.positions.extents = {M};
      in.positions.range = L;
      io.inputs = named(in);
      io.out_extents = {C, M};
      break;
    }
    case Signature::PoolFn: {
      const int C = geti(p, "channels", 64);
      PoolFnInputs in;
      in.x = uniform({C, s.seq, B});
      in.valid.kind = InputSpec::Valid;
      in.valid.extents = {s.seq, B};
      io.inputs = named(in);
      io.out_extents = {C, B};
      break;
    }
  }
  return io;
}

std::map<std::string, Arg> make_inputs(const IoPlan& io, std::mt19937& rng) {
  std::map<std::string, Arg> inputs;
  for (const auto& [name, spec] : io.inputs) {
    if (!spec.alias.empty()) continue;
    Arg a;
    if (spec.kind == InputSpec::Scalar) {
      a.is_buffer = false;
      a.scalar = spec.scalar;
    } else if (spec.kind == InputSpec::Int8) {
      Buffer<int8_t> b = allocate<int8_t>(spec);
      std::uniform_int_distribution<int> u(-127, 127);
      b.for_each_value([&](int8_t& v) { v = int8_t(u(rng)); });
      a.buf = b;
    } else if (spec.kind == InputSpec::KvInt8) {
      Buffer<int8_t> b = allocate<int8_t>(spec);
      const int hd = spec.extents[0] - halformer::kKvInt8ScaleBytes;
      std::uniform_real_distribution<float> u(-1.0f, 1.0f);
      std::vector<float> features(size_t(hd), 0.0f);
      b.for_each_element([&](const int* pos) {
        if (pos[0] != 0) return;  // once per row
        for (float& f : features) f = u(rng) * spec.scale;
        halformer::quantize_kv_row(hd, [&](int f) { return features[size_t(f)]; }, &b(pos));
      });
      a.buf = b;
    } else if (spec.kind == InputSpec::Bf16) {
      Buffer<uint16_t> b = allocate<uint16_t>(spec);
      std::uniform_real_distribution<float> u(-1.0f, 1.0f);
      b.for_each_value([&](uint16_t& v) { v = halformer::to_bf16(u(rng) * spec.scale); });
      a.buf = b;
      a.buf.raw_buffer()->type = spec.bf16_type;
    } else if (spec.kind == InputSpec::Tokens) {
      Buffer<int32_t> b = allocate<int32_t>(spec);
      std::uniform_int_distribution<int> u(0, std::max(1, spec.range) - 1);
      b.for_each_value([&](int32_t& v) { v = u(rng); });
      a.buf = b;
    } else {
      Buffer<float> b = allocate<float>(spec);
      std::uniform_real_distribution<float> u(-1.0f, 1.0f);
      if (spec.kind == InputSpec::Uniform) {
        b.for_each_value([&](float& v) { v = u(rng) * spec.scale; });
      } else {  // Mask: the last eighth of the keys are padding; Valid: 1 except that tail
        const int n = spec.extents[0], cut = n - n / 8;
        b.for_each_element([&](const int* pos) {
          const bool pad = pos[0] >= cut && n > 1;
          b(pos) = spec.kind == InputSpec::Mask ? (pad ? -1e30f : 0.0f) : (pad ? 0.0f : 1.0f);
        });
      }
      a.buf = b;
    }
    if (a.is_buffer) a.buf.set_host_dirty();  // so GPU pipelines copy it to the device
    inputs[name] = a;
  }
  for (const auto& [name, spec] : io.inputs)
    if (!spec.alias.empty()) inputs[name] = inputs.at(spec.alias);
  return inputs;
}

}  // namespace halformer::tune
