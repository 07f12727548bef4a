// Two different models linked into one program (issue 13: a model is a value): the
// encoder-decoder reverse-tiny and the decoder-only gpt-tiny, each from its own
// DIR/lib<name>.a, loaded side by side with different thread limits and run from 4
// threads at once, interleaved; every result must be bit-identical to the same call
// made alone (one model loaded, one thread). Compiled at test time against both
// libraries (tests/models/CMakeLists.txt).
//   usage: two_models REVERSE_TINY_WEIGHTS GPT_TINY_WEIGHTS
#include <cstdio>
#include <cstring>
#include <exception>
#include <string>
#include <thread>
#include <vector>

#include "gpt-tiny.h"
#include "reverse-tiny.h"

using halformer::Sequence;

namespace {

struct Job {
  const halformer::Model* model;
  std::vector<Sequence> src;
};
struct Result {
  std::vector<Sequence> tokens;
  std::vector<float> logits;
};

Result run(const Job& j) {
  auto r = j.model->greedy(j.src, 12);
  return {r.tokens, r.last_logits.data};
}
bool same(const Result& a, const Result& b) {
  return a.tokens == b.tokens && a.logits.size() == b.logits.size() &&
         std::memcmp(a.logits.data(), b.logits.data(), a.logits.size() * sizeof(float)) == 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: %s REVERSE_TINY_WEIGHTS GPT_TINY_WEIGHTS\n", argv[0]);
    return 2;
  }
  try {
    const auto& rd = *halformer_model_reverse_tiny();
    const auto& gd = *halformer_model_gpt_tiny();
    std::printf("models: %s (%s), %s (%s)\n", rd.config->name, rd.devices, gd.config->name, gd.devices);
    // Results alone: one model loaded at a time, one thread.
    std::vector<std::vector<Sequence>> rev_inputs = {{{3, 7, 1, 9}}, {{5, 4, 3, 2, 1, 13}, {2, 2}}, {{12, 11, 10}}};
    std::vector<std::vector<Sequence>> gpt_inputs = {{{5, 9, 13}}, {{100, 200, 300, 400, 7}}, {{1}, {511, 3, 3}}};
    std::vector<Result> expected_rev, expected_gpt;
    {
      auto m = halformer::Model::load(rd, argv[1], {1, "cpu"});
      for (auto& s : rev_inputs) expected_rev.push_back(run({&m, s}));
    }
    {
      auto m = halformer::Model::load(gd, argv[2], {1, "cpu"});
      for (auto& s : gpt_inputs) expected_gpt.push_back(run({&m, s}));
    }
    if (expected_rev[0].tokens[0] != Sequence{9, 1, 7, 3, 15}) {
      std::fprintf(stderr, "reverse-tiny did not reverse 3 7 1 9\n");
      return 1;
    }
    // Both loaded; 4 threads, each running every job of both models in its own order.
    auto rev = halformer::Model::load(rd, argv[1], {2, "cpu"});
    auto gpt = halformer::Model::load(gd, argv[2], {1, "cpu"});
    std::vector<Job> jobs;
    std::vector<const Result*> want;
    for (size_t i = 0; i < rev_inputs.size(); ++i) {
      jobs.push_back({&rev, rev_inputs[i]}), want.push_back(&expected_rev[i]);
      jobs.push_back({&gpt, gpt_inputs[i]}), want.push_back(&expected_gpt[i]);
    }
    const int threads = 4, rounds = 10;
    std::vector<int> differ(threads, 0), done(threads, 0);
    std::vector<std::string> errors(threads);
    std::vector<std::thread> pool;
    for (int t = 0; t < threads; ++t)
      pool.emplace_back([&, t] {
        try {
          for (int r = 0; r < rounds; ++r)
            for (size_t k = 0; k < jobs.size(); ++k) {
              const size_t i = (k * (t + 1) + r) % jobs.size();
              differ[t] += !same(run(jobs[i]), *want[i]);
              ++done[t];
            }
        } catch (const std::exception& e) {
          errors[t] = e.what();
        }
      });
    for (auto& th : pool) th.join();
    int total = 0, bad = 0;
    for (int t = 0; t < threads; ++t) {
      if (!errors[t].empty()) {
        std::fprintf(stderr, "thread %d: %s\n", t, errors[t].c_str());
        return 1;
      }
      total += done[t], bad += differ[t];
    }
    std::printf("two models, %d threads: %d calls, %d differ from the single-model runs\n", threads, total, bad);
    return bad == 0 ? 0 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
}
