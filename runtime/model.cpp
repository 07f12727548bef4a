// Stack assembly: embeddings, encoder and decoder layers, head and greedy decoding,
// each step a call into an ahead-of-time compiled Halide pipeline from the
// KernelTable. Activations are row-major [B][T][C] (Halide x(c, t, b), or x(c, m) with
// m = b*T + t); kernels read and write them through non-owning buffer views, which is
// also how the KV cache is addressed (strided rows of a [B][T_max][3d] buffer).
#include "halformer/model.h"

#include <HalideBuffer.h>
#include <HalideRuntime.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "halformer/error.h"
#include "halformer/packed_layout.h"
#include "halformer/weights.h"

namespace halformer {

// One Halide buffer per weight tensor for the model's lifetime: on a GPU device the
// first kernel that reads it copies it over once, and later calls find it there.
struct WeightBuffers {
  std::mutex lock;
  std::map<std::pair<const float*, int>, std::unique_ptr<Halide::Runtime::Buffer<float>>> bufs;
  // The tensor v as (inner, rows) -- 1-D when rows == 1 -- or, with panels > 0, as the
  // packed linear weight (kPanel, inner, panels).
  halide_buffer_t* get(const std::vector<float>& v, int inner, int rows, int panels = 0) {
    std::lock_guard<std::mutex> guard(lock);
    auto& b = bufs[{v.data(), rows}];
    if (!b) {
      halide_dimension_t dims[3] = {{0, inner, 1}, {0, rows, inner}, {0, 0, 0}};
      if (panels > 0)
        dims[0] = {0, kPanel, 1}, dims[1] = {0, inner, kPanel}, dims[2] = {0, panels, kPanel * inner};
      b = std::make_unique<Halide::Runtime::Buffer<float>>(const_cast<float*>(v.data()),
                                                           panels > 0 ? 3 : rows > 1 ? 2 : 1, dims);
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

const ModelConfig& C() { return halformer_model_config(); }
// The kernel table of the device the current Model call runs on (set by DeviceScope).
thread_local const KernelTable* g_kernels = nullptr;
const KernelTable& K() { return *g_kernels; }

thread_local WeightBuffers* g_weights = nullptr;  // the current Model's (set by DeviceScope)
// GPU: the device interface activations live on (null on the CPU) and the counters.
thread_local const halide_device_interface_t* g_iface = nullptr;
thread_local TransferStats* g_stats = nullptr;

struct DeviceScope {
  const KernelTable* saved_k;
  WeightBuffers* saved_w;
  const halide_device_interface_t* saved_i;
  TransferStats* saved_s;
  DeviceScope(const std::string& device, WeightBuffers* weights, DeviceState* state)
      : saved_k(g_kernels), saved_w(g_weights), saved_i(g_iface), saved_s(g_stats) {
    g_kernels = halformer_model_kernels_for(device.c_str());
    g_weights = weights;
    g_iface = device != "cpu" ? state->iface : nullptr;
    g_stats = &state->stats;
  }
  ~DeviceScope() {
    g_kernels = saved_k;
    g_weights = saved_w;
    g_iface = saved_i;
    g_stats = saved_s;
  }
};

double now_ms() {
  using namespace std::chrono;
  return duration<double, std::milli>(steady_clock::now().time_since_epoch()).count();
}

// HALFORMER_PROFILE=1: time every kernel call, print a per-kernel table at exit.
// On a GPU device, host<->device copies show up as "upload" / "download" and
// device-to-device copies as "device_copy".
struct Profile {
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
void sync_device_for_profile() {
  if (!g_iface) return;
  // Never freed: a destructor at process exit could outlive the device context.
  static thread_local Halide::Runtime::Buffer<float>* probe = nullptr;
  if (!probe || probe->raw_buffer()->device_interface != g_iface) {
    probe = new Halide::Runtime::Buffer<float>(1);
    if (probe->device_malloc(g_iface) != 0) return;
  }
  probe->device_sync();
}
struct KernelTimer {
  const char* name;
  double t0;
  explicit KernelTimer(const char* n) : name(n), t0(profile() ? (sync_device_for_profile(), now_ms()) : 0) {}
  ~KernelTimer() {
    if (Profile* p = profile()) {
      sync_device_for_profile();
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

// A weight tensor's buffer (see WeightBuffers::get). On a GPU device its first use uploads it (once per model).
halide_buffer_t* weight(const std::vector<float>& v, int inner, int rows, int panels = 0) {
  halide_buffer_t* b = g_weights->get(v, inner, rows, panels);
  if (g_iface && b->host_dirty()) {
    KernelTimer timer("upload");
    run(halide_copy_to_device(nullptr, b, g_iface), "weight upload");
    g_stats->weight_uploads += 1;
    g_stats->weight_upload_bytes += int64_t(b->size_in_bytes());
  }
  return b;
}

// A host input (token ids) sent to the device; a no-op on the CPU.
void upload(const IBuf& b) {
  if (!g_iface) return;
  KernelTimer timer("upload");
  IBuf& m = const_cast<IBuf&>(b);
  m.set_host_dirty();
  run(m.copy_to_device(g_iface), "upload");
  g_stats->uploads += 1;
  g_stats->upload_bytes += int64_t(m.size_in_bytes());
}

struct View;

// An activation [B][T][C] (or, for the KV cache, [B][T][C] rows of which a prefix of
// each is used). It owns one 1-D buffer of C*T*B floats: host memory on the CPU
// (zeroed, as before), device memory only on a GPU device -- no host allocation at
// all, so a host round trip of an intermediate cannot happen silently.
struct Act {
  int C = 0, T = 0, B = 0;
  Buf mem;
  Act() = default;
  Act(int c, int t, int b) : C(c), T(t), B(b) {
    const int64_t n = size();
    if (n == 0) return;
    if (!g_iface) {
      mem = Buf(int(n));
      std::memset(mem.data(), 0, size_t(n) * sizeof(float));
      return;
    }
    mem = Buf(static_cast<float*>(nullptr), int(n));
    run(mem.device_malloc(g_iface), "device allocation");
  }
  Act(Act&&) = default;
  Act& operator=(Act&&) = default;
  Act(const Act&) = delete;  // copies share storage: copy explicitly (copy_elems)
  Act& operator=(const Act&) = delete;
  int64_t size() const { return int64_t(C) * T * B; }
  // Host memory: the CPU only.
  float* host() const {
    if (g_iface) throw Error("internal: host access to a device-resident activation");
    return const_cast<Buf&>(mem).data();
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
  Buf keep, buf;
  halide_buffer_t* raw() { return buf.raw_buffer(); }
};

// kernel_arg: the view is passed to a kernel, where OpenCL makes a sub-buffer of it
// (offset must be aligned); views only copied between need no alignment.
View make_view(const Act& a, int64_t offset, int dims, const halide_dimension_t* d, bool kernel_arg = true) {
  if (!g_iface) return View{Buf(), Buf(a.host() + offset, dims, d)};
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
// (d, head, t, b) view of rows holding `nh` heads of `hd` features each.
View view4(const Act& a, int64_t offset, int hd, int nh, int t, int b, int64_t t_stride, int64_t b_stride) {
  halide_dimension_t dims[4] = {
      {0, hd, 1}, {0, nh, hd}, {0, t, int32_t(t_stride)}, {0, b, int32_t(b_stride)}};
  return make_view(a, offset, 4, dims);
}
View Act::flat() const { return view2(*this, 0, C, T * B, C); }
View Act::heads(int hd) const { return view4(*this, 0, hd, C / hd, T, B, C, int64_t(C) * T); }

// dst[dp, dp + n) = src[sp, sp + n): a host copy on the CPU, device to device on a GPU.
void copy_elems(const Act& src, int64_t sp, Act& dst, int64_t dp, int64_t n) {
  if (!g_iface) {
    std::copy_n(src.host() + sp, n, dst.host() + dp);
    return;
  }
  KernelTimer timer("device_copy");
  halide_dimension_t d[1] = {{0, int32_t(n), 1}};
  View s = make_view(src, sp, 1, d, false), t = make_view(dst, dp, 1, d, false);
  run(halide_buffer_copy(nullptr, s.raw(), g_iface, t.raw()), "device_copy");
  g_stats->device_copies += 1;
}

// An input activation written by host code (`fill` gets C*T*B floats to write): on
// the CPU straight into the activation, on a GPU device into host memory, then uploaded.
template <typename F>
Act make_input(int c, int t, int b, F fill) {
  Act a(c, t, b);
  if (!g_iface) {
    fill(a.host());
    return a;
  }
  std::vector<float> h(size_t(a.size()));
  fill(h.data());
  KernelTimer timer("upload");
  Buf hb(h.data(), int(h.size()));
  hb.set_host_dirty();
  halide_dimension_t d[1] = {{0, int32_t(a.size()), 1}};
  View v = make_view(a, 0, 1, d);
  run(halide_buffer_copy(nullptr, hb.raw_buffer(), g_iface, v.raw()), "upload");
  g_stats->uploads += 1;
  g_stats->upload_bytes += a.size() * int64_t(sizeof(float));
  return a;
}

// Elements [off, off + n) of an activation on the host: a copy on the CPU, a download
// (counted) on a GPU device.
std::vector<float> to_host(const Act& a, int64_t off, int64_t n) {
  if (!g_iface) return std::vector<float>(a.host() + off, a.host() + off + n);
  KernelTimer timer("download");
  std::vector<float> h(static_cast<size_t>(n));
  Buf hb(h.data(), int(n));
  halide_dimension_t d[1] = {{0, int32_t(n), 1}};
  View v = make_view(a, off, 1, d, false);
  run(halide_buffer_copy(nullptr, v.raw(), nullptr, hb.raw_buffer()), "download");
  g_stats->downloads += 1;
  g_stats->download_bytes += n * int64_t(sizeof(float));
  return h;
}
std::vector<float> to_host(const Act& a) { return to_host(a, 0, a.size()); }

// A kernel's small integer output (argmax ids) read by host code.
void download(IBuf& b, const char* what) {
  if (!g_iface) return;
  KernelTimer timer("download");
  if (b.copy_to_host() != 0)
    throw Error(std::string("kernel '") + what + "': copying the result from the device failed");
  g_stats->downloads += 1;
  g_stats->download_bytes += int64_t(b.size_in_bytes());
}

// ---- one call per layer kind
void linear(LinearFn fn, const char* name, View x, const LinearWeights& w, View out) {
  halide_buffer_t *wb = weight(w.w, w.in, w.out, panel_count(w.out)), *bb = weight(w.b, w.out, 1);
  KernelTimer timer(name);
  run(fn(x.raw(), wb, bb, out.raw()), name);
}
void linear_residual(LinearResidualFn fn, const char* name, View x, const LinearWeights& w, View residual,
                     View out) {
  halide_buffer_t *wb = weight(w.w, w.in, w.out, panel_count(w.out)), *bb = weight(w.b, w.out, 1);
  KernelTimer timer(name);
  run(fn(x.raw(), wb, bb, residual.raw(), out.raw()), name);
}
void layer_norm(const Act& x, const NormWeights& n, Act& out) {
  const int d = int(n.gamma.size());
  halide_buffer_t *gb = weight(n.gamma, d, 1), *bb = weight(n.beta, d, 1);
  KernelTimer timer("layer_norm");
  View xb = x.flat(), ob = out.flat();
  run(K().layer_norm(xb.raw(), gb, bb, ob.raw()), "layer_norm");
}
void attention(AttentionFn fn, const char* name, View q, View kv, View mask, View out) {
  KernelTimer timer(name);
  run(fn(q.raw(), kv.raw(), mask.raw(), out.raw()), name);
}

// Validates ids and lengths, then right-pads with pad_id into a (T, B) buffer.
IBuf pad_batch(const std::vector<Sequence>& seqs, int vocab, const std::string& what) {
  if (seqs.empty()) throw Error(what + ": empty batch (need at least one sequence)");
  size_t T = 0;
  for (size_t i = 0; i < seqs.size(); ++i) {
    const auto& s = seqs[i];
    std::string where = what + " sequence " + std::to_string(i + 1);
    if (s.empty()) throw Error(where + " is empty");
    if (int64_t(s.size()) > C().max_len)
      throw Error(where + " has " + std::to_string(s.size()) + " tokens; the model's max_len is " +
                  std::to_string(C().max_len));
    for (size_t j = 0; j < s.size(); ++j)
      if (s[j] < 0 || s[j] >= vocab)
        throw Error(where + ", token " + std::to_string(j + 1) + ": id " + std::to_string(s[j]) +
                    " is outside the vocabulary [0, " + std::to_string(vocab) + ")");
    T = std::max(T, s.size());
  }
  IBuf tokens(int(T), int(seqs.size()));
  tokens.fill(C().pad_id);
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
    if (C().padding_mask)
      for (size_t b = 0; b < seqs.size(); ++b)
        for (int t = int(seqs[b].size()); t < T; ++t) m[b * T + t] = kMasked;
  });
}

// Embedding (+ positions, + token types), then the embedding LayerNorm if any.
Act embed(EmbeddingFn fn, const IBuf& tokens, const std::vector<float>& table, int vocab,
          const Weights& w, int pos_offset, bool token_types) {
  const int d = C().d_model;
  Act x(d, tokens.dim(0).extent(), tokens.dim(1).extent());
  // Tables a kernel does not read (no learned positions / types) get the token table as
  // a stand-in.
  halide_buffer_t* tb = weight(table, d, vocab);
  halide_buffer_t* pb = w.positions.empty() ? tb : weight(w.positions, d, C().max_len);
  const bool types_read = token_types && !w.token_types.empty();
  halide_buffer_t* yb = types_read ? weight(w.token_types, d, C().type_vocab) : tb;
  IBuf types(x.T, x.B);
  types.fill(0);  // token type 0 for every token (single-segment inputs)
  halide_dimension_t dims[3] = {{0, d, 1}, {0, x.T, d}, {0, x.B, d * x.T}};
  View o3 = make_view(x, 0, 3, dims);
  upload(tokens);
  // The kernel reads type ids only with token types; otherwise (on a GPU, where an
  // upload would be wasted) the token ids stand in.
  if (token_types || !g_iface) upload(types);
  IBuf& tok = const_cast<IBuf&>(tokens);
  {
    KernelTimer timer("embedding");
    run(fn(tok.raw_buffer(), (token_types || !g_iface ? types : tok).raw_buffer(), tb, pb, yb, pos_offset,
           o3.raw()),
        "embedding");
  }
  if (C().embedding_norm) {
    Act y(x.C, x.T, x.B);
    layer_norm(x, w.embedding_norm, y);
    return y;
  }
  return x;
}

// x <- norm(x + f(x)) (post-norm) or x <- x + f(norm(x)) (pre-norm); `sublayer` writes
// f(input) + residual into its output buffer.
template <typename F>
void residual_block(Act& x, const NormWeights& n, F sublayer) {
  Act y(x.C, x.T, x.B);
  if (C().pre_norm) {
    Act h(x.C, x.T, x.B);
    layer_norm(x, n, h);
    sublayer(h, x, y);
    x = std::move(y);
  } else {
    sublayer(x, x, y);
    layer_norm(y, n, x);
  }
}

void feed_forward(Act& x, const LayerWeights& L) {
  residual_block(x, L.ff_norm, [&](const Act& h, const Act& res, Act& y) {
    Act mid(L.ff1.out, h.T, h.B);
    linear(K().ff1, "ff1", h.flat(), L.ff1, mid.flat());
    linear_residual(K().ff2, "ff2", mid.flat(), L.ff2, res.flat(), y.flat());
  });
}

// Self-attention over the whole sequence (no cache): encoder layers, teacher forcing.
void self_attention_block(Act& x, const LayerWeights& L, AttentionFn fn, const char* name, const Act& mask) {
  const int d = C().d_model, hd = d / C().heads;
  residual_block(x, L.self_norm, [&](const Act& h, const Act& res, Act& y) {
    Act qkv(3 * d, h.T, h.B), a(d, h.T, h.B);
    linear(K().qkv, "qkv", h.flat(), L.qkv, qkv.flat());
    attention(fn, name, qkv.heads(hd), qkv.heads(hd), mask.flat(), a.heads(hd));
    linear_residual(K().attention_out, "attention_out", a.flat(), L.attn_out, res.flat(), y.flat());
  });
}

void final_norm(Act& x, const NormWeights& n) {
  if (!C().final_norm) return;
  Act y(x.C, x.T, x.B);
  layer_norm(x, n, y);
  x = std::move(y);
}

Act run_encoder(const Weights& w, const IBuf& src, const Act& src_mask) {
  Act x = embed(K().embed_src, src, w.src_embedding, C().src_vocab, w, 0, C().type_vocab > 0);
  for (const auto& L : w.encoder) {
    self_attention_block(x, L, K().encoder_self_attention, "encoder_self_attention", src_mask);
    feed_forward(x, L);
  }
  final_norm(x, w.encoder_norm);
  return x;
}

// Cross-attention keys/values of one decoder layer: computed once per source.
Act cross_kv(const LayerWeights& L, const Act& memory) {
  Act kv(2 * C().d_model, memory.T, memory.B);
  linear(K().cross_kv, "cross_kv", memory.flat(), L.cross_kv, kv.flat());
  return kv;
}

void cross_block(Act& x, const LayerWeights& L, const Act& kv, const Act& src_mask) {
  const int d = C().d_model, hd = d / C().heads;
  residual_block(x, L.cross_norm, [&](const Act& h, const Act& res, Act& y) {
    Act q(d, h.T, h.B), a(d, h.T, h.B);
    linear(K().cross_q, "cross_q", h.flat(), L.cross_q, q.flat());
    attention(K().cross_attention, "cross_attention", q.heads(hd), kv.heads(hd), src_mask.flat(), a.heads(hd));
    linear_residual(K().attention_out, "cross_out", a.flat(), L.cross_out, res.flat(), y.flat());
  });
}

// Generator + softmax / log_softmax: `logits` gets the raw generator output, `out` the head's.
void head(const Act& x, const Weights& w, Act& logits, Act& out) {
  linear(K().generator, "generator", x.flat(), w.generator, logits.flat());
  KernelTimer timer("head");
  if (K().head) {
    View lb = logits.flat(), ob = out.flat();
    run(K().head(lb.raw(), ob.raw()), "head");
  } else {
    copy_elems(logits, 0, out, 0, logits.size());
  }
}

// Row-wise argmax of `rows` into `next`, which is then read on the host.
void argmax(const Act& rows, IBuf& next) {
  {
    KernelTimer timer("argmax");
    View rb = rows.flat();
    run(K().argmax(rb.raw(), next.raw_buffer()), "argmax");
  }
  download(next, "argmax");
}

Tensor to_tensor(const Act& a) { return Tensor{{a.B, a.T, a.C}, to_host(a)}; }

// Decoder state for incremental decoding over B rows: per layer, the QKV rows of every
// position so far ([B][Tmax][3d], the self-attention KV cache; on a GPU device each
// row padded to `row` = a multiple of kDeviceAlignFloats so that the rows of a step
// start aligned) and, for an encoder-decoder, the cross-attention keys/values of the
// memory.
struct DecoderState {
  int B = 0, Tmax = 0, len = 0, row = 0;
  std::vector<Act> cache, cross;
  Act src_mask;   // (S, B) additive, encoder-decoder only
  Act self_mask;  // (Tmax, B) zeros: generated positions are all real tokens

  DecoderState(const Weights& w, int B_, int Tmax_)
      : B(B_), Tmax(Tmax_), self_mask(make_input(Tmax_, B_, 1, [](float*) {})) {
    const int w3 = 3 * C().d_model;
    row = g_iface ? int((w3 + kDeviceAlignFloats - 1) / kDeviceAlignFloats * kDeviceAlignFloats) : w3;
    for (size_t l = 0; l < w.decoder.size(); ++l) cache.emplace_back(row, Tmax, B);
  }

  // Runs the decoder on `tokens` (T new positions; T > 1 only with B == 1) and returns
  // the last decoder hidden rows (d, T, B).
  Act step(const Weights& w, const IBuf& tokens) {
    const int d = C().d_model, hd = d / C().heads, H = C().heads, T = tokens.dim(0).extent();
    if (len + T > Tmax) throw Error("decoder cache overflow (internal)");
    Act x = embed(K().embed_tgt, tokens, w.tgt_embedding, C().tgt_vocab, w, len, false);
    const int64_t bstride = int64_t(row) * Tmax, at = int64_t(len) * row;
    for (size_t l = 0; l < w.decoder.size(); ++l) {
      const auto& L = w.decoder[l];
      const Act& c = cache[l];
      residual_block(x, L.self_norm, [&](const Act& h, const Act& res, Act& y) {
        Act a(d, T, B);
        // New QKV rows go straight into the cache: T rows of one sequence, or one row each of B.
        View out = T > 1 ? view2(c, at, 3 * d, T, row) : view2(c, at, 3 * d, B, bstride);
        linear(K().qkv, "qkv", h.flat(), L.qkv, out);
        attention(K().decoder_self_attention, "decoder_self_attention", view4(c, at, hd, 3 * H, T, B, row, bstride),
                  view4(c, 0, hd, 3 * H, len + T, B, row, bstride), view2(self_mask, 0, len + T, B, Tmax),
                  a.heads(hd));
        linear_residual(K().attention_out, "attention_out", a.flat(), L.attn_out, res.flat(), y.flat());
      });
      if (!cross.empty()) cross_block(x, L, cross[l], src_mask);
      feed_forward(x, L);
    }
    final_norm(x, w.decoder_norm);
    len += T;
    return x;
  }

  // Beam search: row b continues from row parent[b].
  void reorder(const std::vector<int>& parent) {
    const int64_t bstride = int64_t(row) * Tmax, used = int64_t(len) * row;
    for (auto& c : cache) {
      if (!g_iface) {
        std::vector<float> old(c.host(), c.host() + c.size());
        for (int b = 0; b < B; ++b)
          std::copy_n(old.data() + parent[b] * bstride, size_t(used), c.host() + b * bstride);
        continue;
      }
      // Device: gather the rows into a fresh cache, device to device.
      Act fresh(c.C, c.T, c.B);
      for (int b = 0; b < B; ++b) copy_elems(c, parent[b] * bstride, fresh, b * bstride, used);
      c = std::move(fresh);
    }
  }
};

// Rows of the last position of x (d, T, B) -> (d, 1, B).
Act last_rows(const Act& x, const std::vector<int>& last) {
  Act y(x.C, 1, x.B);
  for (int b = 0; b < x.B; ++b) copy_elems(x, (int64_t(b) * x.T + last[b]) * x.C, y, int64_t(b) * x.C, x.C);
  return y;
}

// Rows repeated: memory (C, S, B) -> (C, S, B * k), each batch entry k times.
Act repeat_rows(const Act& a, int k) {
  Act r(a.C, a.T, a.B * k);
  const int64_t n = int64_t(a.C) * a.T;
  for (int b = 0; b < a.B; ++b)
    for (int j = 0; j < k; ++j) copy_elems(a, b * n, r, (int64_t(b) * k + j) * n, n);
  return r;
}

}  // namespace

Model::Model(std::unique_ptr<Weights> w, std::string device)
    : weights_(std::move(w)),
      device_(std::move(device)),
      buffers_(std::make_unique<WeightBuffers>()),
      state_(std::make_unique<DeviceState>()) {}
Model::~Model() = default;
Model::Model(Model&&) noexcept = default;
Model& Model::operator=(Model&&) noexcept = default;

Model Model::load(const std::string& weights_path, int threads, const std::string& device) {
  if (!halformer_model_kernels_for(device.c_str()))
    throw Error("device '" + device + "': this model was built for: " + halformer_model_devices() +
                " (add it to the spec's targets, e.g. targets: [host, cuda], and rebuild)");
  if (threads > 0) halide_set_num_threads(threads);
  Model m(std::make_unique<Weights>(load_weights(C(), weights_path)), device);
  if (device != "cpu") {
    // Fail now, clearly, if the device cannot run a kernel (no driver, no device). The
    // probe runs on host buffers that Halide copies over; its output then carries the
    // device interface that every activation of this model is allocated with.
    DeviceScope scope(device, m.buffers_.get(), m.state_.get());
    const int d = C().d_model;
    Buf x(d, 1), y(d, 1), gamma(d), beta(d);
    x.fill(0.0f), gamma.fill(1.0f), beta.fill(0.0f);
    for (Buf* b : {&x, &gamma, &beta}) b->set_host_dirty();
    try {
      run(K().layer_norm(x.raw_buffer(), gamma.raw_buffer(), beta.raw_buffer(), y.raw_buffer()), "layer_norm");
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

const ModelConfig& Model::config() const { return C(); }

TransferStats Model::transfers() const { return state_->stats; }

Tensor Model::encode(const std::vector<Sequence>& src) const {
  DeviceScope scope(device_, buffers_.get(), state_.get());
  if (C().arch == Arch::Decoder) throw Error("encode: a decoder-only model has no encoder");
  IBuf s = pad_batch(src, C().src_vocab, "source");
  return to_tensor(run_encoder(*weights_, s, key_mask(src, s.dim(0).extent())));
}

Tensor Model::pooled(const std::vector<Sequence>& src) const {
  DeviceScope scope(device_, buffers_.get(), state_.get());
  if (!K().pool) throw Error("pooled: the model's head is not 'classifier' or 'embedding'");
  IBuf s = pad_batch(src, C().src_vocab, "source");
  Act x = run_encoder(*weights_, s, key_mask(src, s.dim(0).extent()));
  Act valid = make_input(x.T, x.B, 1, [&](float* v) {  // (T, B): 1 for a real token
    for (int b = 0; b < x.B; ++b)
      for (int t = 0; t < x.T; ++t) v[size_t(b) * x.T + t] = t < int(src[b].size()) ? 1.0f : 0.0f;
  });
  Act p(C().d_model, 1, x.B);
  halide_dimension_t dims[3] = {{0, x.C, 1}, {0, x.T, x.C}, {0, x.B, x.C * x.T}};
  {
    View x3 = make_view(x, 0, 3, dims), pb = view2(p, 0, p.C, x.B, p.C), vb = valid.flat();
    KernelTimer timer("pool");
    run(K().pool(x3.raw(), vb.raw(), pb.raw()), "pool");
  }
  if (C().head != HeadOutput::Classifier) return Tensor{{x.B, p.C}, to_host(p)};
  if (C().pooler) {
    Act q(p.C, 1, p.B);
    linear(K().pooler, "pooler", p.flat(), weights_->pooler, q.flat());
    p = std::move(q);
  }
  Act out(C().num_classes, 1, x.B);
  linear(K().classifier, "classifier", p.flat(), weights_->classifier, out.flat());
  return Tensor{{x.B, out.C}, to_host(out)};
}

namespace {
// The decoder over whole target sequences (teacher forcing / recomputation): head
// output (V, T, B). `cross` holds each layer's cross-attention K/V (empty for
// decoder-only models).
Act decoder_forward(const Weights& w, const std::vector<Sequence>& tgt, const std::vector<Act>& cross,
                    const Act& smask, const char* what) {
  IBuf t = pad_batch(tgt, C().tgt_vocab, what);
  Act tmask = key_mask(tgt, t.dim(0).extent());
  Act x = embed(K().embed_tgt, t, w.tgt_embedding, C().tgt_vocab, w, 0, false);
  for (size_t l = 0; l < w.decoder.size(); ++l) {
    const auto& L = w.decoder[l];
    self_attention_block(x, L, K().decoder_self_attention, "decoder_self_attention", tmask);
    if (!cross.empty()) cross_block(x, L, cross[l], smask);
    feed_forward(x, L);
  }
  final_norm(x, w.decoder_norm);
  Act logits(C().tgt_vocab, x.T, x.B), out(C().tgt_vocab, x.T, x.B);
  head(x, w, logits, out);
  return out;
}
}  // namespace

Tensor Model::score(const std::vector<Sequence>& src, const std::vector<Sequence>& tgt) const {
  DeviceScope scope(device_, buffers_.get(), state_.get());
  const Weights& w = *weights_;
  if (C().arch == Arch::Encoder) throw Error("score: an encoder-only model has no decoder");
  if (C().arch == Arch::Decoder) return to_tensor(decoder_forward(w, src, {}, Act(), "prompt"));
  if (src.size() != tgt.size())
    throw Error("score: " + std::to_string(src.size()) + " source sequences but " + std::to_string(tgt.size()) +
                " target sequences");
  IBuf s = pad_batch(src, C().src_vocab, "source");
  Act smask = key_mask(src, s.dim(0).extent());
  Act memory = run_encoder(w, s, smask);
  std::vector<Act> cross;
  for (const auto& L : w.decoder) cross.push_back(cross_kv(L, memory));
  return to_tensor(decoder_forward(w, tgt, cross, smask, "target"));
}

DecodeResult Model::greedy(const std::vector<Sequence>& src, int max_new_tokens, bool use_cache) const {
  DeviceScope scope(device_, buffers_.get(), state_.get());
  if (C().arch == Arch::Encoder) throw Error("greedy: an encoder-only model does not decode");
  if (max_new_tokens < 1 || max_new_tokens > C().max_len)
    throw Error("max_new_tokens " + std::to_string(max_new_tokens) + " is outside [1, max_len = " +
                std::to_string(C().max_len) + "]");
  const Weights& w = *weights_;
  const int V = C().tgt_vocab;
  DecodeResult r;

  if (C().arch == Arch::Decoder) {
    // Decoder-only: each prompt is continued on its own (prompts differ in length, so a
    // shared position per step would need left padding; one at a time keeps it exact).
    pad_batch(src, V, "prompt");  // validate the whole batch first
    r.last_logits = Tensor{{int64_t(src.size()), V}, std::vector<float>(src.size() * V)};
    for (size_t b = 0; b < src.size(); ++b) {
      const int P = int(src[b].size());
      if (P + max_new_tokens > C().max_len + 1)
        throw Error("prompt " + std::to_string(b + 1) + ": " + std::to_string(P) + " tokens + " +
                    std::to_string(max_new_tokens) + " new tokens exceed max_len " + std::to_string(C().max_len));
      Sequence seq = src[b];
      // GPU: each step's head output row stays on the device until the end.
      Act last = g_iface ? Act(V, 1, 1) : Act();
      DecoderState st(w, 1, P + max_new_tokens);
      Act logits(V, 1, 1), out(V, 1, 1);
      Halide::Runtime::Buffer<int32_t> next(1);
      for (int step = 0; step < max_new_tokens; ++step) {
        double ts = now_ms();
        if (use_cache) {
          // First step: the whole prompt fills the cache; then one new token per step.
          IBuf tok(step == 0 ? P : 1, 1);
          for (int i = 0; i < tok.dim(0).extent(); ++i) tok(i, 0) = seq[seq.size() - tok.dim(0).extent() + i];
          Act x = st.step(w, tok);
          head(last_rows(x, {x.T - 1}), w, logits, out);
        } else {
          Act all = decoder_forward(w, {seq}, {}, Act(), "prompt");  // the whole prefix again
          copy_elems(all, all.size() - V, out, 0, V);
        }
        argmax(out, next);
        double ms = now_ms() - ts;
        if (step == 0) r.encoder_ms += ms; else r.step_ms.push_back(ms);
        r.tokens.resize(src.size());
        r.tokens[b].push_back(next(0));
        seq.push_back(next(0));
        if (g_iface) copy_elems(out, 0, last, 0, V);
        else std::copy_n(out.host(), V, r.last_logits.data.begin() + b * V);
        if (next(0) == C().eos_id) break;
      }
      if (g_iface) {
        std::vector<float> h = to_host(last);
        std::copy(h.begin(), h.end(), r.last_logits.data.begin() + b * V);
      }
    }
    return r;
  }

  double t0 = now_ms();
  IBuf s = pad_batch(src, C().src_vocab, "source");
  const int B = s.dim(1).extent();
  DecoderState st(w, B, max_new_tokens);
  st.src_mask = key_mask(src, s.dim(0).extent());
  Act memory = run_encoder(w, s, st.src_mask);
  for (const auto& L : w.decoder) st.cross.push_back(cross_kv(L, memory));
  r.encoder_ms = now_ms() - t0;

  IBuf tok(1, B);
  tok.fill(C().bos_id);
  std::vector<Sequence> prefix(B, Sequence{int32_t(C().bos_id)});
  Act logits(V, 1, B), out(V, 1, B);
  Act last = g_iface ? Act(V, 1, B) : Act();  // GPU: last_logits rows stay on the device until the end
  Halide::Runtime::Buffer<int32_t> next(B);
  std::vector<bool> done(B, false);
  r.tokens.assign(B, {});
  r.last_logits = Tensor{{B, V}, std::vector<float>(size_t(B) * V)};
  for (int step = 0; step < max_new_tokens; ++step) {
    double ts = now_ms();
    if (use_cache) {
      Act x = st.step(w, tok);
      head(x, w, logits, out);
    } else {
      // Full recomputation of the decoder over the prefix (the encoder output and the
      // cross-attention K/V are per source and reused).
      Act all = decoder_forward(w, prefix, st.cross, st.src_mask, "target");
      const int T = all.T;
      for (int b = 0; b < B; ++b) copy_elems(all, (int64_t(b) * T + T - 1) * V, out, int64_t(b) * V, V);
    }
    argmax(out, next);
    if (g_iface)  // rows still decoding, one device copy per run of them
      for (int b0 = 0, b1; b0 < B; b0 = b1) {
        for (b1 = b0; b1 < B && !done[b1]; ++b1) {}
        if (b1 > b0) copy_elems(out, int64_t(b0) * V, last, int64_t(b0) * V, int64_t(b1 - b0) * V);
        else ++b1;
      }
    bool all_done = true;
    for (int b = 0; b < B; ++b) {
      if (!done[b]) {
        r.tokens[b].push_back(next(b));
        if (!g_iface) std::copy_n(out.host() + size_t(b) * V, V, r.last_logits.data.begin() + size_t(b) * V);
        done[b] = next(b) == C().eos_id;
      }
      all_done = all_done && done[b];
      tok(0, b) = next(b);
      prefix[b].push_back(next(b));
    }
    r.step_ms.push_back(now_ms() - ts);
    if (all_done) break;
  }
  if (g_iface) r.last_logits.data = to_host(last);
  return r;
}

BeamResult Model::beam_search(const std::vector<Sequence>& src, int K_beam, double alpha, int max_new_tokens) const {
  DeviceScope scope(device_, buffers_.get(), state_.get());
  if (C().arch != Arch::EncoderDecoder) throw Error("beam search needs an encoder-decoder model");
  if (K_beam < 1) throw Error("beam size " + std::to_string(K_beam) + " must be >= 1");
  if (max_new_tokens < 1 || max_new_tokens > C().max_len)
    throw Error("max_new_tokens " + std::to_string(max_new_tokens) + " is outside [1, max_len = " +
                std::to_string(C().max_len) + "]");
  const Weights& w = *weights_;
  const int V = C().tgt_vocab, eos = C().eos_id;
  BeamResult r;
  double t0 = now_ms();
  IBuf s = pad_batch(src, C().src_vocab, "source");
  const int B = s.dim(1).extent(), R = B * K_beam;  // R decoder rows: K per source
  Act smask = key_mask(src, s.dim(0).extent());
  Act memory = run_encoder(w, s, smask);
  DecoderState st(w, R, max_new_tokens);
  std::vector<Sequence> src_rep;  // each source once per beam row
  for (const auto& seq : src) src_rep.insert(src_rep.end(), K_beam, seq);
  st.src_mask = key_mask(src_rep, s.dim(0).extent());
  Act rep = repeat_rows(memory, K_beam);
  for (const auto& L : w.decoder) st.cross.push_back(cross_kv(L, rep));
  r.encoder_ms = now_ms() - t0;

  struct Hyp { Sequence tokens; double score; };
  std::vector<std::vector<Hyp>> live(B, std::vector<Hyp>{{{}, 0.0}}), finished(B);
  std::vector<bool> done(B, false);
  IBuf tok(1, R);
  tok.fill(C().bos_id);
  Act logits(V, 1, R), out(V, 1, R);
  std::vector<double> lp(V);
  for (int step = 0; step < max_new_tokens; ++step) {
    double ts = now_ms();
    Act x = st.step(w, tok);
    head(x, w, logits, out);
    // The host ranks candidates from the raw logits: on a GPU they come down once a step.
    std::vector<float> logits_h = g_iface ? to_host(logits) : std::vector<float>();
    const float* lg = g_iface ? logits_h.data() : logits.host();
    std::vector<int> parent(R);
    for (int b = 0; b < B; ++b) {
      for (int k = 0; k < K_beam; ++k) parent[b * K_beam + k] = b * K_beam;  // rows of finished sources
      if (done[b]) continue;
      // Candidates (score, hyp, token), best first; ties -> lower hyp, then lower token.
      struct Cand { double score; int hyp, token; };
      std::vector<Cand> cands;
      for (int i = 0; i < int(live[b].size()); ++i) {
        const float* row = lg + size_t(b * K_beam + i) * V;
        double mx = -std::numeric_limits<double>::infinity(), total = 0;
        for (int v = 0; v < V; ++v) mx = std::max(mx, double(row[v]));
        for (int v = 0; v < V; ++v) total += std::exp(double(row[v]) - mx);
        const double lse = mx + std::log(total);
        for (int v = 0; v < V; ++v) cands.push_back({live[b][i].score + (double(row[v]) - lse), i, v});
      }
      const size_t keep = std::min(cands.size(), size_t(2 * K_beam));
      std::partial_sort(cands.begin(), cands.begin() + keep, cands.end(), [](const Cand& a, const Cand& c) {
        if (a.score != c.score) return a.score > c.score;
        return a.hyp != c.hyp ? a.hyp < c.hyp : a.token < c.token;
      });
      std::vector<Hyp> next;
      std::vector<int> next_parent;
      for (size_t rank = 0; rank < keep && int(next.size()) < K_beam; ++rank) {
        const Cand& c = cands[rank];
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
      for (size_t k = next.size(); k < size_t(K_beam); ++k) tok(0, b * K_beam + int(k)) = C().pad_id;
      live[b] = std::move(next);
    }
    st.reorder(parent);
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

}  // namespace halformer
