// Compiling and calling candidates (compile.h): the generator's pipeline with a
// candidate's schedule JIT-compiled to a Callable, the call with the tuner's synthesised
// inputs, and the comparison of its output with the hand schedule's.
#include "compile.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>

#include "halformer/packed_layout.h"
#include "tuner.h"

namespace halformer::tune {

using namespace Halide;

namespace {

// Halide compile errors become exceptions (not printed: a failing candidate is reported once).
struct QuietReporter : CompileTimeErrorReporter {
  void warning(const char*) override {}
  [[noreturn]] void error(const char* msg) override { throw std::runtime_error(msg); }
};

thread_local std::string g_jit_error;
void jit_error(JITUserContext*, const char* msg) { g_jit_error = msg; }
void jit_print(JITUserContext*, const char*) {}

Argument to_argument(const Parameter& p) {
  return Argument(p.name(), p.is_buffer() ? Argument::InputBuffer : Argument::InputScalar, p.type(), p.dimensions(),
                  p.get_argument_estimates());
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

}  // namespace

void quiet_compile_errors() {
  static QuietReporter reporter;
  set_custom_compile_time_error_reporter(&reporter);
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

}  // namespace halformer::tune
