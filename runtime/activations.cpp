// Views over activations (see activations.h): host views on the CPU; on a GPU device,
// views sharing the activation's device memory (a device crop where they start inside it).
#include "activations.h"

#include <string>

namespace halformer {

// kernel_arg: the view is passed to a kernel, where OpenCL makes a sub-buffer of it
// (offset must be aligned); views only copied between need no alignment.
View make_view(const Array& a, int64_t offset, int dims, const halide_dimension_t* d, bool kernel_arg) {
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
View Array::heads(int hd) const {
  if (!head_major_hd) return view4(*this, 0, hd, C / hd, T, B, C, int64_t(C) * T);
  if (hd != head_major_hd) throw Error("internal: a head-major activation viewed with another head size");
  return view4(*this, 0, hd, C / hd, T, B, hd, int64_t(C) * T, int64_t(T) * hd);
}

}  // namespace halformer
