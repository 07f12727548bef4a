// The C++ API of a generated model: load weights, encode, score, generate.
// Link with the model's library (DIR/lib<name>.a) which carries the compiled kernels
// and declares the model's descriptor in DIR/<name>.h (halformer_model_<name>(), the
// name with every character outside [A-Za-z0-9] as '_'):
//
//   #include "reverse-tiny.h"
//   auto model = halformer::Model::load(*halformer_model_reverse_tiny(), "weights.safetensors");
//   auto out = model.greedy({{3, 7, 1, 9}}, /*max_new_tokens=*/20);
//
// A Model is a value: several models (the same or different ones) live side by side in
// one process and may be called from several threads at once.
//
// Sequences in a batch may have different lengths; they are right-padded with the
// spec's pad id internally and padded keys are masked.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "halformer/generation.h"
#include "halformer/model_config.h"

namespace halformer {

using Sequence = std::vector<int32_t>;

// Row-major float tensor.
struct Tensor {
  std::vector<int64_t> shape;
  std::vector<float> data;
};

struct DecodeResult {
  std::vector<Sequence> tokens;   // per sequence, without bos / prompt, with eos if produced
  // GenerationOptions::return_scores: per sequence, each token's log-probability
  // (TokenChooser::choose's `logprob`); empty otherwise.
  std::vector<std::vector<float>> token_logprobs;
  Tensor last_logits;             // [B, tgt_vocab] head output at each sequence's last step
  double encoder_ms = 0;          // encoder (or prompt) time
  std::vector<double> step_ms;    // wall time of each decoder step (whole batch)
};

struct BeamResult {
  std::vector<std::vector<Sequence>> hypotheses;  // [B][beam]: best first, with eos if produced
  std::vector<std::vector<double>> scores;        // [B][beam]: sum of log-probs / length^penalty
  double encoder_ms = 0;
  std::vector<double> step_ms;
};

// Host<->device copies made by the runtime on a GPU device (all zero on the CPU).
// Activations stay on the device between layers; only inputs (token ids, masks) go up
// and only outputs (returned tensors, logits the host reads, chosen ids) come down.
struct TransferStats {
  int64_t uploads = 0, upload_bytes = 0;                // inputs: token ids, masks
  int64_t downloads = 0, download_bytes = 0;            // outputs
  int64_t weight_uploads = 0, weight_upload_bytes = 0;  // each weight tensor once, on first use
  int64_t device_copies = 0;                            // device-to-device (KV cache reorder, rows)
};

struct Weights;
struct WeightBuffers;
struct DeviceState;
struct Call;

struct LoadOptions {
  // Threads each call of this model uses at most (<= 0: every core). Models share one
  // Halide thread pool, sized for the largest request; a call splits its parallel
  // loops into at most this many chunks.
  int threads = 0;
  // "cpu", or "cuda" / "opencl" when the spec's targets built them; a device that
  // cannot run here is an Error, never a silent fallback to the CPU.
  std::string device = "cpu";
};

class Model {
 public:
  // Loads and checks weights against the model's spec (the descriptor's config).
  static Model load(const ModelDescriptor& model, const std::string& weights_path, const LoadOptions& options = {});
  const std::string& device() const { return device_; }
  ~Model();
  Model(Model&&) noexcept;
  Model& operator=(Model&&) noexcept;

  const ModelConfig& config() const;
  const ModelDescriptor& descriptor() const { return *desc_; }
  int threads() const { return threads_; }

  // Encoder output [B, S, d_model] (S = longest source; padded rows are unspecified).
  Tensor encode(const std::vector<Sequence>& src) const;
  // Encoder-only models: the head's vector per sequence, [B, num_classes] (classifier)
  // or [B, d_model] (embedding).
  Tensor pooled(const std::vector<Sequence>& src) const;
  // Head output [B, T, tgt_vocab] for teacher-forced decoder inputs `tgt`
  // (encoder-decoder), or over the prompts `src` themselves (decoder-only; tgt empty).
  Tensor score(const std::vector<Sequence>& src, const std::vector<Sequence>& tgt = {}) const;
  // Greedy decoding. With the KV cache (default) each step runs the decoder on the new
  // token only; without it every step recomputes the whole prefix (for comparison).
  // Decoder-only models continue each prompt in `src`.
  DecodeResult greedy(const std::vector<Sequence>& src, int max_new_tokens, bool use_cache = true) const;
  // Greedy decoding or sampling with the options of generation.h (penalties, n-gram
  // blocking, minimum length, per-token scores, a callback per token). Beam search
  // (options.beam_size > 1) is beam_search(), which takes the options' sizes.
  DecodeResult generate(const std::vector<Sequence>& src, const GenerationOptions& options) const;
  // Beam search (encoder-decoder), the algorithm of tests/reference/halformer_torch beam_search().
  BeamResult beam_search(const std::vector<Sequence>& src, int beam_size, double length_penalty,
                         int max_new_tokens) const;

  // Transfers made by this model since load (see TransferStats).
  TransferStats transfers() const;

 private:
  friend class Engine;  // engine.h: steps through the model's calls
  Model(const ModelDescriptor& desc, std::unique_ptr<Weights> w, std::string device, int threads);
  Call call() const;  // one public call: the model's session and thread limit
  const ModelDescriptor* desc_;
  const KernelTable* kernels_;
  int threads_;
  std::unique_ptr<Weights> weights_;
  std::string device_;
  std::unique_ptr<WeightBuffers> buffers_;  // Halide buffers of the weights (device copies live here)
  std::unique_ptr<DeviceState> state_;      // the device interface and the transfer counts
};

}  // namespace halformer
