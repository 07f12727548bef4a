// generation.h's token choice as a JSON filter, for tests/generation/check_generation.py.
// stdin:  {"vocab": V, "eos": id, "draws": N, "options": {GenerationOptions fields},
//          "rows": [{"logits": [V floats], "history": [ids], "generated": n}, ...]}
// stdout: {"rows": [{"processed": [...],   // after repetition penalty, n-grams, min_length
//                    "warped": [...],      // processed, then temperature, top-k, top-p
//                    "chosen": id, "logprob": x,  // choose() of a fresh chooser for the row
//                    "counts": [V ints]}]} // N draws from `warped` (sampling options only)
// -inf is written as null. Row i is batch row i (its generator is seeded with (seed, i)).
#include <cmath>
#include <iostream>
#include <nlohmann/json.hpp>

#include "halformer/generation.h"

using nlohmann::json;

static json floats(const std::vector<float>& v) {
  json out = json::array();
  for (float x : v) out.push_back(std::isinf(x) && x < 0 ? json(nullptr) : json(x));
  return out;
}

int main() {
  try {
    const json job = json::parse(std::cin);
    const json& o = job.at("options");
    halformer::GenerationOptions opt;
    opt.sampling_topk = o.value("sampling_topk", opt.sampling_topk);
    opt.sampling_topp = o.value("sampling_topp", opt.sampling_topp);
    opt.sampling_temperature = o.value("sampling_temperature", opt.sampling_temperature);
    opt.seed = o.value("seed", opt.seed);
    opt.repetition_penalty = o.value("repetition_penalty", opt.repetition_penalty);
    opt.no_repeat_ngram_size = o.value("no_repeat_ngram_size", opt.no_repeat_ngram_size);
    opt.min_length = o.value("min_length", opt.min_length);
    const int V = job.at("vocab"), eos = job.at("eos"), N = job.value("draws", 0);
    halformer::validate(opt, V);

    json rows = json::array();
    for (size_t r = 0; r < job.at("rows").size(); ++r) {
      const json& row = job["rows"][r];
      const std::vector<float> logits = row.at("logits");
      const halformer::Sequence history = row.at("history");
      const int generated = row.at("generated");
      if (int(logits.size()) != V) throw std::runtime_error("row " + std::to_string(r) + ": not V logits");
      json out;
      halformer::TokenChooser c(opt, V, eos, int(r));
      std::vector<float> x = logits;
      float lp = 0;
      out["chosen"] = c.choose(x.data(), history, generated, &lp);
      out["logprob"] = std::isinf(lp) ? json(nullptr) : json(lp);

      halformer::TokenChooser d(opt, V, eos, int(r));
      std::vector<float> y = logits;
      d.process(y.data(), history, generated);
      out["processed"] = floats(y);
      d.warp(y.data());
      out["warped"] = floats(y);
      if (d.sampling() && N > 0) {
        std::vector<int> counts(V, 0);
        for (int i = 0; i < N; ++i) ++counts[d.draw(y.data())];
        out["counts"] = counts;
      }
      rows.push_back(out);
    }
    std::cout << json{{"rows", rows}}.dump() << "\n";
  } catch (const std::exception& e) {
    std::cerr << "generation_tool: " << e.what() << "\n";
    return 1;
  }
}
