// The inference binary of a generated model: DIR/<name> --weights W --src "5 9 13".
// What it prints follows the spec's architecture:
//   encoder-decoder: the decoded target ids of each source (greedy, or beam search)
//   decoder-only:    the continuation of each prompt
//   encoder-only:    the head's vector per sequence (class logits / sentence embedding)
#include <CLI/CLI.hpp>

#include <algorithm>
#include <charconv>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>

#include "halformer/error.h"
#include "halformer/model.h"
#include "halformer/safetensors.h"

using halformer::Arch;
using halformer::Error;
using halformer::Sequence;

namespace {

Sequence parse_ids(const std::string& text, const std::string& where) {
  Sequence s;
  size_t i = 0;
  auto sep = [](char c) { return c == ' ' || c == '\t' || c == ',' || c == '\r'; };
  while (i < text.size()) {
    while (i < text.size() && sep(text[i])) ++i;
    if (i >= text.size()) break;
    size_t j = i;
    while (j < text.size() && !sep(text[j])) ++j;
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

std::vector<Sequence> read_sequences(const std::vector<std::string>& args, const std::string& file, const char* flag) {
  std::vector<Sequence> out;
  for (size_t i = 0; i < args.size(); ++i)
    out.push_back(parse_ids(args[i], std::string(flag) + " #" + std::to_string(i + 1)));
  if (!file.empty()) {
    std::error_code ec;
    if (std::filesystem::is_directory(file, ec)) throw Error(file + ": is a directory, not a file of sequences");
    std::ifstream in(file);
    if (!in) throw Error(file + ": cannot open");
    std::string line;
    for (int n = 1; std::getline(in, line); ++n) {
      if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
      out.push_back(parse_ids(line, file + ":" + std::to_string(n)));
    }
    if (in.bad()) throw Error(file + ": read error");
  }
  return out;
}

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v.size() % 2 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
}

// Row-major [B][T]-padded int matrix (-1 fill) of variable-length sequences.
std::vector<int32_t> padded(const std::vector<Sequence>& seqs, size_t& width) {
  width = 0;
  for (const auto& s : seqs) width = std::max(width, s.size());
  std::vector<int32_t> m(seqs.size() * width, -1);
  for (size_t b = 0; b < seqs.size(); ++b) std::copy(seqs[b].begin(), seqs[b].end(), m.begin() + b * width);
  return m;
}

void print_ids(const Sequence& t) {
  for (size_t i = 0; i < t.size(); ++i) std::cout << (i ? " " : "") << t[i];
  std::cout << "\n";
}

}  // namespace

int main(int argc, char** argv) {
  const auto& cfg = halformer_model_config();
  const bool decodes = cfg.arch != Arch::Encoder;
  CLI::App app{std::string(cfg.name) + ": halformer inference binary (spec " + cfg.spec_file + ").\n" +
               (cfg.arch == Arch::Encoder ? "Reads token ids, prints the head's vector for each sequence."
                : cfg.arch == Arch::Decoder ? "Reads prompt token ids, prints the continuation of each prompt."
                                            : "Reads source token ids, prints the decoded target ids of each.")};
  std::string weights, src_file, tgt_file, dump;
  std::vector<std::string> src_args, tgt_args;
  int max_new = cfg.max_new_tokens, threads = 0, repeat = 1, beam = cfg.beam ? cfg.beam_size : 1;
  double length_penalty = cfg.length_penalty;
  bool json = false, logits = false, timing = false, no_cache = false;
  app.add_option("--weights,-w", weights, std::string("safetensors weights (naming preset ") + cfg.preset_name + ")")
      ->required();
  app.add_option("--src,-s", src_args, "token ids of one input sequence, e.g. \"3 7 1 9\" (repeat for a batch)");
  app.add_option("--src-file", src_file, "file with one input sequence per line");
  if (decodes) {
    app.add_option("--max-new-tokens,-n", max_new, "tokens to generate per sequence")->capture_default_str();
    app.add_option("--beam", beam, "beam size (1: greedy)")->capture_default_str()->check(CLI::Range(1, 1024));
    app.add_option("--length-penalty", length_penalty, "beam search: score / length^penalty")->capture_default_str();
    app.add_flag("--no-cache", no_cache, "greedy: recompute the whole prefix every step (no KV cache)");
    app.add_flag("--logits", logits, "with --json: include the head output at the last step");
  }
  if (cfg.arch == Arch::EncoderDecoder) {
    app.add_option("--tgt", tgt_args, "teacher-forced decoder input per source (starts with bos); "
                                      "adds its head output to --dump");
    app.add_option("--tgt-file", tgt_file, "file with one decoder input per line");
  }
  app.add_flag("--json", json, "print JSON: outputs per sequence, timings");
  app.add_option("--dump", dump, "write every output tensor as safetensors (encoder_output, logits, greedy, ...)");
  app.add_option("--threads,-t", threads, "worker threads (default: all cores)");
  std::string device = "cpu";
  app.add_option("--device", device, std::string("device to run on; built: ") + halformer_model_devices())
      ->capture_default_str();
  app.add_option("--repeat", repeat, "run this many times and report median timings")->check(CLI::Range(1, 100000));
  app.add_flag("--time", timing, "print timings (medians) to stderr");
  CLI11_PARSE(app, argc, argv);

  try {
    auto src = read_sequences(src_args, src_file, "--src");
    if (src.empty()) throw Error("no input sequences: give --src \"ids\" or --src-file FILE");
    auto tgt = read_sequences(tgt_args, tgt_file, "--tgt");
    if (!tgt.empty() && tgt.size() != src.size())
      throw Error("--tgt: " + std::to_string(tgt.size()) + " sequences for " + std::to_string(src.size()) + " sources");
    if (!tgt.empty() && dump.empty())
      throw Error("--tgt: the teacher-forced head output is only written by --dump; add --dump FILE");
    // --dump replaces its file: never one of the user's inputs.
    for (const std::string* input : {&weights, &src_file, &tgt_file}) {
      std::error_code ec;
      if (!dump.empty() && !input->empty() && std::filesystem::equivalent(dump, *input, ec))
        throw Error("--dump " + dump + ": is the same file as the input " + *input + "; refusing to overwrite it");
    }
    auto model = halformer::Model::load(weights, threads, device);
    nlohmann::json j;
    j["model"] = cfg.name;
    std::vector<halformer::NamedTensor> out;
    // Storage for tensors referenced by `out` until the dump is written.
    halformer::Tensor enc, head, scored;
    std::vector<int32_t> greedy_m, beam_m;
    std::vector<float> beam_scores;

    if (cfg.arch != Arch::Decoder && !dump.empty()) {
      enc = model.encode(src);
      out.push_back({"encoder_output", "F32", enc.shape, enc.data.data()});
    }
    if (!decodes) {
      std::vector<double> ms;
      for (int i = 0; i < repeat; ++i) {
        auto wall0 = std::chrono::steady_clock::now();
        head = cfg.head == halformer::HeadOutput::Hidden ? model.encode(src) : model.pooled(src);
        ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - wall0).count());
      }
      if (timing) std::fprintf(stderr, "encoder + head %.3f ms (median of %d), batch %zu\n", median(ms), repeat, src.size());
      j["timing"] = {{"encoder_ms", median(ms)}, {"repeat", repeat}};
      if (cfg.head != halformer::HeadOutput::Hidden) out.push_back({"head_output", "F32", head.shape, head.data.data()});
      const size_t X = head.data.size() / src.size();
      for (size_t b = 0; b < src.size(); ++b) {
        std::vector<float> v(head.data.begin() + b * X, head.data.begin() + (b + 1) * X);
        if (json) {
          j["sequences"].push_back({{"source", src[b]}, {"output", v}});
        } else {
          for (size_t i = 0; i < v.size(); ++i) std::printf(i ? " %.6g" : "%.6g", v[i]);
          std::printf("\n");
        }
      }
    } else if (beam > 1) {
      halformer::BeamResult r;
      std::vector<double> enc_ms, step_ms;
      for (int i = 0; i < repeat; ++i) {
        r = model.beam_search(src, beam, length_penalty, max_new);
        enc_ms.push_back(r.encoder_ms);
        step_ms.push_back(median(r.step_ms));
      }
      if (timing)
        std::fprintf(stderr, "encoder %.3f ms, beam step %.3f ms (medians of %d), beam %d, batch %zu\n", median(enc_ms),
                     median(step_ms), repeat, beam, src.size());
      j["timing"] = {{"encoder_ms", median(enc_ms)}, {"step_ms", median(step_ms)}, {"repeat", repeat}};
      size_t N = 0;
      for (auto& hs : r.hypotheses)
        for (auto& h : hs) N = std::max(N, h.size());
      beam_m.assign(src.size() * beam * N, -1);
      beam_scores.assign(src.size() * beam, 0.0f);
      for (size_t b = 0; b < src.size(); ++b) {
        nlohmann::json hyps;
        for (size_t k = 0; k < r.hypotheses[b].size(); ++k) {
          std::copy(r.hypotheses[b][k].begin(), r.hypotheses[b][k].end(), beam_m.begin() + (b * beam + k) * N);
          beam_scores[b * beam + k] = float(r.scores[b][k]);
          hyps.push_back({{"tokens", r.hypotheses[b][k]}, {"score", r.scores[b][k]}});
        }
        if (json) j["sequences"].push_back({{"source", src[b]}, {"hypotheses", hyps}});
        else print_ids(r.hypotheses[b].empty() ? Sequence{} : r.hypotheses[b][0]);
      }
      out.push_back({"beam_tokens", "I32", {int64_t(src.size()), beam, int64_t(N)}, beam_m.data()});
      out.push_back({"beam_scores", "F32", {int64_t(src.size()), beam}, beam_scores.data()});
    } else {
      halformer::DecodeResult r;
      std::vector<double> enc_ms, step_ms;
      for (int i = 0; i < repeat; ++i) {
        r = model.greedy(src, max_new, !no_cache);
        enc_ms.push_back(r.encoder_ms);
        step_ms.push_back(median(r.step_ms));
      }
      if (timing) {
        std::fprintf(stderr, "%s %.3f ms, decoder step %.3f ms (medians of %d), %zu steps, batch %zu%s\n",
                     cfg.arch == Arch::Decoder ? "prompt" : "encoder", median(enc_ms), median(step_ms), repeat,
                     r.step_ms.size(), src.size(), no_cache ? ", no KV cache" : "");
      }
      j["timing"] = {{"encoder_ms", median(enc_ms)}, {"step_ms", median(step_ms)}, {"repeat", repeat},
                     {"steps_ms", r.step_ms}, {"kv_cache", !no_cache}};
      const int V = cfg.tgt_vocab;
      for (size_t b = 0; b < src.size(); ++b) {
        if (json) {
          nlohmann::json s = {{"source", src[b]}, {"tokens", r.tokens[b]}};
          if (logits)
            s["logits"] = std::vector<float>(r.last_logits.data.begin() + b * V, r.last_logits.data.begin() + (b + 1) * V);
          j["sequences"].push_back(s);
        } else {
          print_ids(r.tokens[b]);
        }
      }
      size_t N = 0;
      greedy_m = padded(r.tokens, N);
      out.push_back({"greedy", "I32", {int64_t(src.size()), int64_t(N)}, greedy_m.data()});
    }
    if (!dump.empty() && (cfg.arch == Arch::Decoder || !tgt.empty())) {
      scored = model.score(src, tgt);
      out.push_back({"logits", "F32", scored.shape, scored.data.data()});
    }
    if (!dump.empty()) halformer::write_safetensors(dump, out);
    if (json) std::cout << j.dump() << "\n";
  } catch (const std::exception& e) {
    std::cerr << cfg.name << ": error: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
