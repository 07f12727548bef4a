// Views over activations (see activations.h): host views on the CPU; on a GPU device,
// views sharing the activation's device memory (a device crop where they start inside it).
#include "activations.h"

#include <sys/mman.h>

#include <iterator>
#include <new>
#include <string>
#include <vector>

#include "halformer/kv_int8.h"

namespace halformer {

namespace {

// Blocks from kMapped bytes are mapped from the kernel (page aligned, zeroed) and unmapped
// when the cache lets them go, so they leave no holes in malloc's heap (there, a block
// freed below glibc's adaptive mmap threshold stays resident: 48 MB of llama-small's peak
// in docs/engine.md#memory).
constexpr size_t kMapped = size_t(64) << 10;

float* allocate(size_t bytes) {
  if (bytes < kMapped) return CacheLineAllocator<float>().allocate(bytes / sizeof(float));
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) throw std::bad_alloc();
  return static_cast<float*>(p);
}

void deallocate(float* p, size_t bytes) {
  if (bytes < kMapped)
    CacheLineAllocator<float>().deallocate(p, bytes / sizeof(float));
  else
    munmap(p, bytes);
}

}  // namespace

size_t HostBlockCache::size_class(size_t bytes) {
  if (bytes <= 256) return (bytes + 63) & ~size_t(63);
  if (bytes > kMaxCachedBytes) return bytes;
  const size_t step = (size_t(1) << (63 - __builtin_clzll(bytes - 1))) / 4;  // a quarter of the power of two below
  return (bytes + step - 1) / step * step;
}

std::shared_ptr<float> HostBlockCache::take(size_t floats) {
  const size_t bytes = size_class(floats * sizeof(float));
  float* p = nullptr;
  {
    std::lock_guard<std::mutex> guard(lock_);
    ++takes_;
    if (auto range = free_.equal_range(bytes); range.first != range.second) {
      const auto it = std::prev(range.second);  // the most recently freed of the class (warm; the others age out)
      p = it->second->p;
      recent_.erase(it->second);
      free_.erase(it);
      cached_ -= bytes;
    }
  }
  if (!p) p = allocate(bytes);
  return std::shared_ptr<float>(p, [this, bytes](float* q) { give(q, bytes); });
}

void HostBlockCache::give(float* p, size_t bytes) {
  std::vector<Block> evicted;
  if (bytes > kMaxCachedBytes) {
    evicted.push_back({bytes, p});
  } else {
    std::lock_guard<std::mutex> guard(lock_);
    recent_.push_front({bytes, p, takes_});
    free_.emplace(bytes, recent_.begin());
    cached_ += bytes;
    while (cached_ > kMaxCachedBytes || takes_ - recent_.back().freed > kMaxIdleTakes) {
      const Block old = recent_.back();
      auto range = free_.equal_range(old.bytes);
      for (auto it = range.first; it != range.second; ++it)
        if (it->second->p == old.p) {
          free_.erase(it);
          break;
        }
      recent_.pop_back();
      cached_ -= old.bytes;
      evicted.push_back(old);
    }
  }
  for (const Block& b : evicted) deallocate(b.p, b.bytes);
}

// kernel_arg: the view is passed to a kernel, where OpenCL makes a sub-buffer of it
// (offset must be aligned); views only copied between need no alignment.
View make_view(const Array& a, int64_t offset, int dims, const halide_dimension_t* d, bool kernel_arg) {
  if (a.int8) return View{Buf(), Halide::Runtime::Buffer<void>(halide_type_of<int8_t>(), a.bytes() + offset, dims, d)};
  if (a.bf16 && !a.iface)
    return View{Buf(), Halide::Runtime::Buffer<void>(halide_type_of<uint16_t>(), a.bits() + offset, dims, d)};
  if (a.bf16 && offset != 0) throw Error("internal: a device view inside a bf16 activation");
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
      const std::string msg = take_halide_error();
      throw Error("device crop failed" + (msg.empty() ? "" : ": " + msg));
    }
  }
  halide_buffer_t h{};
  h.type = a.bf16 ? halide_type_of<uint16_t>() : halide_type_of<float>();
  h.dimensions = dims;
  h.dim = const_cast<halide_dimension_t*>(d);
  h.device = v.keep.raw_buffer()->device;
  h.device_interface = v.keep.raw_buffer()->device_interface;
  v.buf = Buf(h, Halide::Runtime::BufferDeviceOwnership::Unmanaged);
  return v;
}
// (c, rows) with rows `row_stride` apart.
View view2(const Array& a, int64_t offset, int c, int rows, int64_t row_stride) {
  halide_dimension_t dims[2] = {{0, c, 1}, {0, rows, int32_t(row_stride)}};
  return make_view(a, offset, 2, dims);
}
// (d, head, t, b) view of rows holding `nh` heads of `hd` features each (heads `h_stride`
// apart: 0, next to each other in a row).
View view4(const Array& a, int64_t offset, int hd, int nh, int t, int b, int64_t t_stride, int64_t b_stride,
           int64_t h_stride) {
  halide_dimension_t dims[4] = {
      {0, hd, 1}, {0, nh, int32_t(h_stride ? h_stride : hd)}, {0, t, int32_t(t_stride)}, {0, b, int32_t(b_stride)}};
  return make_view(a, offset, 4, dims);
}
View Array::flat() const {
  if (head_major_hd) throw Error("internal: a row view of a head-major activation");
  return view2(*this, 0, C, T * B, C);
}
int Array::head_row() const { return int8 ? kv_int8_row_bytes(head_major_hd) : head_major_hd; }
View Array::heads(int hd, int batches) const {
  const int nb = batches < 0 ? B : batches;
  if (!head_major_hd) return view4(*this, 0, hd, C / hd, T, nb, C, int64_t(C) * T);
  if (hd != head_major_hd) throw Error("internal: a head-major activation viewed with another head size");
  const int r = head_row();
  return view4(*this, 0, r, C / r, T, nb, r, int64_t(C) * T, int64_t(T) * r);
}

}  // namespace halformer
