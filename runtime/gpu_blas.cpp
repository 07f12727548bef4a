// cuBLASLt for the many-row linears of CUDA models (gpu_blas.h): the library and the
// driver functions it needs found by name at run time, one matmul plan (descriptors and
// the heuristic's algorithm) cached per shape.
#include "gpu_blas.h"

#include <dlfcn.h>

#include <cstdlib>
#include <vector>

#include "halformer/error.h"
#include "halformer/model_config.h"

#if HALFORMER_HAVE_CUBLASLT
#include <cublasLt.h>
#include <cuda.h>
#endif

namespace halformer {

GemmPolicy gemm_policy_from_env() {
  const char* v = std::getenv("HALFORMER_GPU_GEMM");
  const std::string s = v ? v : "";
  if (s.empty() || s == "auto") return GemmPolicy::Auto;
  if (s == "cublaslt") return GemmPolicy::Cublaslt;
  if (s == "halide") return GemmPolicy::Halide;
  throw Error("HALFORMER_GPU_GEMM='" + s + "': expected auto, cublaslt or halide");
}

#if !HALFORMER_HAVE_CUBLASLT

struct GpuBlas::Impl {};
GpuBlas::GpuBlas(std::unique_ptr<Impl> impl) : impl_(std::move(impl)), policy_(GemmPolicy::Halide) {}
GpuBlas::~GpuBlas() = default;
std::unique_ptr<GpuBlas> GpuBlas::open(const CudaHooks&, bool, std::string* why) {
  *why = "this halformer was built without cuBLASLt's header (cublasLt.h of the CUDA toolkit)";
  return nullptr;
}
bool GpuBlas::prepare(const GemmCall&) { return false; }
void GpuBlas::matmul(const GemmCall&) { throw Error("internal: cuBLASLt is not built in"); }

#else

namespace {

// The library functions used, looked up once per process (never unloaded).
struct Lib {
#define HALFORMER_LT_FN(name) decltype(&::name) name = nullptr;
  HALFORMER_LT_FN(cublasLtCreate)
  HALFORMER_LT_FN(cublasLtDestroy)
  HALFORMER_LT_FN(cublasLtGetVersion)
  HALFORMER_LT_FN(cublasLtGetStatusString)
  HALFORMER_LT_FN(cublasLtMatmulDescCreate)
  HALFORMER_LT_FN(cublasLtMatmulDescDestroy)
  HALFORMER_LT_FN(cublasLtMatmulDescSetAttribute)
  HALFORMER_LT_FN(cublasLtMatrixLayoutCreate)
  HALFORMER_LT_FN(cublasLtMatrixLayoutDestroy)
  HALFORMER_LT_FN(cublasLtMatrixLayoutSetAttribute)
  HALFORMER_LT_FN(cublasLtMatmulPreferenceCreate)
  HALFORMER_LT_FN(cublasLtMatmulPreferenceDestroy)
  HALFORMER_LT_FN(cublasLtMatmulPreferenceSetAttribute)
  HALFORMER_LT_FN(cublasLtMatmulAlgoGetHeuristic)
  HALFORMER_LT_FN(cublasLtMatmul)
#undef HALFORMER_LT_FN
  // Driver API (cuda.h maps these names to their _v2 symbols).
  decltype(&::cuCtxPushCurrent) ctx_push = nullptr;
  decltype(&::cuCtxPopCurrent) ctx_pop = nullptr;
  decltype(&::cuMemAlloc) mem_alloc = nullptr;
  decltype(&::cuMemFree) mem_free = nullptr;
  std::string error;  // why the library cannot be used; empty when it can
};

template <typename F>
bool find(void* lib, const char* name, F& fn, std::string& error) {
  fn = reinterpret_cast<F>(dlsym(lib, name));
  if (!fn && error.empty()) error = std::string("symbol ") + name + " not found";
  return fn != nullptr;
}

const Lib& lib() {
  static const Lib l = [] {
    Lib l;
    const char* path = std::getenv("HALFORMER_CUBLASLT");
    std::vector<std::string> names = path && *path ? std::vector<std::string>{path}
                                                   : std::vector<std::string>{"libcublasLt.so.13", "libcublasLt.so"};
    void* lt = nullptr;
    for (const auto& n : names)
      if ((lt = dlopen(n.c_str(), RTLD_NOW | RTLD_LOCAL))) break;
    if (!lt) {
      const char* e = dlerror();
      l.error = "cannot load " + names.front() + (e ? std::string(" (") + e + ")" : "") +
                ": put its folder on LD_LIBRARY_PATH or set HALFORMER_CUBLASLT";
      return l;
    }
    void* cuda = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!cuda) cuda = dlopen("libcuda.so", RTLD_NOW | RTLD_LOCAL);
    if (!cuda) {
      l.error = "cannot load the CUDA driver (libcuda.so.1)";
      return l;
    }
#define HALFORMER_LT_FIND(name) find(lt, #name, l.name, l.error);
    HALFORMER_LT_FIND(cublasLtCreate)
    HALFORMER_LT_FIND(cublasLtDestroy)
    HALFORMER_LT_FIND(cublasLtGetVersion)
    HALFORMER_LT_FIND(cublasLtGetStatusString)
    HALFORMER_LT_FIND(cublasLtMatmulDescCreate)
    HALFORMER_LT_FIND(cublasLtMatmulDescDestroy)
    HALFORMER_LT_FIND(cublasLtMatmulDescSetAttribute)
    HALFORMER_LT_FIND(cublasLtMatrixLayoutCreate)
    HALFORMER_LT_FIND(cublasLtMatrixLayoutDestroy)
    HALFORMER_LT_FIND(cublasLtMatrixLayoutSetAttribute)
    HALFORMER_LT_FIND(cublasLtMatmulPreferenceCreate)
    HALFORMER_LT_FIND(cublasLtMatmulPreferenceDestroy)
    HALFORMER_LT_FIND(cublasLtMatmulPreferenceSetAttribute)
    HALFORMER_LT_FIND(cublasLtMatmulAlgoGetHeuristic)
    HALFORMER_LT_FIND(cublasLtMatmul)
#undef HALFORMER_LT_FIND
    find(cuda, "cuCtxPushCurrent_v2", l.ctx_push, l.error);
    find(cuda, "cuCtxPopCurrent_v2", l.ctx_pop, l.error);
    find(cuda, "cuMemAlloc_v2", l.mem_alloc, l.error);
    find(cuda, "cuMemFree_v2", l.mem_free, l.error);
    return l;
  }();
  return l;
}

// The largest power of two (<= 256) dividing every byte offset an operand's matrices
// start at: the heuristic may only pick kernels that assume no more.
uint32_t alignment(uint64_t address, int64_t batch_stride_bytes) {
  uint64_t a = 256;
  while (a > 1 && (address % a || batch_stride_bytes % a)) a /= 2;
  return uint32_t(a);
}

}  // namespace

struct GpuBlas::Impl {
  const Lib& l;
  CudaHooks hooks;
  void* stream = nullptr;  // Halide's, asked at every matmul (below)
  cublasLtHandle_t handle = nullptr;
  CUdeviceptr workspace = 0;
  size_t workspace_bytes = size_t(32) << 20;  // what NVIDIA suggests for Hopper
  bool tf32;
  std::mutex lock;

  // One (shape, epilogue, alignment) of matmul: descriptors and the chosen algorithm.
  struct Plan {
    cublasLtMatmulDesc_t op = nullptr;
    cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
    cublasLtMatmulAlgo_t algo{};
  };
  // (M, K, N, rows, batch, bf16, epilogue, residual, alignment of A, B, C/D, bias)
  using Key = std::tuple<int, int, int, int, int, bool, int, bool, uint32_t, uint32_t, uint32_t, uint32_t>;
  std::map<Key, Plan> plans;
  static constexpr size_t kMaxPlans = 4096;  // a few KB of descriptors each

  Impl(const Lib& lib, const CudaHooks& h, bool tf32_ok) : l(lib), hooks(h), tf32(tf32_ok) {}

  // Halide's context current on this thread for a scope (as Halide's own calls do).
  struct Scope {
    Impl& i;
    void* ctx = nullptr;
    explicit Scope(Impl& impl, bool create = true) : i(impl) {
      if (i.hooks.acquire_context(nullptr, &ctx, create) != 0 || !ctx)
        throw Error("cuBLASLt: no CUDA context from Halide's runtime");
      if (i.l.ctx_push(static_cast<CUcontext>(ctx)) != CUDA_SUCCESS) {
        i.hooks.release_context(nullptr);
        throw Error("cuBLASLt: cuCtxPushCurrent failed");
      }
    }
    ~Scope() {
      CUcontext old;
      i.l.ctx_pop(&old);
      i.hooks.release_context(nullptr);
    }
  };

  void check(cublasStatus_t s, const std::string& what) const {
    if (s != CUBLAS_STATUS_SUCCESS) throw Error("cuBLASLt " + what + ": " + l.cublasLtGetStatusString(s));
  }
  template <typename T>
  void set(cublasLtMatmulDesc_t d, cublasLtMatmulDescAttributes_t attr, T v) {
    check(l.cublasLtMatmulDescSetAttribute(d, attr, &v, sizeof v), "matmul attribute");
  }
  cublasLtMatrixLayout_t layout(cudaDataType t, int rows, int cols, int64_t ld, int batch, int64_t stride) {
    cublasLtMatrixLayout_t m = nullptr;
    check(l.cublasLtMatrixLayoutCreate(&m, t, uint64_t(rows), uint64_t(cols), ld), "layout");
    if (batch > 1) {
      int32_t count = batch;
      check(l.cublasLtMatrixLayoutSetAttribute(m, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count, sizeof count), "batch");
      check(l.cublasLtMatrixLayoutSetAttribute(m, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride, sizeof stride),
            "batch stride");
    }
    return m;
  }

  // One cuBLASLt call: out rows [n0, n0 + rows) of `batch` panels (rows = panel, or the
  // last partial one), its device addresses and the plan's key.
  struct Part {
    int rows, batch;
    uint64_t a, x, cin, d, bias;
    bool residual;
    Key key;
  };
  Part part(const GemmCall& c, int rows, int batch, int n0) const {
    const int64_t elem = c.bf16 ? 2 : 4;
    const int64_t w_stride = int64_t(c.K) * c.panel;  // elements from one panel to the next
    Part p{rows, batch, c.w + uint64_t(n0 / c.panel) * w_stride * elem, c.x, 0, c.out + uint64_t(n0) * 4,
           c.bias + uint64_t(n0) * 4, c.epilogue == GemmEpilogue::BiasResidual, {}};
    p.cin = p.residual ? c.residual + uint64_t(n0) * 4 : p.d;
    const int64_t out_stride = int64_t(c.panel) * 4;
    p.key = Key{c.M, c.K, c.N, rows, batch, c.bf16, int(c.epilogue), p.residual, alignment(p.a, w_stride * elem),
                alignment(p.x, 0), std::min(alignment(p.d, out_stride), alignment(p.cin, out_stride)),
                alignment(p.bias, out_stride)};
    return p;
  }
  std::vector<Part> parts(const GemmCall& c) const {
    std::vector<Part> r;
    const int full = c.N / c.panel, tail = c.N % c.panel;
    if (full > 0) r.push_back(part(c, c.panel, full, 0));
    if (tail > 0) r.push_back(part(c, tail, 1, full * c.panel));
    return r;
  }
  // The part's plan, made on first use; null where cuBLASLt has no algorithm for it
  // (remembered: the caller runs its Halide kernel instead).
  const Plan* plan(const GemmCall& c, const Part& part) {
    auto it = plans.find(part.key);
    if (it == plans.end() && plans.size() >= kMaxPlans) {  // many distinct prompt lengths: start over
      for (auto& [key, p] : plans) destroy(p);
      plans.clear();
    }
    if (it == plans.end()) {
      Plan p;
      const bool ok = make_plan(p, c, part);
      if (!ok) destroy(p);
      it = plans.emplace(part.key, ok ? p : Plan{}).first;
    }
    return it->second.op ? &it->second : nullptr;
  }
  void execute(const GemmCall& c, const Part& part, const Plan& p) {
    check(l.cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &part.bias, sizeof part.bias),
          "bias pointer");
    const float alpha = 1.0f, beta = part.residual ? 1.0f : 0.0f;
    check(l.cublasLtMatmul(handle, p.op, &alpha, reinterpret_cast<const void*>(part.a), p.a,
                           reinterpret_cast<const void*>(part.x), p.b, &beta, reinterpret_cast<const void*>(part.cin),
                           p.c, reinterpret_cast<void*>(part.d), p.c, &p.algo, reinterpret_cast<void*>(workspace),
                           workspace_bytes, static_cast<cudaStream_t>(stream)),
          "matmul " + std::to_string(c.M) + "x" + std::to_string(c.K) + "x" + std::to_string(c.N));
  }

  // D (rows x M, column-major, ld N) = A (a panel: rows x K, ld panel) * B (x^T: K x M, ld K).
  // false: no algorithm for it (an unusual shape or alignment); a failing call throws.
  bool make_plan(Plan& p, const GemmCall& c, const Part& part) {
    const int rows = part.rows, batch = part.batch;
    const cudaDataType in = c.bf16 ? CUDA_R_16BF : CUDA_R_32F;
    const cublasComputeType_t compute = !c.bf16 && tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
    try {
      check(l.cublasLtMatmulDescCreate(&p.op, compute, CUDA_R_32F), "matmul descriptor");
      set(p.op, CUBLASLT_MATMUL_DESC_TRANSA, int32_t(CUBLAS_OP_N));
      set(p.op, CUBLASLT_MATMUL_DESC_TRANSB, int32_t(CUBLAS_OP_N));
      cublasLtEpilogue_t e = CUBLASLT_EPILOGUE_BIAS;
      if (c.epilogue == GemmEpilogue::BiasRelu) e = CUBLASLT_EPILOGUE_RELU_BIAS;
      if (c.epilogue == GemmEpilogue::BiasGeluTanh) e = CUBLASLT_EPILOGUE_GELU_BIAS;
      set(p.op, CUBLASLT_MATMUL_DESC_EPILOGUE, uint32_t(e));
      set(p.op, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, int32_t(CUDA_R_32F));
      set(p.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, part.bias);  // the heuristic reads its alignment
      if (batch > 1) set(p.op, CUBLASLT_MATMUL_DESC_BIAS_BATCH_STRIDE, int64_t(c.panel));
      p.a = layout(in, rows, c.K, c.panel, batch, int64_t(c.K) * c.panel);
      p.b = layout(in, c.K, c.M, c.K, batch, 0);
      p.c = layout(CUDA_R_32F, rows, c.M, c.N, batch, c.panel);
    } catch (const Error&) {
      destroy(p);
      throw;
    }
    cublasLtMatmulPreference_t pref = nullptr;
    check(l.cublasLtMatmulPreferenceCreate(&pref), "preference");
    auto pref_set = [&](cublasLtMatmulPreferenceAttributes_t attr, auto v) {
      return l.cublasLtMatmulPreferenceSetAttribute(pref, attr, &v, sizeof v);
    };
    const auto& k = part.key;
    cublasStatus_t s = pref_set(CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, uint64_t(workspace_bytes));
    for (auto [attr, bytes] : {std::pair{CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, std::get<8>(k)},
                               std::pair{CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, std::get<9>(k)},
                               std::pair{CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, std::get<10>(k)},
                               std::pair{CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, std::get<10>(k)}})
      if (s == CUBLAS_STATUS_SUCCESS) s = pref_set(attr, bytes);
    cublasLtMatmulHeuristicResult_t result{};
    int found = 0;
    if (s == CUBLAS_STATUS_SUCCESS)
      s = l.cublasLtMatmulAlgoGetHeuristic(handle, p.op, p.a, p.b, p.c, p.c, pref, 1, &result, &found);
    l.cublasLtMatmulPreferenceDestroy(pref);
    if (s == CUBLAS_STATUS_NOT_SUPPORTED || (s == CUBLAS_STATUS_SUCCESS && found == 0)) return false;
    if (s != CUBLAS_STATUS_SUCCESS) {
      destroy(p);
      check(s, "heuristic");
    }
    p.algo = result.algo;
    return true;
  }
  void destroy(Plan& p) {
    if (p.a) l.cublasLtMatrixLayoutDestroy(p.a);
    if (p.b) l.cublasLtMatrixLayoutDestroy(p.b);
    if (p.c) l.cublasLtMatrixLayoutDestroy(p.c);
    if (p.op) l.cublasLtMatmulDescDestroy(p.op);
    p = Plan{};
  }

  ~Impl() {
    try {
      Scope s(*this, /*create=*/false);
      for (auto& [key, p] : plans) destroy(p);
      if (workspace) l.mem_free(workspace);
      if (handle) l.cublasLtDestroy(handle);
    } catch (const Error&) {  // no context left at exit: nothing to free
    }
  }
};

GpuBlas::GpuBlas(std::unique_ptr<Impl> impl) : impl_(std::move(impl)), policy_(gemm_policy_from_env()) {}
GpuBlas::~GpuBlas() = default;

std::unique_ptr<GpuBlas> GpuBlas::open(const CudaHooks& hooks, bool tf32, std::string* why) {
  const Lib& l = lib();
  if (!l.error.empty()) {
    *why = l.error;
    return nullptr;
  }
  if (const size_t v = l.cublasLtGetVersion(); v / 10000 != CUBLAS_VER_MAJOR) {
    *why = "the loaded libcublasLt is version " + std::to_string(v) + ", this halformer was built for major version " +
           std::to_string(CUBLAS_VER_MAJOR);
    return nullptr;
  }
  auto impl = std::make_unique<Impl>(l, hooks, tf32);
  try {
    Impl::Scope s(*impl);
    impl->check(l.cublasLtCreate(&impl->handle), "create");
    if (l.mem_alloc(&impl->workspace, impl->workspace_bytes) != CUDA_SUCCESS) throw Error("cuBLASLt: workspace allocation failed");
  } catch (const Error& e) {
    *why = e.what();
    return nullptr;
  }
  return std::unique_ptr<GpuBlas>(new GpuBlas(std::move(impl)));
}

bool GpuBlas::prepare(const GemmCall& c) {
  std::lock_guard<std::mutex> guard(impl_->lock);
  Impl::Scope scope(*impl_);
  for (const Impl::Part& p : impl_->parts(c))
    if (!impl_->plan(c, p)) return false;
  return true;
}

void GpuBlas::matmul(const GemmCall& c) {
  std::lock_guard<std::mutex> guard(impl_->lock);
  Impl::Scope scope(*impl_);
  // Halide's stream now (an application may set its own stream handler after load).
  if (impl_->hooks.get_stream(nullptr, scope.ctx, &impl_->stream) != 0) throw Error("cuBLASLt: no stream from Halide's runtime");
  for (const Impl::Part& p : impl_->parts(c)) {
    const Impl::Plan* plan = impl_->plan(c, p);
    if (!plan) throw Error("internal: cuBLASLt matmul without a plan (prepare first)");
    impl_->execute(c, p, *plan);
  }
}

#endif

}  // namespace halformer
