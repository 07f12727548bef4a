// Stack assembly: embeddings, encoder and decoder layers, head and greedy decoding,
// each step a call into an ahead-of-time compiled Halide pipeline from the
// KernelTable. Activations are row-major [B][T][C] (Halide x(c, t, b), or x(c, m) with
// m = b*T + t); kernels read and write them through non-owning buffer views, which is
// also how the KV cache is addressed (strided rows of a [B][T_max][3d] buffer).
#include "halformer/model.h"

#include <HalideBuffer.h>
#include <HalideRuntime.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <exception>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "cpu_features.h"
#include "halformer/error.h"
#include "halformer/packed_layout.h"
#include "halformer/weights.h"

namespace halformer {

// One Halide buffer per weight tensor for the model's lifetime: on a GPU device the
// first kernel that reads it copies it over once, and later calls find it there.
struct WeightBuffers {
  std::mutex lock;
  std::map<std::pair<const float*, int>, std::unique_ptr<Halide::Runtime::Buffer<float>>> bufs;
  template <typename T>
  using Views = std::map<const T*, std::unique_ptr<Halide::Runtime::Buffer<void>>>;
  Views<int8_t> int8_bufs;
  Views<uint16_t> bf16_bufs;
  // A float input a kernel does not read where the real tensor has another type (an
  // int8 embedding table standing in for absent learned positions).
  const WeightVector<float> stand_in = WeightVector<float>(1, 0.0f);
  // The tensor v as (inner, rows) -- a 1-D vector when rows == 0 (biases, norms; a table
  // of one row stays 2-D) -- or, with panel > 0, as the packed linear weight of `rows`
  // output features (panel, inner, panels).
  halide_buffer_t* get(const WeightVector<float>& v, int inner, int rows, int panel = 0) {
    std::lock_guard<std::mutex> guard(lock);
    auto& b = bufs[{v.data(), rows}];
    if (!b) {
      halide_dimension_t dims[3] = {{0, inner, 1}, {0, rows, inner}, {0, 0, 0}};
      if (panel > 0)
        dims[0] = {0, panel, 1}, dims[1] = {0, inner, panel}, dims[2] = {0, panel_count(rows, panel), panel * inner};
      b = std::make_unique<Halide::Runtime::Buffer<float>>(const_cast<float*>(v.data()),
                                                           panel > 0 ? 3 : rows > 0 ? 2 : 1, dims);
      b->set_host_dirty();
    }
    return b->raw_buffer();
  }
  // An int8 linear's weights (G, kInt8Panel, groups * panels), G its k group; CPU only.
  halide_buffer_t* get_int8(const LinearWeights& w) {
    const int G = w.int8_group, rows = int8_groups(w.in, G) * int8_panel_count(w.out);
    return view(int8_bufs, w.q, {{0, G, 1}, {0, kInt8Panel, G}, {0, rows, G * kInt8Panel}});
  }
  // An int8 embedding table: rows of d int8 values and their 4-byte scale, (d + 4, vocab).
  halide_buffer_t* get_int8_table(const WeightVector<int8_t>& q, int d, int vocab) {
    const int stride = d + kInt8RowScaleBytes;
    return view(int8_bufs, q, {{0, stride, 1}, {0, vocab, stride}});
  }
  // A bf16 linear's weights, as bf16_weight_shape and bf16_weight_type.
  halide_buffer_t* get_bf16(const LinearWeights& w) {
    const Bf16WeightShape s = bf16_weight_shape(w.in, w.out, w.panel, w.bf16_pairs);
    return view(bf16_bufs, w.h, {{0, s.pair, 1}, {0, s.panel, s.pair}, {0, s.rows(), s.pair * s.panel}},
                bf16_weight_type(w.bf16_pairs));
  }
  // The buffer over v's data with `dims`, made on first use; `type`: the element type the
  // kernel reads, where not T's (paired bf16 weights: bfloat16).
  template <typename T>
  halide_buffer_t* view(Views<T>& views, const WeightVector<T>& v, std::vector<halide_dimension_t> dims,
                        halide_type_t type = halide_type_of<T>()) {
    std::lock_guard<std::mutex> guard(lock);
    auto& b = views[v.data()];
    if (!b) {
      b = std::make_unique<Halide::Runtime::Buffer<void>>(type, const_cast<T*>(v.data()), int(dims.size()),
                                                           dims.data());
      b->set_host_dirty();
    }
    return b->raw_buffer();
  }
};

// The device a Model runs on: its Halide device interface (null on the CPU, found by
// the probe kernel Model::load runs) and what the runtime has copied to and from it.
struct DeviceState {
  const halide_device_interface_t* iface = nullptr;
  TransferStats stats;
};

namespace {

using Buf = Halide::Runtime::Buffer<float>;
using IBuf = Halide::Runtime::Buffer<int32_t>;
constexpr float kMasked = -1e30f;  // additive mask for padded keys (see attention.cpp)
// Kernel arguments that start inside an activation (KV-cache rows) become OpenCL
// sub-buffers, whose offset must be a multiple of CL_DEVICE_MEM_BASE_ADDR_ALIGN (128
// bytes on PoCL, up to 512 on GPUs); on a GPU device such rows are padded to this.
constexpr int64_t kDeviceAlignFloats = 128;


double now_ms() {
  using namespace std::chrono;
  return duration<double, std::milli>(steady_clock::now().time_since_epoch()).count();
}

// HALFORMER_PROFILE=1: time every kernel call, print a per-kernel table at exit.
// On a GPU device, host<->device copies show up as "upload" / "download" and
// device-to-device copies as "device_copy".
struct Profile {
  std::mutex lock;
  std::map<std::string, std::pair<double, long>> total;  // name -> (ms, calls)
  ~Profile() {
    std::vector<std::pair<double, std::string>> rows;
    double sum = 0;
    for (auto& [name, t] : total) rows.push_back({t.first, name}), sum += t.first;
    std::sort(rows.rbegin(), rows.rend());
    std::fprintf(stderr, "%-24s %10s %8s %6s\n", "kernel", "total ms", "calls", "share");
    for (auto& [ms, name] : rows)
      std::fprintf(stderr, "%-24s %10.2f %8ld %5.1f%%\n", name.c_str(), ms, total[name].second, 100 * ms / sum);
  }
};
Profile* profile() {
  static std::unique_ptr<Profile> p(std::getenv("HALFORMER_PROFILE") ? new Profile : nullptr);
  return p.get();
}
// GPU launches return before the kernel ends: when profiling on a device, wait for it
// (through a one-element device buffer, as Halide syncs per buffer) so that each row
// of the table is that kernel's own time, not the launch's.
void sync_device_for_profile(const halide_device_interface_t* iface) {
  if (!iface) return;
  // Never freed: a destructor at process exit could outlive the device context.
  static thread_local Halide::Runtime::Buffer<float>* probe = nullptr;
  if (!probe || probe->raw_buffer()->device_interface != iface) {
    probe = new Halide::Runtime::Buffer<float>(1);
    if (probe->device_malloc(iface) != 0) return;
  }
  probe->device_sync();
}
struct KernelTimer {
  const char* name;
  const halide_device_interface_t* iface;
  double t0;
  KernelTimer(const char* n, const halide_device_interface_t* i)
      : name(n), iface(i), t0(profile() ? (sync_device_for_profile(i), now_ms()) : 0) {}
  ~KernelTimer() {
    if (Profile* p = profile()) {
      sync_device_for_profile(iface);
      std::lock_guard<std::mutex> guard(p->lock);  // calls may run on several threads
      auto& e = p->total[name];
      e.first += now_ms() - t0;
      e.second += 1;
    }
  }
};

// Halide's default error handler prints and aborts; ours keeps the message so that a
// failing kernel (e.g. no CUDA driver) becomes an Error with the runtime's own words.
thread_local std::string g_halide_error;
void record_halide_error(void*, const char* msg) { g_halide_error += msg; }
struct InstallErrorHandler {
  InstallErrorHandler() { halide_set_error_handler(record_halide_error); }
} g_install_error_handler;

void run(int status, const char* what) {
  if (status != 0) {
    std::string msg = g_halide_error;
    g_halide_error.clear();
    while (!msg.empty() && (msg.back() == '\n' || msg.back() == ' ')) msg.pop_back();
    throw Error(std::string("kernel '") + what + "' failed (Halide error " + std::to_string(status) +
                (msg.empty() ? "" : ": " + msg) + ")");
  }
  g_halide_error.clear();
}

// body(i) for i in [0, n) on Halide's thread pool (so within the calling model's thread
// limit). An exception thrown by body is rethrown once all have run: the one of the
// lowest i, the error the sequential loop would have met first.
template <typename Body>
void parallel_for(int n, const char* what, const Body& body) {
  struct Job {
    const Body* body;
    std::vector<std::exception_ptr> errors;
  } job{&body, std::vector<std::exception_ptr>(size_t(std::max(n, 0)))};
  auto task = [](void*, int i, uint8_t* closure) -> int {
    auto& j = *reinterpret_cast<Job*>(closure);
    try {
      (*j.body)(i);
    } catch (...) {
      j.errors[size_t(i)] = std::current_exception();
    }
    return 0;
  };
  run(halide_do_par_for(nullptr, task, 0, n, reinterpret_cast<uint8_t*>(&job)), what);
  for (const auto& e : job.errors)
    if (e) std::rethrow_exception(e);
}

struct View;

// Host activations are taken from a cache of freed blocks of the same size (a layer's
// buffers repeat in every layer and every call). Fresh blocks this large come from the
// kernel (mmap), whose first touch of each page faults and zeroes it: a batch of 8
// prompts of 128 tokens through GPT-2 small allocates ~30 MB per layer: its prompt took
// 1202 ms with fresh pages, 1087 ms with this cache. Up to kMaxCachedBytes stay cached
// (transformer-base int8's peak resident memory did not grow: 164-171 MiB).
class HostBlockCache {
 public:
  static HostBlockCache& instance() {
    static HostBlockCache* cache = new HostBlockCache;  // never destroyed: blocks may outlive statics
    return *cache;
  }
  std::shared_ptr<float> take(size_t floats) {
    const size_t bytes = floats * sizeof(float);
    float* p = nullptr;
    {
      std::lock_guard<std::mutex> guard(lock_);
      if (auto it = free_.find(bytes); it != free_.end()) {
        p = it->second;
        free_.erase(it);
        cached_ -= bytes;
      }
    }
    if (!p) p = CacheLineAllocator<float>().allocate(floats);
    return std::shared_ptr<float>(p, [this, bytes](float* q) { give(q, bytes); });
  }

 private:
  static constexpr size_t kMaxCachedBytes = size_t(128) << 20;
  void give(float* p, size_t bytes) {
    {
      std::lock_guard<std::mutex> guard(lock_);
      if (cached_ + bytes <= kMaxCachedBytes) {
        free_.emplace(bytes, p);
        cached_ += bytes;
        return;
      }
    }
    CacheLineAllocator<float>().deallocate(p, bytes / sizeof(float));
  }
  std::mutex lock_;
  std::multimap<size_t, float*> free_;
  size_t cached_ = 0;
};

// An activation [B][T][C] (or, for the KV cache, [B][T][C] rows of which a prefix of
// each is used). It owns one 1-D buffer of C*T*B floats: host memory on the CPU
// (zeroed, as before), device memory only on a GPU device -- no host allocation at
// all, so a host round trip of an intermediate cannot happen silently.
// bf16: elements of 2 bytes (bf16 bits), host only -- the attention caches of a
// reduced-precision model (ModelConfig::cross_kv_bf16, self_cache_bf16), which kernels
// alone read and write (and copy_elems copies).
struct Act {
  int C = 0, T = 0, B = 0;
  bool bf16 = false;
  // Stored head by head ([B][C / hd heads][T][hd] instead of [B][T][C]): a CPU
  // cross-attention cache (Model::cross_kv); only heads(hd) views it.
  int head_major_hd = 0;
  std::shared_ptr<float> host_block;  // CPU: the storage `mem` views (HostBlockCache)
  Buf mem;
  const halide_device_interface_t* iface = nullptr;  // the device it lives on (null: host)
  Act() = default;
  // zeroed = false: host memory left as it is (every element about to be written).
  Act(int c, int t, int b, const halide_device_interface_t* device, bool bf16_elems = false, bool zeroed = true)
      : C(c), T(t), B(b), bf16(bf16_elems), iface(device) {
    const int64_t n = size();
    if (n == 0) return;
    if (!iface) {
      const int64_t floats = bf16 ? (n + 1) / 2 : n;
      host_block = HostBlockCache::instance().take(size_t(floats));
      mem = Buf(host_block.get(), int(floats));
      if (zeroed) std::memset(mem.data(), 0, size_t(floats) * sizeof(float));
      return;
    }
    if (bf16) throw Error("internal: bf16 activations live on the host");
    mem = Buf(static_cast<float*>(nullptr), int(n));
    run(mem.device_malloc(iface), "device allocation");
  }
  Act(Act&&) = default;
  Act& operator=(Act&&) = default;
  Act(const Act&) = delete;  // copies share storage: copy explicitly (copy_elems)
  Act& operator=(const Act&) = delete;
  int64_t size() const { return int64_t(C) * T * B; }
  // Host memory: the CPU only.
  float* host() const {
    if (iface) throw Error("internal: host access to a device-resident activation");
    if (bf16) throw Error("internal: float access to a bf16 activation");
    return const_cast<Buf&>(mem).data();
  }
  uint16_t* bits() const {  // a bf16 activation's elements
    if (!bf16) throw Error("internal: bf16 access to a float activation");
    return reinterpret_cast<uint16_t*>(const_cast<Buf&>(mem).data());
  }
  View flat() const;
  View heads(int hd) const;
};

// A kernel argument over an activation: `dims` from element `offset`. On the CPU a
// plain host view. On a GPU device the view shares the activation's device memory:
// `keep` holds the allocation (or a device crop of it starting at `offset`), `buf`
// has the wanted shape on the same device handle, with no host memory and clean
// dirty bits, so Halide neither copies it in nor out.
struct View {
  Buf keep;
  Halide::Runtime::Buffer<void> buf;
  halide_buffer_t* raw() { return buf.raw_buffer(); }
};

// kernel_arg: the view is passed to a kernel, where OpenCL makes a sub-buffer of it
// (offset must be aligned); views only copied between need no alignment.
View make_view(const Act& a, int64_t offset, int dims, const halide_dimension_t* d, bool kernel_arg = true) {
  if (a.bf16) return View{Buf(), Halide::Runtime::Buffer<void>(halide_type_of<uint16_t>(), a.bits() + offset, dims, d)};
  if (!a.iface) return View{Buf(), Buf(a.host() + offset, dims, d)};
  int64_t span = 1;
  for (int i = 0; i < dims; ++i) span += int64_t(d[i].extent - 1) * d[i].stride;
  if (offset < 0 || offset + span > a.size())
    throw Error("internal: device view [" + std::to_string(offset) + ", " + std::to_string(offset + span) +
                ") outside an activation of " + std::to_string(a.size()) + " floats");
  View v;
  if (offset == 0) {
    v.keep = a.mem;
  } else {
    if (kernel_arg && offset % kDeviceAlignFloats != 0)
      throw Error("internal: device view at float offset " + std::to_string(offset) + " is not aligned to " +
                  std::to_string(kDeviceAlignFloats * sizeof(float)) + " bytes");
    v.keep = a.mem.cropped(0, int(offset), int(span));
    if (!v.keep.raw_buffer()->device) {
      std::string msg = g_halide_error;
      g_halide_error.clear();
      throw Error("device crop failed" + (msg.empty() ? "" : ": " + msg));
    }
  }
  halide_buffer_t h{};
  h.type = halide_type_of<float>();
  h.dimensions = dims;
  h.dim = const_cast<halide_dimension_t*>(d);
  h.device = v.keep.raw_buffer()->device;
  h.device_interface = v.keep.raw_buffer()->device_interface;
  v.buf = Buf(h, Halide::Runtime::BufferDeviceOwnership::Unmanaged);
  return v;
}
// (c, rows) with rows `row_stride` apart.
View view2(const Act& a, int64_t offset, int c, int rows, int64_t row_stride) {
  halide_dimension_t dims[2] = {{0, c, 1}, {0, rows, int32_t(row_stride)}};
  return make_view(a, offset, 2, dims);
}
// (d, head, t, b) view of rows holding `nh` heads of `hd` features each (heads `h_stride`
// apart: 0, next to each other in a row).
View view4(const Act& a, int64_t offset, int hd, int nh, int t, int b, int64_t t_stride, int64_t b_stride,
           int64_t h_stride = 0) {
  halide_dimension_t dims[4] = {
      {0, hd, 1}, {0, nh, int32_t(h_stride ? h_stride : hd)}, {0, t, int32_t(t_stride)}, {0, b, int32_t(b_stride)}};
  return make_view(a, offset, 4, dims);
}
View Act::flat() const {
  if (head_major_hd) throw Error("internal: a row view of a head-major activation");
  return view2(*this, 0, C, T * B, C);
}
View Act::heads(int hd) const {
  if (!head_major_hd) return view4(*this, 0, hd, C / hd, T, B, C, int64_t(C) * T);
  if (hd != head_major_hd) throw Error("internal: a head-major activation viewed with another head size");
  return view4(*this, 0, hd, C / hd, T, B, hd, int64_t(C) * T, int64_t(T) * hd);
}

}  // namespace

// One call into a Model: its config, kernels, weight buffers and device, passed to
// every step explicitly (a Model is a value: nothing about it lives in globals).
struct Session {
  const ModelConfig& cfg;
  const KernelTable& kt;
  WeightBuffers& wbufs;
  const halide_device_interface_t* iface;  // null on the CPU
  TransferStats& stats;

  // A weight tensor's buffer (see WeightBuffers::get). On a GPU device its first use uploads it (once per model).
  halide_buffer_t* weight(const WeightVector<float>& v, int inner, int rows, int panel = 0) {
    return uploaded(wbufs.get(v, inner, rows, panel));
  }
  halide_buffer_t* uploaded(halide_buffer_t* b) {
    if (iface && b->host_dirty()) {
      KernelTimer timer("upload", iface);
      run(halide_copy_to_device(nullptr, b, iface), "weight upload");
      stats.weight_uploads += 1;
      stats.weight_upload_bytes += int64_t(b->size_in_bytes());
    }
    return b;
  }

  // A host input (token ids) sent to the device; a no-op on the CPU.
  void upload(const IBuf& b) {
    if (!iface) return;
    KernelTimer timer("upload", iface);
    IBuf& m = const_cast<IBuf&>(b);
    m.set_host_dirty();
    run(m.copy_to_device(iface), "upload");
    stats.uploads += 1;
    stats.upload_bytes += int64_t(m.size_in_bytes());
  }

  // dst[dp, dp + n) = src[sp, sp + n): a host copy on the CPU, device to device on a GPU.
  void copy_elems(const Act& src, int64_t sp, Act& dst, int64_t dp, int64_t n) {
    if (src.bf16 != dst.bf16) throw Error("internal: a copy between bf16 and fp32 activations");
    if (src.bf16) {
      std::copy_n(src.bits() + sp, n, dst.bits() + dp);
      return;
    }
    if (!iface) {
      std::copy_n(src.host() + sp, n, dst.host() + dp);
      return;
    }
    KernelTimer timer("device_copy", iface);
    halide_dimension_t d[1] = {{0, int32_t(n), 1}};
    View s = make_view(src, sp, 1, d, false), t = make_view(dst, dp, 1, d, false);
    run(halide_buffer_copy(nullptr, s.raw(), iface, t.raw()), "device_copy");
    stats.device_copies += 1;
  }

  // `rows` runs of n elements: src at sp + i * src_stride, dst at dp + i * dst_stride (on a
  // device one strided copy).
  void copy_rows(const Act& src, int64_t sp, int64_t src_stride, Act& dst, int64_t dp, int64_t dst_stride, int n,
                 int rows) {
    if (src_stride == n && dst_stride == n) return copy_elems(src, sp, dst, dp, int64_t(n) * rows);
    if (!iface || src.bf16) {
      for (int i = 0; i < rows; ++i) copy_elems(src, sp + i * src_stride, dst, dp + i * dst_stride, n);
      return;
    }
    KernelTimer timer("device_copy", iface);
    halide_dimension_t ds[2] = {{0, n, 1}, {0, rows, int32_t(src_stride)}};
    halide_dimension_t dd[2] = {{0, n, 1}, {0, rows, int32_t(dst_stride)}};
    View s = make_view(src, sp, 2, ds, false), t = make_view(dst, dp, 2, dd, false);
    run(halide_buffer_copy(nullptr, s.raw(), iface, t.raw()), "device_copy");
    stats.device_copies += 1;
  }

  // An input activation written by host code (`fill` gets C*T*B floats to write): on
  // the CPU straight into the activation, on a GPU device into host memory, then uploaded.
  template <typename F>
  Act make_input(int c, int t, int b, F fill) {
    Act a(c, t, b, iface);
    if (!iface) {
      fill(a.host());
      return a;
    }
    std::vector<float> h(size_t(a.size()));
    fill(h.data());
    KernelTimer timer("upload", iface);
    Buf hb(h.data(), int(h.size()));
    hb.set_host_dirty();
    halide_dimension_t d[1] = {{0, int32_t(a.size()), 1}};
    View v = make_view(a, 0, 1, d);
    run(halide_buffer_copy(nullptr, hb.raw_buffer(), iface, v.raw()), "upload");
    stats.uploads += 1;
    stats.upload_bytes += a.size() * int64_t(sizeof(float));
    return a;
  }

  // Elements [off, off + n) of an activation on the host: a copy on the CPU, a download
  // (counted) on a GPU device.
  std::vector<float> to_host(const Act& a, int64_t off, int64_t n) {
    if (!iface) return std::vector<float>(a.host() + off, a.host() + off + n);
    KernelTimer timer("download", iface);
    std::vector<float> h(static_cast<size_t>(n));
    Buf hb(h.data(), int(n));
    halide_dimension_t d[1] = {{0, int32_t(n), 1}};
    View v = make_view(a, off, 1, d, false);
    run(halide_buffer_copy(nullptr, v.raw(), nullptr, hb.raw_buffer()), "download");
    stats.downloads += 1;
    stats.download_bytes += n * int64_t(sizeof(float));
    return h;
  }
  std::vector<float> to_host(const Act& a) { return to_host(a, 0, a.size()); }

  // A kernel's small integer output (argmax ids) read by host code.
  void download(IBuf& b, const char* what) {
    if (!iface) return;
    KernelTimer timer("download", iface);
    if (b.copy_to_host() != 0)
      throw Error(std::string("kernel '") + what + "': copying the result from the device failed");
    stats.downloads += 1;
    stats.download_bytes += int64_t(b.size_in_bytes());
  }

  // ---- one call per layer kind
  // A linear's weight and bias arguments: fp32 packed and [N], or (int8 kernels, whose
  // signature is the same) int8 packed and (N, 2) = bias | per-channel scale (quads: (N, 3),
  // + channel sums), or (bf16) bf16 packed and [N].
  std::pair<halide_buffer_t*, halide_buffer_t*> linear_args(const LinearWeights& w) {
    if (w.int8()) return {wbufs.get_int8(w), weight(w.b, w.out, int8_bias_columns(w.int8_group))};
    if (w.bf16()) return {uploaded(wbufs.get_bf16(w)), weight(w.b, w.out, 0)};
    return {weight(w.w, w.in, w.out, w.panel), weight(w.b, w.out, 0)};
  }
  void linear(LinearFn fn, const char* name, View x, const LinearWeights& w, View out) {
    auto [wb, bb] = linear_args(w);
    KernelTimer timer(name, iface);
    run(fn(x.raw(), wb, bb, out.raw()), name);
  }
  void linear_residual(LinearResidualFn fn, const char* name, View x, const LinearWeights& w, View residual,
                       View out) {
    auto [wb, bb] = linear_args(w);
    KernelTimer timer(name, iface);
    run(fn(x.raw(), wb, bb, residual.raw(), out.raw()), name);
  }
  // fn: the norm kernel of n's width (kt.layer_norm: d_model).
  void layer_norm(const Act& x, const NormWeights& n, Act& out, LayerNormFn fn = nullptr) {
    const int d = int(n.gamma.size());
    halide_buffer_t *gb = weight(n.gamma, d, 0), *bb = weight(n.beta, d, 0);
    KernelTimer timer("layer_norm", iface);
    View xb = x.flat(), ob = out.flat();
    run((fn ? fn : kt.layer_norm)(xb.raw(), gb, bb, ob.raw()), "layer_norm");
  }
  // bias: a stack's relative position table (position_bias below).
  void attention(AttentionFn fn, const char* name, View q, View kv, View mask, halide_buffer_t* bias, View out) {
    KernelTimer timer(name, iface);
    run(fn(q.raw(), kv.raw(), mask.raw(), bias, out.raw()), name);
  }
  // The decoder's self-attention of T new positions after `len` earlier ones. `kv` holds the fused
  // QKV rows (qkv_width() features) of positions [0, len + T) of B sequences,
  // `t_stride` floats apart, `b_stride` per sequence; the queries are positions
  // [len, len + T). mask: (len + T, B), `m_stride` per sequence; out: (d, T, B).
  // Causal, on the CPU, the queries go in chunks of kCausalChunk, each reading only the keys
  // it can see, [0, len + q1): a 128-token prompt scores 5/8 of the full square. Bit-identical
  // to one call: a key left out has weight exactly 0 (its masked score's exp underflows) and
  // lies past every key the chunk reads, so every sum sees the same terms in the same order.
  // No chunk holds a single query (Tq = 1 is the kernel's other path, summed differently).
  // 32 = whole key blocks on AVX2 and AVX-512. GPT-2 small, 128-token prompts, 2-core Zen 3,
  // self-attention per layer: batch 8 5.5-6.9 -> 4.4-4.8 ms, batch 1 0.74-0.81 -> 0.53-0.55
  // ms (chunks of 8, 16, 24, 48, 64: all slower than 32).
  static constexpr int kCausalChunk = 32;
  void decoder_self_attention(const Act& kv, int len, int T, int B, int64_t t_stride, int64_t b_stride,
                              const Act& mask, int64_t m_stride, halide_buffer_t* bias, Act& out) {
    const int d = cfg.d_model, hd = d / cfg.heads, heads = qkv_width() / hd;
    const int chunk = iface || !cfg.causal ? T : kCausalChunk;  // device views must start aligned: one call
    for (int q0 = 0, q1; q0 < T; q0 = q1) {
      q1 = std::min(T, q0 + chunk);
      if (T - q1 == 1) q1 = T;
      attention(kt.decoder_self_attention, "decoder_self_attention",
                view4(kv, (len + q0) * t_stride, hd, heads, q1 - q0, B, t_stride, b_stride),
                view4(kv, 0, hd, heads, len + q1, B, t_stride, b_stride), view2(mask, 0, len + q1, B, m_stride),
                bias, view4(out, int64_t(q0) * d, hd, d / hd, q1 - q0, B, d, int64_t(d) * T));
    }
  }
  // The (2 * relative_table_distance + 1, heads) table of a stack's self-attention (T5), or for
  // every other attention call a 1 x 1 stand-in that its kernel does not read.
  halide_buffer_t* position_bias(const WeightVector<float>& table) {
    static const WeightVector<float> unread(1, 0.0f);
    if (table.empty()) return weight(unread, 1, 1);
    return weight(table, 2 * relative_table_distance(cfg.relative_distance, cfg.max_len) + 1, cfg.heads);
  }

  // Validates ids and lengths, then right-pads with pad_id into a (T, B) buffer.
  IBuf pad_batch(const std::vector<Sequence>& seqs, int vocab, const std::string& what) {
    if (seqs.empty()) throw Error(what + ": empty batch (need at least one sequence)");
    size_t T = 0;
    for (size_t i = 0; i < seqs.size(); ++i) {
      const auto& s = seqs[i];
      std::string where = what + " sequence " + std::to_string(i + 1);
      if (s.empty()) throw Error(where + " is empty");
      if (int64_t(s.size()) > cfg.max_len)
        throw Error(where + " has " + std::to_string(s.size()) + " tokens; the model's max_len is " +
                    std::to_string(cfg.max_len));
      for (size_t j = 0; j < s.size(); ++j)
        if (s[j] < 0 || s[j] >= vocab)
          throw Error(where + ", token " + std::to_string(j + 1) + ": id " + std::to_string(s[j]) +
                      " is outside the vocabulary [0, " + std::to_string(vocab) + ")");
      T = std::max(T, s.size());
    }
    IBuf tokens(int(T), int(seqs.size()));
    tokens.fill(cfg.pad_id);
    for (size_t b = 0; b < seqs.size(); ++b)
      for (size_t t = 0; t < seqs[b].size(); ++t) tokens(int(t), int(b)) = seqs[b][t];
    return tokens;
  }

  // Additive key mask (T, B): 0 for a real token, kMasked for the padding pad_batch added
  // (when the spec masks). Padding is known by length, not by id: a pad id the caller put
  // inside a sequence (e.g. a literal "[PAD]" in text) is an ordinary token, as with a
  // tokenizer's attention mask; for right-padded batches that is the same as `== pad`.
  Act key_mask(const std::vector<Sequence>& seqs, int T) {
    return make_input(T, int(seqs.size()), 1, [&](float* m) {
      if (cfg.padding_mask)
        for (size_t b = 0; b < seqs.size(); ++b)
          for (int t = int(seqs[b].size()); t < T; ++t) m[b * T + t] = kMasked;
    });
  }

  // Embedding (+ positions, + token types), then the embedding LayerNorm if any: the
  // encoder's (source table, token types) or, with `tgt`, the decoder's. Source tables of
  // embedding_size != d_model (ELECTRA-small) are normed at their width, then projected.
  Act embed(EmbeddingFn fn, const IBuf& tokens, bool tgt, const Weights& w, int pos_offset) {
    Act x(embedding_width(tgt), tokens.dim(0).extent(), tokens.dim(1).extent(), iface);
    embed_into(fn, tokens, tgt, w, pos_offset, x, 0);
    x = embedding_norm(std::move(x), w, tgt);
    if (x.C == cfg.d_model) return x;
    Act y(cfg.d_model, x.T, x.B, iface);
    linear(kt.embed_project, "embed_project", x.flat(), w.embed_project, y.flat());
    return y;
  }
  int embedding_width(bool tgt) const { return tgt ? cfg.d_model : cfg.embedding_size; }

  // Decoder rows at their own positions (a batch of left-aligned prompts of different
  // lengths): one new token per row, row b at position pos[b].
  Act embed_rows(EmbeddingFn fn, const IBuf& tokens, const Weights& w, const std::vector<int>& pos) {
    const int d = cfg.d_model, B = tokens.dim(1).extent();
    Act x(d, 1, B, iface);
    Act row = iface ? Act(d, 1, 1, iface) : Act();  // a kernel argument on a device must start aligned
    for (int b = 0; b < B; ++b) {
      IBuf one(1, 1);
      one(0, 0) = tokens(0, b);
      if (!iface) {
        embed_into(fn, one, true, w, pos[b], x, int64_t(b) * d);
        continue;
      }
      embed_into(fn, one, true, w, pos[b], row, 0);
      copy_elems(row, 0, x, int64_t(b) * d, d);
    }
    return embedding_norm(std::move(x), w, true);
  }

  // The embedding kernel on tokens (T, B) into x's elements from `offset` (d, T, B).
  void embed_into(EmbeddingFn fn, const IBuf& tokens, bool tgt, const Weights& w, int pos_offset, Act& x,
                  int64_t offset) {
    const int d = embedding_width(tgt), T = tokens.dim(0).extent(), B = tokens.dim(1).extent();
    const EmbeddingTable& table = tgt ? w.tgt_table() : w.src_embedding;
    const int vocab = tgt ? cfg.tgt_vocab : cfg.src_vocab;
    const bool token_types = !tgt && cfg.type_vocab > 0;
    // An int8 table's rows carry their scale (generators/embedding.cpp, embedding_int8).
    halide_buffer_t* tb = table.int8() ? wbufs.get_int8_table(table.q, d, vocab) : weight(table.f, d, vocab);
    // Tables a kernel does not read (no learned positions / types) get a stand-in.
    halide_buffer_t* unread = table.int8() ? weight(wbufs.stand_in, 1, 1) : tb;
    // The decoder reads its own positions and norm where the weights have them (BART, Marian).
    const WeightVector<float>& positions = tgt && !w.tgt_positions.empty() ? w.tgt_positions : w.positions;
    halide_buffer_t* pb = positions.empty() ? unread : weight(positions, d, cfg.max_len);
    const bool types_read = token_types && !w.token_types.empty();
    halide_buffer_t* yb = types_read ? weight(w.token_types, d, cfg.type_vocab) : unread;
    IBuf types(T, B);
    types.fill(0);  // token type 0 for every token (single-segment inputs)
    halide_dimension_t dims[3] = {{0, d, 1}, {0, T, d}, {0, B, d * T}};
    View o3 = make_view(x, offset, 3, dims);
    upload(tokens);
    // The kernel reads type ids only with token types; otherwise (on a GPU, where an
    // upload would be wasted) the token ids stand in.
    if (token_types || !iface) upload(types);
    IBuf& tok = const_cast<IBuf&>(tokens);
    KernelTimer timer("embedding", iface);
    run(fn(tok.raw_buffer(), (token_types || !iface ? types : tok).raw_buffer(), tb, pb, yb, pos_offset, o3.raw()),
        "embedding");
  }

  Act embedding_norm(Act x, const Weights& w, bool tgt) {
    if (!cfg.embedding_norm) return x;
    Act y(x.C, x.T, x.B, iface);
    layer_norm(x, tgt && !w.tgt_embedding_norm.gamma.empty() ? w.tgt_embedding_norm : w.embedding_norm, y,
               x.C != cfg.d_model ? kt.embedding_norm : nullptr);
    return y;
  }

  // x <- norm(x + f(x)) (post-norm) or x <- x + f(norm(x)) (pre-norm); `sublayer` writes
  // f(input) + residual into its output buffer.
  // normed: the sublayer's input already normalised (parallel_residual: the layer's input).
  // last_row: only each sequence's last position goes on (the last layer of a prefill):
  // the sublayer gets every row as input, but the residual and its output are (C, 1, B),
  // and so is x after.
  template <typename F>
  void residual_block(Act& x, const NormWeights& n, F sublayer, const Act* normed = nullptr, bool last_row = false) {
    Act last = last_row ? last_positions(x) : Act();
    const Act& res = last_row ? last : x;
    Act y(x.C, res.T, x.B, iface);
    if (cfg.pre_norm && normed) {
      sublayer(*normed, res, y);
      x = std::move(y);
    } else if (cfg.pre_norm) {
      Act h(x.C, x.T, x.B, iface);
      layer_norm(x, n, h);
      sublayer(h, res, y);
      x = std::move(y);
    } else {
      sublayer(x, res, y);
      if (last_row) x = Act(y.C, y.T, y.B, iface);
      layer_norm(y, n, x);
    }
  }

  // parallel_residual: the feed-forward's input, LN2 of the layer's input, taken before the
  // attention changes x (empty otherwise); with last_row of each sequence's last row alone.
  Act parallel_input(const Act& x, const LayerWeights& L, bool last_row = false) {
    if (!cfg.parallel_residual) return Act();
    if (last_row) return parallel_input(last_positions(x), L);
    Act h(x.C, x.T, x.B, iface);
    layer_norm(x, L.ff_norm, h);
    return h;
  }

  void feed_forward(Act& x, const LayerWeights& L, const Act& parallel_in = Act()) {
    const Act* normed = cfg.parallel_residual ? &parallel_in : nullptr;
    residual_block(x, L.ff_norm, [&](const Act& h, const Act& res, Act& y) {
      Act mid(L.ff1.out, h.T, h.B, iface);
      if (cfg.gated_ff) {  // SwiGLU / GeGLU: mid = act(h W_gate) * (h W_up)
        Act gate(L.ff_gate.out, h.T, h.B, iface);
        linear(kt.ff1, "ff_gate", h.flat(), L.ff_gate, gate.flat());
        linear_residual(kt.ff_up, "ff_up", h.flat(), L.ff1, gate.flat(), mid.flat());
      } else {
        linear(kt.ff1, "ff1", h.flat(), L.ff1, mid.flat());
      }
      linear_residual(kt.ff2, "ff2", mid.flat(), L.ff2, res.flat(), y.flat());
    }, normed);
  }

  // Rotary or relative positions: applied inside self-attention, where each key's position
  // (its cache row) matters, not added to the embeddings.
  bool positions_in_attention() const {
    return cfg.positions == PositionKind::Rotary || cfg.positions == PositionKind::Relative;
  }

  // Features of a fused self-attention QKV row: H query heads and kv_heads key and value heads.
  int qkv_width() const { return cfg.d_model + 2 * cfg.kv_heads * (cfg.d_model / cfg.heads); }

  // The decoder's self-attention cache is bf16 (its kernels read and write bf16 rows).
  bool self_cache_bf16() const { return cfg.self_cache_bf16 && !iface; }

  // Self-attention over the whole sequence (no cache): encoder layers, teacher forcing.
  // decoder: the decoder's kernels, whose QKV rows are the cache's (bf16 with self_cache_bf16).
  // keep: given the QKV rows (W, T, B) before they are dropped (a prefill keeps them).
  using KeepQkv = std::function<void(const Act&)>;
  // last_row (decoder, sequences without padding): only each sequence's last position goes
  // on; x becomes (d, 1, B).
  void self_attention_block(Act& x, const LayerWeights& L, const Act& mask, halide_buffer_t* bias,
                            bool decoder = false, const KeepQkv& keep = nullptr, bool last_row = false) {
    const int d = cfg.d_model, hd = d / cfg.heads, W = qkv_width(), heads = W / hd;
    const bool bf16 = decoder && self_cache_bf16();
    residual_block(x, L.self_norm, [&](const Act& h, const Act& res, Act& y) {
      Act qkv(W, h.T, h.B, iface, bf16), a(d, y.T, h.B, iface);
      linear(bf16 ? kt.qkv_cache : kt.qkv, "qkv", h.flat(), L.qkv, qkv.flat());
      if (decoder && last_row) {
        // The last query against every key; its row copied out (a view of it would not
        // start aligned on a device).
        Act q = last_positions(qkv);
        attention(kt.decoder_self_attention, "decoder_self_attention", view4(q, 0, hd, heads, 1, h.B, W, W),
                  view4(qkv, 0, hd, heads, h.T, h.B, W, int64_t(W) * h.T), view2(mask, 0, h.T, h.B, h.T), bias,
                  a.heads(hd));
      } else if (decoder)
        decoder_self_attention(qkv, 0, h.T, h.B, W, int64_t(W) * h.T, mask, h.T, bias, a);
      else
        attention(kt.encoder_self_attention, "encoder_self_attention", qkv.heads(hd), qkv.heads(hd), mask.flat(), bias,
                  a.heads(hd));
      if (keep) keep(qkv);
      linear_residual(kt.attention_out, "attention_out", a.flat(), L.attn_out, res.flat(), y.flat());
    }, nullptr, last_row);
  }

  void final_norm(Act& x, const NormWeights& n) {
    if (!cfg.final_norm) return;
    Act y(x.C, x.T, x.B, iface);
    layer_norm(x, n, y);
    x = std::move(y);
  }

  Act run_encoder(const Weights& w, const IBuf& src, const Act& src_mask) {
    Act x = embed(kt.embed_src, src, false, w, 0);
    for (int l = 0; l < cfg.encoder_layers; ++l) {
      const auto& L = w.encoder[cfg.shared_layers ? 0 : l];
      Act ff_in = parallel_input(x, L);
      self_attention_block(x, L, src_mask, position_bias(w.encoder_position_bias));
      feed_forward(x, L, ff_in);
    }
    final_norm(x, w.encoder_norm);
    return x;
  }

  // Cross-attention keys/values of one decoder layer: computed once per source (bf16 bits
  // with cross_kv_bf16: half the bytes each decode step then reads).
  // On the CPU the result is stored head by head: a decode step's cross-attention then
  // reads each (sequence, head) as one contiguous run, which the hardware prefetchers
  // follow, instead of a short piece of every row (a new 4 KB page per key in fp32).
  // transformer-base at batch 8 (2-core Zen 3, HALFORMER_PROFILE): cross-attention per
  // call 0.19-0.21 -> 0.13 ms (bf16 cache), 0.27-0.29 -> 0.16-0.18 (fp32), for a reorder
  // of 0.22-0.25 / 0.94-0.97 ms per layer once per source.
  Act cross_kv(const LayerWeights& L, const Act& memory) {
    const bool bf16 = cfg.cross_kv_bf16 && !iface;
    Act kv(2 * cfg.d_model, memory.T, memory.B, iface, bf16);
    linear(kt.cross_kv, "cross_kv", memory.flat(), L.cross_kv, kv.flat());
    if (iface) return kv;
    KernelTimer timer("cross_kv_heads", iface);
    Act out(kv.C, kv.T, kv.B, nullptr, bf16, /*zeroed=*/false);
    out.head_major_hd = cfg.d_model / cfg.heads;
    // One sequence's rows into its head-major blocks, per task: the rows read in order (a
    // task per (sequence, head) read a piece of every row: 1.6x slower in fp32).
    const uint8_t* rows = reinterpret_cast<const uint8_t*>(kv.mem.data());
    uint8_t* heads = reinterpret_cast<uint8_t*>(out.mem.data());
    const int C = kv.C, T = kv.T, hd = out.head_major_hd;
    const size_t elem = bf16 ? sizeof(uint16_t) : sizeof(float), piece = size_t(hd) * elem, block = size_t(T) * piece;
    parallel_for(kv.B, "cross_kv_heads", [&](int b) {
      const uint8_t* src = rows + int64_t(b) * T * C * elem;
      uint8_t* dst = heads + int64_t(b) * T * C * elem;
      for (int t = 0; t < T; ++t)
        for (int h = 0; h < C / hd; ++h) std::memcpy(dst + h * block + t * piece, src + (int64_t(t) * C + h * hd) * elem, piece);
    });
    return out;
  }

  void cross_block(Act& x, const LayerWeights& L, const Act& kv, const Act& src_mask) {
    const int d = cfg.d_model, hd = d / cfg.heads;
    residual_block(x, L.cross_norm, [&](const Act& h, const Act& res, Act& y) {
      Act q(d, h.T, h.B, iface), a(d, h.T, h.B, iface);
      linear(kt.cross_q, "cross_q", h.flat(), L.cross_q, q.flat());
      attention(kt.cross_attention, "cross_attention", q.heads(hd), kv.heads(hd), src_mask.flat(), position_bias({}),
                a.heads(hd));
      linear_residual(kt.attention_out, "cross_out", a.flat(), L.cross_out, res.flat(), y.flat());
    });
  }

  // The output projection: hidden rows -> raw logits.
  void generator(const Act& x, const Weights& w, Act& logits) {
    linear(kt.generator, "generator", x.flat(), w.generator, logits.flat());
  }
  // Generator + softmax / log_softmax: `logits` gets the raw generator output, `out` the head's.
  void head(const Act& x, const Weights& w, Act& logits, Act& out) {
    generator(x, w, logits);
    head_of(logits, out);
  }
  void head_of(const Act& logits, Act& out) {
    KernelTimer timer("head", iface);
    if (kt.head) {
      View lb = logits.flat(), ob = out.flat();
      run(kt.head(lb.raw(), ob.raw()), "head");
    } else {
      copy_elems(logits, 0, out, 0, logits.size());
    }
  }

  // Row-wise argmax of `rows` into `next`, which is then read on the host.
  void argmax(const Act& rows, IBuf& next) {
    {
      KernelTimer timer("argmax", iface);
      View rb = rows.flat();
      run(kt.argmax(rb.raw(), next.raw_buffer()), "argmax");
    }
    download(next, "argmax");
  }

  Tensor to_tensor(const Act& a) { return Tensor{{a.B, a.T, a.C}, to_host(a)}; }

  // Decoder state for incremental decoding over B rows: per layer, the QKV rows of every
  // position so far ([B][Tmax][3d], the self-attention KV cache; on a GPU device each
  // row padded to `row` = a multiple of kDeviceAlignFloats so that the rows of a step
  // start aligned) and, for an encoder-decoder, the cross-attention keys/values of the
  // memory.
  // A batch of decoder-only prompts of different lengths is left-aligned: row b's prompt
  // fills cache positions [shift[b], Pmax), so every step writes one cache position for
  // all rows at once; row b's token at cache position t sits at sequence position
  // t - shift[b], and self_mask hides positions before shift[b].
  struct DecoderState {
    int B = 0, Tmax = 0, len = 0, row = 0;
    std::vector<Act> cache, cross;
    Act src_mask;   // (S, B) additive, encoder-decoder only
    Act self_mask;  // (Tmax, B): 0, or kMasked before a row's shift
    std::vector<int> shift;  // per row; all 0 unless prompts differ in length
    Act zero_mask;  // (Tmax, 1) zeros: one row's own positions (rotary attention per row)
    std::vector<uint8_t> reorder_scratch;  // beam search: the parents' cache rows (CPU)
    bool shifted() const { return std::any_of(shift.begin(), shift.end(), [](int s) { return s != 0; }); }
  };

  DecoderState decoder_state(const Weights& w, int B, int Tmax, std::vector<int> shift = {}) {
    DecoderState st;
    st.B = B, st.Tmax = Tmax;
    st.shift = shift.empty() ? std::vector<int>(B, 0) : std::move(shift);
    st.self_mask = make_input(Tmax, B, 1, [&](float* m) {
      for (int b = 0; b < B; ++b) std::fill_n(m + int64_t(b) * Tmax, st.shift[b], kMasked);
    });
    if (st.shifted() && positions_in_attention()) st.zero_mask = make_input(Tmax, 1, 1, [](float*) {});
    const int w3 = qkv_width();
    st.row = iface ? int((w3 + kDeviceAlignFloats - 1) / kDeviceAlignFloats * kDeviceAlignFloats) : w3;
    for (size_t l = 0; l < w.decoder.size(); ++l) st.cache.emplace_back(st.row, Tmax, B, iface, self_cache_bf16());
    return st;
  }

  // Runs the decoder on `tokens` (T new positions; T > 1 only with B == 1, whose rows are
  // then contiguous) and returns the last decoder hidden rows (d, T, B); with last_row only
  // the last position's, (d, 1, B): the last layer then needs the other positions' keys and
  // values alone (a prompt's).
  Act decode_step(DecoderState& st, const Weights& w, const IBuf& tokens, bool last_row = false) {
    const int d = cfg.d_model, hd = d / cfg.heads, T = tokens.dim(0).extent();
    const int B = st.B, row = st.row, len = st.len;
    if (len + T > st.Tmax) throw Error("decoder cache overflow (internal)");
    if (T > 1 && B > 1) throw Error("internal: several rows of several positions");
    const bool shifted = st.shifted();
    if (shifted && T != 1) throw Error("internal: a left-aligned batch decodes one position per step");
    Act x;
    if (shifted) {
      std::vector<int> pos(B);
      for (int b = 0; b < B; ++b) pos[b] = len - st.shift[b];
      x = embed_rows(kt.embed_tgt, tokens, w, pos);
    } else {
      x = embed(kt.embed_tgt, tokens, true, w, len);
    }
    // Rotary attention turns keys by their cache position, relative positions bias them by
    // their distance from the query's: rows at their own positions
    // each get their own call over their own positions.
    const bool per_row = shifted && positions_in_attention();
    halide_buffer_t* bias = position_bias(w.decoder_position_bias);
    const int64_t bstride = int64_t(row) * st.Tmax, at = int64_t(len) * row;
    for (size_t l = 0; l < w.decoder.size(); ++l) {
      const auto& L = w.decoder[l];
      const Act& c = st.cache[l];
      const bool tail = last_row && T > 1 && l + 1 == w.decoder.size();
      Act ff_in = parallel_input(x, L, tail);
      residual_block(x, L.self_norm, [&](const Act& h, const Act& res, Act& y) {
        Act a(d, y.T, B, iface);
        // New QKV rows go straight into the cache: T rows of one sequence, or one row each of B.
        const int W = qkv_width(), heads = W / hd;
        View out = T > 1 ? view2(c, at, W, T * B, row) : view2(c, at, W, B, bstride);
        linear(self_cache_bf16() ? kt.qkv_cache : kt.qkv, "qkv", h.flat(), L.qkv, out);
        if (!per_row) {
          decoder_self_attention(c, len + T - y.T, y.T, B, row, bstride, st.self_mask, st.Tmax, bias, a);
        } else {
          Act one = iface ? Act(d, 1, 1, iface) : Act();  // device: an aligned output, then copied
          for (int b = 0; b < B; ++b) {
            const int64_t base = b * bstride, n = len + 1 - st.shift[b];
            View o = iface ? one.heads(hd) : view4(a, int64_t(b) * d, hd, d / hd, 1, 1, d, d);
            attention(kt.decoder_self_attention, "decoder_self_attention", view4(c, base + at, hd, heads, 1, 1, row, row),
                      view4(c, base + int64_t(st.shift[b]) * row, hd, heads, int(n), 1, row, row),
                      view2(st.zero_mask, 0, int(n), 1, st.Tmax), bias, o);
            if (iface) copy_elems(one, 0, a, int64_t(b) * d, d);
          }
        }
        linear_residual(kt.attention_out, "attention_out", a.flat(), L.attn_out, res.flat(), y.flat());
      }, nullptr, tail);
      if (!st.cross.empty()) cross_block(x, L, st.cross[l], st.src_mask);
      feed_forward(x, L, ff_in);
    }
    final_norm(x, w.decoder_norm);
    st.len += T;
    return x;
  }

  // Beam search: row b continues from row parent[b].
  void reorder(DecoderState& st, const std::vector<int>& parent) {
    const int64_t bstride = int64_t(st.row) * st.Tmax, used = int64_t(st.len) * st.row;
    bool moved = false;
    for (int b = 0; b < st.B; ++b) moved |= parent[b] != b;
    if (!moved) return;
    for (auto& c : st.cache) {
      if (!iface) {
        // The used positions of every parent row, set aside once, then copied into the rows
        // that change (a copy of the whole cache per layer and step, allocated afresh, was
        // most of a beam step's host time).
        const size_t elem = c.bf16 ? sizeof(uint16_t) : sizeof(float), piece = size_t(used) * elem;
        uint8_t* data = c.bf16 ? reinterpret_cast<uint8_t*>(c.bits()) : reinterpret_cast<uint8_t*>(c.host());
        st.reorder_scratch.resize(size_t(st.B) * piece);
        for (int b = 0; b < st.B; ++b)
          if (parent[b] != b) std::memcpy(st.reorder_scratch.data() + size_t(parent[b]) * piece, data + size_t(parent[b] * bstride) * elem, piece);
        for (int b = 0; b < st.B; ++b)
          if (parent[b] != b) std::memcpy(data + size_t(b * bstride) * elem, st.reorder_scratch.data() + size_t(parent[b]) * piece, piece);
        continue;
      }
      // Device: gather the rows into a fresh cache, device to device.
      Act fresh(c.C, c.T, c.B, iface);
      for (int b = 0; b < st.B; ++b) copy_elems(c, parent[b] * bstride, fresh, b * bstride, used);
      c = std::move(fresh);
    }
  }

  // Rows of the last position of x (d, T, B) -> (d, 1, B).
  Act last_rows(const Act& x, const std::vector<int>& last) {
    Act y(x.C, 1, x.B, iface, x.bf16);
    for (int b = 0; b < x.B; ++b) copy_elems(x, (int64_t(b) * x.T + last[b]) * x.C, y, int64_t(b) * x.C, x.C);
    return y;
  }

  // Each sequence's row at position T - 1 (d, T, B) -> (d, 1, B).
  Act last_positions(const Act& x) { return last_rows(x, std::vector<int>(x.B, x.T - 1)); }

  // The decoder's hidden rows (d, T, B) over whole target sequences; keep(l, qkv) gets layer
  // l's QKV rows. last_row (sequences of one length): only the last position's, (d, 1, B).
  Act decoder_hidden(const Weights& w, const std::vector<Sequence>& tgt, const std::vector<Act>& cross,
                     const Act& smask, const char* what,
                     const std::function<void(size_t, const Act&)>& keep = nullptr, bool last_row = false) {
    IBuf t = pad_batch(tgt, cfg.tgt_vocab, what);
    const int T = t.dim(0).extent();
    if (last_row && std::any_of(tgt.begin(), tgt.end(), [&](const Sequence& s) { return int(s.size()) != T; }))
      throw Error("internal: last rows of sequences of different lengths");
    Act tmask = key_mask(tgt, T);
    Act x = embed(kt.embed_tgt, t, true, w, 0);
    for (size_t l = 0; l < w.decoder.size(); ++l) {
      const auto& L = w.decoder[l];
      const bool tail = last_row && T > 1 && l + 1 == w.decoder.size();
      Act ff_in = parallel_input(x, L, tail);
      KeepQkv keep_l = keep ? KeepQkv([&](const Act& qkv) { keep(l, qkv); }) : KeepQkv();
      self_attention_block(x, L, tmask, position_bias(w.decoder_position_bias), true, keep_l, tail);
      if (!cross.empty()) cross_block(x, L, cross[l], smask);
      feed_forward(x, L, ff_in);
    }
    final_norm(x, w.decoder_norm);
    return x;
  }

  // The decoder over whole target sequences (teacher forcing / recomputation): head
  // output (V, T, B). `cross` holds each layer's cross-attention K/V (empty for
  // decoder-only models).
  // With `last_logits` / `last_out`, each sequence's last position's generator output
  // and head output rows are copied there ((V, 1, B) each).
  Act decoder_forward(const Weights& w, const std::vector<Sequence>& tgt, const std::vector<Act>& cross,
                      const Act& smask, const char* what, Act* last_logits = nullptr, Act* last_out = nullptr) {
    Act x = decoder_hidden(w, tgt, cross, smask, what);
    Act logits(cfg.tgt_vocab, x.T, x.B, iface), out(cfg.tgt_vocab, x.T, x.B, iface);
    head(x, w, logits, out);
    if (last_out) {
      const int V = cfg.tgt_vocab, T = x.T;
      for (int b = 0; b < x.B; ++b) {
        const int64_t at = (int64_t(b) * T + int64_t(tgt[b].size()) - 1) * V;
        copy_elems(logits, at, *last_logits, int64_t(b) * V, V);
        copy_elems(out, at, *last_out, int64_t(b) * V, V);
      }
    }
    return out;
  }

  // Rows repeated: (C, S, B) -> (C, S, B * k), each sequence k times in a row (its element
  // type and layout kept: a cross-attention cache is bf16 and head-major on the CPU).
  Act repeat_rows(const Act& a, int k) {
    Act r(a.C, a.T, a.B * k, iface, a.bf16, /*zeroed=*/false);
    r.head_major_hd = a.head_major_hd;
    const int64_t n = int64_t(a.C) * a.T;
    for (int b = 0; b < a.B; ++b)
      for (int j = 0; j < k; ++j) copy_elems(a, b * n, r, (int64_t(b) * k + j) * n, n);
    return r;
  }


  Tensor encode(const Weights& w, const std::vector<Sequence>& src) {
    if (cfg.arch == Arch::Decoder) throw Error("encode: a decoder-only model has no encoder");
    IBuf s = pad_batch(src, cfg.src_vocab, "source");
    return to_tensor(run_encoder(w, s, key_mask(src, s.dim(0).extent())));
  }

  Tensor pooled(const Weights& w, const std::vector<Sequence>& src) {
    if (!kt.pool) throw Error("pooled: the model's head is not 'classifier' or 'embedding'");
    IBuf s = pad_batch(src, cfg.src_vocab, "source");
    Act x = run_encoder(w, s, key_mask(src, s.dim(0).extent()));
    Act valid = make_input(x.T, x.B, 1, [&](float* v) {  // (T, B): 1 for a real token
      for (int b = 0; b < x.B; ++b)
        for (int t = 0; t < x.T; ++t) v[size_t(b) * x.T + t] = t < int(src[b].size()) ? 1.0f : 0.0f;
    });
    Act p(cfg.d_model, 1, x.B, iface);
    halide_dimension_t dims[3] = {{0, x.C, 1}, {0, x.T, x.C}, {0, x.B, x.C * x.T}};
    {
      View x3 = make_view(x, 0, 3, dims), pb = view2(p, 0, p.C, x.B, p.C), vb = valid.flat();
      KernelTimer timer("pool", iface);
      run(kt.pool(x3.raw(), vb.raw(), pb.raw()), "pool");
    }
    if (cfg.head != HeadOutput::Classifier) return Tensor{{x.B, p.C}, to_host(p)};
    if (cfg.pooler) {
      Act q(p.C, 1, p.B, iface);
      linear(kt.pooler, "pooler", p.flat(), w.pooler, q.flat());
      p = std::move(q);
    }
    Act out(cfg.num_classes, 1, x.B, iface);
    linear(kt.classifier, "classifier", p.flat(), w.classifier, out.flat());
    return Tensor{{x.B, out.C}, to_host(out)};
  }

  Tensor score(const Weights& w, const std::vector<Sequence>& src, const std::vector<Sequence>& tgt) {
    if (cfg.arch == Arch::Encoder) throw Error("score: an encoder-only model has no decoder");
    if (cfg.arch == Arch::Decoder) return to_tensor(decoder_forward(w, src, {}, Act(), "prompt"));
    if (src.size() != tgt.size())
      throw Error("score: " + std::to_string(src.size()) + " source sequences but " + std::to_string(tgt.size()) +
                  " target sequences");
    IBuf s = pad_batch(src, cfg.src_vocab, "source");
    Act smask = key_mask(src, s.dim(0).extent());
    Act memory = run_encoder(w, s, smask);
    std::vector<Act> cross;
    for (const auto& L : w.decoder) cross.push_back(cross_kv(L, memory));
    return to_tensor(decoder_forward(w, tgt, cross, smask, "target"));
  }

  // The next token of each row still decoding. Plain greedy decoding runs the argmax
  // kernel (on the CPU over the raw logits, on a GPU over the head output, and only the
  // ids come down); any other option brings the step's raw logits to the host for the
  // rows' TokenChoosers.
  struct Chooser {
    const GenerationOptions& o;
    std::vector<TokenChooser> rows;
    bool on_host = false;  // processors, sampling or scores: the choice is made on the host
    Chooser(const GenerationOptions& opts, int V, int eos, int B) : o(opts) {
      for (int b = 0; b < B; ++b) rows.emplace_back(opts, V, eos, b);
      const bool sampling = opts.sampling_topk != 1 && opts.sampling_temperature != 0;  // TokenChooser's rule
      on_host = sampling || opts.repetition_penalty != 1.0f || opts.no_repeat_ngram_size > 0 ||
                opts.min_length > 0 || opts.return_scores;
    }
  };
  // Plain greedy ranks with the argmax kernel: on the CPU the raw logits (the head keeps a
  // row's order up to rounding: where two top logits closer than its rounding tied there
  // and the lower id won, the larger raw logit wins here), on a GPU the head output `out`.
  void choose(Chooser& ch, const Act& logits, const Act& out, IBuf& next, const std::vector<Sequence>& history,
              const std::vector<bool>& done, int generated, DecodeResult& r) {
    if (!ch.on_host) {
      const Act& ranked = iface ? out : logits;
      argmax(ranked, next);
      for (int b = 0; b < ranked.B; ++b) {
        if (done[b]) continue;
        auto row = [b] { return "generation: row " + std::to_string(b); };
        if (next(b) < 0) nonfinite_logits(row(), generated);  // the kernel's -1: NaN or +inf in that row
        // A row that is all -inf has no order either (no processor masks tokens here, so
        // only overflow gives it); the head's output made it NaN, raw logits do not.
        if (!iface && ranked.host()[size_t(b) * ranked.C + next(b)] == -std::numeric_limits<float>::infinity())
          nonfinite_logits(row(), generated, "are all -infinity");
      }
      return;
    }
    std::vector<float> h = to_host(logits);
    // The rows in parallel (each its own chooser; transformer-base int8 at batch 8:
    // --scores' log-softmax and sampling's top-k over 32000 logits a row took more than
    // the step's kernels); no log-softmax unless scores are asked.
    const int V = logits.C;
    std::vector<float> logprob(size_t(logits.B));
    parallel_for(logits.B, "token choice", [&](int b) {
      if (done[b]) return;
      next(b) = ch.rows[b].choose(h.data() + size_t(b) * V, history[b], generated,
                                  ch.o.return_scores ? &logprob[size_t(b)] : nullptr);
    });
    if (ch.o.return_scores)
      for (int b = 0; b < logits.B; ++b)
        if (!done[b]) r.token_logprobs[b].push_back(logprob[size_t(b)]);
  }
  // Delivers a chosen token; false when the row stops here (eos, or the callback said so).
  static bool deliver(const GenerationOptions& o, int row, int32_t token, float logprob, int eos) {
    const bool go_on = !o.on_token || o.on_token(row, token, logprob);
    return go_on && token != eos;
  }

  // Decoder-only, with the cache: the prompts through the decoder, those of one length
  // together (more rows per matmul) as in teacher forcing; each layer's keys and values of
  // prompt b are copied into row b of the batch's cache at [shift[b], Pmax) while hot (a
  // cache per group, copied at the end, cost GPT-2 small at 8 x 128 tokens 20-90 ms of
  // allocation and copying), its last position's head output into row b of logits / out.
  // Past the last layer's QKV projection only each prompt's last row is computed (its
  // other rows' keys and values are all the cache needs): 8 x 128-token prompts through
  // GPT-2 small 1215 -> 1057 ms.
  void prefill(DecoderState& st, const Weights& w, const std::vector<Sequence>& prompts, Act& logits, Act& out) {
    const int V = cfg.tgt_vocab;
    if (st.B == 1) {  // straight into the cache
      const int P = int(prompts[0].size());
      IBuf tok(P, 1);
      for (int i = 0; i < P; ++i) tok(i, 0) = prompts[0][i];
      head(decode_step(st, w, tok, true), w, logits, out);
      return;
    }
    const int64_t bstride = int64_t(st.row) * st.Tmax;
    // Masked positions before a row's shift are still read (times a zero weight): on a
    // device, whose memory is not zeroed, they must not hold NaNs.
    const int max_shift = *std::max_element(st.shift.begin(), st.shift.end());
    Act zeros = iface && max_shift > 0 ? make_input(st.row, max_shift, 1, [](float*) {}) : Act();
    std::map<int, std::vector<int>> by_length;  // prompt length -> batch rows
    for (size_t b = 0; b < prompts.size(); ++b) by_length[int(prompts[b].size())].push_back(int(b));
    for (const auto& [P, rows] : by_length) {
      const int G = int(rows.size()), W = qkv_width();
      std::vector<Sequence> group;
      for (int b : rows) group.push_back(prompts[b]);
      Act x = decoder_hidden(w, group, {}, Act(), "prompt", [&](size_t l, const Act& qkv) {
        for (int g = 0; g < G; ++g) {
          const int b = rows[g];
          copy_rows(qkv, int64_t(g) * P * W, W, st.cache[l], int64_t(b) * bstride + int64_t(st.shift[b]) * st.row,
                    st.row, W, P);
          if (iface && st.shift[b] > 0)
            copy_elems(zeros, 0, st.cache[l], int64_t(b) * bstride, int64_t(st.shift[b]) * st.row);
        }
      }, true);
      Act lg(V, 1, G, iface), og(V, 1, G, iface);
      head(x, w, lg, og);
      for (int g = 0; g < G; ++g) {
        copy_elems(lg, int64_t(g) * V, logits, int64_t(rows[g]) * V, V);
        copy_elems(og, int64_t(g) * V, out, int64_t(rows[g]) * V, V);
      }
    }
    st.len = by_length.rbegin()->first;
  }

  DecodeResult generate(const Weights& w, const std::vector<Sequence>& src, const GenerationOptions& o) {
    if (cfg.arch == Arch::Encoder) throw Error("generate: an encoder-only model does not decode");
    validate(o, cfg.tgt_vocab);
    if (o.beam_size > 1) throw Error("generate: beam_size " + std::to_string(o.beam_size) + " > 1 is beam search");
    const int max_new_tokens = o.max_new_tokens > 0 ? o.max_new_tokens : cfg.max_new_tokens;
    if (max_new_tokens < 1 || max_new_tokens > cfg.max_len)
      throw Error("max_new_tokens " + std::to_string(max_new_tokens) + " is outside [1, max_len = " +
                  std::to_string(cfg.max_len) + "]");
    const int V = cfg.tgt_vocab, eos = cfg.eos_id;
    const bool decoder_only = cfg.arch == Arch::Decoder;
    DecodeResult r;
    Chooser ch(o, V, eos, int(src.size()));
    if (o.return_scores) r.token_logprobs.assign(src.size(), {});

    // The history each row's choice sees: decoder-only, prompt + generated (as
    // transformers' input ids); encoder-decoder, bos + generated.
    std::vector<Sequence> history;
    DecoderState st;
    int B = int(src.size());
    double t0 = now_ms();
    if (decoder_only) {
      // All rows decode together, each at its own position (see DecoderState).
      pad_batch(src, V, "prompt");  // validate the whole batch first
      int Pmax = 0;
      for (int b = 0; b < B; ++b) {
        const int P = int(src[b].size());
        if (P + max_new_tokens > cfg.max_len + 1)
          throw Error("prompt " + std::to_string(b + 1) + ": " + std::to_string(P) + " tokens + " +
                      std::to_string(max_new_tokens) + " new tokens exceed max_len " + std::to_string(cfg.max_len));
        Pmax = std::max(Pmax, P);
      }
      history = src;
      if (o.use_cache) {
        std::vector<int> shift(B);
        for (int b = 0; b < B; ++b) shift[b] = Pmax - int(src[b].size());
        st = decoder_state(w, B, Pmax + max_new_tokens, shift);
      }
    } else {
      IBuf s = pad_batch(src, cfg.src_vocab, "source");
      st = decoder_state(w, B, max_new_tokens);
      st.src_mask = key_mask(src, s.dim(0).extent());
      Act memory = run_encoder(w, s, st.src_mask);
      for (const auto& L : w.decoder) st.cross.push_back(cross_kv(L, memory));
      history.assign(B, Sequence{int32_t(cfg.bos_id)});
      r.encoder_ms = now_ms() - t0;
    }

    IBuf tok(1, B);
    tok.fill(cfg.bos_id);
    Act logits(V, 1, B, iface), out(V, 1, B, iface);
    Act last = iface ? Act(V, 1, B, iface) : Act();  // GPU: last_logits rows stay on the device until the end
    Halide::Runtime::Buffer<int32_t> next(B);
    std::vector<bool> done(B, false);
    r.tokens.assign(B, {});
    r.last_logits = Tensor{{B, V}, std::vector<float>(size_t(B) * V)};
    for (int step = 0; step < max_new_tokens; ++step) {
      double ts = decoder_only && step == 0 ? t0 : now_ms();
      bool have_out = true;  // `out` holds this step's head output
      if (!o.use_cache) {
        // Full recomputation of the decoder over the prefix (the encoder output and the
        // cross-attention K/V are per source and reused).
        decoder_forward(w, history, st.cross, st.src_mask, decoder_only ? "prompt" : "target", &logits, &out);
      } else if (decoder_only && step == 0) {
        prefill(st, w, src, logits, out);
      } else if (!iface) {
        // The CPU chooses from the raw logits (the argmax kernel, or the host's chooser on
        // a copy) and runs the head (softmax / log_softmax over the vocabulary) only in the
        // steps where some row ends, for last_logits: transformer-base at batch 8, 0.15 ms
        // a step of ~5 (int8).
        generator(decode_step(st, w, tok), w, logits);
        have_out = false;
      } else {
        head(decode_step(st, w, tok), w, logits, out);
      }
      choose(ch, logits, out, next, history, done, step, r);
      if (iface)  // rows still decoding, one device copy per run of them
        for (int b0 = 0, b1; b0 < B; b0 = b1) {
          for (b1 = b0; b1 < B && !done[b1]; ++b1) {}
          if (b1 > b0) copy_elems(out, int64_t(b0) * V, last, int64_t(b0) * V, int64_t(b1 - b0) * V);
          else ++b1;
        }
      bool all_done = true;
      std::vector<int> ending;  // rows whose last step this is
      for (int b = 0; b < B; ++b) {
        if (!done[b]) {
          r.tokens[b].push_back(next(b));
          const float lp = o.return_scores ? r.token_logprobs[b].back() : std::nanf("");
          done[b] = !deliver(o, b, next(b), lp, eos);
          history[b].push_back(next(b));
          if (done[b] || step + 1 == max_new_tokens) ending.push_back(b);
        }
        all_done = all_done && done[b];
        tok(0, b) = next(b);
      }
      if (!iface && !ending.empty()) {  // last_logits: each row's head output at its last step
        if (!have_out) head_of(logits, out);
        for (int b : ending) std::copy_n(out.host() + size_t(b) * V, V, r.last_logits.data.begin() + size_t(b) * V);
      }
      // Decoder-only: the prompt and the first token count as the "encoder" time.
      if (decoder_only && step == 0) r.encoder_ms = now_ms() - ts;
      else r.step_ms.push_back(now_ms() - ts);
      if (all_done) break;
    }
    if (iface) r.last_logits.data = to_host(last);
    return r;
  }

  // Beam search's work on one hypothesis' logits: the log-sum-exp of the row (double) and
  // its best `top` candidates by score, ties to the lower token, into `best`. NaN / +inf
  // logits (finite weights can still overflow) leave no order to rank by, and neither do
  // logits that are all -inf (no processor masks tokens here): an error naming `where`.
  struct BeamCand { double score; int hyp, token; };
  static void beam_candidates(const float* x, int V, double score_so_far, int hyp, int top, int step,
                              const std::function<std::string()>& where, std::vector<BeamCand>& best) {
    if (holds_nan_or_inf(x, V)) nonfinite_logits(where(), step);
    double mx = -std::numeric_limits<double>::infinity(), total = 0;
    for (int v = 0; v < V; ++v) mx = std::max(mx, double(x[v]));
    if (mx == -std::numeric_limits<double>::infinity()) nonfinite_logits(where(), step, "are all -infinity");
    for (int v = 0; v < V; ++v) total += std::exp(double(x[v]) - mx);
    const double lse = mx + std::log(total);
    best.reserve(size_t(top));
    for (int v = 0; v < V; ++v) {
      const double score = score_so_far + (double(x[v]) - lse);
      if (best.size() == size_t(top)) {
        if (!(score > best.back().score)) continue;  // a tie keeps the lower token
        best.pop_back();
      }
      // After the equal scores: they have lower tokens.
      auto at = std::upper_bound(best.begin(), best.end(), score,
                                 [](double sc, const BeamCand& c) { return sc > c.score; });
      best.insert(at, BeamCand{score, hyp, v});
    }
  }

  BeamResult beam_search(const Weights& w, const std::vector<Sequence>& src, int K_beam, double alpha,
                         int max_new_tokens) {
    if (cfg.arch != Arch::EncoderDecoder) throw Error("beam search needs an encoder-decoder model");
    if (K_beam < 1) throw Error("beam size " + std::to_string(K_beam) + " must be >= 1");
    if (max_new_tokens < 1 || max_new_tokens > cfg.max_len)
      throw Error("max_new_tokens " + std::to_string(max_new_tokens) + " is outside [1, max_len = " +
                  std::to_string(cfg.max_len) + "]");
    const int V = cfg.tgt_vocab, eos = cfg.eos_id;
    BeamResult r;
    double t0 = now_ms();
    IBuf s = pad_batch(src, cfg.src_vocab, "source");
    const int B = s.dim(1).extent(), R = B * K_beam;  // R decoder rows: K per source
    Act smask = key_mask(src, s.dim(0).extent());
    Act memory = run_encoder(w, s, smask);
    DecoderState st = decoder_state(w, R, max_new_tokens);
    std::vector<Sequence> src_rep;  // each source once per beam row
    for (const auto& seq : src) src_rep.insert(src_rep.end(), K_beam, seq);
    st.src_mask = key_mask(src_rep, s.dim(0).extent());
    // Each source's cross-attention keys and values once, then copied to its K beam rows
    // (projecting the repeated encoder output did the same matmul K times: transformer-base
    // int8, beam 4 at batch 8, 24.7-32.5 ms per layer, 5.3 now).
    for (const auto& L : w.decoder) st.cross.push_back(repeat_rows(cross_kv(L, memory), K_beam));
    r.encoder_ms = now_ms() - t0;

    struct Hyp { Sequence tokens; double score; };
    std::vector<std::vector<Hyp>> live(B, std::vector<Hyp>{{{}, 0.0}}), finished(B);
    std::vector<bool> done(B, false);
    IBuf tok(1, R);
    tok.fill(cfg.bos_id);
    Act logits(V, 1, R, iface);
    for (int step = 0; step < max_new_tokens; ++step) {
      double ts = now_ms();
      Act x = decode_step(st, w, tok);
      // The host ranks candidates from the raw logits (its own log-softmax per row; the
      // head kernel's output is not needed): on a GPU they come down once a step.
      generator(x, w, logits);
      std::vector<float> logits_h = iface ? to_host(logits) : std::vector<float>();
      const float* lg = iface ? logits_h.data() : logits.host();
      // Each live hypothesis' row in parallel (log-sum-exp and its best candidates: the
      // host's share of a step; transformer-base int8, beam 4 at batch 8: 32 rows of 32000),
      // then each source's candidates ranked in order.
      const int top = std::min(2 * K_beam, V);
      std::vector<std::pair<int, int>> rows;  // (source, hypothesis), in order
      for (int b = 0; b < B; ++b)
        for (int i = 0; !done[b] && i < int(live[b].size()); ++i) rows.emplace_back(b, i);
      std::vector<std::vector<BeamCand>> best(rows.size());
      parallel_for(int(rows.size()), "beam search", [&](int n) {
        const auto [b, i] = rows[size_t(n)];
        beam_candidates(lg + size_t(b * K_beam + i) * V, V, live[b][i].score, i, top, step, [b = b, i = i] {
          return "beam search: source " + std::to_string(b) + ", hypothesis " + std::to_string(i);
        }, best[size_t(n)]);
      });
      std::vector<int> parent(R);
      size_t n = 0;
      for (int b = 0; b < B; ++b) {
        for (int k = 0; k < K_beam; ++k) parent[b * K_beam + k] = b * K_beam + k;  // finished sources: rows unused
        if (done[b]) continue;
        // Candidates, best first; ties -> lower hyp, then lower token. The best 2K over all
        // hypotheses are among each hypothesis' best `top` (beam_candidates), so K x 2K
        // candidates are ranked, not K x V (4 x 32000 a step, 2 MB: milliseconds).
        std::vector<BeamCand> cands;
        cands.reserve(live[b].size() * size_t(top));
        for (size_t i = 0; i < live[b].size(); ++i, ++n) cands.insert(cands.end(), best[n].begin(), best[n].end());
        const size_t keep = std::min(cands.size(), size_t(2 * K_beam));
        std::partial_sort(cands.begin(), cands.begin() + keep, cands.end(), [](const BeamCand& a, const BeamCand& c) {
          if (a.score != c.score) return a.score > c.score;
          return a.hyp != c.hyp ? a.hyp < c.hyp : a.token < c.token;
        });
        std::vector<Hyp> next;
        std::vector<int> next_parent;
        for (size_t rank = 0; rank < keep && int(next.size()) < K_beam; ++rank) {
          const BeamCand& c = cands[rank];
          Sequence t = live[b][c.hyp].tokens;
          t.push_back(c.token);
          if (c.token == eos) {
            if (int(rank) < K_beam) finished[b].push_back({t, c.score});
          } else {
            next.push_back({t, c.score});
            next_parent.push_back(b * K_beam + c.hyp);
          }
        }
        if (int(finished[b].size()) >= K_beam || next.empty()) done[b] = true;
        for (size_t k = 0; k < next.size(); ++k) {
          parent[b * K_beam + k] = next_parent[k];
          tok(0, b * K_beam + int(k)) = next[k].tokens.back();
        }
        for (size_t k = next.size(); k < size_t(K_beam); ++k) tok(0, b * K_beam + int(k)) = cfg.pad_id;
        live[b] = std::move(next);
      }
      reorder(st, parent);
      r.step_ms.push_back(now_ms() - ts);
      if (std::all_of(done.begin(), done.end(), [](bool d) { return d; })) break;
    }
    r.hypotheses.resize(B);
    r.scores.resize(B);
    for (int b = 0; b < B; ++b) {
      if (int(finished[b].size()) < K_beam)
        for (auto& h : live[b]) finished[b].push_back(h);
      std::vector<std::pair<double, Sequence>> ranked;
      for (auto& h : finished[b])
        ranked.push_back({h.score / std::pow(double(h.tokens.size()), alpha), h.tokens});
      std::stable_sort(ranked.begin(), ranked.end(), [](const auto& a, const auto& c) {
        if (a.first != c.first) return a.first > c.first;
        return a.second < c.second;
      });
      for (int k = 0; k < K_beam && k < int(ranked.size()); ++k) {
        r.hypotheses[b].push_back(ranked[k].second);
        r.scores[b].push_back(ranked[k].first);
      }
    }
    return r;
  }
};

// ---- threads per model: every model's calls share Halide's thread pool (sized for
// the largest request); a call of a model loaded with `threads` = k splits each
// parallel loop into at most k contiguous chunks, so it never runs on more than k
// threads at once. The limit belongs to the call (set for its duration on the calling
// thread), not to the process.
namespace {
thread_local int t_call_threads = 0;  // 0: no limit

struct Chunks {
  halide_task_t f;
  uint8_t* closure;
  int min, size, chunks;
};
int run_chunk(void* user_context, int i, uint8_t* closure) {
  const Chunks& c = *reinterpret_cast<Chunks*>(closure);
  const int lo = c.min + int(int64_t(c.size) * i / c.chunks), hi = c.min + int(int64_t(c.size) * (i + 1) / c.chunks);
  for (int j = lo; j < hi; ++j)
    if (int status = c.f(user_context, j, c.closure)) return status;
  return 0;
}
// Halide's pool size: every core, unless a model asked for more threads.
std::atomic<int> g_pool_threads{int(std::max(1u, std::thread::hardware_concurrency()))};

int limited_par_for(void* user_context, halide_task_t f, int min, int size, uint8_t* closure) {
  const int k = t_call_threads;
  // No limit, or one the pool cannot exceed anyway: Halide's own (dynamic) scheduling.
  if (k <= 0 || k >= size || k >= g_pool_threads.load(std::memory_order_relaxed))
    return halide_default_do_par_for(user_context, f, min, size, closure);
  Chunks c{f, closure, min, size, k};
  if (k == 1) return run_chunk(user_context, 0, reinterpret_cast<uint8_t*>(&c));
  return halide_default_do_par_for(user_context, run_chunk, 0, k, reinterpret_cast<uint8_t*>(&c));
}

// Installs limited_par_for once and grows the shared pool to `threads` (never shrinks it).
void reserve_threads(int threads) {
  static const bool installed = (halide_set_custom_do_par_for(limited_par_for), true);
  (void)installed;
  static std::mutex lock;
  std::lock_guard<std::mutex> guard(lock);
  if (threads > g_pool_threads.load()) {
    g_pool_threads.store(threads);
    halide_set_num_threads(threads);
  }
}
}  // namespace

// The calling thread's limit for the duration of one Model call.
struct CallThreads {
  int saved;
  explicit CallThreads(int k) : saved(t_call_threads) { t_call_threads = k; }
  ~CallThreads() { t_call_threads = saved; }
};

// A Session plus the thread limit, for one public call.
struct Call {
  CallThreads threads;
  Session s;
  Session* operator->() { return &s; }
};

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
  return Call{CallThreads(threads_), Session{*desc_->config, *kernels_, *buffers_, state_->iface, state_->stats}};
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
      run(m.kernels_->layer_norm(x.raw_buffer(), gamma.raw_buffer(), beta.raw_buffer(), y.raw_buffer()),
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
  return call()->generate(*weights_, src, options);
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
  return call()->beam_search(*weights_, src, beam_size, length_penalty, max_new_tokens);
}

}  // namespace halformer
