// Transfers (see device.h): weights uploaded once per model, inputs up, results down,
// activation copies on the host or device to device -- each counted in TransferStats
// and timed by the profile.
#include "device.h"

#include <algorithm>
#include <string>

namespace halformer {

// A weight tensor's buffer (see WeightBuffers::get). On a GPU device its first use uploads it (once per model).
halide_buffer_t* DeviceContext::weight(const WeightVector<float>& v, int inner, int rows, int panel) {
  return uploaded(wbufs.get(v, inner, rows, panel));
}
halide_buffer_t* DeviceContext::uploaded(halide_buffer_t* b) {
  if (iface && b->host_dirty()) {
    KernelTimer timer("upload", iface);
    check_kernel(halide_copy_to_device(nullptr, b, iface), "weight upload");
    stats.weight_uploads += 1;
    stats.weight_upload_bytes += int64_t(b->size_in_bytes());
  }
  return b;
}

// A host input (token ids) sent to the device; a no-op on the CPU.
void DeviceContext::upload(const IBuf& b) {
  if (!iface) return;
  KernelTimer timer("upload", iface);
  IBuf& m = const_cast<IBuf&>(b);
  m.set_host_dirty();
  check_kernel(m.copy_to_device(iface), "upload");
  stats.uploads += 1;
  stats.upload_bytes += int64_t(m.size_in_bytes());
}

// dst[dp, dp + n) = src[sp, sp + n): a host copy on the CPU, device to device on a GPU.
void DeviceContext::copy_elems(const Array& src, int64_t sp, Array& dst, int64_t dp, int64_t n) {
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
  check_kernel(halide_buffer_copy(nullptr, s.raw(), iface, t.raw()), "device_copy");
  stats.device_copies += 1;
}

// `rows` runs of n elements: src at sp + i * src_stride, dst at dp + i * dst_stride (on a
// device one strided copy).
void DeviceContext::copy_rows(const Array& src, int64_t sp, int64_t src_stride, Array& dst, int64_t dp, int64_t dst_stride, int n,
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
  check_kernel(halide_buffer_copy(nullptr, s.raw(), iface, t.raw()), "device_copy");
  stats.device_copies += 1;
}

void DeviceContext::upload_floats(const std::vector<float>& h, Array& a) {
  KernelTimer timer("upload", iface);
  Buf hb(const_cast<float*>(h.data()), int(h.size()));
  hb.set_host_dirty();
  halide_dimension_t d[1] = {{0, int32_t(a.size()), 1}};
  View v = make_view(a, 0, 1, d);
  check_kernel(halide_buffer_copy(nullptr, hb.raw_buffer(), iface, v.raw()), "upload");
  stats.uploads += 1;
  stats.upload_bytes += a.size() * int64_t(sizeof(float));
}

// Elements [off, off + n) of an activation on the host: a copy on the CPU, a download
// (counted) on a GPU device.
std::vector<float> DeviceContext::to_host(const Array& a, int64_t off, int64_t n) {
  if (!iface) return std::vector<float>(a.host() + off, a.host() + off + n);
  KernelTimer timer("download", iface);
  std::vector<float> h(static_cast<size_t>(n));
  Buf hb(h.data(), int(n));
  halide_dimension_t d[1] = {{0, int32_t(n), 1}};
  View v = make_view(a, off, 1, d, false);
  check_kernel(halide_buffer_copy(nullptr, v.raw(), nullptr, hb.raw_buffer()), "download");
  stats.downloads += 1;
  stats.download_bytes += n * int64_t(sizeof(float));
  return h;
}
std::vector<float> DeviceContext::to_host(const Array& a) { return to_host(a, 0, a.size()); }

// A kernel's small integer output (argmax ids) read by host code.
void DeviceContext::download(IBuf& b, const char* what) {
  if (!iface) return;
  KernelTimer timer("download", iface);
  if (b.copy_to_host() != 0)
    throw Error(std::string("kernel '") + what + "': copying the result from the device failed");
  stats.downloads += 1;
  stats.download_bytes += int64_t(b.size_in_bytes());
}

}  // namespace halformer
