// Choosing and applying (tuning_db.h): the best candidate of a kernel among the
// database's entries for this machine and target (or why the hand schedule stays), and
// a build plan with each kernel's winner applied, validated so that a hand-edited or
// foreign database never breaks a build.
#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <set>
#include <sstream>

#include "tuning_db.h"

namespace halformer::tune {
namespace fs = std::filesystem;

// ---------------------------------------------------------------- choosing

double candidate_score(const std::vector<double>& speedups) {
  if (speedups.empty()) return 0;
  double sum = 0;
  for (double r : speedups) {
    if (!(r >= kMaxSlowdown)) return 0;
    sum += std::log(r);
  }
  return std::exp(sum / double(speedups.size()));
}

Choice choose(const Db& db, const std::string& generator, const Params& shape, const std::string& target,
              const std::string& fingerprint, bool allow_autoscheduler) {
  Choice c;
  c.candidate = "hand";
  std::vector<const Entry*> kernel, mine;
  for (const auto& e : db.entries)
    if (e.generator == generator && e.params == shape && e.target == target) kernel.push_back(&e);
  if (kernel.empty()) {
    c.reason = "no entry in the tuning database";
    return c;
  }
  for (const Entry* e : kernel)
    if (e->fingerprint == fingerprint) mine.push_back(e);
  if (mine.empty()) {
    c.reason = "entries were measured on another machine or with other generator sources (" +
               kernel.front()->fingerprint + "), not this one; run halformer tune again";
    return c;
  }
  // Shapes the hand schedule was measured on; without hand entries, every shape seen.
  std::set<Shape> shapes;
  for (const Entry* e : mine)
    if (e->candidate == "hand" && e->status == "ok") shapes.insert(e->shape);
  if (shapes.empty())
    for (const Entry* e : mine)
      if (e->status == "ok") shapes.insert(e->shape);
  std::map<std::string, std::vector<const Entry*>> by_candidate;
  for (const Entry* e : mine)
    if (e->candidate != "hand" && (allow_autoscheduler || !e->knobs.count("autoscheduler")))
      by_candidate[e->candidate_key()].push_back(e);
  double best = 0;
  int rejected = 0, slower = 0;
  for (const auto& [key, list] : by_candidate) {
    bool ok = true;
    std::map<Shape, const Entry*> at;
    for (const Entry* e : list) {
      if (e->status != "ok") ok = false;
      at[e->shape] = e;
    }
    if (!ok) {
      ++rejected;
      continue;
    }
    std::vector<double> ratios;
    std::vector<const Entry*> used;
    for (const auto& s : shapes) {
      auto it = at.find(s);
      if (it == at.end()) {
        ok = false;
        break;
      }
      ratios.push_back(it->second->ratio());
      used.push_back(it->second);
    }
    if (!ok || shapes.empty()) continue;
    const double speedup = candidate_score(ratios);
    if (speedup == 0) {
      ++slower;
      continue;
    }
    if (speedup > best) {
      best = speedup;
      c.candidate = list.front()->candidate;
      c.knobs = list.front()->knobs;
      c.speedup = speedup;
      c.shapes = int(shapes.size());
      c.winner_entries = used;
    }
  }
  if (best == 0) {
    c.candidate = "hand";
    c.knobs.clear();
    c.reason = by_candidate.empty() ? "only the hand schedule has been measured"
               : rejected == int(by_candidate.size())
                   ? "no candidate passed the correctness checks (" + std::to_string(rejected) + " wrong or failed)"
               : slower > 0 ? "every correct candidate is slower than it on at least one shape"
                            : "no candidate was measured on every shape the hand schedule was";
    return c;
  }
  if (best < kMinSpeedup) {
    std::ostringstream o;
    o.setf(std::ios::fixed);
    o.precision(2);
    const std::string who = c.candidate == "knobs" ? "a knob setting" : c.candidate;
    if (best < 1)
      o << "no candidate beats it (best: " << who << " at " << best << "x)";
    else
      o << "the best candidate (" << who << ", " << best << "x) is within noise (< " << kMinSpeedup << "x)";
    c.reason = o.str();
    c.candidate = "hand";
    c.knobs.clear();
    c.winner_entries.clear();
    return c;
  }
  c.tuned = true;
  return c;
}

// ---------------------------------------------------------------- applying

DbSource resolve_db(const Spec& spec) {
  if (const char* env = std::getenv("HALFORMER_TUNING_DB"); env && *env) {
    if (std::string(env) == "none") return {"", "--no-db"};
    return {fs::absolute(env).lexically_normal().string(), "--db"};
  }
  if (!spec.tuning_db.empty()) {
    fs::path p(spec.tuning_db);
    if (p.is_relative()) p = fs::absolute(fs::path(spec.file).parent_path() / p);
    return {p.lexically_normal().string(), "the spec's tuning.db"};
  }
  return {"", ""};
}

namespace {

// A knob value the generators accept: a small positive integer or a bool.
bool valid_knob_value(const std::string& k, const std::string& v) {
  if (k == "autoscheduler") return find_autoscheduler(v) != nullptr;
  if (v == "true" || v == "false") return true;
  if (v.empty() || v.size() > 6) return false;
  for (char ch : v)
    if (!std::isdigit(static_cast<unsigned char>(ch))) return false;
  const int x = std::stoi(v);
  return x >= 0 && x <= 65536;
}

std::string fmt_speedup(double s) {
  std::ostringstream o;
  o.setf(std::ios::fixed);
  o.precision(2);
  o << s << "x";
  return o.str();
}

}  // namespace

std::vector<std::string> apply_tuning(Plan& plan, const DbSource& source, const std::string& plugin_dir,
                                      const std::string& fingerprint) {
  std::vector<std::string> notes;
  if (source.path.empty()) return notes;
  std::error_code ec;
  if (!fs::exists(source.path, ec)) {
    notes.push_back("notice: tuning database " + source.path + " (" + source.origin +
                    ") does not exist yet: every kernel uses its hand schedule (run `halformer tune` to fill it)");
    return notes;
  }
  plan.tuning_db = source.path;
  Db db;
  try {
    db = load_db(source.path);
  } catch (const DbError& e) {
    notes.push_back(std::string(e.what()));
    notes.push_back("warning: ignoring the unreadable tuning database " + source.path +
                    ": every kernel uses its hand schedule (fix or delete the file, or build with --no-db)");
    return notes;
  }
  int tuned = 0;
  const bool single = plan.variants.size() == 1;
  for (auto& k : plan.kernels) {
    const Params shape = shape_params(k.generator, k.params);
    bool any = false;
    for (const auto& [device, target] : plan.variants) {
      const std::string who = k.function + (single ? "" : " [" + device + "]");
      Choice c = choose(db, k.generator, shape, target, fingerprint, single);
      if (!c.tuned) {
        notes.push_back("notice: " + who + ": hand schedule: " + c.reason);
        continue;
      }
      // Validate before touching the plan: a hand-edited entry must never break the build.
      std::string bad;
      for (const auto& [name, value] : c.knobs)
        if (!is_knob(k.generator, name))
          bad = "'" + name + "' is not a schedule knob of " + k.generator;
        else if (name.rfind("autoscheduler.", 0) == 0 && name != "autoscheduler.parallelism" &&
                 name != "autoscheduler.beam_size")
          bad = "autoscheduler setting '" + name + "' is not one halformer passes (parallelism, beam_size)";
        else if (!valid_knob_value(name, value))
          bad = "knob " + name + ": '" + value + "' is not a valid value";
      std::string plugin;
      if (bad.empty() && c.knobs.count("autoscheduler")) {
        const Autoscheduler* a = find_autoscheduler(c.knobs.at("autoscheduler"));
        plugin = (fs::path(plugin_dir) / a->plugin).string();
        if (!fs::exists(plugin, ec)) bad = "autoscheduler plugin " + plugin + " not found";
      }
      if (!bad.empty()) {
        const int line = c.winner_entries.empty() ? 0 : c.winner_entries.front()->line;
        notes.push_back("notice: " + who + ": hand schedule: " + source.path + ":" + std::to_string(line) + ": " + bad);
        continue;
      }
      for (const auto& [name, value] : c.knobs) {
        auto it = std::find_if(k.params.begin(), k.params.end(), [&](const auto& p) { return p.first == name; });
        if (it != k.params.end())
          it->second = value;
        else
          k.params.emplace_back(name, value);
      }
      if (!plugin.empty()) k.plugins.push_back(plugin);
      std::string desc = c.candidate;
      if (c.candidate == "knobs") {
        desc.clear();
        for (const auto& [name, value] : c.knobs) desc += (desc.empty() ? "" : " ") + name + "=" + value;
      }
      notes.push_back("tuned:  " + who + ": " + desc + " (" + fmt_speedup(c.speedup) + " vs hand over " +
                      std::to_string(c.shapes) + " shape" + (c.shapes == 1 ? "" : "s") + ")");
      any = true;
    }
    if (any) ++tuned;
  }
  notes.push_back("tuning database " + source.path + " (" + source.origin + "): " + std::to_string(tuned) + " of " +
                  std::to_string(plan.kernels.size()) + " kernels use tuned schedules");
  // The engine's paged self-attention sums as the decoder's self-attention does, so that a
  // request's tokens are those of its run alone (docs/engine.md): it takes that kernel's
  // schedule knobs and plugins, whatever the database says of it.
  auto role_kernel = [&](const char* role) -> PlannedKernel* {
    auto r = plan.roles.find(role);
    if (r == plan.roles.end() || r->second.empty()) return nullptr;
    for (auto& k : plan.kernels)
      if (k.function == r->second) return &k;
    return nullptr;
  };
  PlannedKernel *dec = role_kernel("decoder_self_attention"), *paged = role_kernel("paged_self_attention");
  if (dec && paged && dec != paged) {
    auto knob = [&](const std::pair<std::string, std::string>& p) { return is_knob(paged->generator, p.first); };
    paged->params.erase(std::remove_if(paged->params.begin(), paged->params.end(), knob), paged->params.end());
    for (const auto& p : dec->params)
      if (knob(p)) paged->params.push_back(p);
    paged->plugins = dec->plugins;
  }
  return notes;
}

}  // namespace halformer::tune
