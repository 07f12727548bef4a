// Kernel I/O for the tuner: the inputs it synthesises for each kernel (shapes, kinds and
// storage orders of every input, the output's extents) as the runtime calls the kernel,
// and the random buffers made from them. The inputs follow the kernel's signature
// (halformer/model_config.h: HALFORMER_KERNEL_SIGNATURES, named by its roles'
// HALFORMER_KERNEL_ROLES); the runtime (runtime/layers.cpp) calls the same kernels with
// real data.
#pragma once

#include "Halide.h"

#include <map>
#include <random>
#include <string>
#include <vector>

#include "plan.h"
#include "tuning_db.h"

namespace halformer::tune {

// One argument of a kernel call: a buffer or an int32 scalar.
struct Arg {
  Halide::Buffer<> buf;
  int32_t scalar = 0;
  bool is_buffer = true;
};

// How one input is synthesised.
struct InputSpec {
  // Int8: quantized weights in [-127, 127]; Bf16: uniform values as bf16 bits; KvInt8:
  // uniform values as int8 key/value cache rows (halformer/kv_int8.h; extents[0] its bytes)
  enum Kind { Uniform, Tokens, Mask, Valid, Scalar, Int8, Bf16, KvInt8 } kind = Uniform;
  std::vector<int> extents;
  float scale = 1;
  int range = 1;       // Tokens: ids in [0, range)
  int32_t scalar = 0;  // Scalar
  std::string alias;   // same buffer as this input
  std::vector<int> storage_order;  // dimensions innermost first (empty: as listed)
  // Bf16: the element type the kernel reads (paired linear weights: bfloat16).
  halide_type_t bf16_type = halide_type_of<uint16_t>();
};

// Every input of a kernel by name, and the output's extents.
struct IoPlan {
  std::map<std::string, InputSpec> inputs;
  std::vector<int> out_extents;
};

// The pipelines' signatures as values, one per function type (LinearFn, AttentionFn, ...).
enum class Signature {
#define HALFORMER_TUNE_SIGNATURE_ENUM(Fn, inputs) Fn,
#define HALFORMER_TUNE_NO_INPUT(name)
  HALFORMER_KERNEL_SIGNATURES(HALFORMER_TUNE_SIGNATURE_ENUM, HALFORMER_TUNE_NO_INPUT, HALFORMER_TUNE_NO_INPUT)
#undef HALFORMER_TUNE_NO_INPUT
#undef HALFORMER_TUNE_SIGNATURE_ENUM
};

// The signature of the kernels bound to `role` (its function type in HALFORMER_KERNEL_ROLES).
Signature signature(KernelRole role);

// linear and linear_bf16 (+ _residual, _gated): weights in the fp32 packed layout, whose
// panel width follows the target (halformer/packed_layout.h); int8 has its own layout.
bool reads_packed_panels(const std::string& generator);

// Shapes of every input and of the output for one tuning shape, as the runtime calls the
// kernel `k` of that signature (runtime/layers.cpp).
IoPlan io_plan(const PlannedKernel& k, Signature signature, const Shape& s, const Halide::Target& target);

// Random inputs for an io_plan (aliased inputs share their buffer), drawn from `rng` in
// the order of the input names.
std::map<std::string, Arg> make_inputs(const IoPlan& io, std::mt19937& rng);

}  // namespace halformer::tune
