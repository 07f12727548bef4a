// The tuner's shared state: its options, one job per planned kernel (its tuning shapes,
// reference outputs, candidate queue and best so far) and the Tuner, whose methods live
// by concern: the search loop and measurements (search.cpp), calling a compiled
// candidate (compile.cpp), the next candidate (candidates.cpp) and the report
// (report.cpp). tuner.cpp is the command line; jobs.cpp makes the jobs from a plan.
#pragma once

#include "Halide.h"

#include <chrono>
#include <csignal>
#include <deque>
#include <map>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include <sys/stat.h>

#include "candidates.h"
#include "compile.h"
#include "kernel_io.h"
#include "plan.h"
#include "spec.h"
#include "tuning_db.h"

namespace halformer::tune {

using Clock = std::chrono::steady_clock;

// Set by SIGINT / SIGTERM (tuner.cpp): finish the current measurement and stop.
extern volatile std::sig_atomic_t g_stop;

// One shape of a job: its random inputs and the hand schedule's output on them.
struct ShapeData {
  Shape shape;
  std::map<std::string, Arg> inputs;
  Halide::Buffer<> ref;  // hand schedule output, CPU
  std::vector<int> out_extents;
};

// One kernel being tuned: its shapes, reference outputs, knobs and search state.
struct Job {
  const PlannedKernel* k = nullptr;
  std::string label;  // function name
  std::vector<KernelRole> roles;  // the roles bound to it (Plan::roles)
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

// The command line (tuner.cpp).
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

// The search over every job, within the time budget, recording into db_.
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
  std::string call(const Compiled& c, ShapeData& d, Halide::Buffer<>& out, int times = 1);
  Halide::Buffer<> make_output(const Compiled& c, const ShapeData& d) const;

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

// One job per kernel of the plan (already deduplicated by generator + params) whose
// function name contains o.kernel_filter: its tuning shapes (o.seq_lens x o.batch_sizes,
// else the spec's tuning section), correctness-only edge shapes and calls per pass.
std::vector<Job> make_jobs(const Options& o, const Spec& spec, const Plan& plan);

// "90s", "10m", "1h", "1m30s", "2.5m" in seconds (tuner.cpp); throws on anything else.
double parse_budget(const std::string& text);

// Text (report.cpp): an error message on one line, cut at 300 characters; the time now
// (UTC, ISO 8601); a fixed-point number; a duration as "1m05s".
std::string trim_msg(std::string s);
std::string now_utc();
std::string fmt(double v, int prec = 3);
std::string fmt_duration(double s);

}  // namespace halformer::tune
