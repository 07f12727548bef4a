// Candidates: the schedules the tuner tries for a kernel. A candidate is the hand
// schedule, a set of knob values (knobs.cpp's tables) or a Halide autoscheduler;
// candidates.cpp loads the autoscheduler plugins, probes which knobs each generator has,
// queues the first candidates and picks the next one of a search (Tuner::next_candidate).
#pragma once

#include "Halide.h"

#include <string>
#include <vector>

#include "tuning_db.h"

namespace halformer::tune {

struct Job;

// A schedule to try; key() identifies it in Job::seen and the database.
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

// One candidate per Halide autoscheduler whose plugin loads from `plugin_dir` (for GPU
// targets: the GPU ones and Li2018); the others are reported as unavailable. `beam` is
// the beam size of Adams2019 / Anderson2021.
std::vector<Cand> autoscheduler_candidates(bool gpu, const std::string& plugin_dir, const std::string& parallelism,
                                           int beam);

// The knobs `j`'s generator really has for the target (probed on `host`), and its first
// candidates: the autoschedulers, then the hand schedule's neighbours in random order.
void seed_candidates(Job& j, const std::vector<Cand>& as_cands, bool gpu, const Halide::Target& target,
                     const Halide::Target& host);

}  // namespace halformer::tune
