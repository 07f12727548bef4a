// The token choice of generation.h on hand-computed cases: greedy, processors, option
// validation, reproducible sampling, and a chi-square test of the sampled frequencies.
// tests/generation/check_generation.py compares the same code with transformers' own processors.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <numeric>
#include <string>
#include <vector>

#include "halformer/error.h"
#include "halformer/generation.h"

using halformer::GenerationOptions;
using halformer::Sequence;
using halformer::TokenChooser;

namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();

GenerationOptions sampling(int topk, float topp, float temperature, uint64_t seed = 7) {
  GenerationOptions o;
  o.sampling_topk = topk;
  o.sampling_topp = topp;
  o.sampling_temperature = temperature;
  o.seed = seed;
  return o;
}

// Fixed, tie-free logits in about [-4, 4].
std::vector<float> fixed_logits(int V) {
  std::vector<float> x(V);
  for (int i = 0; i < V; ++i) x[i] = float(3.0 * std::sin(1.7 * i + 0.3) + 0.01 * i);
  return x;
}

// `n` choices of one chooser on the same step logits (each from a fresh copy).
std::vector<int32_t> draws(TokenChooser& c, const std::vector<float>& logits, int n) {
  std::vector<int32_t> ids;
  for (int i = 0; i < n; ++i) {
    std::vector<float> x = logits;
    ids.push_back(c.choose(x.data(), {}, 5));
  }
  return ids;
}

}  // namespace

TEST(Greedy, TopK1AndTemperature0AreArgmaxFirstMaxWins) {
  const std::vector<float> logits = {0.5f, 2.0f, -1.0f, 3.0f, 1.0f, 3.0f, 3.0f};  // max 3 at ids 3, 5, 6
  for (const GenerationOptions& o : {sampling(1, 1.0f, 1.0f), sampling(0, 0.9f, 0.0f), sampling(40, 1.0f, 0.0f)}) {
    TokenChooser c(o, int(logits.size()), /*eos=*/0, /*row=*/0);
    EXPECT_FALSE(c.sampling());
    std::vector<float> x = logits;
    EXPECT_EQ(c.choose(x.data(), {}, 0), 3);
  }
  // Random rows: the same id as std::max_element (the first maximum).
  uint64_t s = 1;
  TokenChooser c(GenerationOptions{}, 97, 0, 0);
  for (int row = 0; row < 200; ++row) {
    std::vector<float> x(97);
    for (float& v : x) v = float(((s = s * 6364136223846793005ULL + 1442695040888963407ULL) >> 40) % 9);  // many ties
    const int32_t expected = int32_t(std::max_element(x.begin(), x.end()) - x.begin());
    EXPECT_EQ(c.choose(x.data(), {}, 0), expected);
  }
}

TEST(Sampling, SameSeedSameDrawsOtherSeedOrRowOtherDraws) {
  const std::vector<float> logits = fixed_logits(50);
  const GenerationOptions o = sampling(0, 1.0f, 1.0f, 1234);
  TokenChooser a(o, 50, 0, 3), b(o, 50, 0, 3);
  ASSERT_TRUE(a.sampling());
  const auto da = draws(a, logits, 300);
  EXPECT_EQ(da, draws(b, logits, 300));
  // Another row or another seed: another stream (most positions differ).
  auto differing = [&](const std::vector<int32_t>& other) {
    int n = 0;
    for (size_t i = 0; i < da.size(); ++i) n += da[i] != other[i];
    return n;
  };
  for (int row : {0, 2, 4}) {
    TokenChooser r(o, 50, 0, row);
    EXPECT_GT(differing(draws(r, logits, 300)), 200) << "row " << row;
  }
  TokenChooser other_seed(sampling(0, 1.0f, 1.0f, 1235), 50, 0, 3);
  EXPECT_GT(differing(draws(other_seed, logits, 300)), 200);
  // A row's draws do not depend on the batch around it: row 3 of a batch of 5 choosers
  // used in turn draws what row 3 alone drew.
  std::vector<TokenChooser> batch;
  for (int row = 0; row < 5; ++row) batch.emplace_back(o, 50, 0, row);
  std::vector<int32_t> row3;
  for (int step = 0; step < 300; ++step)
    for (int row = 0; row < 5; ++row) {
      std::vector<float> x = logits;
      const int32_t id = batch[row].choose(x.data(), {}, 5);
      if (row == 3) row3.push_back(id);
    }
  EXPECT_EQ(row3, da);
}

TEST(Validate, EveryBadOptionIsNamed) {
  EXPECT_NO_THROW(halformer::validate(GenerationOptions{}, 10));
  EXPECT_NO_THROW(halformer::validate(sampling(0, 1.0f, 0.5f), 10));
  const float nan = std::numeric_limits<float>::quiet_NaN();
  struct Case {
    std::function<void(GenerationOptions&)> set;
    std::string message;  // must occur in the error
  };
  const std::vector<Case> cases = {
      {[](GenerationOptions& o) { o.max_new_tokens = -1; }, "max_new_tokens -1"},
      {[](GenerationOptions& o) { o.beam_size = 0; }, "beam_size 0"},
      {[](GenerationOptions& o) { o.sampling_topk = -2; }, "sampling_topk -2"},
      {[](GenerationOptions& o) { o.sampling_topp = 0.0f; }, "sampling_topp 0 is outside (0, 1]"},
      {[](GenerationOptions& o) { o.sampling_topp = 1.5f; }, "sampling_topp 1.5"},
      {[&](GenerationOptions& o) { o.sampling_topp = nan; }, "sampling_topp nan"},
      {[](GenerationOptions& o) { o.sampling_temperature = -0.5f; }, "sampling_temperature -0.5"},
      {[](GenerationOptions& o) { o.sampling_temperature = kInf; }, "sampling_temperature inf"},
      {[&](GenerationOptions& o) { o.sampling_temperature = nan; }, "sampling_temperature nan"},
      {[](GenerationOptions& o) { o.repetition_penalty = 0.0f; }, "repetition_penalty 0"},
      {[](GenerationOptions& o) { o.repetition_penalty = -1.0f; }, "repetition_penalty -1"},
      {[](GenerationOptions& o) { o.repetition_penalty = kInf; }, "repetition_penalty inf"},
      {[](GenerationOptions& o) { o.no_repeat_ngram_size = -1; }, "no_repeat_ngram_size -1"},
      {[](GenerationOptions& o) { o.min_length = -3; }, "min_length -3"},
      {[](GenerationOptions& o) { o.beam_size = 4, o.sampling_topk = 10; }, "beam search does not sample"},
  };
  for (const Case& c : cases) {
    GenerationOptions o;
    c.set(o);
    try {
      halformer::validate(o, 10);
      ADD_FAILURE() << "no error for " << c.message;
    } catch (const halformer::Error& e) {
      EXPECT_NE(std::string(e.what()).find(c.message), std::string::npos) << e.what();
    }
  }
}

TEST(Processors, MinLengthMasksEos) {
  GenerationOptions o;
  o.min_length = 2;
  TokenChooser c(o, 5, /*eos=*/2, 0);
  const std::vector<float> logits = {0.0f, 1.0f, 5.0f, 0.5f, -1.0f};  // eos is the best
  for (int generated : {0, 1, 2, 3}) {
    std::vector<float> x = logits;
    const int32_t id = c.choose(x.data(), {1, 3}, generated);
    EXPECT_EQ(id, generated < 2 ? 1 : 2) << "generated " << generated;
    EXPECT_EQ(x[2], generated < 2 ? -kInf : 5.0f);
  }
}

TEST(Processors, RepetitionPenaltyOncePerIdBySign) {
  GenerationOptions o;
  o.repetition_penalty = 2.0f;
  TokenChooser c(o, 7, 5, 0);
  std::vector<float> x = {2.0f, -1.0f, 0.5f, -3.0f, 4.0f, 0.0f, -0.25f};
  c.process(x.data(), {0, 1, 1, 3, 1, 5, 6}, 3);  // id 1 three times: still penalised once
  EXPECT_EQ(x, (std::vector<float>{1.0f, -2.0f, 0.5f, -6.0f, 4.0f, 0.0f, -0.5f}));
  // The penalty changes the greedy choice: 4.0 at id 4 vs 5.0 / 2 at id 0.
  o.repetition_penalty = 1.5f;
  TokenChooser d(o, 6, 5, 0);
  std::vector<float> y = {5.0f, 0.0f, 0.0f, 0.0f, 4.0f, 0.0f};
  EXPECT_EQ(d.choose(y.data(), {0}, 1), 4);
}

TEST(Processors, NoRepeatNgrams) {
  const std::vector<float> zeros(8, 0.0f);
  auto banned = [&](int n, const Sequence& history) {
    GenerationOptions o;
    o.no_repeat_ngram_size = n;
    std::vector<float> x = zeros;
    TokenChooser(o, 8, 7, 0).process(x.data(), history, 0);
    std::vector<int> ids;
    for (int i = 0; i < 8; ++i)
      if (x[i] == -kInf) ids.push_back(i);
      else EXPECT_EQ(x[i], 0.0f);
    return ids;
  };
  EXPECT_EQ(banned(3, {1, 2, 3, 1, 2}), (std::vector<int>{3}));      // (1 2) was followed by 3
  EXPECT_EQ(banned(2, {1, 2, 1, 4, 1}), (std::vector<int>{2, 4}));   // (1) was followed by 2 and 4
  EXPECT_EQ(banned(2, {1, 2, 3, 4, 5}), (std::vector<int>{}));       // 5 never occurred before
  EXPECT_EQ(banned(1, {6, 0, 6, 3}), (std::vector<int>{0, 3, 6}));   // unigrams: the history
  EXPECT_EQ(banned(4, {1, 2, 3, 5, 1, 2, 3}), (std::vector<int>{5}));
  EXPECT_EQ(banned(4, {1, 2}), (std::vector<int>{}));                // shorter than n - 1
  EXPECT_EQ(banned(3, {4, 4, 4, 4}), (std::vector<int>{4}));
}

TEST(Warpers, TopKKeepsTiesTopPKeepsTheSmallestSetReachingP) {
  // top-k 2 with a tie at the 2nd value: all three equal values stay.
  TokenChooser k(sampling(2, 1.0f, 1.0f), 5, 0, 0);
  std::vector<float> x = {1.0f, 3.0f, 2.0f, 2.0f, 2.0f};
  k.warp(x.data());
  EXPECT_EQ(x, (std::vector<float>{-kInf, 3.0f, 2.0f, 2.0f, 2.0f}));
  std::vector<float> y = {1.0f, 5.0f, 3.0f, 4.0f, 2.0f};
  k.warp(y.data());
  EXPECT_EQ(y, (std::vector<float>{-kInf, 5.0f, -kInf, 4.0f, -kInf}));
  // Probabilities 0.5, 0.3, 0.15, 0.05 (ids 2, 0, 3, 1).
  auto top_p = [](float p) {
    std::vector<float> y = {std::log(0.3f), std::log(0.05f), std::log(0.5f), std::log(0.15f)};
    TokenChooser(sampling(0, p, 1.0f), 4, 0, 0).warp(y.data());
    std::vector<int> kept;
    for (int i = 0; i < 4; ++i)
      if (y[i] > -kInf) kept.push_back(i);
    return kept;
  };
  EXPECT_EQ(top_p(0.4f), (std::vector<int>{2}));
  EXPECT_EQ(top_p(0.75f), (std::vector<int>{0, 2}));
  EXPECT_EQ(top_p(0.85f), (std::vector<int>{0, 2, 3}));
  EXPECT_EQ(top_p(0.99f), (std::vector<int>{0, 1, 2, 3}));
  EXPECT_EQ(top_p(1e-6f), (std::vector<int>{2}));  // the most probable token always stays
  // Temperature divides.
  TokenChooser t(sampling(0, 1.0f, 0.5f), 3, 0, 0);
  std::vector<float> z = {1.0f, -2.0f, 0.25f};
  t.warp(z.data());
  EXPECT_EQ(z, (std::vector<float>{2.0f, -4.0f, 0.5f}));
}

TEST(Sampling, LogprobIsLogSoftmaxOfProcessedLogitsBeforeWarpers) {
  const std::vector<float> logits = fixed_logits(20);
  GenerationOptions o = sampling(5, 0.8f, 0.5f);
  o.repetition_penalty = 1.3f;
  TokenChooser c(o, 20, 19, 0);
  const Sequence history = {1, 4, 4, 9};
  for (int step = 0; step < 20; ++step) {
    std::vector<float> processed = logits, x = logits;
    c.process(processed.data(), history, step);
    float lp = 1;
    const int32_t id = c.choose(x.data(), history, step, &lp);
    double sum = 0;
    for (float v : processed) sum += std::exp(double(v));
    EXPECT_NEAR(lp, double(processed[id]) - std::log(sum), 1e-6);
  }
  // Greedy: the same quantity at the argmax.
  TokenChooser g(GenerationOptions{}, 20, 19, 0);
  std::vector<float> x = logits;
  float lp = 1;
  const int32_t id = g.choose(x.data(), {}, 0, &lp);
  double sum = 0;
  for (float v : logits) sum += std::exp(double(v));
  EXPECT_NEAR(lp, double(logits[id]) - std::log(sum), 1e-6);
}

// 20000 draws at one step from fixed logits (V = 50) with top-k 30, top-p 0.9 and
// temperature 0.7: the frequencies follow the filtered softmax (computed here
// independently of generation.cpp). Pearson's chi-square over the kept tokens (bins with
// an expected count < 5 merged); critical value at p = 0.001 from the Wilson–Hilferty
// approximation chi2_crit(df) = df (1 - 2/(9 df) + z sqrt(2/(9 df)))^3, z = 3.0902
// (here 14 tokens survive, df = 13: 34.68; the exact quantile is 34.53). A fixed seed
// makes the test deterministic.
TEST(Sampling, ChiSquareFrequenciesMatchFilteredSoftmax) {
  const int V = 50, N = 20000, K = 30;
  const float P = 0.9f, T = 0.7f;
  const std::vector<float> logits = fixed_logits(V);
  // The expected distribution: / T, the K best, the smallest prefix reaching P, softmax.
  std::vector<int> ids(V);
  std::iota(ids.begin(), ids.end(), 0);
  std::sort(ids.begin(), ids.end(), [&](int a, int b) { return logits[a] > logits[b]; });
  std::vector<double> p(V, 0.0);
  double z = 0;
  for (int j = 0; j < K; ++j) z += std::exp(double(logits[ids[j]] / T));
  double before = 0, kept_mass = 0;
  for (int j = 0; j < K && before < P; ++j) {
    const double q = std::exp(double(logits[ids[j]] / T)) / z;
    p[ids[j]] = q;
    before += q;
    kept_mass += q;
  }
  for (double& q : p) q /= kept_mass;

  TokenChooser c(sampling(K, P, T, 20240601), V, 0, 0);
  std::vector<int> count(V, 0);
  for (int32_t id : draws(c, logits, N)) ++count[id];

  double chi2 = 0, exp_acc = 0, obs_acc = 0;
  int bins = 0, kept = 0;
  // Least probable first, so that small bins merge into larger ones; the last bin holds
  // the most probable token and is never small.
  for (auto it = ids.rbegin(); it != ids.rend(); ++it) {
    const int id = *it;
    if (p[id] == 0) {
      EXPECT_EQ(count[id], 0) << "filtered id " << id << " was drawn";
      continue;
    }
    ++kept;
    exp_acc += N * p[id];
    obs_acc += count[id];
    if (exp_acc >= 5) {
      chi2 += (obs_acc - exp_acc) * (obs_acc - exp_acc) / exp_acc;
      ++bins;
      exp_acc = obs_acc = 0;
    }
  }
  ASSERT_GT(kept, 5);
  ASSERT_LT(kept, K);  // top-p really cut
  const double df = bins - 1, a = 2.0 / (9.0 * df), zc = 3.0902;
  const double critical = df * std::pow(1 - a + zc * std::sqrt(a), 3);
  EXPECT_LT(chi2, critical) << "chi-square " << chi2 << " over " << bins << " bins (df " << df << ")";
}
