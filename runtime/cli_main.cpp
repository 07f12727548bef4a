// The inference binary of a generated model: DIR/<name> --weights W --src "5 9 13".
// What it prints follows the spec's architecture:
//   encoder-decoder: the decoded target ids of each source (greedy, or beam search)
//   decoder-only:    the continuation of each prompt
//   encoder-only:    the head's vector per sequence (class logits / sentence embedding);
//                    from token ids, or from text (--text, --text-file) with a BERT
//                    vocabulary (--vocab vocab.txt; halformer/tokenizer.h)
#include <CLI/CLI.hpp>

#include <algorithm>
#include <cctype>
#include <charconv>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <limits>
#include <numeric>
#include <optional>
#include <sstream>
#include <nlohmann/json.hpp>

#include "halformer/cli.h"
#include "halformer/error.h"
#include "halformer/model.h"
#include "halformer/safetensors.h"
#include "halformer/sentencepiece_text.h"
#include "halformer/tokenizer.h"

using halformer::Architecture;
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

// ---- text input (encoder-only models): --text, --text-file, --vocab, --max-length
// Every line of the file is one text, blank lines included (they embed as [CLS] [SEP]),
// so output line i belongs to input line i. Lines end at '\n' only.
std::vector<std::string> read_texts(const std::vector<std::string>& args, const std::string& file) {
  std::vector<std::string> out(args);
  if (!file.empty()) {
    std::error_code ec;
    if (std::filesystem::is_directory(file, ec)) throw Error(file + ": is a directory, not a file of texts");
    std::ifstream in(file, std::ios::binary);
    if (!in) throw Error(file + ": cannot open");
    std::ostringstream all;
    all << in.rdbuf();
    if (in.bad()) throw Error(file + ": read error");
    const std::string s = all.str();
    for (size_t pos = 0; pos < s.size();) {
      size_t end = std::min(s.find('\n', pos), s.size());
      out.push_back(s.substr(pos, end - pos));
      pos = end + 1;
    }
  }
  return out;
}

// The text with every byte that does not start valid UTF-8 replaced by U+FFFD (JSON
// output must be valid UTF-8; the tokenizer reads such bytes the same way).
std::string valid_utf8(const std::string& s) {
  std::string out;
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  for (size_t i = 0, n = s.size(); i < n;) {
    unsigned c = p[i];
    size_t len = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
    bool ok = len > 0 && i + len <= n;
    for (size_t k = 1; ok && k < len; ++k) ok = (p[i + k] & 0xC0) == 0x80;
    if (ok && len > 1) {  // no overlong forms, surrogates or code points past U+10FFFF
      unsigned cp = c & (0xFF >> (len + 1));
      for (size_t k = 1; k < len; ++k) cp = (cp << 6) | (p[i + k] & 0x3F);
      ok = cp >= (len == 2 ? 0x80u : len == 3 ? 0x800u : 0x10000u) && cp <= 0x10FFFF && (cp < 0xD800 || cp > 0xDFFF);
    }
    if (ok) {
      out.append(s, i, len);
      i += len;
    } else {
      out += "\xEF\xBF\xBD";
      i += 1;
    }
  }
  return out;
}

// Encoder-only models: `f` (pooled / encode) over the sequences in batches of
// `batch_size` (0: all at once), longest first so that little is padded; the rows come
// back in input order, [N, ...] ([N, S, d] outputs padded to the longest S).
halformer::Tensor batched(const std::function<halformer::Tensor(const std::vector<Sequence>&)>& f,
                          const std::vector<Sequence>& src, size_t batch_size) {
  if (batch_size == 0 || batch_size >= src.size()) return f(src);
  std::vector<size_t> order(src.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return src[a].size() > src[b].size(); });
  halformer::Tensor out;
  size_t row = 0;
  for (size_t i = 0; i < order.size(); i += batch_size) {
    std::vector<Sequence> part;
    for (size_t j = i; j < std::min(i + batch_size, order.size()); ++j) part.push_back(src[order[j]]);
    halformer::Tensor t;
    try {
      t = f(part);
    } catch (const Error& e) {  // "... sequence K ..." counts within the batch: name the input
      std::string m = e.what();
      size_t at = m.find("sequence "), k = 0, end = at == std::string::npos ? at : at + 9;
      while (end < m.size() && std::isdigit(static_cast<unsigned char>(m[end]))) k = k * 10 + size_t(m[end++] - '0');
      if (k >= 1 && k <= part.size()) m += " (input sequence " + std::to_string(order[i + k - 1] + 1) + ")";
      throw Error(m);
    }
    if (i == 0) {  // the longest sequences come first: their shape is the widest
      out.shape = t.shape;
      out.shape[0] = int64_t(src.size());
      row = t.data.size() / part.size();
      out.data.assign(row * src.size(), 0.0f);
    }
    const size_t r = t.data.size() / part.size();  // <= row: shorter S, same trailing dims
    for (size_t j = 0; j < part.size(); ++j)
      std::copy(t.data.begin() + j * r, t.data.begin() + (j + 1) * r, out.data.begin() + order[i + j] * row);
  }
  return out;
}

}  // namespace

int halformer::run_cli(const ModelDescriptor& model_descriptor, int argc, char** argv) {
  const auto& cfg = *model_descriptor.config;
  const bool decodes = cfg.arch != Architecture::Encoder;
  CLI::App app{std::string(cfg.name) + ": halformer inference binary (spec " + cfg.spec_file + ").\n" +
               (cfg.arch == Architecture::Encoder ? "Reads token ids, prints the head's vector for each sequence."
                : cfg.arch == Architecture::Decoder ? "Reads prompt token ids, prints the continuation of each prompt."
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
  std::vector<std::string> text_args;
  std::string text_file, vocab, spm;
  int max_length = cfg.max_len, batch_size = 0;
  app.add_option("--text", text_args, std::string("one input text, tokenized with ") +
                                          (cfg.arch == Architecture::Encoder ? "--vocab or --spm" : "--spm") +
                                          " (repeat for a batch)");
  app.add_option("--text-file", text_file, "file with one input text per line (UTF-8; blank lines too)");
  app.add_option("--spm", spm, std::string("SentencePiece model for --text: tokenizer.model, or a Hugging Face directory "
                                               "with tokenizer.model, T5's spiece.model or Marian's source.spm + vocab.json "
                                               "(+ target.spm): ") +
                                   (cfg.arch == Architecture::Decoder          ? "bos + the pieces in; generated text out"
                                    : cfg.arch == Architecture::EncoderDecoder ? "the pieces + eos in; generated text out"
                                                                       : "the pieces in"));
  if (cfg.arch == Architecture::Encoder) {
    app.add_option("--vocab", vocab, "BERT WordPiece vocabulary (vocab.txt) for --text / --text-file");
    app.add_option("--max-length", max_length, "text: tokens per text with [CLS] and [SEP]; longer texts are truncated")
        ->capture_default_str();
    app.add_option("--batch-size", batch_size, "run the inputs in batches of this many, longest first (0: one batch)")
        ->capture_default_str()->check(CLI::NonNegativeNumber);
  }
  if (decodes) {
    app.add_option("--max-new-tokens,-n", max_new, "tokens to generate per sequence")->capture_default_str();
    app.add_option("--beam", beam, "beam size (1: greedy)")->capture_default_str()->check(CLI::Range(1, 1024));
    app.add_option("--length-penalty", length_penalty, "beam search: score / length^penalty")->capture_default_str();
    app.add_flag("--no-cache", no_cache, "greedy: recompute the whole prefix every step (no KV cache)");
    app.add_flag("--logits", logits, "with --json: include the head output at the last step");
  }
  // Generation options (halformer/generation.h), greedy unless --sampling-topk is not 1.
  halformer::GenerationOptions gen;
  bool stream = false;
  if (decodes) {
    app.add_option("--sampling-topk", gen.sampling_topk, "sample from the k most probable tokens (1: greedy, 0: all)")
        ->capture_default_str();
    app.add_option("--sampling-topp", gen.sampling_topp, "sample from the smallest set of tokens reaching this probability")
        ->capture_default_str();
    app.add_option("--temperature", gen.sampling_temperature, "sampling temperature (0: greedy)")->capture_default_str();
    app.add_option("--seed", gen.seed, "sampling seed (the same seed gives the same tokens)")->capture_default_str();
    app.add_option("--repetition-penalty", gen.repetition_penalty, "penalise tokens already in the sequence (1: off)")
        ->capture_default_str();
    app.add_option("--no-repeat-ngram-size", gen.no_repeat_ngram_size, "never repeat an n-gram of this size (0: off)")
        ->capture_default_str();
    app.add_option("--min-length", gen.min_length, "new tokens before eos may be chosen")->capture_default_str();
    app.add_flag("--scores", gen.return_scores, "with --json: each new token's log-probability");
    app.add_flag("--stream", stream, "print tokens as they are generated (one sequence: on one line; "
                                     "several: one \"<sequence> <token>\" line per token)");
  }
  if (cfg.arch == Architecture::EncoderDecoder) {
    app.add_option("--tgt", tgt_args, "teacher-forced decoder input per source (starts with bos); "
                                      "adds its head output to --dump");
    app.add_option("--tgt-file", tgt_file, "file with one decoder input per line");
  }
  app.add_flag("--json", json, "print JSON: outputs per sequence, timings");
  app.add_option("--dump", dump, "write every output tensor as safetensors (encoder_output, logits, greedy, ...)");
  app.add_option("--threads,-t", threads, "worker threads (default: all cores)");
  std::string device = "cpu";
  app.add_option("--device", device, std::string("device to run on; built: ") + model_descriptor.devices)
      ->capture_default_str();
  app.add_option("--repeat", repeat, "run this many times and report median timings")->check(CLI::Range(1, 100000));
  app.add_flag("--time", timing, "print timings (medians) to stderr");
  CLI11_PARSE(app, argc, argv);

  try {
    auto src = read_sequences(src_args, src_file, "--src");
    const auto texts = read_texts(text_args, text_file);
    const bool text_mode = !text_args.empty() || !text_file.empty();
    std::optional<halformer::SentencePieceText> pieces;
    if (!spm.empty() && !vocab.empty()) throw Error("give one tokenizer: --vocab (WordPiece) or --spm (SentencePiece)");
    if (!spm.empty() && !text_mode) throw Error("--spm applies to text input: give --text or --text-file");
    if (text_mode && !src.empty())
      throw Error("give token ids (--src, --src-file) or text (--text, --text-file), not both");
    if (text_mode && !spm.empty()) {
      if (max_length != cfg.max_len) throw Error("--max-length applies to --vocab (WordPiece) text, not to --spm");
      pieces = halformer::SentencePieceText::load(spm);
      const int vocab_size = cfg.arch == Architecture::Decoder ? cfg.tgt_vocab : cfg.src_vocab;
      if (pieces->size() > vocab_size)
        throw Error("--spm " + spm + ": " + std::to_string(pieces->size()) + " pieces, more than the model's vocabulary of " +
                    std::to_string(vocab_size) + " (is it this model's tokenizer?)");
      // Decoder-only (Llama): bos first; encoder-decoder (Marian): eos last; as their tokenizers do.
      for (const auto& t : texts) {
        Sequence ids = pieces->encode(t);
        if (cfg.arch == Architecture::Decoder) ids.insert(ids.begin(), cfg.bos_id);
        if (cfg.arch == Architecture::EncoderDecoder) ids.push_back(cfg.eos_id);
        src.push_back(std::move(ids));
      }
    } else if (text_mode) {
      if (cfg.arch != Architecture::Encoder) throw Error("--text/--text-file: --spm FILE is required (the model's SentencePiece model)");
      if (vocab.empty()) throw Error("--text/--text-file: --vocab FILE (the model's vocab.txt) or --spm FILE is required");
      if (max_length < 2 || max_length > cfg.max_len)
        throw Error("--max-length " + std::to_string(max_length) + " is outside [2, " + std::to_string(cfg.max_len) +
                    "] (2: [CLS] and [SEP]; the model's max_len is " + std::to_string(cfg.max_len) + ")");
      auto t0 = std::chrono::steady_clock::now();
      auto tokenizer = halformer::BertTokenizer::from_vocab_file(vocab);
      if (tokenizer.vocab_size() > size_t(cfg.src_vocab))
        throw Error("--vocab " + vocab + ": " + std::to_string(tokenizer.vocab_size()) +
                    " tokens, more than the model's vocabulary of " + std::to_string(cfg.src_vocab) +
                    " (is it this model's vocab.txt?)");
      src = tokenizer.encode_batch(texts, max_length);
      double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
      if (timing) std::fprintf(stderr, "tokenizer (vocabulary load + %zu texts) %.3f ms\n", texts.size(), ms);
    }
    if (src.empty())
      throw Error(std::string("no input sequences: give --src \"ids\" or --src-file FILE") +
                  (cfg.arch == Architecture::Encoder ? ", or --text \"...\" / --text-file FILE with --vocab FILE or --spm FILE"
                                             : ", or --text \"...\" / --text-file FILE with --spm FILE"));
    if (!text_mode && (!vocab.empty() || max_length != cfg.max_len))
      throw Error(std::string(vocab.empty() ? "--max-length" : "--vocab") + " applies to text input: give --text or --text-file");
    auto tgt = read_sequences(tgt_args, tgt_file, "--tgt");
    if (!tgt.empty() && tgt.size() != src.size())
      throw Error("--tgt: " + std::to_string(tgt.size()) + " sequences for " + std::to_string(src.size()) + " sources");
    if (!tgt.empty() && dump.empty())
      throw Error("--tgt: the teacher-forced head output is only written by --dump; add --dump FILE");
    // --dump replaces its file: never one of the user's inputs.
    for (const std::string* input : {&weights, &src_file, &tgt_file, &text_file, &vocab, &spm}) {
      std::error_code ec;
      if (!dump.empty() && !input->empty() && std::filesystem::equivalent(dump, *input, ec))
        throw Error("--dump " + dump + ": is the same file as the input " + *input + "; refusing to overwrite it");
    }
    const bool sampling_options = gen.sampling_topk != 1 || gen.repetition_penalty != 1.0f ||
                                  gen.no_repeat_ngram_size != 0 || gen.min_length != 0 || gen.return_scores || stream;
    if (beam > 1 && sampling_options)
      throw Error("--beam " + std::to_string(beam) + ": beam search takes --length-penalty and --max-new-tokens; "
                  "the sampling, penalty, --min-length, --scores and --stream options apply to greedy/sampling (--beam 1)");
    if (decodes) {
      gen.max_new_tokens = max_new;
      gen.use_cache = !no_cache;
      halformer::validate(gen, cfg.tgt_vocab);
    }
    auto model = halformer::Model::load(model_descriptor, weights, {threads, device});
    nlohmann::json j;
    j["model"] = cfg.name;
    std::vector<halformer::NamedTensor> out;
    // Storage for tensors referenced by `out` until the dump is written.
    halformer::Tensor enc, head, scored;
    std::vector<int32_t> greedy_m, beam_m;
    std::vector<float> beam_scores;

    if (cfg.arch != Architecture::Decoder && !dump.empty()) {
      enc = cfg.arch == Architecture::Encoder
                ? batched([&](const std::vector<Sequence>& s) { return model.encode(s); }, src, size_t(batch_size))
                : model.encode(src);
      out.push_back({"encoder_output", "F32", enc.shape, enc.data.data()});
    }
    // Host<->device copies of the timed runs below (GPU devices; see docs/gpu.md).
    const halformer::TransferStats before = model.transfers();
    if (!decodes) {
      std::vector<double> ms;
      for (int i = 0; i < repeat; ++i) {
        auto wall0 = std::chrono::steady_clock::now();
        head = batched([&](const std::vector<Sequence>& s) {
          return cfg.head == halformer::HeadKind::Hidden ? model.encode(s) : model.pooled(s);
        }, src, size_t(batch_size));
        ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - wall0).count());
      }
      if (timing) std::fprintf(stderr, "encoder + head %.3f ms (median of %d), batch %zu\n", median(ms), repeat, src.size());
      j["timing"] = {{"encoder_ms", median(ms)}, {"repeat", repeat}};
      if (cfg.head != halformer::HeadKind::Hidden) out.push_back({"head_output", "F32", head.shape, head.data.data()});
      const size_t X = head.data.size() / src.size();
      for (size_t b = 0; b < src.size(); ++b) {
        std::vector<float> v(head.data.begin() + b * X, head.data.begin() + (b + 1) * X);
        if (json) {
          nlohmann::json s = {{"source", src[b]}, {"output", v}};
          if (text_mode) s["text"] = valid_utf8(texts[b]);
          j["sequences"].push_back(s);
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
      beam_scores.assign(src.size() * beam, -std::numeric_limits<float>::infinity());  // missing hypotheses
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
      if (stream) {
        const bool one = src.size() == 1;
        gen.on_token = [one](int row, int32_t token, float) {
          if (one) std::printf("%d ", token);
          else std::printf("%d %d\n", row, token);
          std::fflush(stdout);
          return true;
        };
      }
      if (max_new < 1 || max_new > cfg.max_len)
        throw Error("max_new_tokens " + std::to_string(max_new) + " is outside [1, max_len = " +
                    std::to_string(cfg.max_len) + "]");
      for (int i = 0; i < repeat; ++i) {
        r = model.generate(src, gen);
        if (stream && src.size() == 1) std::printf("\n");
        gen.on_token = nullptr;  // --repeat: stream the first run only
        enc_ms.push_back(r.encoder_ms);
        step_ms.push_back(median(r.step_ms));
      }
      if (timing) {
        std::fprintf(stderr, "%s %.3f ms, decoder step %.3f ms (medians of %d), %zu steps, batch %zu%s\n",
                     cfg.arch == Architecture::Decoder ? "prompt" : "encoder", median(enc_ms), median(step_ms), repeat,
                     r.step_ms.size(), src.size(), no_cache ? ", no KV cache" : "");
      }
      // runs_*: each run's figure, so that a caller can leave out the first (cold) run.
      j["timing"] = {{"encoder_ms", median(enc_ms)}, {"step_ms", median(step_ms)}, {"repeat", repeat},
                     {"runs_encoder_ms", enc_ms}, {"runs_step_ms", step_ms}, {"steps_ms", r.step_ms},
                     {"kv_cache", !no_cache}};
      const int V = cfg.tgt_vocab;
      // Text out with --spm: the new tokens up to eos, decoded.
      auto text_of = [&](const Sequence& t) {
        Sequence body(t.begin(), std::find(t.begin(), t.end(), cfg.eos_id));
        return pieces->decode(body);
      };
      for (size_t b = 0; b < src.size(); ++b) {
        if (json) {
          nlohmann::json s = {{"source", src[b]}, {"tokens", r.tokens[b]}};
          if (pieces) s["text"] = valid_utf8(text_of(r.tokens[b]));
          if (logits)
            s["logits"] = std::vector<float>(r.last_logits.data.begin() + b * V, r.last_logits.data.begin() + (b + 1) * V);
          if (gen.return_scores) s["token_logprobs"] = r.token_logprobs[b];
          j["sequences"].push_back(s);
        } else if (!stream && pieces) {
          std::printf("%s\n", text_of(r.tokens[b]).c_str());
        } else if (!stream) {
          print_ids(r.tokens[b]);
        }
      }
      size_t N = 0;
      greedy_m = padded(r.tokens, N);
      out.push_back({"greedy", "I32", {int64_t(src.size()), int64_t(N)}, greedy_m.data()});
    }
    if (device != "cpu") {
      const halformer::TransferStats now = model.transfers();
      const int64_t up = now.uploads - before.uploads, up_b = now.upload_bytes - before.upload_bytes,
                    down = now.downloads - before.downloads, down_b = now.download_bytes - before.download_bytes,
                    dd = now.device_copies - before.device_copies, wu = now.weight_uploads - before.weight_uploads,
                    wu_b = now.weight_upload_bytes - before.weight_upload_bytes;
      if (timing)
        std::fprintf(stderr,
                     "device transfers (%d runs): %lld uploads (%lld bytes), %lld downloads (%lld bytes), "
                     "%lld device-to-device copies; weights: %lld uploads (%lld bytes)\n",
                     repeat, (long long)up, (long long)up_b, (long long)down, (long long)down_b, (long long)dd,
                     (long long)wu, (long long)wu_b);
      j["transfers"] = {{"runs", repeat},         {"uploads", up},       {"upload_bytes", up_b},
                        {"downloads", down},      {"download_bytes", down_b}, {"device_copies", dd},
                        {"weight_uploads", wu},   {"weight_upload_bytes", wu_b}};
    }
    if (!dump.empty() && (cfg.arch == Architecture::Decoder || !tgt.empty())) {
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
