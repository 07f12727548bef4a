// The inference binary of a generated model: DIR/<name> --weights W --src "5 9 13".
#include <CLI/CLI.hpp>

#include <algorithm>
#include <charconv>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>

#include "halformer/error.h"
#include "halformer/model.h"
#include "halformer/safetensors.h"

using halformer::Error;
using halformer::Sequence;

namespace {

Sequence parse_ids(const std::string& text, const std::string& where) {
  Sequence s;
  size_t i = 0;
  while (i < text.size()) {
    while (i < text.size() && (text[i] == ' ' || text[i] == '\t' || text[i] == ',' || text[i] == '\r')) ++i;
    if (i >= text.size()) break;
    size_t j = i;
    while (j < text.size() && !(text[j] == ' ' || text[j] == '\t' || text[j] == ',' || text[j] == '\r')) ++j;
    std::string tok = text.substr(i, j - i);
    int64_t v = 0;
    auto [p, ec] = std::from_chars(tok.data(), tok.data() + tok.size(), v);
    if (ec != std::errc() || p != tok.data() + tok.size() || v < INT32_MIN || v > INT32_MAX)
      throw Error(where + ": '" + tok + "' is not a token id (expected integers separated by spaces)");
    s.push_back(int32_t(v));
    i = j;
  }
  return s;
}

std::vector<Sequence> read_sequences(const std::vector<std::string>& args, const std::string& file,
                                     const char* flag) {
  std::vector<Sequence> out;
  for (size_t i = 0; i < args.size(); ++i)
    out.push_back(parse_ids(args[i], std::string(flag) + " #" + std::to_string(i + 1)));
  if (!file.empty()) {
    std::ifstream in(file);
    if (!in) throw Error(file + ": cannot open");
    std::string line;
    for (int n = 1; std::getline(in, line); ++n) {
      if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
      out.push_back(parse_ids(line, file + ":" + std::to_string(n)));
    }
  }
  return out;
}

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v.size() % 2 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
}

}  // namespace

int main(int argc, char** argv) {
  const auto& cfg = halformer_model_config();
  CLI::App app{std::string(cfg.name) + ": halformer inference binary (spec " + cfg.spec_file +
               ").\nReads token ids, prints the greedy decode of each source sequence, one line each."};
  std::string weights, src_file, tgt_file, dump;
  std::vector<std::string> src_args, tgt_args;
  int max_new = cfg.max_new_tokens, threads = 0, repeat = 1;
  bool json = false, logits = false, timing = false;
  app.add_option("--weights,-w", weights, "safetensors weights (naming preset " +
                                              std::string(cfg.weight_preset) + ")")->required();
  app.add_option("--src,-s", src_args, "source token ids, e.g. \"3 7 1 9\" (repeat for a batch)");
  app.add_option("--src-file", src_file, "file with one source sequence per line");
  app.add_option("--tgt", tgt_args, "teacher-forced decoder input per source (starts with bos); "
                                    "adds its head output to --json/--dump");
  app.add_option("--tgt-file", tgt_file, "file with one decoder input per line");
  app.add_option("--max-new-tokens,-n", max_new, "tokens to generate per sequence")
      ->capture_default_str();
  app.add_flag("--json", json, "print JSON: tokens per sequence, timings");
  app.add_flag("--logits", logits, "with --json: include the head output at the last step");
  app.add_option("--dump", dump, "write encoder_output, greedy (and logits with --tgt) as safetensors");
  app.add_option("--threads,-t", threads, "worker threads (default: all cores)");
  app.add_option("--repeat", repeat, "run the decode this many times and report median timings")
      ->check(CLI::Range(1, 100000));
  app.add_flag("--time", timing, "print encoder and per-token times (medians) to stderr");
  CLI11_PARSE(app, argc, argv);

  try {
    auto src = read_sequences(src_args, src_file, "--src");
    if (src.empty()) throw Error("no source sequences: give --src \"ids\" or --src-file FILE");
    auto tgt = read_sequences(tgt_args, tgt_file, "--tgt");
    if (!tgt.empty() && tgt.size() != src.size())
      throw Error("--tgt: " + std::to_string(tgt.size()) + " sequences for " +
                  std::to_string(src.size()) + " sources");
    auto model = halformer::Model::load(weights, threads);

    halformer::DecodeResult result;
    std::vector<double> enc_ms, step_ms;
    for (int i = 0; i < repeat; ++i) {
      result = model.greedy(src, max_new);
      enc_ms.push_back(result.encoder_ms);
      step_ms.push_back(median(result.step_ms));
    }
    if (timing)
      std::fprintf(stderr, "encoder %.3f ms (median of %d), decoder step %.3f ms (median), %zu steps, batch %zu\n",
                   median(enc_ms), repeat, median(step_ms), result.step_ms.size(), src.size());

    halformer::Tensor scored;
    if (!tgt.empty()) scored = model.score(src, tgt);
    if (!dump.empty()) {
      halformer::Tensor enc = model.encode(src);
      size_t B = src.size(), N = 0;
      for (auto& t : result.tokens) N = std::max(N, t.size());
      std::vector<int32_t> greedy(B * N, -1);
      for (size_t b = 0; b < B; ++b) std::copy(result.tokens[b].begin(), result.tokens[b].end(), greedy.begin() + b * N);
      std::vector<halformer::NamedTensor> out = {
          {"encoder_output", "F32", enc.shape, enc.data.data()},
          {"greedy", "I32", {int64_t(B), int64_t(N)}, greedy.data()}};
      if (!tgt.empty()) out.push_back({"logits", "F32", scored.shape, scored.data.data()});
      halformer::write_safetensors(dump, out);
    }
    if (json) {
      nlohmann::json j;
      j["model"] = cfg.name;
      const int V = cfg.tgt_vocab;
      for (size_t b = 0; b < src.size(); ++b) {
        nlohmann::json s = {{"source", src[b]}, {"tokens", result.tokens[b]}};
        if (logits)
          s["logits"] = std::vector<float>(result.last_logits.data.begin() + b * V,
                                           result.last_logits.data.begin() + (b + 1) * V);
        j["sequences"].push_back(s);
      }
      j["timing"] = {{"encoder_ms", median(enc_ms)}, {"step_ms", median(step_ms)}, {"repeat", repeat}};
      std::cout << j.dump() << "\n";
    } else {
      for (const auto& t : result.tokens) {
        for (size_t i = 0; i < t.size(); ++i) std::cout << (i ? " " : "") << t[i];
        std::cout << "\n";
      }
    }
  } catch (const std::exception& e) {
    std::cerr << cfg.name << ": error: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
