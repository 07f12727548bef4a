// cuBLASLt's loader and policy (runtime/gpu_blas.h) where there is no GPU: a bad
// HALFORMER_GPU_GEMM is an error naming it; a library that cannot be loaded leaves the
// model on its Halide kernels with a reason naming the path and how to give another.
// (The matmuls themselves run on a GPU only: tools/gpu/run.sh, docs/gpu-tensor-cores.md.)
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

#include "gpu_blas.h"
#include "halformer/error.h"
#include "halformer/model_config.h"

namespace {

using halformer::GemmPolicy;

struct EnvVar {
  std::string name;
  EnvVar(const char* n, const char* value) : name(n) { setenv(n, value, 1); }
  ~EnvVar() { unsetenv(name.c_str()); }
};

TEST(GpuBlas, PolicyFromEnvironment) {
  unsetenv("HALFORMER_GPU_GEMM");
  EXPECT_EQ(halformer::gemm_policy_from_env(), GemmPolicy::Auto);
  {
    EnvVar e("HALFORMER_GPU_GEMM", "halide");
    EXPECT_EQ(halformer::gemm_policy_from_env(), GemmPolicy::Halide);
  }
  {
    EnvVar e("HALFORMER_GPU_GEMM", "cublaslt");
    EXPECT_EQ(halformer::gemm_policy_from_env(), GemmPolicy::Cublaslt);
  }
  EnvVar e("HALFORMER_GPU_GEMM", "cublas");
  try {
    halformer::gemm_policy_from_env();
    FAIL() << "HALFORMER_GPU_GEMM=cublas was accepted";
  } catch (const halformer::Error& err) {
    const std::string msg = err.what();
    EXPECT_NE(msg.find("HALFORMER_GPU_GEMM='cublas'"), std::string::npos) << msg;
    EXPECT_NE(msg.find("auto, cublaslt or halide"), std::string::npos) << msg;
  }
}

// Hooks that must not be called: the library fails to load first.
int no_acquire(void*, void**, bool) {
  ADD_FAILURE() << "a CUDA hook was used although cuBLASLt did not load";
  return -1;
}
int no_release(void*) { return -1; }
int no_stream(void*, void*, void**) { return -1; }

TEST(GpuBlas, MissingLibraryIsAReasonNotACrash) {
  EnvVar e("HALFORMER_CUBLASLT", "/nonexistent/libcublasLt.so.13");
  const halformer::CudaHooks hooks{no_acquire, no_release, no_stream};
  std::string why;
  EXPECT_EQ(halformer::GpuBlas::open(hooks, false, &why), nullptr);
#if HALFORMER_HAVE_CUBLASLT
  EXPECT_NE(why.find("/nonexistent/libcublasLt.so.13"), std::string::npos) << why;
  EXPECT_NE(why.find("HALFORMER_CUBLASLT"), std::string::npos) << why;
#else
  EXPECT_NE(why.find("without cuBLASLt"), std::string::npos) << why;
#endif
}

}  // namespace
