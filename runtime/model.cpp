// Model: a built model's descriptor and weights as a value (halformer/model.h). load()
// checks the descriptor, the CPU or device and the weights; each public call runs on a
// Stack (stack.h: layer blocks and stacks) within the model's thread limit (threads.h),
// decoding through decoding.h. The rooms of the runtime: activations.h (arrays, views,
// host block cache), device.h (weight buffers, transfers), profile.h, threads.h,
// halide_status.h, stack.h (layers.cpp, stacks.cpp), decoding.h (token_choice.cpp,
// prefill.cpp, generate.cpp, beam_search.cpp), weights (weight_*.cpp).
#include "halformer/model.h"

#include <HalideBuffer.h>
#include <HalideRuntime.h>

#include <algorithm>
#include <cstdio>
#include <memory>
#include <mutex>
#include <string>

#include "cpu_features.h"
#include "decoding.h"
#include "device.h"
#include "halformer/error.h"
#include "halformer/weights.h"
#include "halide_status.h"
#include "call.h"

namespace halformer {

Model::Model(const ModelDescriptor& desc, std::unique_ptr<Weights> w, std::string device, int threads)
    : desc_(&desc),
      kernels_(desc.kernels_for(device.c_str())),
      threads_(threads),
      weights_(std::move(w)),
      device_(std::move(device)),
      buffers_(std::make_unique<WeightBuffers>()),
      state_(std::make_unique<DeviceState>()) {}
Model::~Model() = default;
Model::Model(Model&&) noexcept = default;
Model& Model::operator=(Model&&) noexcept = default;

Call Model::call() const {
  return Call{CallThreads(threads_),
              Stack(DeviceContext{state_->iface, state_->stats, *buffers_, state_->blas.get()}, *desc_->config, *kernels_)};
}

Model Model::load(const ModelDescriptor& desc, const std::string& weights_path, const LoadOptions& options) {
  if (desc.version != kDescriptorVersion)
    throw Error("model descriptor version " + std::to_string(desc.version) + " but this runtime reads version " +
                std::to_string(kDescriptorVersion) + ": rebuild the model with this halformer");
  const ModelConfig& cfg = *desc.config;
  const std::string& device = options.device;
  const KernelTable* kernels = desc.kernels_for(device.c_str());
  if (!kernels)
    throw Error("device '" + device + "': this model was built for: " + desc.devices +
                " (add it to the spec's targets, e.g. targets: [host, cuda], and rebuild)");
  // Refuse, naming what is missing, rather than die of an illegal instruction in a kernel.
  const std::string target = kernels->metadata()->target;
  // AMX tiles, where the build used them ("amx": cpu_features.cpp), on top of the target.
  const bool amx = cfg.amx_tiles && device == "cpu";
  if (auto missing = missing_cpu_features(amx ? target + "-amx" : target); !missing.empty()) {
    std::string list;
    for (const auto& f : missing) list += (list.empty() ? "" : ", ") + f;
    throw Error("model '" + std::string(cfg.name) + "' was compiled for " + target + ", but this CPU lacks " + list +
                ": rebuild it on this machine (halformer build) to run it here");
  }
  if (amx)
    if (std::string why = request_amx_tile_state(); !why.empty())
      throw Error("model '" + std::string(cfg.name) + "' was compiled with AMX tiles, but " + why);
  reserve_threads(options.threads);
  Model m(desc, std::make_unique<Weights>(load_weights(cfg, weights_path, weight_layout(target))), device,
          std::max(0, options.threads));
  if (device != "cpu") {
    // Fail now, clearly, if the device cannot run a kernel (no driver, no device). The
    // probe runs on host buffers that Halide copies over; its output then carries the
    // device interface that every activation of this model is allocated with.
    const int d = cfg.d_model;
    Buf x(d, 1), y(d, 1), gamma(d), beta(d);
    x.fill(0.0f), gamma.fill(1.0f), beta.fill(0.0f);
    for (Buf* b : {&x, &gamma, &beta}) b->set_host_dirty();
    try {
      check_kernel(m.kernels_->layer_norm(x.raw_buffer(), gamma.raw_buffer(), beta.raw_buffer(), y.raw_buffer()),
          "layer_norm");
    } catch (const Error& e) {
      throw Error("device '" + device + "' is not usable here (" + e.what() + "). Use --device cpu.");
    }
    m.state_->iface = y.raw_buffer()->device_interface;
    if (!m.state_->iface) throw Error("device '" + device + "': the probe kernel ran on the host (internal)");
    // Activations are allocated and freed many times per decode step: let the Halide
    // runtime keep freed device blocks for reuse (cuMemAlloc / clCreateBuffer per
    // activation would dominate small steps on a real GPU).
    halide_reuse_device_allocations(nullptr, true);
    // CUDA: the many-row linears on tensor cores through cuBLASLt, unless
    // HALFORMER_GPU_GEMM=halide; where cuBLASLt cannot load, Halide kernels, said once.
    if (kernels->cuda && gemm_policy_from_env() != GemmPolicy::Halide) {
      std::string why;
      m.state_->blas = GpuBlas::open(*kernels->cuda, cfg.tf32, &why);
      static std::once_flag said;
      if (!m.state_->blas)
        std::call_once(said, [&] { std::fprintf(stderr, "halformer: cuBLASLt not used (%s): linears run as Halide kernels\n", why.c_str()); });
    }
  }
  return m;
}

const ModelConfig& Model::config() const { return *desc_->config; }

TransferStats Model::transfers() const { return state_->stats; }

Tensor Model::encode(const std::vector<Sequence>& src) const { return call()->encode(*weights_, src); }

Tensor Model::pooled(const std::vector<Sequence>& src) const { return call()->pooled(*weights_, src); }

Tensor Model::score(const std::vector<Sequence>& src, const std::vector<Sequence>& tgt) const {
  return call()->score(*weights_, src, tgt);
}

DecodeResult Model::generate(const std::vector<Sequence>& src, const GenerationOptions& options) const {
  Call c = call();
  return halformer::generate(c.stack, *weights_, src, options);
}

DecodeResult Model::greedy(const std::vector<Sequence>& src, int max_new_tokens, bool use_cache) const {
  if (max_new_tokens < 1 || max_new_tokens > config().max_len)  // 0 is not "the spec's default" here
    throw Error("max_new_tokens " + std::to_string(max_new_tokens) + " is outside [1, max_len = " +
                std::to_string(config().max_len) + "]");
  GenerationOptions o;
  o.max_new_tokens = max_new_tokens;
  o.use_cache = use_cache;
  return generate(src, o);
}

BeamResult Model::beam_search(const std::vector<Sequence>& src, int beam_size, double length_penalty,
                              int max_new_tokens) const {
  Call c = call();
  return halformer::beam_search(c.stack, *weights_, src, beam_size, length_penalty, max_new_tokens);
}

}  // namespace halformer

