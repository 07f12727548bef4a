// Activations: the arrays [B][T][C] that pass between layers (Array), host or device
// resident, the host block cache they are drawn from, and the non-owning views (View) by
// which kernels read and write them -- also how the KV cache is addressed (strided rows of
// a [B][T_max][W] array). Halide dims are innermost first: x(c, t, b), or x(c, m) with
// m = b*T + t.
#pragma once

#include <HalideBuffer.h>
#include <HalideRuntime.h>

#include <cstdint>
#include <cstring>
#include <list>
#include <map>
#include <memory>
#include <mutex>

#include "halformer/error.h"
#include "halformer/weights.h"
#include "halide_status.h"

namespace halformer {

using Buf = Halide::Runtime::Buffer<float>;
using IBuf = Halide::Runtime::Buffer<int32_t>;
constexpr float kMasked = -1e30f;  // additive mask for padded keys (see attention.cpp)
// Kernel arguments that start inside an activation (KV-cache rows) become OpenCL
// sub-buffers, whose offset must be a multiple of CL_DEVICE_MEM_BASE_ADDR_ALIGN (128
// bytes on PoCL, up to 512 on GPUs); on a GPU device such rows are padded to this.
constexpr int64_t kDeviceAlignFloats = 128;

struct View;

// Host activations are taken from a cache of freed blocks (a layer's buffers repeat in
// every layer and every call): fresh pages from mmap fault and zero on first touch.
// Blocks are cut to size classes, four per power of two (at most 25% over the request),
// so that shapes varying from call to call (the engine's prompt pieces and row counts)
// reuse each other's blocks. A block not taken again within kMaxIdleTakes later takes
// (a few passes of a model), or past kMaxCachedBytes the least recently freed, goes back
// to the system. See docs/performance-log.md#runtime-host-block-cache.
class HostBlockCache {
 public:
  static HostBlockCache& instance() {
    static HostBlockCache* cache = new HostBlockCache;  // never destroyed: blocks may outlive statics
    return *cache;
  }
  // A block of at least `floats` floats, returned to the cache when the last owner lets go.
  std::shared_ptr<float> take(size_t floats);
  // The bytes of the block a request of `bytes` gets: its size class, or itself past
  // kMaxCachedBytes (never cached).
  static size_t size_class(size_t bytes);
  // Bytes cached in blocks of exactly `bytes` (a size class).
  size_t cached(size_t bytes) {
    std::lock_guard<std::mutex> guard(lock_);
    return free_.count(bytes) * bytes;
  }
  static constexpr size_t kMaxCachedBytes = size_t(128) << 20;
  static constexpr uint64_t kMaxIdleTakes = 300;

 private:
  void give(float* p, size_t bytes);
  struct Block {
    size_t bytes;
    float* p;
    uint64_t freed;  // takes_ when it was freed
  };
  std::mutex lock_;
  std::list<Block> recent_;  // freed blocks, the most recently freed first
  std::multimap<size_t, std::list<Block>::iterator> free_;  // the same, by size
  size_t cached_ = 0;
  uint64_t takes_ = 0;
};

// An activation [B][T][C] (or, for the KV cache, [B][T][C] rows of which a prefix of
// each is used). It owns one 1-D buffer of C*T*B floats: host memory on the CPU
// (zeroed, as before), device memory only on a GPU device -- no host allocation at
// all, so a host round trip of an intermediate cannot happen silently.
// bf16: elements of 2 bytes (bf16 bits) -- on the host the attention caches of a
// reduced-precision model (ModelConfig::cross_kv_bf16, self_cache_bf16), which kernels
// alone read and write (and copy_elems copies); on CUDA the bf16 input of a cuBLASLt
// matmul (gpu_blas.h), viewed whole only.
struct Array {
  int C = 0, T = 0, B = 0;
  bool bf16 = false;
  // int8 rows (an int8 key/value cache on the CPU, halformer/kv_int8.h): C counts bytes,
  // each head's row kv_int8_row_bytes(head_major_hd) of them.
  bool int8 = false;
  // Stored head by head ([B][C / hd heads][T][hd] instead of [B][T][C]): a CPU
  // cross-attention cache (Model::cross_kv); only heads(hd) views it.
  int head_major_hd = 0;
  std::shared_ptr<float> host_block;  // CPU: the storage `mem` views (HostBlockCache)
  Buf mem;
  const halide_device_interface_t* iface = nullptr;  // the device it lives on (null: host)
  Array() = default;
  // zeroed = false: host memory left as it is (every element about to be written).
  Array(int c, int t, int b, const halide_device_interface_t* device, bool bf16_elems = false, bool zeroed = true)
      : C(c), T(t), B(b), bf16(bf16_elems), iface(device) {
    const int64_t n = size();
    if (n == 0) return;
    if (!iface) {
      host_alloc(bf16 ? (n + 1) / 2 : n, zeroed);
      return;
    }
    mem = Buf(static_cast<float*>(nullptr), int(bf16 ? (n + 1) / 2 : n));  // bf16: cuBLASLt's input (gpu_blas.h)
    check_kernel(mem.device_malloc(iface), "device allocation");
  }
  struct Int8Rows {};
  Array(int c, int t, int b, Int8Rows) : C(c), T(t), B(b), int8(true) {  // host memory, zeroed
    if (size() > 0) host_alloc((size() + 3) / 4, true);
  }
  Array(Array&&) = default;
  Array& operator=(Array&&) = default;
  Array(const Array&) = delete;  // copies share storage: copy explicitly (copy_elems)
  Array& operator=(const Array&) = delete;
  int64_t size() const { return int64_t(C) * T * B; }
  // Host memory: the CPU only.
  float* host() const {
    if (iface) throw Error("internal: host access to a device-resident activation");
    if (bf16 || int8) throw Error("internal: float access to a bf16 or int8 activation");
    return const_cast<Buf&>(mem).data();
  }
  uint16_t* bits() const {  // a bf16 activation's elements
    if (!bf16) throw Error("internal: bf16 access to a float activation");
    return reinterpret_cast<uint16_t*>(const_cast<Buf&>(mem).data());
  }
  int8_t* bytes() const {  // an int8 activation's elements
    if (!int8) throw Error("internal: int8 access to a float or bf16 activation");
    return reinterpret_cast<int8_t*>(const_cast<Buf&>(mem).data());
  }
  size_t elem_bytes() const { return int8 ? 1 : bf16 ? 2 : 4; }
  // The elements of a host activation of any type, as bytes.
  uint8_t* host_bytes() const {
    if (iface) throw Error("internal: host access to a device-resident activation");
    return reinterpret_cast<uint8_t*>(const_cast<Buf&>(mem).data());
  }
  // A head's row as stored in a head-major activation: head_major_hd elements, int8: with
  // its scale.
  int head_row() const;
  View flat() const;
  View heads(int hd, int batches = -1) const;  // batches: the first ones (-1: all B)

 private:
  void host_alloc(int64_t floats, bool zeroed) {  // host storage of `floats` 4-byte units
    host_block = HostBlockCache::instance().take(size_t(floats));
    mem = Buf(host_block.get(), int(floats));
    if (zeroed) std::memset(mem.data(), 0, size_t(floats) * sizeof(float));
  }
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
View make_view(const Array& a, int64_t offset, int dims, const halide_dimension_t* d, bool kernel_arg = true);
// (c, rows) with rows `row_stride` apart.
View view2(const Array& a, int64_t offset, int c, int rows, int64_t row_stride);
// (d, head, t, b) view of rows holding `nh` heads of `hd` features each (heads `h_stride`
// apart: 0, next to each other in a row).
View view4(const Array& a, int64_t offset, int hd, int nh, int t, int b, int64_t t_stride, int64_t b_stride,
           int64_t h_stride = 0);

}  // namespace halformer
