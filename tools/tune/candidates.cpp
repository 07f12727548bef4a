// Candidates (candidates.h): the autoscheduler candidates, the knobs each generator
// really has and the first candidates queued for a job, then the search's next
// candidate: a neighbour of the best so far or a random point of the knob grid.
#include "candidates.h"

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <iostream>
#include <stdexcept>

#include "schedules/cpu_matmul.h"  // amx_tiles
#include "tuner.h"

namespace halformer::tune {

using namespace Halide;
namespace fs = std::filesystem;

std::vector<Cand> autoscheduler_candidates(bool gpu, const std::string& plugin_dir, const std::string& parallelism,
                                           int beam) {
  std::vector<Cand> cands;
  for (const auto& a : autoschedulers()) {
    if (a.gpu != gpu && !(gpu && a.name == "Li2018")) continue;
    const std::string path = (fs::path(plugin_dir) / a.plugin).string();
    try {
      if (!fs::exists(path)) throw std::runtime_error("not found");
      load_plugin(path);
      Cand c;
      c.candidate = a.name;
      for (char& ch : c.candidate) ch = char(std::tolower(static_cast<unsigned char>(ch)));
      c.knobs["autoscheduler"] = a.name;
      c.knobs["autoscheduler.parallelism"] = parallelism;
      // Adams2019 / Anderson2021 search with a beam (default 32): minutes per kernel. The
      // greedy search (beam 1) fits a tuning budget; --autoscheduler-beam raises it.
      if (a.name == "Adams2019" || a.name == "Anderson2021")
        c.knobs["autoscheduler.beam_size"] = std::to_string(beam);
      cands.push_back(c);
    } catch (const std::exception& e) {
      std::cout << "[tune] autoscheduler " << a.name << " unavailable (" << path << ": " << trim_msg(e.what())
                << ")\n";
    }
  }
  return cands;
}

void seed_candidates(Job& j, const std::vector<Cand>& as_cands, bool gpu, const Halide::Target& target,
                     const Halide::Target& host) {
  // Knobs each generator really has (probe: an unknown GeneratorParam is an error).
  const auto& table = gpu ? gpu_knobs(j.k->generator) : cpu_knobs(j.k->generator);
  for (const auto& kn : table) {
    // The AMX knob changes nothing where the kernels get no tiles.
    if (kn.name == "amx" && !halformer::amx_tiles(target)) continue;
    try {
      auto gen = Internal::GeneratorRegistry::create(j.k->generator, GeneratorContext(host));
      if (!gen) break;
      gen->set_generatorparam_value(kn.name, kn.values.front());
      j.knobs.push_back(kn);
    } catch (const std::exception&) {
      std::cout << "[tune] " << j.k->generator << " has no knob " << kn.name << "; not searched\n";
    }
  }
  for (const auto& c : as_cands) {
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


}  // namespace halformer::tune
