// Naming preset "torch.nn.Transformer": the state_dict of the module documented in
// tools/halformer_torch.py (Seq2Seq), saved with safetensors.torch.save_file:
//   src_embedding.weight [src_vocab, d]      tgt_embedding.weight [tgt_vocab, d]
//   pos_embedding.weight [max_len, d]        (positions: learned)
//   transformer.encoder.layers.N.{self_attn.in_proj_weight [3d, d], self_attn.in_proj_bias,
//       self_attn.out_proj.{weight,bias}, linear1.{weight,bias}, linear2.{weight,bias},
//       norm1.{weight,bias}, norm2.{weight,bias}}
//   transformer.decoder.layers.N.{self_attn.*, multihead_attn.*, linear1, linear2, norm1..3}
//   transformer.{encoder,decoder}.norm.{weight,bias}   (final_norm: true)
//   generator.{weight [tgt_vocab, d], bias [tgt_vocab]}
#include "halformer/weights.h"

#include <cmath>
#include <cstring>
#include <set>
#include <sstream>
#include <tuple>

#include "halformer/error.h"
#include "halformer/safetensors.h"

namespace halformer {
namespace {

class Loader {
 public:
  explicit Loader(const std::string& path) : file_(path) {}

  // Returns the tensor's floats (row-major) or records a problem and returns zeros.
  std::vector<float> take(const std::string& name, std::vector<int64_t> shape) {
    size_t n = 1;
    for (int64_t d : shape) n *= static_cast<size_t>(d);
    std::vector<float> v(n, 0.0f);
    const TensorInfo* t = file_.find(name);
    used_.insert(name);
    if (!t) {
      missing_.push_back(name + " " + shape_str(shape));
      return v;
    }
    if (t->dtype != "F32" || t->shape != shape) {
      mismatched_.push_back(name + ": expected F32 " + shape_str(shape) + ", found " + t->dtype +
                            " " + shape_str(t->shape));
      return v;
    }
    std::memcpy(v.data(), t->data, n * sizeof(float));
    for (float x : v) {
      if (!std::isfinite(x)) {
        nonfinite_.push_back(name);
        break;
      }
    }
    return v;
  }

  LinearWeights linear(const std::string& prefix, int in, int out) {
    return transpose(take(prefix + ".weight", {out, in}), take(prefix + ".bias", {out}), in, out);
  }

  // torch.nn.MultiheadAttention packs the Q, K, V projections as rows of in_proj_weight;
  // self-attention keeps them fused (one d -> 3d matmul).
  LinearWeights packed_in_proj(const std::string& prefix, int d) {
    return transpose(take(prefix + ".in_proj_weight", {3 * d, d}),
                     take(prefix + ".in_proj_bias", {3 * d}), d, 3 * d);
  }

  // Cross-attention splits them: Q from the decoder stream, K and V from the memory.
  std::pair<LinearWeights, LinearWeights> split_in_proj(const std::string& prefix, int d,
                                                        int q_rows) {
    auto w = take(prefix + ".in_proj_weight", {3 * d, d});
    auto b = take(prefix + ".in_proj_bias", {3 * d});
    auto part = [&](int row0, int rows) {
      std::vector<float> pw(w.begin() + size_t(row0) * d, w.begin() + size_t(row0 + rows) * d);
      std::vector<float> pb(b.begin() + row0, b.begin() + row0 + rows);
      return transpose(std::move(pw), std::move(pb), d, rows);
    };
    return {part(0, q_rows), part(q_rows, 3 * d - q_rows)};
  }

  NormWeights norm(const std::string& prefix, int d) {
    return {take(prefix + ".weight", {d}), take(prefix + ".bias", {d})};
  }

  void check() const {
    std::vector<std::string> unexpected;
    for (const auto& [name, info] : file_.tensors()) {
      if (!used_.count(name)) unexpected.push_back(name + " " + shape_str(info.shape));
    }
    if (missing_.empty() && mismatched_.empty() && unexpected.empty() && nonfinite_.empty()) return;
    std::ostringstream msg;
    msg << file_.path() << ": weights do not match the spec (naming preset torch.nn.Transformer)";
    auto list = [&](const char* title, const std::vector<std::string>& items) {
      if (items.empty()) return;
      msg << "\n  " << title << " (" << items.size() << "):";
      for (size_t i = 0; i < items.size() && i < 20; ++i) msg << "\n    " << items[i];
      if (items.size() > 20) msg << "\n    ... and " << items.size() - 20 << " more";
    };
    list("missing", missing_);
    list("wrong dtype or shape", mismatched_);
    list("unexpected (not used by this spec)", unexpected);
    list("containing NaN or Inf", nonfinite_);
    throw Error(msg.str());
  }

 private:
  static std::string shape_str(const std::vector<int64_t>& s) {
    std::string r = "[";
    for (size_t i = 0; i < s.size(); ++i) r += (i ? ", " : "") + std::to_string(s[i]);
    return r + "]";
  }
  static LinearWeights transpose(std::vector<float> w, std::vector<float> b, int in, int out) {
    LinearWeights l;
    l.in = in;
    l.out = out;
    l.w.resize(size_t(in) * out);
    for (int o = 0; o < out; ++o)
      for (int i = 0; i < in; ++i) l.w[size_t(i) * out + o] = w[size_t(o) * in + i];
    l.b = std::move(b);
    return l;
  }

  SafetensorsFile file_;
  std::set<std::string> used_;
  std::vector<std::string> missing_, mismatched_, nonfinite_;
};

}  // namespace

Weights load_weights(const ModelConfig& c, const std::string& path) {
  if (std::string(c.weight_preset) != "torch.nn.Transformer")
    throw Error(std::string("weight naming preset '") + c.weight_preset + "' is not supported yet");
  Loader ld(path);
  const int d = c.d_model;
  Weights w;
  w.src_embedding = ld.take("src_embedding.weight", {c.src_vocab, d});
  w.tgt_embedding = ld.take("tgt_embedding.weight", {c.tgt_vocab, d});
  if (c.positions == PositionKind::Learned) w.positions = ld.take("pos_embedding.weight", {c.max_len, d});
  for (int i = 0; i < c.encoder_layers; ++i) {
    std::string p = "transformer.encoder.layers." + std::to_string(i) + ".";
    EncoderLayerWeights L;
    L.qkv = ld.packed_in_proj(p + "self_attn", d);
    L.attn_out = ld.linear(p + "self_attn.out_proj", d, d);
    L.ff1 = ld.linear(p + "linear1", d, c.d_ff);
    L.ff2 = ld.linear(p + "linear2", c.d_ff, d);
    L.norm1 = ld.norm(p + "norm1", d);
    L.norm2 = ld.norm(p + "norm2", d);
    w.encoder.push_back(std::move(L));
  }
  for (int i = 0; i < c.decoder_layers; ++i) {
    std::string p = "transformer.decoder.layers." + std::to_string(i) + ".";
    DecoderLayerWeights L;
    L.qkv = ld.packed_in_proj(p + "self_attn", d);
    L.attn_out = ld.linear(p + "self_attn.out_proj", d, d);
    std::tie(L.cross_q, L.cross_kv) = ld.split_in_proj(p + "multihead_attn", d, d);
    L.cross_out = ld.linear(p + "multihead_attn.out_proj", d, d);
    L.ff1 = ld.linear(p + "linear1", d, c.d_ff);
    L.ff2 = ld.linear(p + "linear2", c.d_ff, d);
    L.norm1 = ld.norm(p + "norm1", d);
    L.norm2 = ld.norm(p + "norm2", d);
    L.norm3 = ld.norm(p + "norm3", d);
    w.decoder.push_back(std::move(L));
  }
  if (c.final_norm) {
    w.encoder_norm = ld.norm("transformer.encoder.norm", d);
    w.decoder_norm = ld.norm("transformer.decoder.norm", d);
  }
  w.generator = ld.linear("generator", d, c.tgt_vocab);
  ld.check();
  return w;
}

}  // namespace halformer
