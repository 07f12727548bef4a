// DecodeResult::last_logits: each row's head output at its own last step. Decoding on the
// CPU chooses from the raw logits and runs the head only in the steps where some row ends
// (runtime/model.cpp, generate), so this checks, for an encoder-decoder (reverse-tiny) and
// a decoder-only model (gpt-tiny), on a batch whose rows end at different steps (eos, or
// the token callback) and at max_new_tokens:
//   * tokens and last_logits bit-identical between plain greedy (the argmax kernel) and
//     the same call with return_scores (the host's chooser);
//   * last_logits within 1e-4 of the largest |value| of the teacher-forced head output
//     (Model::score over the row's inputs up to its last step: another code path, the
//     whole prefix at once, summed in another order). Without the head at a row's last
//     step this is off by the log-sum-exp (3.8-4.0 here).
// Compiled at test time against both libraries (tests/generation/CMakeLists.txt).
//   usage: greedy_last_logits REVERSE_TINY_WEIGHTS GPT_TINY_WEIGHTS
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <exception>
#include <memory>
#include <string>
#include <vector>

#include "gpt-tiny.h"
#include "reverse-tiny.h"

using halformer::Sequence;

namespace {

int failures = 0;
void check(bool ok, const std::string& what) {
  if (!ok) {
    std::fprintf(stderr, "FAILED: %s\n", what.c_str());
    ++failures;
  }
}

// `model` on `src`: the two greedy paths, then each row against its teacher-forced head output.
// `stop_after[r]` > 0: row r is stopped by the token callback after that many tokens.
void check_model(const halformer::Model& m, const std::string& name, const std::vector<Sequence>& src, int max_new,
                 bool decoder_only, std::vector<int> stop_after = {}) {
  const auto& cfg = m.config();
  const int V = cfg.tgt_vocab;
  halformer::GenerationOptions plain;
  plain.max_new_tokens = max_new;
  // Each call counts its own tokens per row.
  auto stopper = [&] {
    auto seen = std::make_shared<std::vector<int>>(src.size(), 0);
    return [seen, stop_after](int row, int32_t, float) { return ++(*seen)[row] != stop_after[row]; };
  };
  if (!stop_after.empty()) plain.on_token = stopper();
  const auto a = m.generate(src, plain);
  halformer::GenerationOptions scored = plain;
  if (!stop_after.empty()) scored.on_token = stopper();
  scored.return_scores = true;
  const auto b = m.generate(src, scored);
  check(a.tokens == b.tokens, name + ": tokens differ with return_scores");
  check(a.last_logits.data.size() == b.last_logits.data.size() &&
            std::memcmp(a.last_logits.data.data(), b.last_logits.data.data(), a.last_logits.data.size() * 4) == 0,
        name + ": last_logits differ between the argmax kernel's path and the host chooser's");

  // The rows must end at different steps, one of them at max_new_tokens.
  std::vector<size_t> lengths;
  for (const auto& t : a.tokens) lengths.push_back(t.size());
  std::sort(lengths.begin(), lengths.end());
  check(lengths.front() < lengths.back() && lengths.back() == size_t(max_new),
        name + ": the batch's rows do not end at different steps and at max_new_tokens");

  for (size_t r = 0; r < src.size(); ++r) {
    // The inputs of the row's last step: prompt (decoder-only) or bos, then the tokens before the last.
    Sequence in = decoder_only ? src[r] : Sequence{int32_t(cfg.bos_id)};
    in.insert(in.end(), a.tokens[r].begin(), a.tokens[r].end() - 1);
    const auto tf = decoder_only ? m.score({in}) : m.score({src[r]}, {in});
    const float* want = tf.data.data() + (in.size() - 1) * V;
    const float* got = a.last_logits.data.data() + r * V;
    float scale = 0, err = 0;
    for (int v = 0; v < V; ++v) {
      scale = std::max(scale, std::fabs(want[v]));
      err = std::max(err, std::fabs(got[v] - want[v]));
    }
    std::printf("%s row %zu: %zu tokens, last_logits vs teacher-forced head output: %.2e of %.3g\n", name.c_str(), r,
                a.tokens[r].size(), err, scale);
    check(err <= 1e-4f * scale, name + ": row " + std::to_string(r) + " last_logits differ from the head output");
  }
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: %s REVERSE_TINY_WEIGHTS GPT_TINY_WEIGHTS\n", argv[0]);
    return 2;
  }
  try {
    // 2 threads: the host chooser's rows run in parallel.
    auto rev = halformer::Model::load(*halformer_model_reverse_tiny(), argv[1], {2, "cpu"});
    auto gpt = halformer::Model::load(*halformer_model_gpt_tiny(), argv[2], {2, "cpu"});
    // reverse-tiny reverses its source, then emits eos: sources of 2, 4 and 6 ids end
    // after 3, 5 and 7 tokens; 6 new tokens cut the longest short.
    check_model(rev, "reverse-tiny", {{3, 7}, {5, 4, 3, 2}, {9, 8, 7, 6, 5, 4}}, 6, false);
    // gpt-tiny (random weights) rarely says eos: the token callback stops two of its rows
    // after 2 and 4 tokens.
    check_model(gpt, "gpt-tiny", {{5, 9, 13}, {100, 200, 300, 400, 7}, {1}}, 6, true, {2, 4, 0});
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  std::printf("greedy last_logits: %d failures\n", failures);
  return failures == 0 ? 0 : 1;
}
