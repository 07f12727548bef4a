// The C++ API of a generated model: load weights, encode, score, decode greedily.
// Link with the model's library (DIR/lib<name>.a) which carries the compiled kernels.
//
//   auto model = halformer::Model::load("weights.safetensors");
//   auto out = model.greedy({{3, 7, 1, 9}}, /*max_new_tokens=*/20);
//
// Sequences in a batch may have different lengths; they are right-padded with the
// spec's pad id internally and padded keys are masked.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "halformer/model_config.h"

namespace halformer {

using Sequence = std::vector<int32_t>;

// Row-major float tensor.
struct Tensor {
  std::vector<int64_t> shape;
  std::vector<float> data;
};

struct DecodeResult {
  std::vector<Sequence> tokens;   // per sequence, without bos, with eos if produced
  Tensor last_logits;             // [B, tgt_vocab] head output at each sequence's last step
  double encoder_ms = 0;
  std::vector<double> step_ms;    // wall time of each decoder step (whole batch)
};

struct Weights;

class Model {
 public:
  // Loads and checks weights against the compiled-in spec. threads <= 0: Halide's default.
  static Model load(const std::string& weights_path, int threads = 0);
  ~Model();
  Model(Model&&) noexcept;
  Model& operator=(Model&&) noexcept;

  const ModelConfig& config() const;

  // Encoder output [B, S, d_model] (S = longest source; padded rows are unspecified).
  Tensor encode(const std::vector<Sequence>& src) const;
  // Head output for teacher-forced decoder inputs: [B, T, tgt_vocab].
  Tensor score(const std::vector<Sequence>& src, const std::vector<Sequence>& tgt) const;
  // Greedy decoding with a KV cache: each step runs the decoder on the new token only.
  DecodeResult greedy(const std::vector<Sequence>& src, int max_new_tokens) const;

 private:
  explicit Model(std::unique_ptr<Weights> w);
  std::unique_ptr<Weights> weights_;
};

}  // namespace halformer
