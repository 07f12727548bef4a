// embedding: out(c, t, b) = table(c, token(t, b)) * scale + position(c, pos_offset + t)
//                           [+ type_table(c, type_id(t, b))]   (token_types, BERT)
//   positions sinusoidal: PE(p, 2i) = sin(p * w_i), PE(p, 2i+1) = cos(p * w_i),
//                         w_i = exp(2i * -ln(10000) / d), evaluated in fp32 like PyTorch
//   positions sinusoidal_split (Marian): PE(p, c) = sin(p / v_c) for c < h = ceil(C / 2),
//                         cos(p / v_(c-h)) after, v_j = 10000^(2j / C), in fp64 then
//                         rounded to fp32 like transformers' numpy table (fp32 on
//                         OpenCL devices without doubles)
//   positions learned:    a (C, max_len) table, the pos_table input
//   positions none:       nothing added
// embedding_int8: the same, over a table of int8 rows (halformer/packed_layout.h): row r
// holds C int8 values then the row's fp32 scale in 4 bytes, table(c, r) * scale(r) being
// the fp32 value; one contiguous row per token (a quarter of the fp32 table's memory).
// Token ids are range-checked by the runtime before the call; the clamp here only keeps
// a bad id from reading outside the table.
#include "common.h"

namespace halformer {
using namespace Halide;

template <bool kInt8>
class Embedding : public Generator<Embedding<kInt8>> {
 public:
  template <typename T> using GeneratorParam = Halide::GeneratorParam<T>;
  template <typename T> using Input = typename Generator<Embedding<kInt8>>::template Input<T>;
  template <typename T> using Output = typename Generator<Embedding<kInt8>>::template Output<T>;
  using TableType = std::conditional_t<kInt8, int8_t, float>;
  using Generator<Embedding<kInt8>>::get_target;
  using Generator<Embedding<kInt8>>::using_autoscheduler;
  GeneratorParam<int> channels{"channels", 64};
  GeneratorParam<int> vocab{"vocab", 16};
  GeneratorParam<int> max_len{"max_len", 64};
  GeneratorParam<bool> scale{"scale", true};  // multiply by sqrt(channels)
  // The positions an embedding adds (rotary and relative ones are the attention's: "none").
  GeneratorParam<Positions> positions{"positions", Positions::Sinusoidal,
                                      param_names({Positions::Sinusoidal, Positions::Learned, Positions::None,
                                                   Positions::SinusoidalSplit})};
  GeneratorParam<int> type_vocab{"type_vocab", 0};  // > 0: add token type embeddings
  GeneratorParam<int> vec{"vec", 16};

  Input<Buffer<int32_t, 2>> tokens{"tokens"};  // (T, B)
  Input<Buffer<int32_t, 2>> type_ids{"type_ids"};  // (T, B); read only when type_vocab > 0
  Input<Buffer<TableType, 2>> table{"table"};   // (C, vocab); int8: (C + 4, vocab)
  Input<Buffer<float, 2>> pos_table{"pos_table"};  // (C, max_len); read only when learned
  Input<Buffer<float, 2>> type_table{"type_table"};  // (C, type_vocab); read only when type_vocab > 0
  Input<int32_t> pos_offset{"pos_offset"};      // position of t = 0 (decode steps)
  Output<Buffer<float, 3>> out{"out"};          // (C, T, B)

  void generate() {
    const int C = channels;
    Var c("c"), t("t"), b("b");
    Expr tok = clamp(tokens(t, b), 0, int(vocab) - 1);
    const float embed_scale = scale ? std::sqrt(float(C)) : 1.0f;
    Func row_scale("row_scale");  // int8: per token, its row's scale (x sqrt(C))
    Expr e;
    if (kInt8) {
      Expr bits = cast<uint32_t>(0);
      for (int i = 0; i < 4; ++i) bits = bits | (cast<uint32_t>(cast<uint8_t>(table(C + i, tok))) << (8 * i));
      row_scale(t, b) = reinterpret<float>(bits) * embed_scale;
      e = cast<float>(table(c, tok)) * row_scale(t, b);
    } else {
      e = table(c, tok);
      if (scale) e = e * embed_scale;
    }
    Expr p = pos_offset + t;
    Func freq("freq");  // per feature, not per element
    freq(c) = exp(cast<float>((c / 2) * 2) * float(-std::log(10000.0) / C));
    if (positions == Positions::Sinusoidal) {
      Expr angle = cast<float>(p) * freq(c);
      e = e + select(c % 2 == 0, sin(angle), cos(angle));
    } else if (positions == Positions::SinusoidalSplit) {
      const int h = (C + 1) / 2;
      Expr j = select(c < h, c, c - h);
      // fp64 where the target has it; OpenCL without cl_khr_fp64: fp32 (within the layer
      // tests' tolerance, not bit-identical to transformers' table)
      const bool f64 = !get_target().has_feature(Target::OpenCL) || get_target().has_feature(Target::CLDoubles);
      const Type ft = f64 ? Float(64) : Float(32);
      Expr angle = cast(ft, p) / pow(Internal::make_const(ft, 10000.0), cast(ft, 2 * j) / Internal::make_const(ft, C));
      e = e + cast<float>(select(c < h, sin(angle), cos(angle)));
    } else if (positions == Positions::Learned) {
      e = e + pos_table(c, clamp(p, 0, int(max_len) - 1));
    }
    if (type_vocab > 0) e = e + type_table(c, clamp(type_ids(t, b), 0, int(type_vocab) - 1));
    out(c, t, b) = e;

    const int row = kInt8 ? C + 4 : C;
    table.dim(0).set_bounds(0, row).dim(1).set_bounds(0, vocab).set_stride(row);
    out.dim(0).set_bounds(0, C);

    if (using_autoscheduler()) {
      tokens.set_estimates({{0, 128}, {0, 1}});
      table.set_estimates({{0, row}, {0, vocab}});
      pos_table.set_estimates({{0, C}, {0, max_len}});
      type_ids.set_estimates({{0, 128}, {0, 1}});
      type_table.set_estimates({{0, C}, {0, std::max(1, int(type_vocab))}});
      pos_offset.set_estimate(0);
      out.set_estimates({{0, C}, {0, 128}, {0, 1}});
      return;
    }
    if (get_target().has_gpu_feature()) {
      Var co("co"), ci("ci");
      out.split(c, co, ci, std::min(C, 64), TailStrategy::GuardWithIf)
          .reorder(ci, co, t, b)
          .gpu_blocks(t, b)
          .gpu_threads(ci);
      return;
    }
    // Tasks of 8 tokens: a single sequence (batch 1) still uses every core.
    Var tb("tb");
    if (positions == Positions::Sinusoidal) freq.compute_root().vectorize(c, pow2_divisor(C, vec));
    out.vectorize(c, pow2_divisor(C, vec)).fuse(t, b, tb).parallel(tb, 8, TailStrategy::GuardWithIf);
  }
};

}  // namespace halformer

HALIDE_REGISTER_GENERATOR(halformer::Embedding<false>, embedding)
HALIDE_REGISTER_GENERATOR(halformer::Embedding<true>, embedding_int8)
