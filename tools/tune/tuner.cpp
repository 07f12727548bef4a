// halformer-tune: searches schedules for the kernels of a spec on this machine and records
// every measurement in a tuning database (docs/tuning.md). Run as `halformer tune`.
//
// The layer generators are compiled into this program (they register themselves), so each
// candidate is the real generator with other GeneratorParams (or with a Halide
// autoscheduler), JIT-compiled, run on random inputs of each tuning shape, checked against
// the hand schedule's output (run on the CPU), and timed interleaved with the hand
// schedule (medians of several samples).
//
// This file is the command line: options, the spec and its plan, the target, then the
// jobs (jobs.cpp), their candidates (candidates.cpp), the search (search.cpp) and the
// report (report.cpp). The inputs each kernel is fed are in kernel_io.cpp.
#include "Halide.h"
#include "cpu_features.h"  // request_amx_tile_state

#include <CLI/CLI.hpp>

#include <algorithm>
#include <cctype>
#include <csignal>
#include <cstdlib>
#include <iostream>
#include <stdexcept>
#include <string>
#include <thread>
#include <unistd.h>

#include "tuner.h"

#ifndef HALFORMER_HALIDE_PLUGIN_DIR
#define HALFORMER_HALIDE_PLUGIN_DIR ""
#endif

namespace halformer::tune {

volatile std::sig_atomic_t g_stop = 0;

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

}  // namespace halformer::tune

namespace {

using namespace Halide;
using halformer::Plan;
using halformer::Spec;
using namespace halformer::tune;

extern "C" void on_sigint(int) {
  if (g_stop) _exit(130);  // second Ctrl-C: leave now (the database is already on disk)
  g_stop = 1;
  const char msg[] = "\n[tune] interrupted: finishing the current measurement (Ctrl-C again to quit now)\n";
  (void)!::write(2, msg, sizeof msg - 1);
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

  quiet_compile_errors();

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

  // Autoscheduler plugins.
  const std::string plugin_dir = HALFORMER_HALIDE_PLUGIN_DIR;
  if (!o.no_autoschedulers && !o.report)
    t.as_cands_ = autoscheduler_candidates(t.gpu_, plugin_dir, t.parallelism_, o.autoscheduler_beam);

  // Jobs: one per kernel of the plan (the plan is already deduplicated by generator + params).
  t.jobs_ = make_jobs(o, spec, plan);
  if (t.jobs_.empty()) {
    std::cerr << "halformer tune: no kernel matches --kernel " << o.kernel_filter << "\n";
    return 2;
  }

  if (o.report) {
    t.print_report();
    return 0;
  }

  // Knobs each generator really has, and the first candidates.
  for (auto& j : t.jobs_) seed_candidates(j, t.as_cands_, t.gpu_, t.target_, t.host_);

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
