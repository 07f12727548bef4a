// Model weights in the layout the kernels want, loaded from a safetensors file through
// a naming preset. Linear weights are transposed at load time to (in, out) row-major,
// i.e. Halide w(n, k) with the output feature contiguous, so the matmul vectorises
// over outputs with plain loads.
#pragma once

#include <string>
#include <vector>

#include "halformer/model_config.h"

namespace halformer {

struct LinearWeights {
  int in = 0, out = 0;
  std::vector<float> w;  // [in][out]
  std::vector<float> b;  // [out]
};
struct NormWeights {
  std::vector<float> gamma, beta;
};
struct EncoderLayerWeights {
  LinearWeights qkv, attn_out, ff1, ff2;
  NormWeights norm1, norm2;
};
struct DecoderLayerWeights {
  LinearWeights qkv, attn_out, cross_q, cross_kv, cross_out, ff1, ff2;
  NormWeights norm1, norm2, norm3;
};
struct Weights {
  std::vector<float> src_embedding, tgt_embedding;  // [vocab][d]
  std::vector<float> positions;                     // [max_len][d], learned only
  std::vector<EncoderLayerWeights> encoder;
  std::vector<DecoderLayerWeights> decoder;
  NormWeights encoder_norm, decoder_norm;           // final_norm only
  LinearWeights generator;
};

// Checks every tensor the preset expects (name, dtype F32, shape) and that there are
// no unexpected ones, reporting all problems in one Error, then loads.
Weights load_weights(const ModelConfig& config, const std::string& path);

}  // namespace halformer
