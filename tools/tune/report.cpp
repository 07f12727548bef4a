// The report (Tuner::print_report): per kernel and tuning shape, the hand schedule's time,
// the tuned winner's (the schedule a build uses) and the best autoscheduler's, and the
// sums per encoder pass and per decoded token; also the text helpers the tuner's
// progress lines use.
#include <cstdio>
#include <ctime>
#include <iostream>
#include <set>

#include "tuner.h"

namespace halformer::tune {

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

std::string fmt(double v, int prec) {
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

}  // namespace halformer::tune
