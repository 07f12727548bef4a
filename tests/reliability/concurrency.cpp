// Determinism and concurrency of the model library (issue 8, item 7): 4 threads, each
// with its own Model instance (loaded concurrently), each running the same 100
// inferences (greedy decode + teacher-forced scores, batches of 1-3 sequences of varied
// lengths) in a different order; every result must be bit-identical to the
// single-threaded run. Compiled at test time against DIR/lib<name>.a (like
// examples/reverse_api.cpp). Needs a model with >= 14 source/target symbols.
//   usage: concurrency WEIGHTS [threads=4] [inferences=100]
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "reverse-tiny.h"

using halformer::Sequence;

namespace {

struct Input {
  std::vector<Sequence> src, tgt;
};
struct Output {
  std::vector<Sequence> tokens;
  std::vector<float> last_logits, scores;
};

std::vector<Input> make_inputs(int n, int src_vocab, int tgt_vocab, int bos) {
  uint32_t state = 12345;
  auto next = [&](int lo, int hi) {  // [lo, hi]
    state = state * 1664525u + 1013904223u;
    return lo + int((state >> 8) % uint32_t(hi - lo + 1));
  };
  std::vector<Input> in(n);
  for (auto& x : in) {
    int b = next(1, 3);
    for (int i = 0; i < b; ++i) {
      Sequence s(next(1, 12)), t{bos};
      for (auto& v : s) v = next(1, std::min(13, src_vocab - 1));
      for (int j = next(0, 5); j > 0; --j) t.push_back(next(1, std::min(13, tgt_vocab - 1)));
      x.src.push_back(s);
      x.tgt.push_back(t);
    }
  }
  return in;
}

Output infer(const halformer::Model& m, const Input& in, int max_new) {
  auto r = m.greedy(in.src, max_new);
  return {r.tokens, r.last_logits.data, m.score(in.src, in.tgt).data};
}

bool same(const Output& a, const Output& b) {
  auto bits = [](const std::vector<float>& x, const std::vector<float>& y) {
    return x.size() == y.size() && (x.empty() || std::memcmp(x.data(), y.data(), x.size() * sizeof(float)) == 0);
  };
  return a.tokens == b.tokens && bits(a.last_logits, b.last_logits) && bits(a.scores, b.scores);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s WEIGHTS [threads] [inferences]\n", argv[0]);
    return 2;
  }
  const std::string weights = argv[1];
  const int T = argc > 2 ? std::atoi(argv[2]) : 4, N = argc > 3 ? std::atoi(argv[3]) : 100;
  try {
    auto ref_model = halformer::Model::load(*halformer_model_reverse_tiny(), weights);
    const auto& c = ref_model.config();
    const int max_new = std::min(c.max_len, 12);
    const auto inputs = make_inputs(N, c.src_vocab, c.tgt_vocab, c.bos_id);
    // The C++ API refuses bad inputs with an exception (never a crash): bad runtime inputs
    // through the library, as tests/reliability/runtime_inputs.py does for the binary.
    {
      const Sequence ok{3, 7, 1, 9}, too_long(size_t(c.max_len) + 1, 3);
      const std::vector<std::pair<const char*, std::function<void()>>> bad = {
          {"empty batch", [&] { ref_model.greedy({}, 4); }},
          {"empty sequence", [&] { ref_model.greedy({ok, {}}, 4); }},
          {"id = vocab", [&] { ref_model.greedy({{3, c.src_vocab}}, 4); }},
          {"negative id", [&] { ref_model.greedy({{-1}}, 4); }},
          {"too long", [&] { ref_model.greedy({too_long}, 4); }},
          {"max_new_tokens 0", [&] { ref_model.greedy({ok}, 0); }},
          {"max_new_tokens max_len + 1", [&] { ref_model.greedy({ok}, c.max_len + 1); }},
          {"encode empty batch", [&] { ref_model.encode({}); }},
          {"score count mismatch", [&] { ref_model.score({ok, ok}, {{c.bos_id}}); }},
          {"score target id = vocab", [&] { ref_model.score({ok}, {{c.bos_id, c.tgt_vocab}}); }},
          {"score empty target", [&] { ref_model.score({ok}, {{}}); }},
      };
      int refused = 0;
      for (const auto& [what, call] : bad) {
        try {
          call();
          std::fprintf(stderr, "API accepted a bad input: %s\n", what);
        } catch (const std::exception&) {
          ++refused;
        }
      }
      std::printf("API: %d of %zu bad inputs refused with an exception\n", refused, bad.size());
      if (refused != int(bad.size())) return 1;
    }
    std::vector<Output> ref;
    for (const auto& in : inputs) ref.push_back(infer(ref_model, in, max_new));
    // Same inputs again on the same instance: deterministic across runs.
    for (int i = 0; i < N; ++i)
      if (!same(ref[i], infer(ref_model, inputs[i], max_new))) {
        std::fprintf(stderr, "inference %d differs between two single-threaded runs\n", i);
        return 1;
      }

    std::vector<int> mismatches(T, 0), done(T, 0);
    std::vector<std::string> errors(T);
    std::vector<std::thread> pool;
    for (int t = 0; t < T; ++t)
      pool.emplace_back([&, t] {
        try {
          auto model = halformer::Model::load(*halformer_model_reverse_tiny(), weights);  // own instance, loaded concurrently
          for (int k = 0; k < N; ++k) {
            int i = (k * (2 * t + 1) + 7 * t) % N;  // a different order per thread
            if (!same(ref[i], infer(model, inputs[i], max_new))) ++mismatches[t];
            ++done[t];
          }
        } catch (const std::exception& e) {
          errors[t] = e.what();
        }
      });
    for (auto& th : pool) th.join();
    int bad = 0, total = 0;
    for (int t = 0; t < T; ++t) {
      if (!errors[t].empty()) std::fprintf(stderr, "thread %d: error: %s\n", t, errors[t].c_str());
      bad += mismatches[t] + (errors[t].empty() ? 0 : 1);
      total += done[t];
    }
    // FNV-1a over every output bit: compared across processes (thread counts) by the test.
    uint64_t h = 1469598103934665603ull;
    auto mix = [&](const void* p, size_t n) {
      for (size_t i = 0; i < n; ++i) h = (h ^ static_cast<const uint8_t*>(p)[i]) * 1099511628211ull;
    };
    for (const auto& o : ref) {
      for (const auto& s : o.tokens) mix(s.data(), s.size() * sizeof(s[0])), mix("|", 1);
      mix(o.last_logits.data(), o.last_logits.size() * sizeof(float));
      mix(o.scores.data(), o.scores.size() * sizeof(float));
    }
    std::printf("%d threads x %d inferences (%d done): %d differ from the single-threaded results\n", T, N, total,
                bad);
    std::printf("checksum %016llx\n", static_cast<unsigned long long>(h));
    return bad == 0 && total == T * N ? 0 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
}
