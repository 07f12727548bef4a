// The tuning database: what `halformer tune` measured, and how `halformer build` uses it.
//
// A database is one human-readable YAML file (format: docs/tuning.md). Each entry is one
// measurement: a kernel (generator + its non-knob GeneratorParams, i.e. its baked shape),
// a tuning shape (rows of the call), a target, a machine fingerprint, a candidate schedule
// (the hand schedule, a set of knob values, or a Halide autoscheduler) and its median time
// next to the hand schedule's median measured in the same session.
//
// Writes are atomic (temporary file + rename) and merge with what is on disk: entries of
// other kernels, machines or targets are kept; an entry with the same key is replaced by
// the newer measurement. A file that cannot be read is never overwritten.
//
// This library has no Halide dependency: the CLI links it to apply a database to a plan.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "plan.h"

namespace halformer::tune {

using Params = std::map<std::string, std::string>;  // name -> value, ordered by name

// ---------------------------------------------------------------- knobs and candidates

// One schedule knob of a generator and the values the tuner tries (in "adjacent" order:
// neighbours in this list are neighbours in the search).
struct Knob {
  std::string name;
  std::vector<std::string> values;
  std::string hand;  // the generator's default (the hand schedule), for reports only
};

// Knobs per generator for CPU targets and for GPU targets (CUDA / OpenCL).
const std::vector<Knob>& cpu_knobs(const std::string& generator);
const std::vector<Knob>& gpu_knobs(const std::string& generator);

// True when `param` of `generator` is a schedule knob (or an autoscheduler setting)
// rather than a shape/algorithm parameter.
bool is_knob(const std::string& generator, const std::string& param);

// Halide autoschedulers the tuner can try: name as Halide registers it ("Adams2019") and
// the plugin library's file name ("libautoschedule_adams2019.so").
struct Autoscheduler {
  std::string name;
  std::string plugin;
  bool gpu;  // for GPU targets (else CPU)
};
const std::vector<Autoscheduler>& autoschedulers();
const Autoscheduler* find_autoscheduler(const std::string& name);  // case-insensitive

// ---------------------------------------------------------------- shapes

// A tuning shape: "encode" runs a whole sequence (rows = batch * seq; attention over seq
// keys), "decode" one new token per sequence (rows = batch; attention of 1 query over seq
// cached keys).
struct Shape {
  std::string phase = "encode";
  int batch = 1;
  int seq = 128;
  int64_t rows() const { return phase == "decode" ? batch : int64_t(batch) * seq; }
  std::string str() const;  // "encode b1 s128"
  bool operator<(const Shape& o) const;
  bool operator==(const Shape& o) const;
};

// ---------------------------------------------------------------- entries, database

struct Entry {
  std::string generator;
  Params params;  // non-knob GeneratorParams (the kernel's baked shape)
  std::string target;       // Halide target the kernel was measured for: host, host-opencl, ...
  std::string fingerprint;  // machine (see host_fingerprint())
  Shape shape;
  std::string candidate;    // hand | knobs | adams2019 | mullapudi2016 | li2018 | anderson2021
  Params knobs;             // knob values (autoscheduler=..., autoscheduler.* for autoschedulers)
  std::string status = "ok";  // ok | wrong (output differs from the hand schedule) | failed
  double median_ms = 0;       // candidate median
  double baseline_ms = 0;     // hand schedule median, measured interleaved with the candidate
  double speedup = 0;         // median of the per-sample ratios hand / candidate (robust to load)
  double ratio() const { return speedup > 0 ? speedup : median_ms > 0 ? baseline_ms / median_ms : 0; }
  int samples = 0;
  std::string note;      // why wrong / failed
  std::string measured;  // UTC time, ISO 8601
  int line = 0;          // where it was read from (0 = not read from a file)

  // Identity: everything but the measurement.
  std::string key() const;
  std::string candidate_key() const;  // candidate + knobs
};

class DbError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;  // message is "file:line:column: error: ..."
};

struct Db {
  std::string path;
  std::vector<Entry> entries;

  // Replaces the entry with the same key, or appends.
  void upsert(const Entry& e);
  const Entry* find(const std::string& key) const;
};

// Reads a database. A missing file gives an empty Db; anything else that is not a valid
// database throws DbError naming file:line:column.
Db load_db(const std::string& path);
// Parses database text (file is used in messages).
Db parse_db(const std::string& text, const std::string& file);
// YAML text of a database.
std::string format_db(const Db& db);
// Atomic write: <path>.tmp.<pid> then rename.
void write_db_atomic(const Db& db, const std::string& path);

// ---------------------------------------------------------------- machine

// "<cpu model>; <n> cpus; <arch> <ISA flags>; generators <hash>" from /proc/cpuinfo (ISA
// flags that change generated code: sse4.1 ... avx512*) and a hash of the generator and
// schedule sources this halformer was built from. Timings on another machine, or against
// another version of the hand schedules, say little here.
std::string host_fingerprint();

// ---------------------------------------------------------------- choosing

// The tuning shapes a kernel's entries were measured on, and the best candidate.
struct Choice {
  bool tuned = false;          // a candidate beats the hand schedule
  std::string candidate;       // winner (or "hand")
  Params knobs;                // winner's knobs
  double speedup = 1.0;        // geometric mean over shapes of the paired speed-ups
  int shapes = 0;              // shapes compared
  std::string reason;          // why the hand schedule is kept (when !tuned)
  std::vector<const Entry*> winner_entries;  // one per shape (tuned only)
};

// Minimum score for a candidate to replace the hand schedule (noise guard).
constexpr double kMinSpeedup = 1.03;
// No tuned shape may get slower than this (a kernel serves encoding and decoding: a
// schedule 2x faster at one row count must not make the other row count slower).
constexpr double kMaxSlowdown = 0.97;

// Score of a candidate from its speed-ups vs the hand schedule, one per tuning shape:
// their geometric mean, or 0 when some shape is slower than kMaxSlowdown (or missing).
double candidate_score(const std::vector<double>& speedups);

// Splits a kernel's params into the shape part (the DB key) and its knobs.
Params shape_params(const std::string& generator, const std::vector<std::pair<std::string, std::string>>& params);
Params knob_params(const std::string& generator, const std::vector<std::pair<std::string, std::string>>& params);

// Best candidate for one kernel: among entries of this generator + shape params + target
// + fingerprint, candidates whose every entry is "ok" and that cover every shape the hand
// schedule was measured on; highest candidate_score() wins if >= kMinSpeedup.
// allow_autoscheduler = false skips autoscheduler candidates (a plan with several device
// variants shares one set of GeneratorParams, and `autoscheduler=` would apply to all).
Choice choose(const Db& db, const std::string& generator, const Params& shape, const std::string& target,
              const std::string& fingerprint, bool allow_autoscheduler = true);

// ---------------------------------------------------------------- applying to a plan

// Where the database for a build comes from.
struct DbSource {
  std::string path;    // empty: none
  std::string origin;  // "--db", "spec tuning.db", ...
};
// HALFORMER_TUNING_DB (set by `halformer build --db/--no-db`; "none" = no database) wins over
// the spec's tuning.db (relative to the spec's directory).
DbSource resolve_db(const Spec& spec);

// Applies the best entry of `db_path` to every kernel of `plan`, for each device variant
// of the plan (entries whose target is the variant's Halide target): knobs become
// GeneratorParams (CPU and GPU knobs have different names, so variants do not collide);
// autoscheduler winners (single-variant plans only) also add their plugin from `plugin_dir`.
// Never throws for a bad database: returns the notices to print (fallbacks to the hand
// schedule, unreadable database with file:line). Sets plan.tuning_db when the file exists.
std::vector<std::string> apply_tuning(Plan& plan, const DbSource& source, const std::string& plugin_dir,
                                      const std::string& fingerprint = host_fingerprint());

}  // namespace halformer::tune
