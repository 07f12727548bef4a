// A whole generated model against PyTorch on the same weights.
//
// The ctest fixtures have already (1) built the model with `halformer build` and (2) run
// tests/torch_reference.py, which builds the spec's model in PyTorch with seeded random
// weights, saves them with safetensors.torch.save_file (the naming preset, unchanged)
// and records the PyTorch outputs for a padded batch. The reference is produced at test
// time, not committed, so it always matches the current spec and script.
//
// Environment: HALFORMER_MODEL_BIN (the inference binary), HALFORMER_REFERENCE_DIR,
// HALFORMER_WEIGHTS (the weights the reference used).
// Tolerance: max |halformer - torch| <= 1e-4 * max |torch| over non-padded positions
// (fp32; the two sum in different orders), and identical greedy tokens.
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <memory>
#include <fstream>
#include <string>
#include <vector>

#include "halformer/safetensors.h"

namespace {

std::string env(const char* name) {
  const char* v = std::getenv(name);
  if (!v) ADD_FAILURE() << name << " is not set (run through ctest)";
  return v ? v : "";
}

template <typename T>
std::vector<T> values(const halformer::TensorInfo& t) {
  std::vector<T> v(t.bytes / sizeof(T));
  std::memcpy(v.data(), t.data, t.bytes);
  return v;
}

struct Reference {
  std::vector<int32_t> src, tgt, src_len, tgt_len, greedy;
  std::vector<float> encoder_output, logits;
  std::vector<int64_t> src_shape, tgt_shape, enc_shape, logit_shape, greedy_shape;
};

class ModelVsTorch : public ::testing::Test {
 protected:
  // One run of the binary serves every test of the suite.
  static void SetUpTestSuite() {
    bin_ = env("HALFORMER_MODEL_BIN");
    dir_ = env("HALFORMER_REFERENCE_DIR");
    if (bin_.empty() || dir_.empty()) return;
    halformer::SafetensorsFile f(dir_ + "/reference.safetensors");
    auto get = [&](const char* name) -> const halformer::TensorInfo& {
      const auto* t = f.find(name);
      if (!t) throw std::runtime_error(std::string("reference lacks ") + name);
      return *t;
    };
    r_.src = values<int32_t>(get("src"));
    r_.src_shape = get("src").shape;
    r_.tgt = values<int32_t>(get("tgt"));
    r_.tgt_shape = get("tgt").shape;
    r_.src_len = values<int32_t>(get("src_lengths"));
    r_.tgt_len = values<int32_t>(get("tgt_lengths"));
    r_.encoder_output = values<float>(get("encoder_output"));
    r_.enc_shape = get("encoder_output").shape;
    r_.logits = values<float>(get("logits"));
    r_.logit_shape = get("logits").shape;
    r_.greedy = values<int32_t>(get("greedy"));
    r_.greedy_shape = get("greedy").shape;

    // Sequences as the binary's input files (unpadded), then one run with --dump.
    auto write = [&](const std::string& path, const std::vector<int32_t>& m, int64_t T,
                     const std::vector<int32_t>& len) {
      std::ofstream o(path);
      for (size_t b = 0; b < len.size(); ++b) {
        for (int i = 0; i < len[b]; ++i) o << (i ? " " : "") << m[b * T + i];
        o << "\n";
      }
    };
    write(dir_ + "/src.txt", r_.src, r_.src_shape[1], r_.src_len);
    write(dir_ + "/tgt.txt", r_.tgt, r_.tgt_shape[1], r_.tgt_len);
    std::string cmd = "'" + bin_ + "' --weights '" + env("HALFORMER_WEIGHTS") + "' --src-file '" + dir_ +
                      "/src.txt' --tgt-file '" + dir_ + "/tgt.txt' --max-new-tokens " +
                      std::to_string(r_.greedy_shape[1]) + " --dump '" + dir_ + "/halformer.safetensors'";
    if (std::system(cmd.c_str()) != 0) {
      ADD_FAILURE() << "inference binary failed: " << cmd;
      return;
    }
    out_ = std::make_unique<halformer::SafetensorsFile>(dir_ + "/halformer.safetensors");
  }

  static void TearDownTestSuite() { out_.reset(); }
  void SetUp() override { ASSERT_NE(out_, nullptr) << "no halformer output (see the suite set-up)"; }

  // Max error over the first len[b] rows of each batch entry, relative to the scale.
  static void expect_close(const char* name, const std::vector<float>& want, const std::vector<int64_t>& shape,
                    const std::vector<int32_t>& len) {
    const auto* t = out_->find(name);
    ASSERT_NE(t, nullptr) << name;
    ASSERT_EQ(t->shape, shape) << name;
    auto got = values<float>(*t);
    const int64_t T = shape[1], C = shape[2];
    double err = 0, scale = 0;
    for (size_t b = 0; b < len.size(); ++b)
      for (int64_t i = 0; i < len[b] * C; ++i) {
        size_t k = b * T * C + i;
        err = std::max(err, double(std::abs(got[k] - want[k])));
        scale = std::max(scale, double(std::abs(want[k])));
      }
    std::printf("%s: max abs error %.3g, scale %.3g, relative %.3g\n", name, err, scale, err / scale);
    EXPECT_GT(scale, 0.0) << name << " reference is all zeros";
    EXPECT_LE(err, 1e-4 * scale) << name;
  }

  static inline std::string bin_, dir_;
  static inline Reference r_;
  static inline std::unique_ptr<halformer::SafetensorsFile> out_;
};

TEST_F(ModelVsTorch, EncoderOutput) {
  expect_close("encoder_output", r_.encoder_output, r_.enc_shape, r_.src_len);
}

TEST_F(ModelVsTorch, DecoderLogits) { expect_close("logits", r_.logits, r_.logit_shape, r_.tgt_len); }

TEST_F(ModelVsTorch, GreedyTokensIdentical) {
  const auto* t = out_->find("greedy");
  ASSERT_NE(t, nullptr);
  auto got = values<int32_t>(*t);
  const int64_t B = r_.greedy_shape[0], N = r_.greedy_shape[1], G = t->shape[1];
  for (int64_t b = 0; b < B; ++b) {
    std::vector<int32_t> want, have;
    for (int64_t i = 0; i < N && r_.greedy[b * N + i] >= 0; ++i) want.push_back(r_.greedy[b * N + i]);
    for (int64_t i = 0; i < G && got[b * G + i] >= 0; ++i) have.push_back(got[b * G + i]);
    EXPECT_EQ(have, want) << "sequence " << b;
    EXPECT_FALSE(want.empty());
  }
}

}  // namespace
