// halformer_model_bench: times a built halformer model through its C++ API
// (halformer/model.h), the way an application embedding the library would run it.
//
// Compiled by bench/run against DIR/lib<name>.a that `halformer build` made (any spec),
// so it is not a CMake target:
//   c++ -O2 -std=c++17 bench/cpp/model_bench.cpp -I runtime/include -include DIR/<name>.h
//       -DHALFORMER_MODEL=halformer_model_<name> DIR/lib<name>.a -lpthread -ldl
//
//   halformer_model_bench --weights W.safetensors --src-file F [--threads 2] [--warmup 1]
//                         [--repeat 5] [--new-tokens 64] [--dump OUT.safetensors]
//                         [--skip-encoder] [--skip-decode] [--device cpu|cuda|opencl]
//                         [--prefill-len N] [--prefill-repeat 3]
//   -> one JSON object on stdout:
//      {"batch": B, "src_len": S, "load_ms": .., "encoder_ms": [one per timed run],
//       "decode": [{"steps": n, "step_ms": [one per step], "prompt_ms": ..} one per timed run],
//       "max_rss_bytes": .., "decoder_only": false|true,
//       "prefill": {"len": N, "ms": [..]} or {"len": N, "error": ".."}   (with --prefill-len)}
//
// F holds one sequence of token ids per line: the sources of an encoder-decoder model, the
// prompts of a decoder-only one (greedy continues them; such a model has no encoder, so
// encoder_ms stays empty: --skip-encoder is implied).
//
// Why not the inference binary's --time: its "encoder" time is measured inside
// Model::greedy and includes the cross-attention K/V projections of every decoder layer
// (work the decoder does once per source), and its per-step figure is a median. Here:
// * encoder = Model::encode(src) alone: embedding + encoder stack (+ the copy of the
//   output into a Tensor, < 1% at these sizes) — the same work the peers time;
// * decode = Model::greedy, every step's wall time kept (DecodeResult::step_ms), so the
//   harness reports the mean step time of a fixed-length decode (= total / steps), the
//   same statistic it computes for every peer. Decoding stops early only if every
//   sequence emitted eos; the step count is reported so the harness can say so.
//   prompt_ms is DecodeResult::encoder_ms: the encoder and the cross-attention K/V
//   (encoder-decoder), or the prompt's prefill and the first token (decoder-only, whose
//   step_ms then has new_tokens - 1 entries).
// * prefill (--prefill-len N): Model::greedy of one sequence of N tokens (F's ids, row
//   after row, repeated) with one new token: its prompt_ms, timed --prefill-repeat times
//   after one warm-up. An error there (N past a kernel's limit) is reported in the JSON,
//   not fatal, so that the other figures still come back.
// * max_rss_bytes (getrusage) is the process's peak resident memory: weights (mmapped,
//   counted once touched) + activations + KV cache, for the "weights + 25%" target.
// --device runs the spec's GPU build: every timed call ends with its results on the host
// (encode downloads the output, each greedy step downloads its argmax ids), so wall
// time covers the device work with no extra synchronisation.
// --dump writes, from the first (warm-up) run: encoder_output [B, S, d] (not for a
// decoder-only model), greedy [B, N] (int32, -1 after eos) and last_logits [B, V] (the
// head output at each sequence's last step): the values the peers are checked against.
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "halformer/model.h"
// The model: compiled with -include DIR/<name>.h -DHALFORMER_MODEL=halformer_model_<name>.
#ifndef HALFORMER_MODEL
#error "compile with -include DIR/<name>.h -DHALFORMER_MODEL=halformer_model_<name> (bench/run does)"
#endif
#include "halformer/safetensors.h"

namespace {

double now_ms() {
  using namespace std::chrono;
  return duration<double, std::milli>(steady_clock::now().time_since_epoch()).count();
}

std::vector<halformer::Sequence> read_sources(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw std::runtime_error(path + ": cannot open");
  std::vector<halformer::Sequence> out;
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream ss(line);
    halformer::Sequence s;
    int32_t v;
    while (ss >> v) s.push_back(v);
    if (!s.empty()) out.push_back(std::move(s));
  }
  if (out.empty()) throw std::runtime_error(path + ": no sequences");
  return out;
}

void print_list(const std::vector<double>& v) {
  std::printf("[");
  for (size_t i = 0; i < v.size(); ++i) std::printf("%s%.4f", i ? ", " : "", v[i]);
  std::printf("]");
}

std::string json_escape(const std::string& in) {
  std::string out;
  for (char c : in) {
    if (c == '"' || c == '\\') out += '\\', out += c;
    else if (static_cast<unsigned char>(c) < 0x20) out += ' ';
    else out += c;
  }
  return out;
}

int usage() {
  std::fprintf(stderr,
               "usage: halformer_model_bench --weights W --src-file F [--threads T] [--warmup N] "
               "[--repeat N] [--new-tokens N] [--dump OUT] [--skip-encoder] [--skip-decode] [--device D] "
               "[--prefill-len N] [--prefill-repeat N]\n");
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  std::string weights, src_file, dump, device = "cpu";
  int threads = 2, warmup = 1, repeat = 5, new_tokens = 64, prefill_len = 0, prefill_repeat = 3;
  bool skip_encoder = false, skip_decode = false;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--skip-encoder") { skip_encoder = true; continue; }
    if (a == "--skip-decode") { skip_decode = true; continue; }
    if (i + 1 >= argc) return usage();
    std::string v = argv[++i];
    if (a == "--weights") weights = v;
    else if (a == "--src-file") src_file = v;
    else if (a == "--threads") threads = std::atoi(v.c_str());
    else if (a == "--warmup") warmup = std::max(1, std::atoi(v.c_str()));
    else if (a == "--repeat") repeat = std::max(1, std::atoi(v.c_str()));
    else if (a == "--new-tokens") new_tokens = std::atoi(v.c_str());
    else if (a == "--dump") dump = v;
    else if (a == "--device") device = v;
    else if (a == "--prefill-len") prefill_len = std::atoi(v.c_str());
    else if (a == "--prefill-repeat") prefill_repeat = std::max(1, std::atoi(v.c_str()));
    else return usage();
  }
  if (weights.empty() || src_file.empty()) return usage();
  try {
    auto src = read_sources(src_file);
    double t0 = now_ms();
    auto model = halformer::Model::load(*HALFORMER_MODEL(), weights, {threads, device});
    double load_ms = now_ms() - t0;
    const bool decoder_only = model.config().arch == halformer::Architecture::Decoder;
    if (decoder_only) skip_encoder = true;  // no encoder to time or dump

    // Encoder: warm-up runs (the first one kept for --dump), then timed runs.
    halformer::Tensor enc;
    std::vector<double> enc_ms;
    if (!decoder_only && (!skip_encoder || !dump.empty())) {
      enc = model.encode(src);
      for (int i = 1; i < warmup; ++i) model.encode(src);
    }
    if (!skip_encoder)
      for (int i = 0; i < repeat; ++i) {
        double ts = now_ms();
        halformer::Tensor e = model.encode(src);
        enc_ms.push_back(now_ms() - ts);
      }

    // Greedy decode with the KV cache.
    halformer::DecodeResult first;
    std::vector<std::vector<double>> steps;
    std::vector<double> prompt_ms;
    if (!skip_decode || !dump.empty()) {
      first = model.greedy(src, new_tokens);
      for (int i = 1; i < warmup; ++i) model.greedy(src, new_tokens);
    }
    if (!skip_decode)
      for (int i = 0; i < repeat; ++i) {
        halformer::DecodeResult r = model.greedy(src, new_tokens);
        steps.push_back(std::move(r.step_ms));
        prompt_ms.push_back(r.encoder_ms);
      }

    // Prefill: one sequence of prefill_len tokens (F's ids, repeated), one new token.
    std::vector<double> prefill_ms;
    std::string prefill_error;
    if (prefill_len > 0) {
      halformer::Sequence prompt;
      while (int(prompt.size()) < prefill_len)
        for (const auto& s : src)
          for (int32_t t : s)
            if (int(prompt.size()) < prefill_len) prompt.push_back(t);
      try {
        model.greedy({prompt}, 1);  // warm-up: buffers of a new size, first launches
        for (int i = 0; i < prefill_repeat; ++i) prefill_ms.push_back(model.greedy({prompt}, 1).encoder_ms);
      } catch (const std::exception& e) {
        prefill_error = e.what();
      }
    }

    if (!dump.empty()) {
      const size_t B = src.size();
      std::vector<int32_t> greedy(B * size_t(new_tokens), -1);
      for (size_t b = 0; b < B; ++b)
        std::copy(first.tokens[b].begin(), first.tokens[b].end(), greedy.begin() + b * new_tokens);
      std::vector<halformer::NamedTensor> out;
      if (!decoder_only) out.push_back({"encoder_output", "F32", enc.shape, enc.data.data()});
      out.push_back({"greedy", "I32", {int64_t(B), int64_t(new_tokens)}, greedy.data()});
      out.push_back({"last_logits", "F32", first.last_logits.shape, first.last_logits.data.data()});
      halformer::write_safetensors(dump, out);
    }

    struct rusage ru {};
    getrusage(RUSAGE_SELF, &ru);
    size_t S = 0;
    for (const auto& s : src) S = std::max(S, s.size());
    std::printf("{\"batch\": %zu, \"src_len\": %zu, \"threads\": %d, \"load_ms\": %.3f, \"encoder_ms\": ", src.size(),
                S, threads, load_ms);
    print_list(enc_ms);
    std::printf(", \"decode\": [");
    for (size_t r = 0; r < steps.size(); ++r) {
      std::printf("%s{\"steps\": %zu, \"step_ms\": ", r ? ", " : "", steps[r].size());
      print_list(steps[r]);
      std::printf(", \"prompt_ms\": %.4f}", prompt_ms[r]);
    }
    std::printf("], \"max_rss_bytes\": %lld, \"decoder_only\": %s", (long long)ru.ru_maxrss * 1024,
                decoder_only ? "true" : "false");
    if (prefill_len > 0) {
      std::printf(", \"prefill\": {\"len\": %d, ", prefill_len);
      if (prefill_error.empty()) {
        std::printf("\"ms\": ");
        print_list(prefill_ms);
      } else {
        std::printf("\"error\": \"%s\"", json_escape(prefill_error).c_str());
      }
      std::printf("}");
    }
    std::printf("}\n");
  } catch (const std::exception& e) {
    std::fprintf(stderr, "halformer_model_bench: error: %s\n", e.what());
    return 1;
  }
  return 0;
}
