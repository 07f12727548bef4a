// Naive reference implementations of every layer kind: the readable spec each fast
// kernel is tested against. Plain loops, double accumulation, PyTorch's layouts
// (row-major, Linear weights [out][in]) -- deliberately nothing shared with the
// generators or the runtime. Shape letters: M rows, K in, N out, T time, B batch,
// H heads, D head size.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

namespace ref {

using Vec = std::vector<float>;

// Test data: n normal values (mean 0, standard deviation `scale`), reproducible by seed.
inline Vec random_vec(size_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, scale);
  Vec v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

inline double activate(const std::string& act, double v) {
  if (act == "relu") return v > 0 ? v : 0;
  if (act == "gelu") return 0.5 * v * (1 + std::erf(v / std::sqrt(2.0)));
  if (act == "tanh") return std::tanh(v);
  if (act == "silu") return v / (1 + std::exp(-v));
  if (act == "relu2") return v > 0 ? v * v : 0;  // squared ReLU
  if (act == "gelu_tanh")
    return 0.5 * v * (1 + std::tanh(std::sqrt(2.0 / M_PI) * (v + 0.044715 * v * v * v)));
  return v;
}

// y[m][n] = act(sum_k x[m][k] * w[n][k] + b[n]) (+ residual[m][n])
inline Vec linear(const Vec& x, const Vec& w, const Vec& b, int M, int K, int N,
                  const std::string& act = "none", const Vec* residual = nullptr) {
  Vec y(size_t(M) * N);
  for (int m = 0; m < M; ++m)
    for (int n = 0; n < N; ++n) {
      double s = b[n];
      for (int k = 0; k < K; ++k) s += double(x[size_t(m) * K + k]) * w[size_t(n) * K + k];
      double v = activate(act, s);
      if (residual) v += (*residual)[size_t(m) * N + n];
      y[size_t(m) * N + n] = float(v);
    }
  return y;
}

// Multi-head attention. q rows [B][Tq][Cq], kv rows [B][Tk][Ckv]; head h of the query is
// at columns (q_head + h) * D, its key at (k_head + h) * D, value at (v_head + h) * D.
// key_mask [B][Tk] additive; causal: key j visible to query i iff j <= i + Tk - Tq.
// position_bias (T5; nullptr: none): bucket_bias [buckets][H] at bucket(j - (i + Tk - Tq)),
// where bucket maps a relative position to its bucket; scale 0: 1 / sqrt(D).
inline Vec attention(const Vec& q, int Cq, const Vec& kv, int Ckv, const Vec& key_mask, int B,
                     int Tq, int Tk, int H, int D, int q_head, int k_head, int v_head, bool causal,
                     int kv_group = 1, const Vec* bucket_bias = nullptr, int (*bucket)(int) = nullptr,
                     double scale = 0) {
  const double sc = scale > 0 ? scale : 1.0 / std::sqrt(double(D));
  Vec out(size_t(B) * Tq * H * D);
  std::vector<double> s(Tk);
  for (int b = 0; b < B; ++b)
    for (int h = 0; h < H; ++h)
      for (int i = 0; i < Tq; ++i) {
        const float* qi = &q[(size_t(b) * Tq + i) * Cq + (q_head + h) * D];
        double mx = -1e300;
        for (int j = 0; j < Tk; ++j) {
          const float* kj = &kv[(size_t(b) * Tk + j) * Ckv + (k_head + h / kv_group) * D];
          double dot = 0;
          for (int d = 0; d < D; ++d) dot += double(qi[d]) * kj[d];
          s[j] = dot * sc + key_mask[size_t(b) * Tk + j];
          if (bucket_bias) s[j] += (*bucket_bias)[size_t(bucket(j - (i + Tk - Tq))) * H + h];
          if (causal && j > i + Tk - Tq) s[j] = -1e30;
          mx = std::max(mx, s[j]);
        }
        double total = 0;
        for (int j = 0; j < Tk; ++j) total += (s[j] = std::exp(s[j] - mx));
        for (int d = 0; d < D; ++d) {
          double acc = 0;
          for (int j = 0; j < Tk; ++j) acc += s[j] * kv[(size_t(b) * Tk + j) * Ckv + (v_head + h / kv_group) * D + d];
          out[(size_t(b) * Tq + i) * H * D + h * D + d] = float(acc / total);
        }
      }
  return out;
}

// Rotary positions, in double: heads [first, first + n) of rows [B][T][C] (head size D)
// at position t (or positions[b * T + t]) turned pairwise by t * theta^(-2c/R), c < R/2:
// pairs (c, c + R/2) ("half", Llama) or (2c, 2c + 1) (interleaved, GPT-J); features from R
// on unchanged.
inline void rotary(Vec& x, int C, int B, int T, int first, int n, int D, int R, double theta, bool interleaved,
                   const std::vector<int>* positions = nullptr) {
  for (int b = 0; b < B; ++b)
    for (int t = 0; t < T; ++t)
      for (int h = first; h < first + n; ++h) {
        float* r = &x[(size_t(b) * T + t) * C + size_t(h) * D];
        const int p = positions ? (*positions)[size_t(b) * T + t] : t;
        for (int c = 0; c < R / 2; ++c) {
          const double angle = p * std::pow(theta, -2.0 * c / R);
          const int i = interleaved ? 2 * c : c, j = interleaved ? 2 * c + 1 : c + R / 2;
          const double a = r[i], z = r[j];
          r[i] = float(a * std::cos(angle) - z * std::sin(angle));
          r[j] = float(z * std::cos(angle) + a * std::sin(angle));
        }
      }
}

// RMSNorm: g * x / sqrt(mean(x^2) + eps)
inline Vec rms_norm(const Vec& x, const Vec& g, int M, int C, double eps) {
  Vec y(x.size());
  for (int m = 0; m < M; ++m) {
    const float* r = &x[size_t(m) * C];
    double sq = 0;
    for (int c = 0; c < C; ++c) sq += double(r[c]) * r[c];
    const double inv = 1.0 / std::sqrt(sq / C + eps);
    for (int c = 0; c < C; ++c) y[size_t(m) * C + c] = float(g[c] * r[c] * inv);
  }
  return y;
}

// standard: (x - mean) / sqrt(biased var + eps); annotated: (x - mean) / (unbiased std + eps)
inline Vec layer_norm(const Vec& x, const Vec& g, const Vec& beta, int M, int C, double eps,
                      bool annotated) {
  Vec y(x.size());
  for (int m = 0; m < M; ++m) {
    const float* r = &x[size_t(m) * C];
    double mean = 0, sq = 0;
    for (int c = 0; c < C; ++c) mean += r[c];
    mean /= C;
    for (int c = 0; c < C; ++c) sq += (r[c] - mean) * (r[c] - mean);
    double spread = annotated ? std::sqrt(sq / std::max(C - 1, 1)) + eps : std::sqrt(sq / C + eps);
    for (int c = 0; c < C; ++c) y[size_t(m) * C + c] = float(g[c] * (r[c] - mean) / spread + beta[c]);
  }
  return y;
}

// tokens [B][T]; table [V][C]; positions: "sinusoidal" | "sinusoidal_split" | "learned" (pos [P][C]) | "none";
// types [B][T] with type_table [Y][C] when type_table is non-empty
inline Vec embedding(const std::vector<int32_t>& tokens, int B, int T, const Vec& table, int C,
                     bool scale, const std::string& positions, const Vec& pos, int pos_offset,
                     const std::vector<int32_t>& types = {}, const Vec& type_table = {}) {
  Vec y(size_t(B) * T * C);
  for (int b = 0; b < B; ++b)
    for (int t = 0; t < T; ++t)
      for (int c = 0; c < C; ++c) {
        double e = table[size_t(tokens[size_t(b) * T + t]) * C + c] * (scale ? std::sqrt(double(C)) : 1.0);
        int p = pos_offset + t;
        if (positions == "sinusoidal") {
          double angle = p / std::pow(10000.0, double(c - c % 2) / C);
          e += (c % 2 == 0) ? std::sin(angle) : std::cos(angle);
        } else if (positions == "sinusoidal_split") {  // Marian: sin half, then cos half
          const int h = (C + 1) / 2, j = c < h ? c : c - h;
          double angle = p / std::pow(10000.0, 2.0 * j / C);
          e += float(c < h ? std::sin(angle) : std::cos(angle));
        } else if (positions == "learned") {
          e += pos[size_t(p) * C + c];
        }
        if (!type_table.empty()) e += type_table[size_t(types[size_t(b) * T + t]) * C + c];
        y[(size_t(b) * T + t) * C + c] = float(e);
      }
  return y;
}

inline Vec softmax(const Vec& x, int M, int V, bool log) {
  Vec y(x.size());
  for (int m = 0; m < M; ++m) {
    const float* r = &x[size_t(m) * V];
    double mx = *std::max_element(r, r + V), total = 0;
    for (int v = 0; v < V; ++v) total += std::exp(double(r[v]) - mx);
    for (int v = 0; v < V; ++v)
      y[size_t(m) * V + v] = float(log ? r[v] - mx - std::log(total) : std::exp(r[v] - mx) / total);
  }
  return y;
}

// x [B][T][C]; valid [B][T] (1 real, 0 pad); cls: row 0, else mean over valid rows;
// normalize: divide by max(L2 norm, 1e-12)
inline Vec pool(const Vec& x, const Vec& valid, int B, int T, int C, bool cls, bool normalize) {
  Vec y(size_t(B) * C);
  for (int b = 0; b < B; ++b) {
    std::vector<double> acc(C, 0.0);
    double count = 0;
    for (int t = 0; t < (cls ? 1 : T); ++t) {
      double w = cls ? 1.0 : valid[size_t(b) * T + t];
      count += w;
      for (int c = 0; c < C; ++c) acc[c] += w * x[(size_t(b) * T + t) * C + c];
    }
    double norm = 0;
    for (int c = 0; c < C; ++c) norm += (acc[c] / count) * (acc[c] / count);
    norm = normalize ? std::max(std::sqrt(norm), 1e-12) : 1.0;
    for (int c = 0; c < C; ++c) y[size_t(b) * C + c] = float(acc[c] / count / norm);
  }
  return y;
}

inline std::vector<int32_t> argmax(const Vec& x, int M, int V) {
  std::vector<int32_t> y(M);
  for (int m = 0; m < M; ++m) y[m] = int32_t(std::max_element(&x[size_t(m) * V], &x[size_t(m) * V] + V) - &x[size_t(m) * V]);
  return y;
}

// ---- int8 (generators/linear_int8.cpp). Symmetric quantization of one row: q in
// [-127, 127], round half to even, the multiplier 127 / max|v| computed in float as the
// kernel does; returns the scale max|v| / 127.
inline float quantize_int8(const float* v, int n, int8_t* q) {
  float amax = 0;
  for (int i = 0; i < n; ++i) amax = std::max(amax, std::fabs(v[i]));
  const float inv = amax > 0 ? 127.0f / amax : 0.0f;
  for (int i = 0; i < n; ++i) q[i] = int8_t(std::max(-127.0f, std::min(127.0f, std::nearbyint(v[i] * inv))));
  return amax * (1.0f / 127.0f);
}

// An activation row quantized to [-levels, levels] (int16), as the kernel does; returns
// the scale max|v| / levels.
inline float quantize_levels(const float* v, int n, int levels, int32_t* q) {
  float amax = 0;
  for (int i = 0; i < n; ++i) amax = std::max(amax, std::fabs(v[i]));
  const float inv = amax > 0 ? float(levels) / amax : 0.0f;
  const float l = float(levels);
  for (int i = 0; i < n; ++i) q[i] = int32_t(std::max(-l, std::min(l, std::nearbyint(v[i] * inv))));
  return amax * (1.0f / float(levels));
}

// An activation row quantized to uint8 with a zero point, as the quad kernels do
// (generators/linear_int8.cpp): the range [min(v, 0), max(v, 0)] in 255 steps; q gets
// the levels minus the zero point (so that sum q * w is the corrected sum), returns the
// scale (max - min) / 255.
inline float quantize_u8_zero_point(const float* v, int n, int32_t* q) {
  float lo = 0, hi = 0;
  for (int i = 0; i < n; ++i) lo = std::min(lo, v[i]), hi = std::max(hi, v[i]);
  const float range = hi - lo, inv = range > 0 ? 255.0f / range : 0.0f;
  const int32_t zp = int32_t(std::nearbyint(-lo * inv));
  for (int i = 0; i < n; ++i)
    q[i] = std::max(0, std::min(255, int32_t(std::nearbyint(v[i] * inv)) + zp)) - zp;
  return range * (1.0f / 255.0f);
}

// y[m][n] = act(float(sum_k xq[m][k] * wq[n][k]) * sx[m] * sw[n] + b[n]), then + or *
// `second` (residual / gate): x quantized per row here -- to int16 `levels`
// (halformer::int8_activation_levels) for the pair kernels, or (levels = 0) to uint8
// with a zero point for the quad kernels -- wq [N][K] with scales sw. The integer sum is
// exact (and must fit int32); the float epilogue is the kernel's (one rounding per step).
inline Vec linear_int8(const Vec& x, const std::vector<int8_t>& wq, const Vec& sw, const Vec& b, int M, int K,
                       int N, int levels, const std::string& act = "none", const Vec* second = nullptr,
                       bool gate = false) {
  Vec y(size_t(M) * N);
  std::vector<int32_t> xq(K);
  for (int m = 0; m < M; ++m) {
    const float sx = levels > 0 ? quantize_levels(&x[size_t(m) * K], K, levels, xq.data())
                                : quantize_u8_zero_point(&x[size_t(m) * K], K, xq.data());
    for (int n = 0; n < N; ++n) {
      int64_t acc = 0;
      for (int k = 0; k < K; ++k) acc += int64_t(xq[k]) * int64_t(wq[size_t(n) * K + k]);
      if (acc > INT32_MAX || acc < INT32_MIN) throw std::runtime_error("int8 reference: int32 sum overflows");
      const float s = sx * sw[n];
      double v = activate(act, double(float(acc) * s + b[n]));
      if (second) v = gate ? v * (*second)[size_t(m) * N + n] : v + (*second)[size_t(m) * N + n];
      y[size_t(m) * N + n] = float(v);
    }
  }
  return y;
}

// ---- int4 (generators/linear_blocks.cpp): llama.cpp's Q4_0 weights x Q8_0 activations,
// written from the format's description (not from halformer/packed_blocks.h).
// A weight block of 32: d = (the value of largest magnitude) / -8, rounded to fp16;
// q = min(15, trunc(w / d + 8.5)) in [0, 15], the weight (q - 8) * d.
inline float to_fp16_value(float f) { return float(_Float16(f)); }
inline void quantize_q4_0_block(const float* w, int count, int* q, float* d_out) {
  float big = 0;
  for (int i = 0; i < count; ++i)
    if (std::fabs(w[i]) > std::fabs(big)) big = w[i];
  const float d = big / -8.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
  for (int i = 0; i < 32; ++i) q[i] = std::min(15, int(int8_t((i < count ? w[i] * id : 0.0f) + 8.5f)));
  *d_out = to_fp16_value(d);
}
// An activation block: d = max |x| * (1 / 127), q = round half away from 0 (x / d), and
// d rounded to fp16 for the product.
inline float quantize_q8_block(const float* x, int count, int* q) {
  float amax = 0;
  for (int i = 0; i < count; ++i) amax = std::max(amax, std::fabs(x[i]));
  const float d = amax * (1.0f / 127.0f), id = d > 0.0f ? 1.0f / d : 0.0f;
  for (int i = 0; i < 32; ++i) {
    const float v = i < count ? x[i] * id : 0.0f;
    q[i] = int(v < 0 ? -std::floor(0.5f - v) : std::floor(v + 0.5f));
  }
  return to_fp16_value(d);
}
// ---- q8_0 (the same kernels' 8-bit twin): llama.cpp's Q8_0 weights x Q8_0 activations.
// A weight block of 32: d = max |w| / 127, q = round half away from 0 (w / d) in
// [-127, 127] (with the unrounded d), d then rounded to fp16; the weight q * d.
inline void quantize_q8_0_block(const float* w, int count, int* q, float* d_out) {
  float amax = 0;
  for (int i = 0; i < count; ++i) amax = std::max(amax, std::fabs(w[i]));
  const float d = amax / 127.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
  for (int i = 0; i < 32; ++i) q[i] = int(std::round(i < count ? w[i] * id : 0.0f));
  *d_out = to_fp16_value(d);
}
// y = act(sum over blocks dw * dx * sum qw qx + b) (+ or * second), w torch [N][K]; bits 4
// (Q4_0: qw = the stored nibble - 8) or 8 (Q8_0).
inline Vec linear_blocks(int bits, const Vec& x, const Vec& w, const Vec& b, int M, int K, int N,
                         const std::string& act = "none", const Vec* second = nullptr, bool gate = false) {
  const int B = (K + 31) / 32;
  std::vector<int> qw(size_t(N) * B * 32), qx(size_t(B) * 32);
  Vec dw(size_t(N) * B), dx(B);
  for (int n = 0; n < N; ++n)
    for (int blk = 0; blk < B; ++blk)
      (bits == 8 ? quantize_q8_0_block : quantize_q4_0_block)(&w[size_t(n) * K + blk * 32], std::min(32, K - blk * 32),
                                                             &qw[(size_t(n) * B + blk) * 32], &dw[size_t(n) * B + blk]);
  Vec y(size_t(M) * N);
  for (int m = 0; m < M; ++m) {
    for (int blk = 0; blk < B; ++blk)
      dx[blk] = quantize_q8_block(&x[size_t(m) * K + blk * 32], std::min(32, K - blk * 32), &qx[size_t(blk) * 32]);
    for (int n = 0; n < N; ++n) {
      double acc = 0;
      for (int blk = 0; blk < B; ++blk) {
        int32_t s = 0;
        for (int i = 0; i < 32; ++i)
          s += (qw[(size_t(n) * B + blk) * 32 + i] - (bits == 8 ? 0 : 8)) * qx[size_t(blk) * 32 + i];
        acc += double(dw[size_t(n) * B + blk]) * double(dx[blk]) * s;
      }
      double v = activate(act, acc + b[n]);
      if (second) v = gate ? v * (*second)[size_t(m) * N + n] : v + (*second)[size_t(m) * N + n];
      y[size_t(m) * N + n] = float(v);
    }
  }
  return y;
}

}  // namespace ref
