// halformer-tune: searches schedules for the kernels of a spec on this machine and records
// every measurement in a tuning database (docs/tuning.md). Run as `halformer tune`.
//
// The layer generators are compiled into this program (they register themselves), so each
// candidate is the real generator with other GeneratorParams (or with a Halide
// autoscheduler), JIT-compiled, run on random inputs of each tuning shape, checked against
// the hand schedule's output (run on the CPU), and timed interleaved with the hand
// schedule (medians of several samples).
#include "Halide.h"
#include "cpu_features.h"  // request_amx_tile_state

#include <CLI/CLI.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <ctime>
#include <deque>
#include <functional>
#include <thread>
#include <filesystem>
#include <iostream>
#include <random>
#include <set>
#include <sstream>
#include <sys/stat.h>
#include <unistd.h>

#include "halformer/packed_layout.h"
#include "schedules/cpu_matmul.h"  // amx_tiles
#include "plan.h"
#include "spec.h"
#include "tuning_db.h"

#ifndef HALFORMER_HALIDE_PLUGIN_DIR
#define HALFORMER_HALIDE_PLUGIN_DIR ""
#endif

namespace {

using namespace Halide;
using halformer::Plan;
using halformer::PlannedKernel;
using halformer::Spec;
using namespace halformer::tune;
namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

volatile std::sig_atomic_t g_stop = 0;
extern "C" void on_sigint(int) {
  if (g_stop) _exit(130);  // second Ctrl-C: leave now (the database is already on disk)
  g_stop = 1;
  const char msg[] = "\n[tune] interrupted: finishing the current measurement (Ctrl-C again to quit now)\n";
  (void)!::write(2, msg, sizeof msg - 1);
}

// Halide compile errors become exceptions (not printed: a failing candidate is reported once).
struct QuietReporter : CompileTimeErrorReporter {
  void warning(const char*) override {}
  [[noreturn]] void error(const char* msg) override { throw std::runtime_error(msg); }
};

thread_local std::string g_jit_error;
void jit_error(JITUserContext*, const char* msg) { g_jit_error = msg; }
void jit_print(JITUserContext*, const char*) {}

std::string trim_msg(std::string s) {
  for (char& c : s)
    if (c == '\n' || c == '\r' || c == '\t') c = ' ';
  while (!s.empty() && s.back() == ' ') s.pop_back();
  if (s.size() > 300) s = s.substr(0, 300) + "...";
  return s;
}

std::string now_utc() {
  std::time_t t = std::time(nullptr);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&t));
  return buf;
}

std::string fmt(double v, int prec = 3) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", prec, v);
  return buf;
}

std::string fmt_duration(double s) {
  if (s < 0) s = 0;
  const int t = int(s + 0.5);
  char buf[32];
  if (t >= 60)
    std::snprintf(buf, sizeof buf, "%dm%02ds", t / 60, t % 60);
  else
    std::snprintf(buf, sizeof buf, "%ds", t);
  return buf;
}

double parse_budget(const std::string& text) {
  // 90, 90s, 10m, 1h, 1m30s, 2.5m
  double total = 0;
  size_t i = 0;
  bool any = false;
  while (i < text.size()) {
    size_t j = i;
    while (j < text.size() && (std::isdigit(static_cast<unsigned char>(text[j])) || text[j] == '.')) ++j;
    if (j == i) throw std::runtime_error("--budget '" + text + "': expected e.g. 90s, 10m, 1h or 1m30s");
    const double v = std::stod(text.substr(i, j - i));
    double unit = 1;
    if (j < text.size()) {
      const char u = text[j++];
      unit = u == 's' ? 1 : u == 'm' ? 60 : u == 'h' ? 3600 : -1;
      if (unit < 0) throw std::runtime_error("--budget '" + text + "': unknown unit '" + std::string(1, u) + "' (s, m, h)");
    }
    total += v * unit;
    any = true;
    i = j;
  }
  if (!any || total <= 0) throw std::runtime_error("--budget '" + text + "': must be > 0");
  return total;
}

// ---------------------------------------------------------------- where kernels are used

// Calls per encoder pass ("encode") and per decoded token ("decode") of each plan role.
std::map<std::string, std::pair<double, double>> role_counts(const Spec& s) {
  const double enc = double(s.encoder_layers), dec = double(s.decoder_layers);
  const bool cross = s.architecture == halformer::Architecture::EncoderDecoder;
  const bool dec_only = s.architecture == halformer::Architecture::Decoder;
  const double fin = s.final_norm ? 1 : 0;
  std::map<std::string, std::pair<double, double>> r{
      {"embed_src", {1, 0}},
      {"embed_tgt", {0, 1}},
      {"qkv", {enc, dec}},
      {"encoder_self_attention", {enc, 0}},
      {"decoder_self_attention", {0, dec}},
      {"cross_attention", {0, cross ? dec : 0}},
      {"cross_q", {0, cross ? dec : 0}},
      {"cross_kv", {cross ? dec : 0, 0}},
      {"attention_out", {enc, dec * (cross ? 2 : 1)}},
      {"ff1", {enc, dec}},
      {"ff2", {enc, dec}},
      {"layer_norm",
       {2 * enc + (enc > 0 ? fin : 0) + (s.embedding_norm ? 1 : 0), (cross ? 3 : 2) * dec + (dec > 0 ? fin : 0)}},
      {"generator", {0, 1}},
      {"head", {0, 1}},
      {"argmax", {0, 1}},
      {"pool", {1, 0}},
      {"pooler", {1, 0}},
      {"classifier", {1, 0}},
  };
  if (s.cache_precision() == halformer::Precision::Bf16) {  // the decoder's QKV into its bf16 cache
    r["qkv_cache"] = {0, dec};
    r["qkv"].second = 0;
  }
  if (dec_only)  // the prompt runs the decoder over whole sequences
    for (const char* role : {"embed_tgt", "qkv", "qkv_cache", "decoder_self_attention", "attention_out", "ff1", "ff2",
                             "layer_norm"})
      r[role].first = r[role].second;
  return r;
}

// ---------------------------------------------------------------- inputs of a kernel

struct Arg {
  Buffer<> buf;
  int32_t scalar = 0;
  bool is_buffer = true;
};

struct InputSpec {
  // Int8: quantized weights in [-127, 127]; Bf16: uniform values as bf16 bits
  enum Kind { Uniform, Tokens, Mask, Valid, Scalar, Int8, Bf16 } kind = Uniform;
  std::vector<int> extents;
  float scale = 1;
  int range = 1;       // Tokens: ids in [0, range)
  int32_t scalar = 0;  // Scalar
  std::string alias;   // same buffer as this input
  std::vector<int> storage_order;  // dimensions innermost first (empty: as listed)
  // Bf16: the element type the kernel reads (paired linear weights: bfloat16).
  halide_type_t bf16_type = halide_type_of<uint16_t>();
};

// A buffer of the spec's extents, laid out in its storage order.
template <typename T>
Buffer<T> allocate(const InputSpec& spec) {
  return spec.storage_order.empty() ? Buffer<T>(spec.extents) : Buffer<T>(spec.extents, spec.storage_order);
}

struct IoPlan {
  std::map<std::string, InputSpec> inputs;
  std::vector<int> out_extents;
};

int geti(const std::vector<std::pair<std::string, std::string>>& p, const std::string& k, int fallback) {
  for (const auto& [name, v] : p)
    if (name == k) return std::stoi(v);
  return fallback;
}
// A boolean GeneratorParam set to "true" (absent: false).
bool getb(const std::vector<std::pair<std::string, std::string>>& p, const std::string& k) {
  for (const auto& [name, v] : p)
    if (name == k) return v == "true";
  return false;
}

// linear and linear_bf16 (+ _residual, _gated): weights in the fp32 packed layout, whose
// panel width follows the target (halformer/packed_layout.h); int8 has its own layout.
bool reads_packed_panels(const std::string& generator) {
  return generator.rfind("linear", 0) == 0 && generator.rfind("linear_int8", 0) != 0;
}

// Shapes of every input and of the output for one tuning shape, as the runtime calls the
// kernel (runtime/model.cpp).
IoPlan io_plan(const PlannedKernel& k, const Shape& s, const Halide::Target& target) {
  const auto& p = k.params;
  const int B = s.batch, M = int(s.rows());
  const int T = s.phase == "decode" ? 1 : s.seq;  // new positions
  IoPlan io;
  auto uni = [](std::vector<int> e, float scale = 1) {
    InputSpec i;
    i.extents = std::move(e);
    i.scale = scale;
    return i;
  };
  const std::string& g = k.generator;
  if (reads_packed_panels(g)) {
    const int K = geti(p, "in_features", 64), N = geti(p, "out_features", 64);
    io.inputs["x"] = uni({K, M});
    const halformer::WeightLayout layout = halformer::weight_layout(target.to_string());  // packed_layout.h
    const int panel = layout.panel, panels = halformer::panel_count(N, panel);
    io.inputs["w"] = uni({panel, K, panels}, 1.0f / std::sqrt(float(K)));
    if (g.rfind("linear_bf16", 0) == 0) {
      io.inputs["w"].kind = InputSpec::Bf16;
      const halformer::Bf16WeightShape s = halformer::bf16_weight_shape(K, N, layout.bf16_panel(), layout.bf16_pairs);
      io.inputs["w"].extents = {s.pair, s.panel, s.rows()};
      io.inputs["w"].bf16_type = halformer::bf16_weight_type(layout.bf16_pairs);
    }
    io.inputs["b"] = uni({N}, 0.1f);
    io.inputs["residual"] = uni({N, M});
    io.out_extents = {N, M};
  } else if (g == "linear_int8" || g == "linear_int8_residual" || g == "linear_int8_gated") {
    const int K = geti(p, "in_features", 64), N = geti(p, "out_features", 64);
    io.inputs["x"] = uni({K, M});
    InputSpec w;  // halformer/packed_layout.h
    w.kind = InputSpec::Int8;
    const int G = halformer::int8_group(target.to_string(), getb(p, "int16_activations"));
    w.extents = {G, halformer::kInt8Panel, halformer::int8_groups(K, G) * halformer::int8_panel_count(N)};
    io.inputs["w"] = w;
    // bias | per-channel scale (| channel sum, quads) (signed here: any values work)
    io.inputs["b"] = uni({N, halformer::int8_bias_columns(G)}, 0.1f);
    io.inputs["residual"] = uni({N, M});
    io.out_extents = {N, M};
  } else if (g == "attention") {
    const int H = geti(p, "heads", 4), D = geti(p, "head_dim", 16);
    const int qh = geti(p, "q_head", 0), kh = geti(p, "k_head", H), vh = geti(p, "v_head", 2 * H);
    const int Tk = s.seq;
    const int kv_ext = std::max(kh, vh) + H;
    const int q_ext = kh > 0 ? std::max({qh, kh, vh}) + H : qh + H;  // self: one fused QKV buffer
    io.inputs["q"] = uni({D, q_ext, T, B});
    io.inputs["kv"] = uni({D, kv_ext, Tk, B});
    if (q_ext == kv_ext && T == Tk) io.inputs["kv"].alias = "q";
    // kv_bf16 (a bf16 cache's keys and values): bf16 bits on the CPU; GPU kernels keep fp32.
    // q_bf16 (a bf16 self-attention cache): the queries too.
    if (getb(p, "kv_bf16") && !target.has_gpu_feature()) io.inputs["kv"].kind = InputSpec::Bf16;
    if (getb(p, "q_bf16") && !target.has_gpu_feature()) io.inputs["q"].kind = InputSpec::Bf16;
    // Cross-attention (its own key/value buffer, keys from head 0): the CPU runtime stores
    // that cache head by head (Model::cross_kv), [sequence][head][position][features].
    if (kh == 0 && !target.has_gpu_feature()) io.inputs["kv"].storage_order = {0, 2, 1, 3};
    InputSpec mask;
    mask.kind = InputSpec::Mask;
    mask.extents = {Tk, B};
    io.inputs["key_mask"] = mask;
    // Relative position bias (T5): a (2M + 1, heads) table; 1 x 1, unread, without one.
    const int M = geti(p, "relative_distance", 0);
    io.inputs["position_bias"] = M > 0 ? uni({2 * M + 1, H}) : uni({1, 1});
    io.out_extents = {D, H, T, B};
  } else if (g == "layernorm") {
    const int C = geti(p, "channels", 64);
    io.inputs["x"] = uni({C, M}, 2);
    io.inputs["gamma"] = uni({C});
    io.inputs["beta"] = uni({C});
    io.out_extents = {C, M};
  } else if (g == "embedding") {
    const int C = geti(p, "channels", 64), V = geti(p, "vocab", 16), L = geti(p, "max_len", 64);
    const int TV = std::max(1, geti(p, "type_vocab", 0));
    InputSpec tok;
    tok.kind = InputSpec::Tokens;
    tok.extents = {T, B};
    tok.range = V;
    io.inputs["tokens"] = tok;
    tok.range = TV;
    io.inputs["type_ids"] = tok;
    io.inputs["table"] = uni({C, V});
    io.inputs["pos_table"] = uni({C, L});
    io.inputs["type_table"] = uni({C, TV});
    InputSpec off;
    off.kind = InputSpec::Scalar;
    off.scalar = s.phase == "decode" ? std::min(s.seq, L) - 1 : 0;
    io.inputs["pos_offset"] = off;
    io.out_extents = {C, T, B};
  } else if (g == "softmax") {
    const int V = geti(p, "classes", 16);
    io.inputs["x"] = uni({V, M}, 4);
    io.out_extents = {V, M};
  } else if (g == "argmax") {
    const int V = geti(p, "classes", 16);
    io.inputs["x"] = uni({V, M}, 4);
    io.out_extents = {M};
  } else if (g == "pooling") {
    const int C = geti(p, "channels", 64);
    io.inputs["x"] = uni({C, s.seq, B});
    InputSpec valid;
    valid.kind = InputSpec::Valid;
    valid.extents = {s.seq, B};
    io.inputs["valid"] = valid;
    io.out_extents = {C, B};
  } else {
    throw std::runtime_error("the tuner does not know the input shapes of generator '" + g + "'");
  }
  return io;
}

// ---------------------------------------------------------------- compiling and calling

struct Cand {
  std::string candidate = "hand";  // hand | knobs | adams2019 | ...
  Params knobs;
  std::string label() const {
    if (candidate != "knobs") return candidate;
    std::string s;
    for (const auto& [k, v] : knobs) s += (s.empty() ? "" : " ") + k + "=" + v;
    return s;
  }
  std::string key() const {
    std::string s = candidate + "{";
    for (const auto& [k, v] : knobs) s += k + "=" + v + ",";
    return s + "}";
  }
};

struct Compiled {
  Callable fn;
  std::vector<std::string> inputs;  // argument order
  Type out_type;
  int out_dims = 0;
};

Argument to_argument(const Parameter& p) {
  return Argument(p.name(), p.is_buffer() ? Argument::InputBuffer : Argument::InputScalar, p.type(), p.dimensions(),
                  p.get_argument_estimates());
}

Compiled compile(const PlannedKernel& k, const Cand& c, const Halide::Target& t) {
  AutoschedulerParams asp;
  if (c.knobs.count("autoscheduler")) {
    asp.name = c.knobs.at("autoscheduler");
    for (const auto& [name, v] : c.knobs)
      if (name.rfind("autoscheduler.", 0) == 0) asp.extra[name.substr(14)] = v;
  }
  GeneratorContext ctx(t, asp);
  Internal::AbstractGeneratorPtr gen = Internal::GeneratorRegistry::create(k.generator, ctx);
  if (!gen) throw std::runtime_error("generator '" + k.generator + "' is not compiled into the tuner");
  for (const auto& [name, v] : k.params)
    if (!c.knobs.count(name)) gen->set_generatorparam_value(name, v);
  for (const auto& [name, v] : c.knobs)
    if (name.rfind("autoscheduler", 0) != 0) gen->set_generatorparam_value(name, v);
  Pipeline pipe = gen->build_pipeline();
  if (!asp.name.empty()) pipe.apply_autoscheduler(t, asp);
  Compiled out;
  std::vector<Argument> args;
  for (const auto& a : gen->arginfos()) {
    if (a.dir == Internal::ArgInfoDirection::Input) {
      for (const auto& p : gen->input_parameter(a.name)) args.push_back(to_argument(p));
      out.inputs.push_back(a.name);
    } else {
      out.out_type = a.types.at(0);
      out.out_dims = a.dimensions;
    }
  }
  pipe.jit_handlers().custom_error = jit_error;
  pipe.jit_handlers().custom_print = jit_print;
  out.fn = pipe.compile_to_callable(args, t);
  return out;
}

// Calls a Callable with a run-time list of buffers and int32 scalars (inputs, then output).
template <size_t I = 0, typename... Done>
int call_callable(const Callable& c, const std::vector<Arg>& a, const Done&... done) {
  if constexpr (I == 8) {
    return c(done...);
  } else {
    if (I == a.size()) return c(done...);
    if (a[I].is_buffer) return call_callable<I + 1>(c, a, done..., a[I].buf);
    return call_callable<I + 1>(c, a, done..., a[I].scalar);
  }
}

// ---------------------------------------------------------------- tuning state

struct ShapeData {
  Shape shape;
  std::map<std::string, Arg> inputs;
  Buffer<> ref;  // hand schedule output, CPU
  std::vector<int> out_extents;
};

struct Job {
  const PlannedKernel* k = nullptr;
  std::string label;  // function name
  Params shape_params, hand_knobs;
  std::vector<Shape> shapes;
  std::pair<double, double> counts{0, 0};  // calls per encoder pass / per decoded token
  double weight = 0;
  std::vector<ShapeData> data;    // timed shapes
  std::vector<Shape> edge_shapes;  // awkward small shapes: correctness only
  std::vector<ShapeData> checks;
  std::optional<Compiled> hand;  // on the tuning target
  std::vector<Knob> knobs;       // this generator's knobs for the target (those it has)
  std::set<std::string> seen;    // candidate keys tried or queued
  std::deque<Cand> queue;
  Cand best;
  double best_speedup = 1.0;
  int done = 0, skipped = 0, wrong = 0, failed = 0;
  bool prepared = false, broken = false, exhausted = false;
  std::mt19937 rng;
};

struct Timing;

struct Options {
  std::string spec_path, target = "host", budget = "10m", db_path, kernel_filter, precision;
  bool report = false, no_autoschedulers = false;
  std::vector<int> seq_lens, batch_sizes;
  unsigned seed = 1;
  int min_samples = 5;
  int autoscheduler_beam = 1;
  double sample_seconds = 0.2;
  double tolerance = 1e-5;
};

class Tuner {
 public:
  Tuner(const Options& o, const Spec& spec, const Plan& plan) : opt_(o), spec_(spec), plan_(plan) {}

  int run();
  void print_report();

 private:
  // Measurement
  bool prepare(Job& j);
  void measure(Job& j, const Cand& c);
  std::optional<Cand> next_candidate(Job& j);
  Job* pick_job();
  bool all_shapes_in_db(const Job& j, const Cand& c) const;
  Entry make_entry(const Job& j, const Shape& s, const Cand& c) const;
  void record(const Entry& e);
  void save();
  double elapsed() const { return std::chrono::duration<double>(Clock::now() - start_).count(); }
  double left() const { return budget_s_ - elapsed(); }
  bool out_of_time() const { return g_stop || left() <= 0; }

  Timing time_pair(Job& j, const Compiled& comp, ShapeData& d, double seconds, int min_samples);
  // Callable on random inputs: 0 or the error.
  std::string call(const Compiled& c, ShapeData& d, Buffer<>& out, int times = 1);
  Buffer<> make_output(const Compiled& c, const ShapeData& d) const;

  const Options& opt_;
  const Spec& spec_;
  const Plan& plan_;
 public:
  Db db_;
  std::string fp_, target_name_;
  Halide::Target target_, host_;
  bool gpu_ = false;
  std::string parallelism_;
  double decode_tokens_ = 64;  // decoded tokens per encoder pass, for the search's priorities
  std::vector<Job> jobs_;
  std::vector<Cand> as_cands_;
 private:
  Clock::time_point start_ = Clock::now();
  double budget_s_ = 600;
  int measured_ = 0, skipped_ = 0;
  struct stat db_stat_ {};
  bool db_stat_valid_ = false;
};

Buffer<> Tuner::make_output(const Compiled& c, const ShapeData& d) const {
  Buffer<> out(c.out_type, d.out_extents);
  return out;
}

std::string Tuner::call(const Compiled& c, ShapeData& d, Buffer<>& out, int times) {
  std::vector<Arg> args;
  for (const auto& name : c.inputs) {
    auto it = d.inputs.find(name);
    if (it == d.inputs.end()) return "the tuner does not know how to make input '" + name + "'";
    args.push_back(it->second);
  }
  Arg o;
  o.buf = out;
  args.push_back(o);
  if (args.size() > 8) return "too many arguments for the tuner's caller";
  for (int i = 0; i < times; ++i) {
    g_jit_error.clear();
    int rc = call_callable(c.fn, args);
    if (rc != 0) return "runtime error " + std::to_string(rc) + ": " + trim_msg(g_jit_error);
  }
  if (gpu_) out.device_sync();
  return "";
}

// Relative error of `out` against the reference: max |a - r| / max(|r|, mean |r|).
double rel_error(const Buffer<>& a, const Buffer<>& r, std::string& why) {
  if (a.type() == Int(32)) {
    Buffer<int32_t> x(a), y(r);
    int64_t bad = 0;
    x.for_each_element([&](const int* pos) {
      if (x(pos) != y(pos)) ++bad;
    });
    if (bad) why = std::to_string(bad) + " elements differ";
    return bad ? 1.0 : 0.0;
  }
  if (a.type() == UInt(16)) {  // bf16 bits (out_bf16): compared widened
    std::vector<int> ext;
    for (int i = 0; i < a.dimensions(); ++i) ext.push_back(a.dim(i).extent());
    Buffer<float> fa(ext), fr(ext);
    Buffer<uint16_t> ua(a), ur(r);
    fa.for_each_element([&](const int* pos) { fa(pos) = halformer::from_bf16(ua(pos)); });
    fr.for_each_element([&](const int* pos) { fr(pos) = halformer::from_bf16(ur(pos)); });
    return rel_error(fa, fr, why);
  }
  Buffer<float> x(a), y(r);
  double mean = 0;
  int64_t n = 0;
  y.for_each_value([&](float v) { mean += std::fabs(v); ++n; });
  mean = n ? mean / double(n) : 0;
  double worst = 0;
  bool nan = false;
  x.for_each_element([&](const int* pos) {
    const double u = x(pos), v = y(pos);
    if (!std::isfinite(u) && std::isfinite(v)) nan = true;
    const double e = std::fabs(u - v) / std::max({std::fabs(v), mean, 1e-30});
    worst = std::max(worst, e);
  });
  if (nan) {
    why = "non-finite outputs";
    return INFINITY;
  }
  return worst;
}

bool Tuner::prepare(Job& j) {
  if (j.prepared) return !j.broken;
  j.prepared = true;
  const PlannedKernel& k = *j.k;
  try {
    Cand hand;
    // The CPU reference reads the weights in the tuned target's layout (its panel width).
    Cand ref_cand;
    if (gpu_ && reads_packed_panels(k.generator))
      ref_cand.knobs["panel"] = std::to_string(halformer::weight_panel(target_.to_string()));
    Compiled ref = compile(k, ref_cand, host_);
    j.hand = gpu_ ? compile(k, hand, target_) : ref;
    std::mt19937 rng(opt_.seed * 7919u + uint32_t(std::hash<std::string>()(j.label)));
    std::vector<Shape> all = j.shapes;
    all.insert(all.end(), j.edge_shapes.begin(), j.edge_shapes.end());
    for (const Shape& s : all) {
      ShapeData d;
      d.shape = s;
      IoPlan io = io_plan(k, s, target_);
      d.out_extents = io.out_extents;
      for (const auto& [name, spec] : io.inputs) {
        if (!spec.alias.empty()) continue;
        Arg a;
        if (spec.kind == InputSpec::Scalar) {
          a.is_buffer = false;
          a.scalar = spec.scalar;
        } else if (spec.kind == InputSpec::Int8) {
          Buffer<int8_t> b = allocate<int8_t>(spec);
          std::uniform_int_distribution<int> u(-127, 127);
          b.for_each_value([&](int8_t& v) { v = int8_t(u(rng)); });
          a.buf = b;
        } else if (spec.kind == InputSpec::Bf16) {
          Buffer<uint16_t> b = allocate<uint16_t>(spec);
          std::uniform_real_distribution<float> u(-1.0f, 1.0f);
          b.for_each_value([&](uint16_t& v) { v = halformer::to_bf16(u(rng) * spec.scale); });
          a.buf = b;
          a.buf.raw_buffer()->type = spec.bf16_type;
        } else if (spec.kind == InputSpec::Tokens) {
          Buffer<int32_t> b = allocate<int32_t>(spec);
          std::uniform_int_distribution<int> u(0, std::max(1, spec.range) - 1);
          b.for_each_value([&](int32_t& v) { v = u(rng); });
          a.buf = b;
        } else {
          Buffer<float> b = allocate<float>(spec);
          std::uniform_real_distribution<float> u(-1.0f, 1.0f);
          if (spec.kind == InputSpec::Uniform) {
            b.for_each_value([&](float& v) { v = u(rng) * spec.scale; });
          } else {  // Mask: the last eighth of the keys are padding; Valid: 1 except that tail
            const int n = spec.extents[0], cut = n - n / 8;
            b.for_each_element([&](const int* pos) {
              const bool pad = pos[0] >= cut && n > 1;
              b(pos) = spec.kind == InputSpec::Mask ? (pad ? -1e30f : 0.0f) : (pad ? 0.0f : 1.0f);
            });
          }
          a.buf = b;
        }
        if (a.is_buffer) a.buf.set_host_dirty();  // so GPU pipelines copy it to the device
        d.inputs[name] = a;
      }
      for (const auto& [name, spec] : io.inputs)
        if (!spec.alias.empty()) d.inputs[name] = d.inputs.at(spec.alias);
      d.ref = make_output(ref, d);
      const bool was_gpu = gpu_;
      gpu_ = false;
      std::string err = call(ref, d, d.ref);
      gpu_ = was_gpu;
      if (!err.empty()) throw std::runtime_error("hand schedule on the CPU (" + s.str() + "): " + err);
      (j.data.size() < j.shapes.size() ? j.data : j.checks).push_back(std::move(d));
    }
  } catch (const std::exception& e) {
    j.broken = true;
    std::cout << "[tune] " << j.label << ": cannot tune: " << trim_msg(e.what()) << std::endl;
    return false;
  }
  return true;
}

Entry Tuner::make_entry(const Job& j, const Shape& s, const Cand& c) const {
  Entry e;
  e.generator = j.k->generator;
  e.params = j.shape_params;
  e.target = target_name_;
  e.fingerprint = fp_;
  e.shape = s;
  e.candidate = c.candidate;
  e.knobs = c.candidate == "hand" ? j.hand_knobs : c.knobs;
  e.measured = now_utc();
  return e;
}

bool Tuner::all_shapes_in_db(const Job& j, const Cand& c) const {
  for (const Shape& s : j.shapes)
    if (!db_.find(make_entry(j, s, c).key())) return false;
  return true;
}

void Tuner::save() {
  // Another process (a second tuner) may have written the file: merge, ours win.
  struct stat st {};
  if (::stat(db_.path.c_str(), &st) == 0 &&
      (!db_stat_valid_ || st.st_mtim.tv_sec != db_stat_.st_mtim.tv_sec ||
       st.st_mtim.tv_nsec != db_stat_.st_mtim.tv_nsec || st.st_size != db_stat_.st_size)) {
    Db disk = load_db(db_.path);  // throws on a corrupt file: never overwrite it
    for (const auto& e : db_.entries) disk.upsert(e);
    disk.path = db_.path;
    db_ = std::move(disk);
  }
  write_db_atomic(db_, db_.path);
  db_stat_valid_ = ::stat(db_.path.c_str(), &db_stat_) == 0;
}

void Tuner::record(const Entry& e) {
  db_.upsert(e);
  save();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n == 0 ? 0 : n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// Times a candidate and the hand schedule interleaved on the same inputs: samples of
// `times` calls (>= ~0.5 ms) alternate c, h, c, h, ... so that load changes on a shared
// machine hit both; the speed-up is the median of the per-pair ratios h_i / c_i.
struct Timing {
  double cand = 0, hand = 0, speedup = 0;
  int samples = 0;
  std::string error;
};

Timing Tuner::time_pair(Job& j, const Compiled& comp, ShapeData& d, double seconds, int min_samples) {
  Timing t;
  Buffer<> out = make_output(comp, d), hout = make_output(*j.hand, d);
  auto sample = [&](const Compiled& f, Buffer<>& o, int times) {
    const auto s0 = Clock::now();
    std::string er = call(f, d, o, times);
    if (!er.empty()) throw std::runtime_error(er);
    return std::chrono::duration<double, std::milli>(Clock::now() - s0).count() / times;
  };
  try {
    sample(comp, out, 1), sample(*j.hand, hout, 1);  // warm up (device copies, caches)
    const double c1 = sample(comp, out, 1), h1 = sample(*j.hand, hout, 1);
    const int times = std::clamp(int(std::ceil(0.5 / std::max(1e-5, std::min(c1, h1)))), 1, 4000);
    std::vector<double> cs, hs, rs;
    const auto s0 = Clock::now();
    for (int i = 0; i < 101; ++i) {
      const bool hand_first = i % 2;  // alternate the order too
      double c, h;
      if (hand_first) {
        h = sample(*j.hand, hout, times);
        c = sample(comp, out, times);
      } else {
        c = sample(comp, out, times);
        h = sample(*j.hand, hout, times);
      }
      cs.push_back(c), hs.push_back(h), rs.push_back(h / c);
      const double spent = std::chrono::duration<double>(Clock::now() - s0).count();
      if (int(cs.size()) >= min_samples && (spent > seconds || g_stop)) break;
    }
    t.cand = median(cs);
    t.hand = median(hs);
    t.speedup = median(rs);
    t.samples = int(cs.size());
  } catch (const std::exception& ex) {
    t.error = trim_msg(ex.what());
  }
  return t;
}

void Tuner::measure(Job& j, const Cand& c) {
  std::optional<Compiled> comp;
  const auto t0 = Clock::now();
  std::string compile_error;
  try {
    comp = c.candidate == "hand" ? *j.hand : compile(*j.k, c, target_);
  } catch (const std::exception& e) {
    compile_error = trim_msg(e.what());
  }
  const double compile_s = std::chrono::duration<double>(Clock::now() - t0).count();
  // The runtime calls a kernel with any row count / sequence length: a candidate must also
  // be right on small awkward shapes (autoscheduled tails often assume the estimated size).
  std::string edge_error;
  if (compile_error.empty() && c.candidate != "hand") {
    for (ShapeData& d : j.checks) {
      Buffer<> out = make_output(*comp, d);
      std::string err = call(*comp, d, out);
      if (err.empty()) {
        if (gpu_) out.copy_to_host();
        std::string why;
        const double rel = rel_error(out, d.ref, why);
        if (!(rel <= opt_.tolerance))
          err = "max relative error " + (why.empty() ? fmt(rel, 9) : why) + " vs the hand schedule";
      }
      if (!err.empty()) {
        edge_error = "at " + d.shape.str() + " (rows " + std::to_string(d.shape.rows()) + "): " + err;
        break;
      }
    }
  }
  std::vector<Entry> entries;
  for (ShapeData& d : j.data) {
    Entry e = make_entry(j, d.shape, c);
    if (db_.find(e.key())) {
      ++skipped_;
      continue;  // resumed: measured before
    }
    if (!compile_error.empty()) {
      e.status = "failed";
      e.note = "compile: " + compile_error;
    } else if (!edge_error.empty() && !c.knobs.count("autoscheduler")) {
      e.status = "wrong";
      e.note = edge_error;
    } else {
      Buffer<> out = make_output(*comp, d);
      std::string err = call(*comp, d, out);
      if (!err.empty()) {
        e.status = "failed";
        e.note = err;
      } else {
        if (gpu_) out.copy_to_host();
        std::string why;
        const double rel = rel_error(out, d.ref, why);
        if (!(rel <= opt_.tolerance)) {
          e.status = "wrong";
          e.note = "max relative error " + (why.empty() ? fmt(rel, 9) : why) + " vs the hand schedule (tolerance " +
                   fmt(opt_.tolerance, 7) + ")";
        } else {
          Timing t = time_pair(j, *comp, d, opt_.sample_seconds, opt_.min_samples);
          if (!t.error.empty()) {
            e.status = "failed";
            e.note = t.error;
          } else {
            e.median_ms = t.cand, e.baseline_ms = t.hand, e.speedup = t.speedup, e.samples = t.samples;
          }
          // An autoscheduler schedule that is only wrong at the small shapes is still timed
          // here, for the report's comparison; it is never used.
          if (e.status == "ok" && !edge_error.empty()) {
            e.status = "wrong";
            e.note = edge_error + " (timed at this shape for comparison only)";
          }
        }
      }
    }
    record(e);
    ++measured_;
    entries.push_back(e);
    if (e.status == "wrong") ++j.wrong;
    if (e.status == "failed") ++j.failed;
    if (e.status != "ok" && (&d == &j.data.front() || e.note != entries.front().note))
      std::cout << "[tune]   " << j.label << " " << c.label() << ": " << e.status << ": " << e.note << "\n";
    if (g_stop) break;
  }
  ++j.done;
  auto score_of = [&](const std::vector<Entry>& es) {  // as choose() scores it
    std::vector<double> r;
    for (const auto& e : es) r.push_back(e.speedup);
    return candidate_score(r);
  };
  const bool all_ok = int(entries.size()) == int(j.data.size()) &&
                      std::all_of(entries.begin(), entries.end(), [](const Entry& e) { return e.status == "ok"; });
  std::string result;
  if (all_ok) {
    double s = score_of(entries);
    result = s > 0 ? fmt(s, 2) + "x" : "slower on a shape";
    // A new best is measured again, longer, before it counts: one lucky sample window on a
    // busy machine must not win.
    if (c.candidate != "hand" && s > j.best_speedup && s >= kMinSpeedup && !g_stop) {
      std::vector<Entry> again;
      for (ShapeData& d : j.data) {
        Timing t = time_pair(j, *comp, d, 3 * opt_.sample_seconds, 2 * opt_.min_samples);
        Entry e = make_entry(j, d.shape, c);
        if (!t.error.empty()) {
          e.status = "failed";
          e.note = t.error;
        } else {
          e.median_ms = t.cand, e.baseline_ms = t.hand, e.speedup = t.speedup, e.samples = t.samples;
        }
        record(e);
        again.push_back(e);
      }
      const bool ok2 = std::all_of(again.begin(), again.end(), [](const Entry& e) { return e.status == "ok"; });
      s = ok2 ? score_of(again) : 0;
      result += ", confirmed " + (ok2 ? fmt(s, 2) + "x" : std::string("failed"));
      entries = again;
    }
    if (c.candidate != "hand" && s > j.best_speedup) {
      j.best_speedup = s;
      j.best = c;
    }
  } else if (!entries.empty() && std::any_of(entries.begin(), entries.end(), [](const Entry& e) { return e.status == "ok"; })) {
    result = "partial";
  } else {
    result = !compile_error.empty() ? "compile failed" : entries.empty() ? "no new shapes" : "rejected";
  }
  std::string detail;
  for (const auto& e : entries)
    detail += (detail.empty() ? "" : ", ") + e.shape.phase + " " +
              (e.status == "ok" ? fmt(e.median_ms, 4) + "/" + fmt(e.baseline_ms, 4) + "ms" : e.status);
  int total_done = 0;
  for (const auto& jj : jobs_) total_done += jj.done;
  std::cout << "[tune " << total_done << " done, " << fmt_duration(left()) << " left] " << j.label << ": "
            << c.label() << " -> " << result << " (" << detail << "; compile " << fmt(compile_s, 1) << "s) | best "
            << (j.best.candidate == "hand" ? std::string("hand") : j.best.label() + " " + fmt(j.best_speedup, 2) + "x")
            << std::endl;
}

// Next candidate for a job: queued ones (autoschedulers, then neighbours of the hand
// schedule), then alternately a neighbour of the best so far and a random grid point.
std::optional<Cand> Tuner::next_candidate(Job& j) {
  auto fresh = [&](const Cand& c) { return !j.seen.count(c.key()); };
  while (!j.queue.empty()) {
    Cand c = j.queue.front();
    j.queue.pop_front();
    return c;
  }
  if (j.knobs.empty()) return std::nullopt;
  auto knobs_of = [&](const Cand& base) {
    Params p;
    for (const auto& kn : j.knobs) {
      auto it = base.knobs.find(kn.name);
      p[kn.name] = it != base.knobs.end() ? it->second
                   : j.hand_knobs.count(kn.name) ? j.hand_knobs.at(kn.name)
                                                 : kn.hand;
    }
    return p;
  };
  std::uniform_real_distribution<double> coin(0, 1);
  for (int attempt = 0; attempt < 200; ++attempt) {
    Cand c;
    c.candidate = "knobs";
    if (j.best.candidate == "knobs" && coin(j.rng) < 0.5) {
      c.knobs = knobs_of(j.best);
      const Knob& kn = j.knobs[std::uniform_int_distribution<size_t>(0, j.knobs.size() - 1)(j.rng)];
      auto pos = std::find(kn.values.begin(), kn.values.end(), c.knobs[kn.name]);
      long i = pos == kn.values.end() ? 0 : long(pos - kn.values.begin());
      i += coin(j.rng) < 0.5 ? -1 : 1;
      if (i < 0 || i >= long(kn.values.size())) continue;
      c.knobs[kn.name] = kn.values[size_t(i)];
    } else {
      for (const auto& kn : j.knobs)
        c.knobs[kn.name] = kn.values[std::uniform_int_distribution<size_t>(0, kn.values.size() - 1)(j.rng)];
    }
    if (fresh(c)) {
      j.seen.insert(c.key());
      return c;
    }
  }
  // Sampling keeps hitting tried points: walk the grid for any untried one.
  std::vector<size_t> idx(j.knobs.size(), 0);
  while (true) {
    Cand c;
    c.candidate = "knobs";
    for (size_t i = 0; i < j.knobs.size(); ++i) c.knobs[j.knobs[i].name] = j.knobs[i].values[idx[i]];
    if (fresh(c)) {
      j.seen.insert(c.key());
      return c;
    }
    size_t i = 0;
    while (i < idx.size() && ++idx[i] == j.knobs[i].values.size()) idx[i++] = 0;
    if (i == idx.size()) return std::nullopt;
  }
}

// Autoscheduler candidates first (every kernel gets them: the report compares with them),
// then the kernel with the largest share of the model's time per candidate tried so far.
Job* Tuner::pick_job() {
  Job* best = nullptr;
  double best_p = -1;
  for (auto& j : jobs_) {
    if (j.broken || j.exhausted) continue;
    const bool urgent = !j.queue.empty() && j.queue.front().candidate != "knobs";
    const double p = urgent ? 1e30 - double(j.done) : j.weight / (1.0 + j.done);
    if (p > best_p) {
      best_p = p;
      best = &j;
    }
  }
  return best;
}

int Tuner::run() {
  budget_s_ = parse_budget(opt_.budget);
  start_ = Clock::now();
  std::cout << "[tune] " << plan_.name << ": " << jobs_.size() << " kernels, target " << target_name_ << ", budget "
            << fmt_duration(budget_s_) << ", database " << db_.path << " (" << db_.entries.size() << " entries)\n"
            << "[tune] machine: " << fp_ << std::endl;

  // 1. Hand schedules: reference outputs, baselines, usage weights.
  for (auto& j : jobs_) {
    if (out_of_time()) break;
    Cand hand;
    if (!prepare(j)) continue;  // reference outputs: needed even when resuming
    if (!all_shapes_in_db(j, hand))
      measure(j, hand);
    else
      skipped_ += int(j.shapes.size());
    for (const Shape& s : j.shapes)
      if (const Entry* e = db_.find(make_entry(j, s, hand).key()); e && e->status == "ok")
        j.weight += e->median_ms * (s.phase == "encode" ? j.counts.first : j.counts.second * decode_tokens_);
  }

  // 2. Candidates until the budget is spent or every grid is exhausted.
  while (!out_of_time()) {
    Job* j = pick_job();
    if (!j) {
      std::cout << "[tune] every candidate of every kernel has been measured" << std::endl;
      break;
    }
    std::optional<Cand> c = next_candidate(*j);
    if (!c) {
      j->exhausted = true;
      continue;
    }
    j->seen.insert(c->key());
    if (all_shapes_in_db(*j, *c)) {  // resume: measured by an earlier run
      ++j->skipped;
      ++skipped_;
      std::vector<double> r;
      for (const Shape& s : j->shapes) {
        const Entry* e = db_.find(make_entry(*j, s, *c).key());
        if (e && e->status == "ok") r.push_back(e->ratio());
      }
      const double sc = r.size() == j->shapes.size() ? candidate_score(r) : 0;
      if (sc > j->best_speedup) {
        j->best_speedup = sc;
        j->best = *c;
      }
      continue;
    }
    measure(*j, *c);
  }
  const double spent = elapsed();
  std::cout << "[tune] " << (g_stop ? "interrupted after " : "done in ") << fmt_duration(spent) << ": " << measured_
            << " new measurements, " << skipped_ << " skipped (already in the database); database " << db_.path
            << " has " << db_.entries.size() << " entries" << std::endl;
  if (g_stop) std::cout << "[tune] rerun the same command to resume: finished measurements are kept" << std::endl;
  return 0;
}

// ---------------------------------------------------------------- report

void Tuner::print_report() {
  std::cout << "\nTuning report for " << plan_.name << " (target " << target_name_ << ", " << fp_ << ")\n";
  std::cout << "database " << db_.path << "; speed-up = hand / tuned, medians measured interleaved\n\n";
  char line[512];
  std::snprintf(line, sizeof line, "%-34s %-16s %10s %10s %8s %22s %9s  %s\n", "kernel", "shape", "hand ms",
                "tuned ms", "speedup", "best autosched ms", "tuned/AS", "winner (build uses)");
  std::cout << line;
  double enc_hand = 0, enc_tuned = 0, dec_hand = 0, dec_tuned = 0;
  bool starred = false;
  for (const auto& j : jobs_) {
    const Choice c = choose(db_, j.k->generator, j.shape_params, target_name_, fp_);
    std::string winner = c.tuned ? (c.candidate == "knobs" ? Cand{"knobs", c.knobs}.label() : c.candidate) : "hand";
    if (!c.tuned && c.reason.find("no entry") != std::string::npos) winner = "hand (not tuned yet)";
    int n_cands = 0;
    std::set<std::string> cands;
    for (const auto& e : db_.entries)
      if (e.generator == j.k->generator && e.params == j.shape_params && e.target == target_name_ &&
          e.fingerprint == fp_ && e.candidate != "hand")
        cands.insert(e.candidate_key());
    n_cands = int(cands.size());
    for (const Shape& s : j.shapes) {
      const Entry* hand = nullptr;
      const Entry* best_as = nullptr;
      for (const auto& e : db_.entries) {
        if (e.generator != j.k->generator || e.params != j.shape_params || e.target != target_name_ ||
            e.fingerprint != fp_ || !(e.shape == s) || e.ratio() <= 0)
          continue;
        if (e.candidate == "hand" && e.status == "ok") hand = &e;
        // The fastest autoscheduler result, including those wrong only at small shapes
        // (timed at this shape, marked *: a comparison, not a usable schedule).
        if (find_autoscheduler(e.candidate) && (!best_as || e.ratio() > best_as->ratio())) best_as = &e;
      }
      if (best_as && best_as->status != "ok") starred = true;
      const Entry* win = nullptr;
      for (const Entry* e : c.winner_entries)
        if (e->shape == s) win = e;
      // Times relative to this row's hand time (each candidate was timed next to the hand):
      // tuned = hand / paired speed-up.
      const double h = win ? win->baseline_ms : hand ? hand->median_ms : 0;
      const double t = win ? h / win->ratio() : h;
      const double as = best_as ? h / best_as->ratio() : 0;
      std::string as_s =
          best_as ? fmt(as, 4) + " (" + best_as->candidate + (best_as->status == "ok" ? ")" : ")*") : "-";
      std::snprintf(line, sizeof line, "%-34s %-16s %10s %10s %8s %22s %9s  %s\n", j.label.substr(0, 34).c_str(),
                    s.str().c_str(), h > 0 ? fmt(h, 4).c_str() : "-", t > 0 ? fmt(t, 4).c_str() : "-",
                    h > 0 && t > 0 ? (fmt(h / t, 2) + "x").c_str() : "-", as_s.c_str(),
                    best_as && t > 0 ? (fmt(as / t, 2) + "x").c_str() : "-",
                    (s == j.shapes.front() ? winner + " [" + std::to_string(n_cands) + " candidates]" : "").c_str());
      std::cout << line;
      if (h > 0 && t > 0) {
        if (s.phase == "encode" && s == j.shapes.front()) enc_hand += h * j.counts.first, enc_tuned += t * j.counts.first;
        if (s.phase == "decode") dec_hand += h * j.counts.second, dec_tuned += t * j.counts.second;
      }
    }
  }
  if (starred)
    std::cout << "* wrong at small row counts / sequence lengths (the schedule assumes the estimated size): "
                 "timed at the tuning shape for comparison, never used\n";
  if (enc_hand > 0)
    std::cout << "\nsum of kernel times per encoder pass (first encode shape, x calls per pass): hand "
              << fmt(enc_hand, 3) << " ms, tuned " << fmt(enc_tuned, 3) << " ms (" << fmt(enc_hand / enc_tuned, 2)
              << "x)\n";
  if (dec_hand > 0)
    std::cout << "sum of kernel times per decoded token (x calls per token): hand " << fmt(dec_hand, 3)
              << " ms, tuned " << fmt(dec_tuned, 3) << " ms (" << fmt(dec_hand / dec_tuned, 2) << "x)\n";
  if (target_name_ != "host")
    std::cout << "\nnote: OpenCL here runs on PoCL, a CPU device: these timings exercise the GPU code path only.\n"
                 "      CUDA timings need a GPU: run `halformer tune SPEC --target cuda` on a machine with one.\n";
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"halformer tune: search schedules for a spec's kernels on this machine and record them in a tuning database (docs/tuning.md)", "halformer tune"};
  Options o;
  app.add_option("SPEC", o.spec_path, "model spec (YAML)")->required();
  app.add_option("--target", o.target, "host (CPU), opencl (measured on the OpenCL device, PoCL here) or cuda")
      ->check(CLI::IsMember({"host", "opencl", "cuda"}));
  app.add_option("--budget", o.budget, "time budget, e.g. 90s, 10m, 1h (default 10m)");
  app.add_option("--db", o.db_path, "tuning database (default: the spec's tuning.db)");
  app.add_flag("--report", o.report, "print the per-kernel report from the database and exit (no measurement)");
  app.add_option("--seq-lens", o.seq_lens, "sequence lengths to tune for (default: the spec's tuning.seq_lens, else 128)")
      ->delimiter(',');
  app.add_option("--batch-sizes", o.batch_sizes, "batch sizes (default: the spec's tuning.batch_sizes, else 1)")
      ->delimiter(',');
  app.add_option("--kernel", o.kernel_filter, "only kernels whose name contains this text");
  app.add_option("--precision", o.precision, "tune the kernels of this precision instead of the spec's (as halformer build --precision)")
      ->check(CLI::IsMember({"fp32", "bf16", "int8"}));
  app.add_flag("--no-autoschedulers", o.no_autoschedulers, "only knob candidates");
  app.add_option("--autoscheduler-beam", o.autoscheduler_beam,
                 "beam size of Adams2019 / Anderson2021 (default 1: greedy; 32 is their own default, much slower)")
      ->check(CLI::Range(1, 64));
  app.add_option("--seed", o.seed, "random seed of the search and the inputs (default 1)");
  app.add_option("--min-samples", o.min_samples, "timing samples per measurement, at least (default 5)")
      ->check(CLI::Range(1, 1000));
  app.add_option("--sample-seconds", o.sample_seconds, "timing per shape and candidate, about (default 0.2)");
  app.add_option("--tolerance", o.tolerance, "max relative error vs the hand schedule (default 1e-5)");
  CLI11_PARSE(app, argc, argv);
  // Candidates built for AMX (Sapphire Rapids hosts) multiply in tile registers.
  if (std::string why = halformer::request_amx_tile_state(); !why.empty()) {
    std::cerr << "halformer tune: " << why << "\n";
    return 1;
  }

  halformer::ParseResult r = halformer::parse_spec_file(o.spec_path);
  for (const auto& d : r.diagnostics) std::cerr << d.str() << "\n";
  if (!r.ok()) return 1;
  if (!o.precision.empty()) r.spec->precision = *halformer::parse_precision(o.precision);
  const Spec& spec = *r.spec;
  auto unsupported = halformer::check_supported(spec);
  for (const auto& d : unsupported) std::cerr << d.str() << "\n";
  if (!unsupported.empty()) return 1;
  const Plan plan = halformer::make_plan(spec);

  if (o.db_path.empty()) {
    DbSource src = resolve_db(spec);
    if (src.path.empty() || src.origin == "--no-db") {
      std::cerr << "halformer tune: no tuning database: pass --db FILE or set tuning.db in " << o.spec_path
                << " (the tuner never writes next to your spec unless told to)\n";
      return 2;
    }
    o.db_path = src.path;
  }

  static QuietReporter reporter;
  set_custom_compile_time_error_reporter(&reporter);

  Tuner t(o, spec, plan);
  try {
    t.db_ = load_db(o.db_path);
  } catch (const DbError& e) {
    std::cerr << e.what() << "\nhalformer tune: refusing to touch a database it cannot read; fix it or use another --db\n";
    return 1;
  }
  t.db_.path = o.db_path;
  t.fp_ = host_fingerprint();
  t.host_ = get_jit_target_from_environment();
  t.decode_tokens_ = double(std::max<int64_t>(1, spec.max_new_tokens));
  t.parallelism_ = std::to_string(std::max(1u, std::thread::hardware_concurrency()));
  if (o.target == "host") {
    t.target_ = t.host_;
    t.target_name_ = "host";
  } else {
    t.gpu_ = true;
    // Named as the plan's device variant names it (tools/spec/plan.cpp), so builds find it.
    const std::string cap = "cuda_capability_" + std::to_string(halformer::halide_ptx_capability(spec.cuda_capability));
    t.target_name_ = o.target == "cuda" ? "host-cuda-" + cap : "host-opencl";
    t.target_ = Halide::Target(t.host_.to_string() + (o.target == "cuda" ? "-cuda-" + cap : "-opencl"));
    if (o.target == "opencl") setenv("HL_OCL_DEVICE_TYPE", "cpu", 0);  // PoCL is a CPU device
    if (!host_supports_target_device(t.target_)) {
      if (o.target == "cuda")
        std::cerr << "halformer tune: no CUDA device here: CUDA timings need an NVIDIA GPU. Run this on a machine\n"
                     "with one, or use --target opencl to exercise the GPU code path (PoCL measures on the CPU).\n";
      else
        std::cerr << "halformer tune: no OpenCL device found (install PoCL, or check HL_OCL_DEVICE_TYPE)\n";
      return 3;
    }
    if (o.target == "opencl")
      std::cout << "[tune] note: OpenCL runs on PoCL here (a CPU device): this exercises the GPU code path;\n"
                   "[tune]       its timings say nothing about a real GPU. CUDA timings need a GPU.\n";
  }

  // Shapes.
  std::vector<int> seqs = o.seq_lens, batches = o.batch_sizes;
  if (seqs.empty())
    for (auto v : spec.tuning_seq_lens) seqs.push_back(int(v));
  if (batches.empty())
    for (auto v : spec.tuning_batch_sizes) batches.push_back(int(v));
  if (seqs.empty()) seqs = {int(std::min<int64_t>(128, spec.max_len))};
  if (batches.empty()) batches = {1};
  for (int& s : seqs) s = int(std::min<int64_t>(s, spec.max_len));
  const int max_seq = *std::max_element(seqs.begin(), seqs.end());

  // Autoscheduler plugins.
  const std::string plugin_dir = HALFORMER_HALIDE_PLUGIN_DIR;
  if (!o.no_autoschedulers && !o.report) {
    for (const auto& a : autoschedulers()) {
      if (a.gpu != t.gpu_ && !(t.gpu_ && a.name == "Li2018")) continue;
      const std::string path = (fs::path(plugin_dir) / a.plugin).string();
      try {
        if (!fs::exists(path)) throw std::runtime_error("not found");
        load_plugin(path);
        Cand c;
        c.candidate = a.name;
        for (char& ch : c.candidate) ch = char(std::tolower(static_cast<unsigned char>(ch)));
        c.knobs["autoscheduler"] = a.name;
        c.knobs["autoscheduler.parallelism"] = t.parallelism_;
        // Adams2019 / Anderson2021 search with a beam (default 32): minutes per kernel. The
        // greedy search (beam 1) fits a tuning budget; --autoscheduler-beam raises it.
        if (a.name == "Adams2019" || a.name == "Anderson2021")
          c.knobs["autoscheduler.beam_size"] = std::to_string(o.autoscheduler_beam);
        t.as_cands_.push_back(c);
      } catch (const std::exception& e) {
        std::cout << "[tune] autoscheduler " << a.name << " unavailable (" << path << ": " << trim_msg(e.what())
                  << ")\n";
      }
    }
  }

  // Jobs: one per kernel of the plan (the plan is already deduplicated by generator + params).
  const auto counts = role_counts(spec);
  std::mt19937 seed_rng(o.seed);
  for (const auto& k : plan.kernels) {
    if (!o.kernel_filter.empty() && k.function.find(o.kernel_filter) == std::string::npos) continue;
    Job j;
    j.k = &k;
    j.label = k.function;
    j.shape_params = shape_params(k.generator, k.params);
    j.hand_knobs = knob_params(k.generator, k.params);
    for (const auto& [role, fn] : plan.roles) {
      if (fn != k.function) continue;
      auto it = counts.find(role);
      if (it == counts.end()) {
        j.counts.first += 1, j.counts.second += 1;
      } else {
        j.counts.first += it->second.first;
        j.counts.second += it->second.second;
      }
    }
    if (j.counts.first == 0 && j.counts.second == 0) j.counts = {1, 1};
    if (j.counts.first > 0)
      for (int s : seqs)
        for (int b : batches) j.shapes.push_back(Shape{"encode", b, s});
    if (j.counts.second > 0 && k.generator != "pooling")
      for (int b : batches) j.shapes.push_back(Shape{"decode", b, max_seq});
    // Correctness-only shapes: one row, odd row counts, several sequences, short key ranges.
    for (const Shape& e : {Shape{"encode", 1, 1}, Shape{"encode", 1, 3}, Shape{"encode", 2, 5},
                           Shape{"encode", 1, 37}, Shape{"decode", 1, 1}, Shape{"decode", 3, 6}}) {
      Shape x = e;
      x.seq = int(std::min<int64_t>(x.seq, spec.max_len));
      if (k.generator == "pooling" && x.phase == "decode") continue;
      if (std::find(j.shapes.begin(), j.shapes.end(), x) == j.shapes.end() &&
          std::find(j.edge_shapes.begin(), j.edge_shapes.end(), x) == j.edge_shapes.end())
        j.edge_shapes.push_back(x);
    }
    j.rng.seed(seed_rng());
    t.jobs_.push_back(std::move(j));
  }
  if (t.jobs_.empty()) {
    std::cerr << "halformer tune: no kernel matches --kernel " << o.kernel_filter << "\n";
    return 2;
  }

  if (o.report) {
    t.print_report();
    return 0;
  }

  // Knobs each generator really has (probe: an unknown GeneratorParam is an error).
  for (auto& j : t.jobs_) {
    const auto& table = t.gpu_ ? gpu_knobs(j.k->generator) : cpu_knobs(j.k->generator);
    for (const auto& kn : table) {
      // The AMX knob changes nothing where the kernels get no tiles.
      if (kn.name == "amx" && !halformer::amx_tiles(t.target_)) continue;
      try {
        auto gen = Internal::GeneratorRegistry::create(j.k->generator, GeneratorContext(t.host_));
        if (!gen) break;
        gen->set_generatorparam_value(kn.name, kn.values.front());
        j.knobs.push_back(kn);
      } catch (const std::exception&) {
        std::cout << "[tune] " << j.k->generator << " has no knob " << kn.name << "; not searched\n";
      }
    }
    for (const auto& c : t.as_cands_) {
      j.queue.push_back(c);
      j.seen.insert(c.key());
    }
    // Neighbours of the hand schedule: one knob moved by one step.
    std::vector<Cand> near;
    Params hand;
    for (const auto& kn : j.knobs)
      hand[kn.name] = j.hand_knobs.count(kn.name) ? j.hand_knobs.at(kn.name) : kn.hand;
    for (const auto& kn : j.knobs) {
      auto pos = std::find(kn.values.begin(), kn.values.end(), hand[kn.name]);
      if (pos == kn.values.end()) continue;
      for (long d : {-1L, 1L}) {
        const long i = long(pos - kn.values.begin()) + d;
        if (i < 0 || i >= long(kn.values.size())) continue;
        Cand c;
        c.candidate = "knobs";
        c.knobs = hand;
        c.knobs[kn.name] = kn.values[size_t(i)];
        near.push_back(c);
      }
    }
    std::shuffle(near.begin(), near.end(), j.rng);
    for (auto& c : near) {
      j.queue.push_back(c);
      j.seen.insert(c.key());
    }
    Cand hand_as_knobs;  // the hand schedule's own values are the hand candidate
    hand_as_knobs.candidate = "knobs";
    hand_as_knobs.knobs = hand;
    j.seen.insert(hand_as_knobs.key());
  }

  std::signal(SIGINT, on_sigint);
  std::signal(SIGTERM, on_sigint);
  int rc = 0;
  try {
    rc = t.run();
  } catch (const DbError& e) {
    std::cerr << e.what() << "\nhalformer tune: stopped; the measurements before this point are in the database\n";
    return 1;
  }
  t.print_report();
  return rc;
}
