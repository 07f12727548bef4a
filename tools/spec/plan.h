// Build plan: the lowering of a validated Spec to the set of Halide pipelines a model
// needs (generator name + GeneratorParams per pipeline, deduplicated: layers whose baked
// sizes agree share one pipeline) and the generated C++ glue that hands the runtime
// its config and a kernel table.
#pragma once

#include <deque>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "halformer/model_config.h"
#include "spec.h"

namespace halformer {

struct PlannedKernel {
  std::string function;   // C symbol of the generated pipeline, e.g. reverse_tiny_linear_64x192
  std::string generator;  // registered generator name (generators/*.cpp)
  std::vector<std::pair<std::string, std::string>> params;  // GeneratorParams, in order
  // Halide plugins the generator must load (autoscheduler winners from a tuning database:
  // tools/tune/tuning_db.h apply_tuning), passed as `-p` next to the params.
  std::vector<std::string> plugins;
};

struct Plan {
  std::string name;   // model name (binary name)
  std::string cname;  // C identifier form of the name
  std::vector<PlannedKernel> kernels;
  std::map<std::string, std::string> roles;  // KernelTable field -> kernel function ("" = none)
  // One build of every kernel per device the spec targets: device -> Halide target,
  // e.g. {"cpu", "host"}, {"cuda", "host-cuda-cuda_capability_80"}, {"opencl", "host-opencl"}.
  std::vector<std::pair<std::string, std::string>> variants;
  std::string tuning_db;  // tuning database applied to the kernels ("" = none); a configure dependency
};

Plan make_plan(const Spec& spec);

// The decoder's key/value cache memory in words (per position, at max_len), for `halformer
// build` to state; "" for an encoder.
std::string memory_summary(const Spec& spec);

// The CUDA capability Halide generates PTX for, given the spec's cuda_capability (the
// highest Halide knows at or below it).
int halide_ptx_capability(int64_t capability);

// The runtime's ModelConfig for a spec -- the values <name>_model.cpp bakes in -- for
// tools that read a model's weights without building it (`halformer quantize`). Owns the
// strings the config points at.
struct SpecModelConfig {
  ModelConfig config{};
  std::deque<std::string> strings;
  std::vector<const char*> weight_map;  // key, value, ..., nullptr
};
std::unique_ptr<SpecModelConfig> model_config(const Spec& spec);

// "<dir>/plan.cmake" (kernels for halformer_add_model) and "<dir>/<name>_model.cpp".
// Files are rewritten only when their content changes, so an unchanged spec rebuilds
// nothing and a changed field rebuilds only the kernels whose parameters changed.
void write_plan(const Spec& spec, const Plan& plan, const std::string& dir);

}  // namespace halformer
