// The device a model runs on: its weight buffers (one Halide buffer per weight tensor,
// uploaded once on a GPU), its device interface and transfer counts, and DeviceContext,
// the one place host<->device and device<->device copies of activations are made and
// counted (TransferStats). On the CPU every transfer is a host copy or a no-op.
#pragma once

#include <HalideBuffer.h>
#include <HalideRuntime.h>

#include <map>
#include <memory>
#include <mutex>
#include <vector>

#include "activations.h"
#include "gpu_blas.h"
#include "halformer/model.h"
#include "halformer/packed_blocks.h"
#include "halformer/packed_layout.h"
#include "halformer/weights.h"
#include "profile.h"

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
  Views<uint8_t> block_bufs;
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
  // An int4 / q8_0 linear's weights (kBlockQuad, kBlockPanel, rows of 64 bytes); CPU only.
  halide_buffer_t* get_blocks(const LinearWeights& w) {
    const int rows = block_panel_count(w.out) * k_blocks(w.in) * w.block_format().rows_per_block();
    return view(block_bufs, w.blocks, {{0, kBlockQuad, 1}, {0, kBlockPanel, kBlockQuad}, {0, rows, kBlockQuad * kBlockPanel}});
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
  std::unique_ptr<GpuBlas> blas;  // CUDA: cuBLASLt for the many-row linears (null: Halide kernels only)
};

// One call's view of the device: its interface (null on the CPU), the model's weight
// buffers and transfer counts.
struct DeviceContext {
  const halide_device_interface_t* iface;  // null on the CPU
  TransferStats& stats;
  WeightBuffers& wbufs;
  GpuBlas* blas;  // null unless a CUDA model has cuBLASLt

  // A weight tensor's buffer (see WeightBuffers::get). On a GPU device its first use uploads it (once per model).
  halide_buffer_t* weight(const WeightVector<float>& v, int inner, int rows, int panel = 0);
  halide_buffer_t* uploaded(halide_buffer_t* b);
  // A host input (token ids) sent to the device; a no-op on the CPU.
  void upload(const IBuf& b);
  // dst[dp, dp + n) = src[sp, sp + n): a host copy on the CPU, device to device on a GPU.
  void copy_elems(const Array& src, int64_t sp, Array& dst, int64_t dp, int64_t n);
  // `rows` runs of n elements: src at sp + i * src_stride, dst at dp + i * dst_stride (on a
  // device one strided copy).
  void copy_rows(const Array& src, int64_t sp, int64_t src_stride, Array& dst, int64_t dp, int64_t dst_stride, int n,
                 int rows);
  // An input activation written by host code (`fill` gets C*T*B floats to write).
  template <typename F>
  Array make_input(int c, int t, int b, F fill);
  // Elements [off, off + n) of an activation on the host: a copy on the CPU, a download
  // (counted) on a GPU device.
  std::vector<float> to_host(const Array& a, int64_t off, int64_t n);
  std::vector<float> to_host(const Array& a);
  // A kernel's small integer output (argmax ids) read by host code.
  void download(IBuf& b, const char* what);

 private:
  void upload_floats(const std::vector<float>& h, Array& a);
};

// On the CPU straight into the activation, on a GPU device into host memory, then uploaded.
template <typename F>
Array DeviceContext::make_input(int c, int t, int b, F fill) {
  Array a(c, t, b, iface);
  if (!iface) {
    fill(a.host());
    return a;
  }
  std::vector<float> h(size_t(a.size()));
  fill(h.data());
  upload_floats(h, a);
  return a;
}

}  // namespace halformer
