// The search (Tuner, tuner.h): reference outputs of the hand schedule, then candidates
// until the budget is spent, each checked against the reference (also at awkward small
// shapes) and timed interleaved with the hand schedule; every measurement is merged into
// the database on disk as soon as it is made, so an interrupted run resumes.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <functional>
#include <iostream>
#include <random>
#include <stdexcept>

#include <sys/stat.h>

#include "halformer/packed_layout.h"
#include "tuner.h"

namespace halformer::tune {

using namespace Halide;

bool Tuner::prepare(Job& j) {
  if (j.prepared) return !j.broken;
  j.prepared = true;
  const PlannedKernel& k = *j.k;
  try {
    if (j.roles.empty()) throw std::runtime_error("no kernel role calls it");
    const Signature sig = signature(j.roles.front());  // a kernel's roles share its signature
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
      IoPlan io = io_plan(k, sig, s, target_);
      d.out_extents = io.out_extents;
      d.inputs = make_inputs(io, rng);
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

namespace {
double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n == 0 ? 0 : n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}
}  // namespace

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

}  // namespace halformer::tune
