// Tensor-core matmuls for the many-row linears of CUDA models, through cuBLASLt
// (docs/gpu.md#cublaslt). Halide 21 cannot schedule tensor-core instructions; cuBLASLt,
// part of the CUDA toolkit, multiplies bf16 (or TF32) on them with fp32 sums and fuses
// the bias, ReLU / tanh-GELU and a residual into the same kernel.
//
// The library is opened at run time (dlopen libcublasLt.so.13, or $HALFORMER_CUBLASLT),
// so a model links nothing new and runs where the driver's machine has it (PyTorch's
// wheels ship a copy); the calls run in the CUDA context and on the stream of Halide's
// kernels (model_config.h CudaHooks), so they are ordered with them.
//
// The weights stay in the packed panels the Halide kernels read (packed_layout.h:
// [N / panel][K][panel]): each panel is a column-major panel x K matrix, so the whole
// linear is one strided-batched matmul over the panels (the activations shared, batch
// stride 0) writing panel-wide column blocks of the output; a last partial panel is a
// second call.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <tuple>

namespace halformer {

struct CudaHooks;

// What the matmul adds after x W^T: the bias always; then an activation, or a residual.
enum class GemmEpilogue { Bias, BiasRelu, BiasGeluTanh, BiasResidual };

// One linear's call: out(n, m) = epilogue(sum_k x(k, m) w(n, k) + b(n)) for M rows, as the
// Halide kernel computes it. Pointers are CUDA device addresses (a Halide buffer's
// `device` field on CUDA).
struct GemmCall {
  int M, K, N, panel;
  bool bf16;  // x and w are bf16 bits (else fp32); b, residual and out are fp32
  uint64_t x, w, bias, residual, out;
  GemmEpilogue epilogue;
};

// Which linears go to cuBLASLt ($HALFORMER_GPU_GEMM): "auto" (the default) those of more
// than kGemmMinRows rows and, at any row count, those of at least kGemmMinWeights weights,
// "cublaslt" all, "halide" none. On the H200 cuBLASLt was faster at every measured shape
// above 256 rows, and TinyLlama's decode (one row, 4-66 M weights per linear) ran 11.55
// -> 6.33 ms per step with its linears there (docs/gpu-tensor-cores.md); transformer-base's
// layer linears (0.26-1 M weights, a launch-bound decode) stay Halide kernels at few rows.
enum class GemmPolicy { Auto, Cublaslt, Halide };
constexpr int kGemmMinRows = 256;  // the Halide kernels' few-row path reaches this far (schedules/gpu.h)
constexpr int64_t kGemmMinWeights = int64_t(1) << 22;
GemmPolicy gemm_policy_from_env();

class GpuBlas {
 public:
  // Opens cuBLASLt in Halide's CUDA context (which the model's first kernel created);
  // null with `why` set where the library, the driver or the context is not there.
  static std::unique_ptr<GpuBlas> open(const CudaHooks& hooks, bool tf32, std::string* why);
  ~GpuBlas();
  GpuBlas(const GpuBlas&) = delete;
  GpuBlas& operator=(const GpuBlas&) = delete;

  // Whether cuBLASLt has an algorithm for `c` (its shape, epilogue and the alignment of its
  // addresses): the plans are made here and kept, a refusal too. false: run the Halide kernel.
  bool prepare(const GemmCall& c);
  // Runs `c`, prepared; throws Error naming the shape and cuBLASLt's status on failure.
  void matmul(const GemmCall& c);
  // Whether the policy sends a call of `rows` rows through a K x N weight here.
  bool takes(int rows, int K, int N) const {
    return policy_ == GemmPolicy::Cublaslt ||
           (policy_ == GemmPolicy::Auto && (rows > kGemmMinRows || int64_t(K) * N >= kGemmMinWeights));
  }

  struct Impl;

 private:
  explicit GpuBlas(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
  GemmPolicy policy_;
};

}  // namespace halformer
