// attention: multi-head scaled dot-product attention with additive key mask and optional
// causal mask, on 4-D views of the projection outputs:
//   q(d, hq, i, b), kv(d, hk, j, b)   d < head_dim, h = head index inside the buffer
//   out(d, h, i, b) = sum_j softmax_j(q_h . k_h / sqrt(head_dim) + mask) * v_h
// Query head h lives at hq = q_head + h, its key at k_head + h and value at v_head + h.
// That one rule covers self-attention on a fused QKV buffer (q_head 0, k_head H,
// v_head 2H) and cross-attention on a separate Q buffer and fused KV buffer (0, 0, H).
//
// key_mask(j, b) is additive (0 for a real key, -1e30 for padding): a finite value so a
// row whose keys are all masked (a padded query) gives a uniform row instead of NaN.
// Causal: key j is visible to query i iff j <= i + (Tk - Tq), so the same kernel serves
// a full sequence (Tq == Tk) and incremental decoding (Tq new rows after a cache).
//
// Relative position bias (relative_distance M > 0, T5): position_bias(r, h) is added to
// the score of query position p and key j, r = clamp(j - p, -M, M) + M. The runtime
// fills that (2M + 1, H) table from the model's bucketed table (T5's buckets saturate at
// M, so the clamp is exact); p = Tk - Tq + i, as for rotary positions. Without it the
// input is not read (any buffer will do). `scale` replaces 1/sqrt(head_dim) (T5: 1).
//
// Grouped-query attention (kv_group > 1): query head h reads key and value head
// h / kv_group (Hugging Face's repeat_kv order), so a fused row holds H query heads and
// H / kv_group key and value heads each, and so does the KV cache.
// Rotary positions (rotary_dim > 0): queries and keys are rotated on read, at position
// Tk - Tq + i (query i) and j (key j) -- the position in the buffer (rotary_math.h has the
// arithmetic). Models do not use this any more: the rotary kernel (rotary.cpp) turns each
// row once before it is attended or cached, so that a decode step reads its keys as they
// are (docs/performance-log.md#rotary-once); the layer tests still check it here.
#include <algorithm>
#include <cmath>
#include <functional>

#include "common.h"
#include "halformer/kv_int8.h"
#include "halformer/packed_layout.h"
#include "rotary_math.h"
#include "schedules/cpu_rows.h"
#include "attention_stages.h"

namespace halformer {
using namespace Halide;

class Attention : public Generator<Attention> {
 public:
  GeneratorParam<int> heads{"heads", 4};
  GeneratorParam<int> head_dim{"head_dim", 16};
  GeneratorParam<int> q_head{"q_head", 0};
  GeneratorParam<int> k_head{"k_head", 4};
  GeneratorParam<int> v_head{"v_head", 8};
  GeneratorParam<bool> causal{"causal", false};
  GeneratorParam<int> kv_group{"kv_group", 1};         // query heads per key/value head
  GeneratorParam<int> rotary_dim{"rotary_dim", 0};     // 0: no rotary positions
  GeneratorParam<float> rotary_theta{"rotary_theta", 10000.0f};
  GeneratorParam<bool> rotary_interleaved{"rotary_interleaved", false};
  // > 0: the positions a call can see (the model's max_len): on a CPU the cos / sin of
  // every (frequency, position) are computed here, once, into constant tables (below).
  GeneratorParam<int> rotary_positions{"rotary_positions", 0};
  GeneratorParam<int> relative_distance{"relative_distance", 0};  // 0: no position bias
  GeneratorParam<float> scale{"scale", 0.0f};                     // 0: 1 / sqrt(head_dim)
  // true: keys and values arrive as bf16 bits (uint16) on the CPU -- a bf16 attention
  // cache (precision_overrides.kv_cache), half the bytes a decode step streams; widened
  // to fp32 on read (exact), so the arithmetic is unchanged. GPU targets keep fp32.
  GeneratorParam<bool> kv_bf16{"kv_bf16", false};
  // true: the queries too (self-attention over a bf16 KV cache: the fused QKV rows that
  // the cache holds, queries included). CPU only, as kv_bf16.
  GeneratorParam<bool> q_bf16{"q_bf16", false};
  // The 16-bit format of the *_bf16 flags (common.h kHalfNames): bf16, or fp16 (an fp16 cache).
  GeneratorParam<Precision> half{"half", Precision::Bf16, kHalfNames};
  // true: keys and values arrive as int8 rows on the CPU (an int8 cache,
  // halformer/kv_int8.h: each head's features, then their fp32 scale in 4 bytes), instead
  // of kv_bf16. The integers are read exactly (as bf16 bits where the pair products take
  // them); a key's scale multiplies its score; a value's multiplies its softmax weight
  // (decode) or its compact copy (many queries). GPU: fp32.
  GeneratorParam<bool> kv_int8{"kv_int8", false};
  // How many key / value rows ahead the one-query (decode) path prefetches on the CPU; 0:
  // none. For caches whose rows hold every head (self-attention's fused rows); the CPU's
  // cross-attention cache is stored head by head (Model::cross_kv), streams the hardware
  // follows, and its kernel takes 0 (tools/spec/plan.cpp).
  GeneratorParam<int> decode_prefetch{"decode_prefetch", 4};
  // Schedule knobs.
  // 0: the target's (below): AVX-512 16 keys x 8 queries, AVX2 16 keys x 6 queries.
  GeneratorParam<int> vec{"vec", 0};
  GeneratorParam<int> tile_q{"tile_q", 0};  // queries per tile (bf16 pairs: one vector of them)
  // The V product's register block: v_features head features x v_queries queries (0: the
  // target's, below).
  GeneratorParam<int> v_features{"v_features", 0};
  GeneratorParam<int> v_queries{"v_queries", 0};
  GeneratorParam<int> gpu_tile_q{"gpu_tile_q", 8};   // queries per block
  GeneratorParam<int> gpu_key_lanes{"gpu_key_lanes", 32};  // threads across keys
  // Softmax max and sum per query: 0 walked by one thread per query; L > 0: each query's
  // keys split across L threads (partials in shared memory), then combined. 32: measured
  // faster than one thread per query (docs/performance-log.md#attention).
  GeneratorParam<int> gpu_reduce_lanes{"gpu_reduce_lanes", 32};
  // The V product: 0, one thread per (feature, query) adding into the block's shared
  // memory at every key; n > 0, one thread per (feature, n queries), its n sums held in
  // registers over the keys and stored once (docs/gpu.md).
  GeneratorParam<int> gpu_v_queries{"gpu_v_queries", 2};
  // The scores: 0, one thread per (key, query) adding into the block's shared memory at
  // every head feature; n > 0, one thread per (key, n queries) summing in registers.
  // 1 and 2 (V): fewer queries per thread keep more threads busy
  // (docs/performance-log.md#attention).
  GeneratorParam<int> gpu_score_queries{"gpu_score_queries", 1};
  // GPU: keys in tiles of this many with an online softmax (a running max, sum and V
  // product per query, rescaled as each tile's arrive), so shared memory does not grow with
  // the sequence; 0: whole score rows in shared memory (the knobs above), which fit the 48
  // KB a launch may use up to about 635 keys at head size 64 and were faster at 128 keys
  // on the H200 (transformer-base b32: 6.12 ms against 7.34 with tiles of 32); -1 (the
  // default): whole rows where max_keys is known and their shared memory there fits 48 KB
  // (512 keys at head size 64), else tiles of 32. docs/gpu-tensor-cores.md#attention.
  GeneratorParam<int> gpu_key_tile{"gpu_key_tile", -1};
  GeneratorParam<int> max_keys{"max_keys", 0};  // the longest key sequence of a call (the spec's max_len; 0: unknown)
  // > 0: a paged cache (the engine's, runtime/kv_blocks.h): kv is a pool of blocks of this
  // many positions, (d, h, slot, block), and key j of sequence b sits at slot j % block_size
  // of block block_table(j / block_size, b) -- an extra input after position_bias. The key
  // count is key_mask's. Arithmetic and schedule are the contiguous cache's, so a paged call
  // gives the same bits (tests/layers/test_layers_paged.cpp).
  GeneratorParam<int> block_size{"block_size", 0};

  Input<Buffer<void, 4>> q{"q"};                 // float, or uint16 (bf16 bits) with q_bf16
  Input<Buffer<void, 4>> kv{"kv"};               // float, uint16 (bf16 bits) with kv_bf16, int8 rows with kv_int8
  Input<Buffer<float, 2>> key_mask{"key_mask"};  // (Tk, B)
  Input<Buffer<float, 2>> position_bias{"position_bias"};  // (2M + 1, heads); read only when M > 0
  Output<Buffer<float, 4>> out{"out"};           // (head_dim, heads, Tq, B)
  Input<Buffer<int32_t, 2>>* block_table = nullptr;  // (blocks, B), block_size > 0 only

  bool bf16_kv() const { return kv_bf16 && !get_target().has_gpu_feature(); }
  bool bf16_q() const { return q_bf16 && !get_target().has_gpu_feature(); }
  bool int8_kv() const { return kv_int8 && !get_target().has_gpu_feature(); }
  void configure() {
    if (kv_int8 && kv_bf16) throw std::invalid_argument("attention: kv_int8 and kv_bf16 are exclusive");
    q.set_type(bf16_q() ? UInt(16) : Float(32));
    kv.set_type(int8_kv() ? Int(8) : bf16_kv() ? UInt(16) : Float(32));
    if (block_size > 0) block_table = add_input<Buffer<int32_t, 2>>("block_table");
  }

  void generate() {
    const int H = heads, D = head_dim, G = kv_group, R = rotary_dim;
    AttentionStages st;  // the stages the GPU schedules share (copies below name the same ones)
    Var d = st.d, h = st.h, i = st.i, j = st.j, b = st.b;
    const int BS = block_size;
    if (BS < 0) throw std::invalid_argument("attention: block_size must be >= 0");
    Expr Tq = q.dim(2).extent(), Tk = BS > 0 ? key_mask.dim(0).extent() : kv.dim(2).extent();
    if (G < 1 || H % G != 0) throw std::invalid_argument("attention: kv_group must divide heads");
    if (R < 0 || R > D || R % 2 != 0) throw std::invalid_argument("attention: rotary_dim must be even and <= head_dim");
    const int M = relative_distance;
    if (M < 0) throw std::invalid_argument("attention: relative_distance must be >= 0");
    const float score_scale = float(scale) > 0.0f ? float(scale) : 1.0f / std::sqrt(float(D));
    // The relative position bias of key j for a query at position p (0 without one).
    auto bias = [&](Expr jj, Expr p, Expr hh) -> Expr {
      if (M == 0) return 0.0f;
      return position_bias(clamp(jj - p, -M, M) + M, hh);
    };

    // Rotary positions: rope.rotate(x, d, pos) is feature d of a row at position `pos`.
    const RotaryMath rope(R, D, float(rotary_theta), rotary_interleaved, rotary_positions,
                          !get_target().has_gpu_feature() && !using_autoscheduler());
    auto rotate = [&](const std::function<Expr(Expr)>& x, Expr dd, Expr p) { return rope.rotate(x, dd, p); };
    const Expr kv_h = h / G;  // the key/value head of query head h
    // A query, key or value feature as fp32.
    auto qf = [&](Expr dd, Expr hh, Expr ii, Expr bb) -> Expr {
      Expr e = q(dd, hh, ii, bb);
      return bf16_q() ? from_half_bits(e, half) : e;
    };
    auto kv_raw = [&](Expr dd, Expr hh, Expr jj, Expr bb) -> Expr {  // as stored (bf16: its bits)
      return BS > 0 ? kv(dd, hh, jj % BS, clamp((*block_table)(jj / BS, bb), 0, kv.dim(3).extent() - 1))
                    : kv(dd, hh, jj, bb);
    };
    // A key or value feature as fp32; int8: the integer, its row's scale applied apart.
    auto kvf = [&](Expr dd, Expr hh, Expr jj, Expr bb) -> Expr {
      Expr e = kv_raw(dd, hh, jj, bb);
      return int8_kv() ? cast<float>(e) : bf16_kv() ? from_half_bits(e, half) : e;
    };
    // A key feature as bf16 bits for the pair products (int8: exactly, |v| <= 128).
    auto kv_bits = [&](Expr dd, Expr hh, Expr jj, Expr bb) -> Expr {
      Expr e = kv_raw(dd, hh, jj, bb);
      return int8_kv() ? cast<uint16_t>(reinterpret<uint32_t>(cast<float>(e)) >> 16) : e;
    };
    // int8: a row's scale, the fp32 in the 4 bytes after its features; the factor `x` times it.
    auto scaled = [&](Expr x, Expr hh, Expr jj, Expr bb) -> Expr {
      if (!int8_kv()) return x;
      Expr u = cast<uint32_t>(0);
      for (int k = 0; k < kKvInt8ScaleBytes; ++k)
        u = u | (cast<uint32_t>(cast<uint8_t>(kv_raw(D + k, hh, jj, bb))) << (8 * k));
      return x * reinterpret<float>(u);
    };

    // Query rows past Tq belong to a partial tile and are discarded: clamp reads.
    Func qc = st.qc;
    {
      Expr ic = min(i, Tq - 1);
      qc(d, h, i, b) = rotate([&](Expr e) { return qf(e, q_head + h, ic, b); }, d, Tk - Tq + ic);
    }
    // Keys transposed per (head, batch) so the score loop vectorises over keys. On the
    // CPU they are first copied to a compact (d, j) block: gathering straight from kv's
    // rows, 3 * d_model floats apart, hits one cache set per row (4-KiB aliasing;
    // docs/performance-log.md#attention).
    Func kc = st.kc, kt = st.kt;
    {
      Expr jc = min(j, Tk - 1);  // whole key blocks: clamp reads
      kc(d, j, h, b) = rotate([&](Expr e) { return kvf(e, k_head + kv_h, jc, b); }, d, jc);
    }
    kt(j, d, h, b) = kc(d, j, h, b);

    // bf16 queries and keys on a CPU with a bf16 dot product (AVX-512 BF16), not turned on
    // read: each fp32 lane sums a pair of bf16 products per instruction (vdpbf16ps), the
    // pairs adjacent in the rows as stored; the products are exact, only the order of the
    // sum differs from the widened path (docs/performance-log.md#self-cache-apart).
    const bool bf16_pairs = bf16_q() && (bf16_kv() || int8_kv()) && half == Precision::Bf16 && R == 0 && D % 2 == 0 &&
                            bf16_dot_product(get_target().to_string()) && !using_autoscheduler();
    RDom rp(0, 2, 0, D / 2, "rp");  // rp.x: the pair's element, rp.y: the pair
    auto bf16_value = [](Expr bits) { return cast<float>(reinterpret(BFloat(16), bits)); };
    Expr pair_d = 2 * rp.y + rp.x;

    RDom rd = st.rd = RDom(0, D, "rd");
    // qk: the dot products; score: their values as the softmax reads them (inlined but on a
    // GPU with gpu_score_queries, where qk sums in registers and score is the shared row).
    Func qk = st.qk, score = st.score;
    qk(j, i, h, b) = 0.0f;
    qk(j, i, h, b) += qc(rd, h, i, b) * kt(j, rd, h, b);
    // Many queries in bf16 pairs (CPU): a vector of queries are the lanes -- each key's pair
    // broadcast against the queries' pairs, a vdpbf16ps per pair -- so the keys are read as
    // the cache holds them, neither widened nor transposed (docs/performance-log.md#queries-as-lanes).
    Func q_lanes("q_lanes"), qk_lanes("qk_lanes");  // (pair element, query, pair, head, b); (query, key, ...)
    // int8: per task, each key/value head's keys as bf16 bits for the pair products (k_bits),
    // and its keys' and values' scales (key_scale times the score scale), each made once,
    // not at every query tile or head (kvh: a key/value head).
    Var kvh("kvh");
    Func k_bits("k_bits"), key_scale("key_scale"), value_scale("value_scale");
    k_bits(d, j, kvh, b) = kv_bits(d, k_head + kvh, min(j, Tk - 1), b);
    key_scale(j, kvh, b) = scaled(score_scale, k_head + kvh, min(j, Tk - 1), b);
    value_scale(j, kvh, b) = scaled(1.0f, v_head + kvh, min(j, Tk - 1), b);
    const Expr score_factor = int8_kv() ? key_scale(j, kv_h, b) : Expr(score_scale);
    if (bf16_pairs) {
      q_lanes(d, i, j, h, b) = q(2 * j + d, q_head + h, min(i, Tq - 1), b);
      qk_lanes(i, j, h, b) = 0.0f;
      qk_lanes(i, j, h, b) += bf16_value(q_lanes(rp.x, i, rp.y, h, b)) * bf16_value(k_bits(pair_d, j, kv_h, b));
    }
    score(j, i, h, b) = bf16_pairs ? qk_lanes(i, j, h, b) : qk(j, i, h, b);
    Expr s = score(j, i, h, b) * score_factor + key_mask(j, b) + bias(j, Tk - Tq + i, h);
    // Added rather than selected: a select would let bounds inference skip the scores of
    // hidden keys, which breaks the fixed-size score blocks of the CPU schedule.
    if (causal) s += select(j > i + (Tk - Tq), -1e30f, 0.0f);
    Func masked = st.masked;
    masked(j, i, h, b) = s;

    RDom rj = st.rj = RDom(0, Tk, "rj");
    Func row_max = st.row_max, row_sum = st.row_sum, p = st.p;
    row_max(i, h, b) = Float(32).min();
    row_max(i, h, b) = max(row_max(i, h, b), masked(rj, i, h, b));
    p(j, i, h, b) = exp(masked(j, i, h, b) - row_max(i, h, b));
    row_sum(i, h, b) = 0.0f;
    row_sum(i, h, b) += p(rj, i, h, b);

    Func acc = st.acc;
    acc(d, h, i, b) = 0.0f;
    // Values, like keys, copied per (head, batch) into a compact block on the CPU.
    Func vc = st.vc;
    vc(d, j, h, b) = kvf(d, v_head + kv_h, j, b) * (int8_kv() ? value_scale(j, kv_h, b) : Expr(1.0f));
    acc(d, h, i, b) += p(rj, i, h, b) * vc(d, rj, h, b);
    Expr all_rows = acc(d, h, i, b) / row_sum(i, h, b);

    // One query row (every decode step) on the CPU: scores as dot products along the
    // contiguous head features instead -- for a single query the transposed copy of K
    // would cost more than the scores themselves. Selected at run time by specialising
    // out on Tq == 1; Halide then drops the other path from each branch.
    RDom rd1(0, D, "rd1");
    Func dot("dot"), s1("s1"), max1("max1"), p1("p1"), sum1("sum1"), acc1("acc1");
    // With rotary positions, the query row and the keys rotated first (q1, k1).
    Func q1("q1"), k1("k1");
    q1(d, h, b) = rotate([&](Expr e) { return qf(e, q_head + h, 0, b); }, d, Tk - 1);
    k1(d, j, h, b) = rotate([&](Expr e) { return kvf(e, k_head + h, j, b); }, d, j);
    const bool dot_pairs = bf16_pairs && D % 16 == 0;  // the one-query path's pairs: whole vectors of them
    // Grouped-query heads as lanes: a task's heads are the G query heads of one key/value
    // head (an even number of such groups, as below), a key's G scores one vector (each
    // pair of the key broadcast against the G heads' pairs, a vdpbf16ps per pair), with no
    // horizontal add per (key, head).
    const bool heads_as_lanes = dot_pairs && G % 4 == 0 && G <= 16 && (H / G) % 2 == 0;
    Func q_pairs("q_pairs");  // (pair element, head, pair, b): the heads of a pair adjacent
    q_pairs(d, h, j, b) = q(2 * j + d, q_head + h, 0, b);
    dot(j, h, b) = 0.0f;
    if (heads_as_lanes) {
      dot(j, h, b) += bf16_value(q_pairs(rp.x, h, rp.y, b)) * bf16_value(k_bits(pair_d, j, kv_h, b));
    } else if (dot_pairs) {
      dot(j, h, b) += bf16_value(q(pair_d, q_head + h, 0, b)) * bf16_value(k_bits(pair_d, j, kv_h, b));
    } else {
      dot(j, h, b) += q1(rd1, h, b) * k1(rd1, j, kv_h, b);
    }
    s1(j, h, b) = dot(j, h, b) * score_factor + key_mask(j, b) + bias(j, Tk - 1, h);  // causal: every key j < Tk is visible
    max1(h, b) = Float(32).min();
    max1(h, b) = max(max1(h, b), s1(rj, h, b));
    p1(j, h, b) = exp(s1(j, h, b) - max1(h, b));
    sum1(h, b) = 0.0f;
    sum1(h, b) += p1(rj, h, b);
    acc1(d, h, b) = 0.0f;
    // int8: the weights times their values' scales (p1v), the values read as integers.
    Func p1v("p1v");
    p1v(j, h, b) = int8_kv() ? p1(j, h, b) * value_scale(j, kv_h, b) : p1(j, h, b);
    acc1(d, h, b) += p1v(rj, h, b) * kvf(d, v_head + kv_h, rj, b);
    Expr one_row = acc1(d, h, b) / sum1(h, b);

    // GPU, keys in tiles (gpu_key_tile): per tile t of Bk keys its own max, exp-weights,
    // sum and V product (pure in t), folded into a running (max, sum, V product) per query
    // feature: state = (m, l, o) -> (m', l * e^(m - m') + sum_t e^(max_t - m'),
    // o * e^(m - m') + acc_t e^(max_t - m')), m' = max(m, max_t). Keys past Tk score far
    // below any masked key (-1e30), so they weigh exactly 0 even in an all-masked row.
    // Whole rows' shared memory at Tk keys: a tile's score rows and weights, the staged key
    // chunk (padded) and the queries (about what ptxas_check reads from the launch: 41 KB
    // for transformer-base at 512 keys, this says 43).
    auto whole_row_bytes = [&](int64_t keys) {
      return 4 * (2 * int64_t(gpu_tile_q) * keys + (int64_t(gpu_key_lanes) + 1) * D + int64_t(gpu_tile_q) * D);
    };
    const int key_tile = gpu_key_tile >= 0 ? int(gpu_key_tile)
                         : max_keys > 0 && whole_row_bytes(max_keys) <= 48 * 1024 ? 0 : 32;
    const bool key_tiles = get_target().has_gpu_feature() && key_tile > 0 && !using_autoscheduler();
    const int Bk = std::max(key_tile, 1);
    Var jj = st.jj, t("t");
    Func tile_score = st.tile_score, tile_max = st.tile_max, tile_p = st.tile_p, tile_sum = st.tile_sum,
         tile_acc = st.tile_acc, online = st.online;
    RDom rk = st.rk = RDom(0, Bk, "rk"), rt = st.rt = RDom(0, (Tk + Bk - 1) / Bk, "rt");
    if (key_tiles) {
      const float beyond = -1.7e38f;  // below any masked score (-1e30 per mask)
      Expr key = t * Bk + jj;
      tile_score(jj, i, h, b, t) = select(key < Tk, masked(min(key, Tk - 1), i, h, b), beyond);
      tile_max(i, h, b, t) = Float(32).min();
      tile_max(i, h, b, t) = max(tile_max(i, h, b, t), tile_score(rk, i, h, b, t));
      tile_p(jj, i, h, b, t) = exp(tile_score(jj, i, h, b, t) - tile_max(i, h, b, t));
      tile_sum(i, h, b, t) = 0.0f;
      tile_sum(i, h, b, t) += tile_p(rk, i, h, b, t);
      tile_acc(d, i, h, b, t) = 0.0f;
      tile_acc(d, i, h, b, t) += tile_p(rk, i, h, b, t) * vc(d, min(t * Bk + rk, Tk - 1), h, b);
      online(d, i, h, b) = Tuple(Float(32).min(), 0.0f, 0.0f);
      Expr m = online(d, i, h, b)[0], m_tile = tile_max(i, h, b, rt);
      Expr m_new = max(m, m_tile), keep = exp(m - m_new), add = exp(m_tile - m_new);
      online(d, i, h, b) = Tuple(m_new, online(d, i, h, b)[1] * keep + tile_sum(i, h, b, rt) * add,
                                 online(d, i, h, b)[2] * keep + tile_acc(d, i, h, b, rt) * add);
    }
    Expr tiled_rows = key_tiles ? online(d, i, h, b)[2] / online(d, i, h, b)[1] : Expr(0.0f);

    const bool single_row_path = !get_target().has_gpu_feature() && !using_autoscheduler();
    out(d, h, i, b) = single_row_path ? select(Tq == 1, one_row, all_rows) : key_tiles ? tiled_rows : all_rows;

    // ---- shapes the runtime must honour
    q.dim(0).set_bounds(0, D);
    const int kv_row = int8_kv() ? kv_int8_row_bytes(D) : D;  // a row's elements (int8: its bytes)
    kv.dim(0).set_bounds(0, kv_row);
    out.dim(0).set_bounds(0, D).dim(1).set_bounds(0, H);
    out.dim(2).set_min(0).dim(3).set_min(0);
    q.dim(2).set_min(0);
    if (BS > 0)
      kv.dim(2).set_bounds(0, BS).dim(3).set_min(0);
    else
      kv.dim(2).set_min(0);
    key_mask.dim(0).set_min(0);
    if (M > 0) position_bias.dim(0).set_bounds(0, 2 * M + 1).dim(1).set_bounds(0, H);

    // ---- schedule
    if (using_autoscheduler()) {
      q.set_estimates({{0, D}, {0, 3 * H}, {0, 128}, {0, 1}});
      if (BS > 0) {
        kv.set_estimates({{0, kv_row}, {0, 2 * H}, {0, BS}, {0, (128 + BS - 1) / BS}});
        block_table->set_estimates({{0, (128 + BS - 1) / BS}, {0, 1}});
      } else {
        kv.set_estimates({{0, kv_row}, {0, 3 * H}, {0, 128}, {0, 1}});
      }
      key_mask.set_estimates({{0, 128}, {0, 1}});
      position_bias.set_estimates({{0, 2 * std::max(M, 1) + 1}, {0, H}});
      out.set_estimates({{0, D}, {0, H}, {0, 128}, {0, 1}});
      return;
    }
    if (get_target().has_gpu_feature()) {
      schedule_attention_gpu(st, out,
                             {gpu_tile_q, gpu_key_lanes, gpu_reduce_lanes, gpu_v_queries, gpu_score_queries,
                              key_tiles ? Bk : 0},
                             D);
      return;
    }
    // The score block (vec keys x tile_q queries) stays in registers over d, and so does the
    // V product's (v_features x v_queries). AVX-512's 32 zmm: 8 queries x 1 vector of 16
    // keys; V 4 queries x the whole head. AVX2's 16 ymm: 6 queries x 2 ymm of keys and V 6
    // queries x 2 ymm of features, 12 accumulators each: the whole head's V block spilled
    // there (docs/performance-log.md#attention).
    struct Blocks {
      int tile_q, v_queries, v_features;  // v_features 0: the whole head
    };
    const Blocks target_blocks = get_target().has_feature(Target::AVX512) ? Blocks{8, 4, 0} : Blocks{6, 6, 16};
    const int vec_ = vec > 0 ? int(vec) : 16;
    // Queries as lanes (bf16 pairs): a tile is one vector of queries.
    const int tile_q_ = bf16_pairs ? vec_ : tile_q > 0 ? int(tile_q) : target_blocks.tile_q;
    const int dvec = pow2_divisor(D, vec_);
    rope.schedule_per_call();  // one table per call: Tk positions x R/2 frequencies
    auto vectorize_rotated = [&](Func f) { return rope.vectorize(f, d, vec_); };
    Var io("io"), ii("ii"), hb("hb");
    if (int8_kv()) {
      // Once per task: the scales in scalar loops (4 bytes each, a row apart), the keys' bf16
      // bits a vector at a time (the pair products read them as a bf16 cache's; converted per
      // block of 8 keys inside the decode loop instead they took 1.7x as long).
      key_scale.compute_at(out, hb);
      value_scale.compute_at(out, hb);
      k_bits.compute_at(out, hb).vectorize(d, dvec);
    }
    {
      // Tq == 1: a task per (group of up to 4 heads, batch): scores, softmax and the V
      // product of the group's heads in one sweep over the keys each, so that each key
      // and value row is read as one contiguous run of the group's features (per head
      // they were 256-byte pieces 3 * d_model floats apart). The CPU's cross-attention
      // cache is since stored head by head (Model::cross_kv): there each head of the group
      // is its own contiguous stream.
      // An even number of groups where one exists, so that a single sequence's groups
      // split evenly over 2 (or 4) threads: 12 heads go in 4 groups of 3, not 3 of 4
      // (docs/performance-log.md#attention). Heads as lanes: the G heads of a key/value head.
      int hg = heads_as_lanes ? G : 0;
      for (int even = 1; even >= 0 && hg == 0; --even)
        for (int c = std::min(4, H); c >= 1 && hg == 0; --c)
          if (H % c == 0 && (!even || (H / c) % 2 == 0)) hg = c;
      Var ho("ho"), hi("hi");  // tasks fuse (ho, b) into hb, the name both branches share
      out.specialize(Tq == 1)
          .split(h, ho, hi, hg)
          .reorder(d, hi, i, ho, b)
          .fuse(ho, b, hb)
          .parallel(hb)
          .vectorize(d, dvec);
      RVar rdo("rdo"), rdi("rdi");
      Var lane("lane");
      dot.compute_at(out, hb);
      // The query row widened (and rotated) once; with rotary_dim the group's keys rotated
      // once too, else read as they are in the score loop (one pass over the cache).
      if (!dot_pairs) vectorize_rotated(q1.compute_at(out, hb));
      if (R > 0) vectorize_rotated(k1.compute_at(out, hb));
      // Per key and head: dvec-wide partial sums along d, then one horizontal add. Keys
      // (and below, values) decode_prefetch rows ahead are prefetched: in rows that hold
      // every head each key's row is a short run (the group's heads) a whole cache row
      // apart, which the hardware prefetchers did not follow. Head by head (the CPU's
      // cross-attention cache) the same prefetches slowed it: decode_prefetch 0 there
      // (docs/performance-log.md#attention).
      // Paged: a block's rows are contiguous, and a row decode_prefetch ahead may be in
      // another block (the prefetch would span the pool).
      const int prefetch = BS > 0 ? 0 : int(decode_prefetch);
      if (heads_as_lanes) {
        // Keys in groups of 8 (independent sums in flight), the G heads a vector.
        Var jo1("jo1"), ji1("ji1");
        q_pairs.compute_at(out, hb);
        dot.align_bounds(h, G).reorder_storage(h, j);  // a key's G scores adjacent
        dot.update().split(j, jo1, ji1, 8, TailStrategy::GuardWithIf).reorder(rp.x, h, ji1, rp.y, jo1).atomic()
            .vectorize(rp.x).vectorize(h).unroll(ji1);
        if (prefetch > 0 && !int8_kv()) dot.update().prefetch(kv, jo1, jo1, 1);  // int8: k_bits reads kv
      } else {
        // bf16 pairs (dot_pairs): lane l sums pairs l, l + L, ... (L lanes), a vdpbf16ps each.
        const int pair_lanes = pow2_divisor(D / 2, vec_);
        Func partial = dot_pairs ? dot.update().split(rp.y, rdo, rdi, pair_lanes).rfactor(rdi, lane)
                                 : dot.update().split(rd1.x, rdo, rdi, dvec).rfactor(rdi, lane);
        dot.update().reorder(rdi, h, j);
        if (prefetch > 0 && !int8_kv()) dot.update().prefetch(kv, j, j, prefetch);
        partial.compute_at(dot, h).vectorize(lane);
        if (dot_pairs)
          partial.update().reorder(rp.x, lane, rdo).atomic().vectorize(rp.x).vectorize(lane);
        else
          partial.update().vectorize(lane);
        dot.update().atomic().vectorize(rdi);
      }
      if (heads_as_lanes) {
        // The softmax over the scores as dot stores them (head-minor): max, weights and sum
        // a vector of the G heads per key, the scaled and masked scores not stored; turned
        // key-minor for the lanes below, each (16 keys, head) block was a transpose
        // (docs/performance-log.md#self-cache-apart).
        s1.compute_inline();
        p1.compute_at(out, hb).align_bounds(h, G).reorder_storage(h, j).reorder(h, j).vectorize(h, G);
        if (int8_kv()) p1v.compute_at(out, hb).align_bounds(h, G).reorder_storage(h, j).reorder(h, j).vectorize(h, G);
        for (Func f : {max1, sum1}) {
          f.compute_at(out, hb).align_bounds(h, G).vectorize(h, G);
          f.update().reorder(h, rj).vectorize(h, G);
        }
      } else {
        s1.compute_at(out, hb).vectorize(j, vec_, TailStrategy::GuardWithIf);
        p1.compute_at(out, hb).vectorize(j, vec_, TailStrategy::GuardWithIf);
        if (int8_kv()) p1v.compute_at(out, hb).vectorize(j, vec_, TailStrategy::GuardWithIf);
        // Each head's max and sum in vec lanes, then one horizontal step: walked key by key,
        // each was a chain of dependent scalar adds as long as the context
        // (docs/performance-log.md#self-cache-apart).
        for (Func f : {max1, sum1}) schedule_cpu_row_reduction(f, LoopLevel(out, hb), rj.x, h, vec_);
      }
      acc1.compute_at(out, hb).vectorize(d, dvec);
      acc1.update().reorder(d, h, rj).vectorize(d, dvec).unroll(d).unroll(h);
      if (prefetch > 0) acc1.update().prefetch(kv, rj, rj, prefetch);
    }
    // Tq > 1: per (head, batch) task K is transposed once (not with bf16 pairs, whose tile
    // is one vector of queries read against the keys as stored); then per tile of tile_q
    // queries a register-blocked score block (a key vector x tile_q queries, accumulated
    // over d), the softmax statistics, and a register-blocked V product (v_features head
    // features x v_queries queries). Per-tile Funcs cover whole tiles (bound_extent; query
    // reads are clamped), so their inner loops carry no row guards.
    out.split(i, io, ii, tile_q_, TailStrategy::GuardWithIf)
        .reorder(d, ii, io, h, b)
        .fuse(h, b, hb)
        .parallel(hb)
        .vectorize(d, dvec);
    Var jo("jo"), ji("ji"), iq("iq"), iqi("iqi");
    if (bf16_pairs) {
      // Queries as lanes: per block of 8 keys (independent sums in flight) the tile's
      // scores, a vector each, over the pairs; the softmax statistics then need no
      // horizontal step (each lane is a query).
      q_lanes.compute_at(out, io).bound_extent(i, tile_q_);
      masked.compute_at(out, io)
          .bound_extent(i, tile_q_)
          .reorder_storage(i, j)
          .split(j, jo, ji, 8, TailStrategy::GuardWithIf)
          .reorder(i, ji, jo)
          .vectorize(i)
          .unroll(ji);
      qk_lanes.compute_at(masked, jo).bound_extent(i, tile_q_).bound_extent(j, 8).reorder_storage(i, j)
          .vectorize(i).unroll(j);
      qk_lanes.update().reorder(rp.x, i, j, rp.y).atomic().vectorize(rp.x).vectorize(i).unroll(j);
      for (Func f : {row_max, row_sum}) {
        f.compute_at(out, io).bound_extent(i, tile_q_).vectorize(i);
        f.update().reorder(i, rj).vectorize(i);
      }
      p.compute_at(out, io).reorder_storage(i, j).reorder(i, j).vectorize(i);
    } else {
      // Keys compacted (and rotated) once per task; queries widened (and rotated) once per
      // query tile, not per key block.
      vectorize_rotated(kc.compute_at(out, hb));
      vectorize_rotated(qc.compute_at(out, io));
      kt.compute_at(out, hb).vectorize(j, vec_, TailStrategy::GuardWithIf);
      // Per block of vec keys, the vec x tile_q score block lives in registers over d (a
      // fixed-size allocation; one sized by Tk stayed in memory: 2x slower).
      masked.compute_at(out, io)
          .bound_extent(i, tile_q_)
          .split(j, jo, ji, vec_, TailStrategy::GuardWithIf)
          .reorder(ji, i, jo)
          .vectorize(ji)
          .unroll(i);
      qk.compute_at(masked, jo).bound_extent(j, vec_).bound_extent(i, tile_q_).vectorize(j).unroll(i);
      qk.update().reorder(j, i, rd).vectorize(j).unroll(i);
      // Row max and sum: vec lanes of partial results per row, then one horizontal step.
      for (Func f : {row_max, row_sum}) schedule_cpu_row_reduction(f, LoopLevel(out, io), rj.x, i, vec_);
      p.compute_at(out, io).vectorize(j, vec_, TailStrategy::GuardWithIf);
    }
    score.compute_inline();
    vc.compute_at(out, hb).vectorize(d, dvec);
    // Whole blocks of the tile: the split below rounds up within acc's fixed extent.
    int q_block = std::min(v_queries > 0 ? int(v_queries) : target_blocks.v_queries, int(tile_q_));
    while (tile_q_ % q_block != 0) --q_block;
    const int v_features_ = v_features > 0 ? int(v_features) : target_blocks.v_features;
    const int v_block = v_features_ > 0 ? std::min(v_features_, D) : D;
    Var dvo("dvo"), dvi("dvi");
    acc.compute_at(out, io).bound_extent(i, tile_q_).vectorize(d, dvec);
    acc.update()
        .split(i, iq, iqi, q_block, TailStrategy::RoundUp)
        .split(d, dvo, dvi, v_block, TailStrategy::GuardWithIf)
        .reorder(dvi, iqi, rj, dvo, iq)
        .vectorize(dvi, dvec)
        .unroll(dvi)
        .unroll(iqi);
  }
};

}  // namespace halformer

HALIDE_REGISTER_GENERATOR(halformer::Attention, attention)
