// Saving (save_weights, what `halformer quantize` writes): loaded weights back as a
// safetensors file under the canonical names (docs/weights.md), each tensor in the format
// the model's kernels read -- linears unpacked from their panels to [rows][in] rows, int8
// ones and tables as I8 with F32 "_scale" rows, bf16 linears as BF16, int4 ones as U8 Q4_0
// blocks and q8_0 ones as I8 [rows][blocks][32], with F32 "_scale" [rows][blocks] -- so that loading
// the file (weight_load.cpp) gives bit-identical weights.
#include "halformer/weights.h"

#include <cstring>
#include <deque>
#include <map>
#include <string>
#include <vector>

#include "halformer/packed_blocks.h"
#include "halformer/packed_layout.h"
#include "halformer/safetensors.h"

namespace halformer {

namespace {

// Collects canonical tensors for save_weights, owning the bytes they are written from.
class CanonicalWriter {
 public:
  explicit CanonicalWriter(const ModelConfig& c) : c_(c) {}

  void floats(const std::string& name, const WeightVector<float>& v, std::vector<int64_t> shape) {
    tensors_.push_back({name, "F32", std::move(shape), v.data()});
  }
  void norm(const std::string& prefix, const NormWeights& n) {
    floats(prefix + ".weight", n.gamma, {int64_t(n.gamma.size())});
    if (!c_.rms_norm) floats(prefix + ".bias", n.beta, {int64_t(n.beta.size())});
  }
  // `d`: the table's width (the source table's is embedding_size).
  void table(const std::string& name, const EmbeddingTable& t, int vocab, int d) {
    if (!t.int8()) return floats(name, t.f, {vocab, d});
    std::vector<uint8_t> q(size_t(vocab) * d), scales(size_t(vocab) * sizeof(float));
    const size_t stride = size_t(d) + kInt8RowScaleBytes;
    for (int r = 0; r < vocab; ++r) {
      std::memcpy(q.data() + size_t(r) * d, t.q.data() + r * stride, size_t(d));
      std::memcpy(scales.data() + size_t(r) * 4, t.q.data() + r * stride + d, 4);
    }
    add(name, "I8", {vocab, d}, std::move(q));
    add(name + "_scale", "F32", {vocab}, std::move(scales));
  }
  // Rows [n0, n0 + rows) of a loaded linear as `prefix`.weight [rows][in] (+ _scale) and
  // `prefix`.bias, in the format the linear is stored in.
  void linear(const std::string& prefix, const LinearWeights& l, int n0, int rows) {
    if (l.block_quantized()) return linear_blocks(prefix, l, n0, rows);
    const int in = l.in;
    const size_t esize = l.int8() ? 1 : l.bf16() ? 2 : 4;
    std::vector<uint8_t> w(size_t(rows) * in * esize);
    for (int r = 0; r < rows; ++r)
      for (int k = 0; k < in; ++k) {
        const int n = n0 + r;
        uint8_t* dst = w.data() + (size_t(r) * in + k) * esize;
        if (l.int8())
          std::memcpy(dst, &l.q[packed_int8_index(in, n, k, l.int8_group)], 1);
        else if (l.bf16())
          std::memcpy(dst, &l.h[packed_bf16_index(in, n, k, l.panel, l.bf16_pairs)], 2);
        else
          std::memcpy(dst, &l.w[packed_index(in, n, k, l.panel)], 4);
      }
    add(prefix + ".weight", l.int8() ? "I8" : l.bf16() ? "BF16" : "F32", {rows, in}, std::move(w));
    std::vector<float> bias(l.b.begin() + n0, l.b.begin() + n0 + rows);
    if (l.int8()) {
      std::vector<float> scales(l.b.begin() + l.out + n0, l.b.begin() + l.out + n0 + rows);
      owned_floats(prefix + ".weight_scale", std::move(scales));
    }
    owned_floats(prefix + ".bias", std::move(bias));
  }
  // An int4 / q8_0 linear's rows as Q4_0 / Q8_0 blocks (U8 [rows][blocks * 16] / I8
  // [rows][blocks][32]) and F32 _scale [rows][blocks].
  void linear_blocks(const std::string& prefix, const LinearWeights& l, int n0, int rows) {
    const int B = k_blocks(l.in);
    const BlockFormat f = l.block_format();
    std::vector<uint8_t> w(size_t(rows) * B * f.block_bytes), scales(size_t(rows) * B * sizeof(float));
    std::vector<float> bias(static_cast<size_t>(rows));
    for (int r = 0; r < rows; ++r) {
      const int n = n0 + r;
      for (int b = 0; b < B; ++b) {
        for (int i = 0; i < f.block_bytes; ++i)
          w[(size_t(r) * B + b) * f.block_bytes + i] = file_byte(f, l.blocks[packed_block_index(f, l.in, n, b, i)]);
        const float d = block_scale(l.b.data(), l.in, l.out, n, b);
        std::memcpy(&scales[(size_t(r) * B + b) * sizeof(float)], &d, 4);
      }
      bias[size_t(r)] = l.b[size_t(n)];  // the biases lead the bias + scale input
    }
    if (f.bits == 8)
      add(prefix + ".weight", "I8", {rows, B, kBlockK}, std::move(w));
    else
      add(prefix + ".weight", "U8", {rows, int64_t(B) * kInt4BlockBytes}, std::move(w));
    add(prefix + ".weight_scale", "F32", {rows, B}, std::move(scales));
    owned_floats(prefix + ".bias", std::move(bias));
  }
  // A concatenated projection split back into its parts (outs[i] rows each).
  void projections(const std::string& prefix, const std::vector<std::string>& projs, const LinearWeights& l,
                   const std::vector<int>& outs) {
    for (size_t i = 0, n0 = 0; i < projs.size(); n0 += size_t(outs[i]), ++i)
      linear(prefix + "." + projs[i], l, int(n0), outs[i]);
  }
  void layer(const std::string& stack, int i, const LayerWeights& L) {
    const int d = c_.d_model, kvd = c_.kv_heads * (d / c_.heads);
    const std::string p = stack + "." + std::to_string(i) + ".";
    projections(p + "self_attn", {"q", "k", "v"}, L.qkv, {d, kvd, kvd});
    linear(p + "self_attn.o", L.attn_out, 0, d);
    if (stack == "decoder" && c_.arch == Architecture::EncoderDecoder) {
      projections(p + "cross_attn", {"q"}, L.cross_q, {d});
      projections(p + "cross_attn", {"k", "v"}, L.cross_kv, {d, d});
      linear(p + "cross_attn.o", L.cross_out, 0, d);
      norm(p + "cross_norm", L.cross_norm);
    }
    if (c_.gated_ff) linear(p + "ff_gate", L.ff_gate, 0, c_.d_ff);
    linear(p + "ff1", L.ff1, 0, c_.d_ff);
    linear(p + "ff2", L.ff2, 0, d);
    norm(p + "self_norm", L.self_norm);
    norm(p + "ff_norm", L.ff_norm);
  }
  void write(const std::string& path, const std::map<std::string, std::string>& metadata) const {
    write_safetensors(path, tensors_, metadata);
  }
  void owned_floats(const std::string& name, std::vector<float> v) {
    const int64_t n = int64_t(v.size());
    owned_f_.push_back(std::move(v));
    tensors_.push_back({name, "F32", {n}, owned_f_.back().data()});
  }

 private:
  void add(const std::string& name, const char* dtype, std::vector<int64_t> shape, std::vector<uint8_t> bytes) {
    owned_.push_back(std::move(bytes));
    tensors_.push_back({name, dtype, std::move(shape), owned_.back().data()});
  }
  const ModelConfig& c_;
  std::vector<NamedTensor> tensors_;
  std::deque<std::vector<uint8_t>> owned_;  // deque: pointers into it stay valid
  std::deque<std::vector<float>> owned_f_;
};

}  // namespace

void save_weights(const ModelConfig& c, const Weights& w, const std::string& path) {
  CanonicalWriter out(c);
  const int d = c.d_model;
  const bool enc = c.arch != Architecture::Decoder, dec = c.arch != Architecture::Encoder;
  if (enc) out.table("src_embedding.weight", w.src_embedding, c.src_vocab, c.embedding_size);
  if (dec && !c.share_src_tgt) out.table("tgt_embedding.weight", w.tgt_embedding, c.tgt_vocab, c.d_model);
  const int e = c.embedding_size;
  if (!w.positions.empty()) out.floats("pos_embedding.weight", w.positions, {c.max_len, e});
  if (!w.tgt_positions.empty()) out.floats("tgt_pos_embedding.weight", w.tgt_positions, {c.max_len, d});
  if (!w.token_types.empty()) out.floats("type_embedding.weight", w.token_types, {c.type_vocab, e});
  if (c.embedding_norm) out.norm("embedding_norm", w.embedding_norm);
  if (!w.tgt_embedding_norm.gamma.empty()) out.norm("tgt_embedding_norm", w.tgt_embedding_norm);
  if (e != d) out.linear("embed_project", w.embed_project, 0, d);
  for (size_t i = 0; i < w.encoder.size(); ++i) out.layer("encoder", int(i), w.encoder[i]);
  for (size_t i = 0; i < w.decoder.size(); ++i) out.layer("decoder", int(i), w.decoder[i]);
  if (c.final_norm) {
    if (enc) out.norm("encoder_norm", w.encoder_norm);
    if (dec) out.norm("decoder_norm", w.decoder_norm);
  }
  if (!w.encoder_relative_bias.empty())
    out.floats("encoder_relative_bias.weight", w.encoder_relative_bias, {c.relative_buckets, c.heads});
  if (!w.decoder_relative_bias.empty())
    out.floats("decoder_relative_bias.weight", w.decoder_relative_bias, {c.relative_buckets, c.heads});
  if (dec) {
    if (c.share_tgt_output)  // the weight is the target table's
      out.owned_floats("generator.bias", {w.generator.b.begin(), w.generator.b.begin() + c.tgt_vocab});
    else
      out.linear("generator", w.generator, 0, c.tgt_vocab);
  }
  if (c.head == HeadKind::Classifier) {
    if (c.pooler) out.linear("pooler", w.pooler, 0, d);
    out.linear("classifier", w.classifier, 0, c.num_classes);
  }
  out.write(path, {{"halformer.names", "canonical"},
                   {"halformer.model", c.name},
                   {"halformer.layers", enum_name(c.layer_weights)},
                   {"halformer.generator", enum_name(c.generator_weights)},
                   {"halformer.embeddings", enum_name(c.embedding_weights)}});
}

}  // namespace halformer
