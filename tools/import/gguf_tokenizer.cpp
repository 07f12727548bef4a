// The tokenizer of a GGUF file as a SentencePiece model and a tokenizers JSON
// (gguf_tokenizer.h says what is written and why).
#include "gguf_tokenizer.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <map>
#include <optional>
#include <tuple>
#include <unordered_map>

#include "gguf_file.h"
#include "import_internal.h"

namespace halformer::import {
namespace {
namespace fs = std::filesystem;
using ojson = nlohmann::ordered_json;
using detail::Problems;

// llama.cpp's token types (gguf's TokenType) are sentencepiece's own numbers.
enum Type : int64_t { Normal = 1, Unknown = 2, Control = 3, UserDefined = 4, Unused = 5, Byte = 6 };

// ---------------------------------------------------------------- protobuf wire format
// Just what a ModelProto needs: varints (int32, enums, bools; a negative int32 is
// sign-extended to ten bytes, as protobuf writes pad_id -1), little-endian 32-bit floats
// and length-delimited fields (strings, nested messages).
struct Proto {
  std::string b;
  void varint(uint64_t v) {
    for (; v >= 0x80; v >>= 7) b += char((v & 0x7f) | 0x80);
    b += char(v);
  }
  Proto& num(int field, int64_t v) { return varint(uint64_t(field) << 3), varint(uint64_t(v)), *this; }
  Proto& f32(int field, float v) {
    uint32_t u;
    std::memcpy(&u, &v, 4);
    varint(uint64_t(field) << 3 | 5);
    return b += {char(u), char(u >> 8), char(u >> 16), char(u >> 24)}, *this;
  }
  Proto& bytes(int field, const std::string& s) {
    return varint(uint64_t(field) << 3 | 2), varint(s.size()), b += s, *this;
  }
};

// ---------------------------------------------------------------- the pre-tokenizers of "gpt2"
// tokenizer.ggml.pre names llama.cpp's pre-tokenizer (llama-vocab.cpp maps the names to
// regexes); the JSON writes each as the model family's own tokenizer.json has it.
const char* const kLlama3 = R"re((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3})re"
                            R"re(| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)re";
const char* const kQwen2 = R"re((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N})re"
                           R"re(| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)re";
struct Pre {
  std::vector<std::string> names;
  std::vector<const char*> regexes;  // applied one after the other; none: ByteLevel's own (GPT-2's) regex
  bool nfc;                          // Qwen2's tokenizer.json normalizes to NFC first
  bool trim_offsets;                 // offsets only: as the family's file has it
  bool add_bos;                      // llama.cpp's default where tokenizer.ggml.add_bos_token is absent
  const char* as;
};
const std::vector<Pre>& pres() {
  static const std::vector<Pre> p = {
      {{"gpt2", "gpt-2", "phi-2", "mpt", "olmo"}, {}, false, true, false, "GPT-2's tokenizer.json"},
      {{"llama-bpe", "llama3", "llama-v3", "falcon3"}, {kLlama3}, false, true, true, "Llama 3's tokenizer.json"},
      {{"dbrx", "smaug-bpe"}, {kLlama3}, false, true, false, "Llama 3's regex"},
      {{"qwen2", "deepseek-r1-qwen"}, {kQwen2}, true, false, false, "Qwen2's tokenizer.json"},
      {{"default"},  // a file converted before tokenizer.ggml.pre existed: llama.cpp's own fallback
       {R"([\p{P}\$\+<=>\^~\|]+)", R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S))",
        R"(\p{N}+)", R"([0-9][0-9][0-9])"}, false, true, false, "llama.cpp's default regexes"},
  };
  return p;
}

// ---------------------------------------------------------------- reading the metadata
std::string quote(const std::string& s) { return "'" + (s.size() > 60 ? s.substr(0, 60) + "..." : s) + "'"; }

// Problems of one key, three of them shown: a 150k-token list may be wrong everywhere.
struct Bad {
  std::string text;
  size_t n = 0;
  void add(const std::string& s) { text += n++ < 3 ? (text.empty() ? "" : "; ") + s : ""; }
  std::string str() const { return text + (n > 3 ? " (and " + std::to_string(n - 3) + " more)" : ""); }
};

// tokenizer.ggml.K reads (K without the prefix) that record problems: a wrong type is the
// GgufFile's error, naming the key.
struct Reader {
  const GgufFile& f;
  Problems pr;
  static std::string key(const std::string& k) { return "tokenizer.ggml." + k; }
  void problem(const std::string& k, const std::string& msg) { pr.add(f.path(), "key '" + key(k) + "'", msg); }
  template <class T>
  std::optional<T> get(const std::string& k, T (GgufFile::*read)(const std::string&) const) {
    if (!f.has(key(k))) return std::nullopt;
    try {
      return (f.*read)(key(k));
    } catch (const GgufError& e) {
      pr.list.push_back(e.what());
    }
    return std::nullopt;
  }
  // A per-token list: exactly `n` entries (absent and required: a problem).
  template <class T>
  std::vector<T> list(const std::string& k, int64_t n, bool required, const std::string& why,
                      std::vector<T> (GgufFile::*read)(const std::string&) const) {
    if (!f.has(key(k)) && required) problem(k, "missing (required: " + why + ")");
    auto v = get(k, read);
    if (v && int64_t(v->size()) != n)
      problem(k, std::to_string(v->size()) + " entries for a vocabulary of " + std::to_string(n) + " tokens");
    return v.value_or(std::vector<T>());
  }
};

struct Vocab {
  std::vector<std::string> tokens;
  std::vector<float> scores;  // "llama" only
  std::vector<int64_t> types;
  std::map<std::string, int64_t> ids;                 // "bos" / "eos" / "unknown" / "padding" -> id
  std::unordered_map<std::string, int64_t> last;      // token -> its last id (as a JSON object keeps it)
  bool add_bos = true, add_eos = false, add_space_prefix = true;
  const std::string& at(const char* which) const { return tokens[size_t(ids.at(which))]; }
};

// ---------------------------------------------------------------- the tokenizers JSON
// The document's head: the tokens of the types `added` as added tokens (special: control
// and unknown ones), matched before the model sees the text (`normalized`: after the
// normalizer).
ojson json_head(const Vocab& v, std::initializer_list<int64_t> added, bool normalized) {
  ojson doc = {{"version", "1.0"}, {"truncation", nullptr}, {"padding", nullptr}, {"added_tokens", ojson::array()}};
  for (size_t i = 0; i < v.tokens.size(); ++i)
    if (std::count(added.begin(), added.end(), v.types[i]))
      doc["added_tokens"].push_back({{"id", i}, {"content", v.tokens[i]}, {"single_word", false}, {"lstrip", false},
                                     {"rstrip", false}, {"normalized", normalized},
                                     {"special", v.types[i] != UserDefined}});
  return doc;
}
// "<s>:0 $A:0 </s>:0" for one sequence, its pair with ":1": the post-processor transformers'
// converters write where the tokenizer adds bos / eos.
ojson template_processing(const Vocab& v) {
  ojson single = ojson::array(), pair = ojson::array(), special = ojson::object();
  auto tok = [&](const char* which, int t) { return ojson{{"SpecialToken", {{"id", v.at(which)}, {"type_id", t}}}}; };
  for (int part = 0; part < 2; ++part) {
    ojson& seq = part ? pair : single;
    if (part) seq = single;
    if (v.add_bos) seq.push_back(tok("bos", part));
    seq.push_back({{"Sequence", {{"id", part ? "B" : "A"}, {"type_id", part}}}});
    if (v.add_eos) seq.push_back(tok("eos", part));
  }
  for (const char* which : {"bos", "eos"})
    if (std::string(which) == "bos" ? v.add_bos : v.add_eos)
      special[v.at(which)] = {{"id", v.at(which)}, {"ids", {v.ids.at(which)}}, {"tokens", {v.at(which)}}};
  return {{"type", "TemplateProcessing"}, {"single", single}, {"pair", pair}, {"special_tokens", special}};
}

// The document with its BPE model last (unknown token where there is one; SentencePiece's
// fuses runs of unknowns and falls back to bytes), the vocabulary one token a line in id
// order and the merges spliced in as text: a 150k-entry ordered_json object would be
// built by as many linear searches.
std::string bpe_json(ojson doc, const Vocab& v, const std::vector<std::string>& merges, bool spm, bool fallback) {
  doc["model"] = {{"type", "BPE"}, {"dropout", nullptr},
                  {"unk_token", v.ids.count("unknown") ? ojson(v.at("unknown")) : ojson(nullptr)},
                  {"continuing_subword_prefix", nullptr}, {"end_of_word_suffix", nullptr}, {"fuse_unk", spm},
                  {"byte_fallback", fallback}, {"vocab", "@vocab@"}, {"merges", "@merges@"}};
  std::string vocab, list, s = doc.dump(2) + "\n";
  for (size_t i = 0; i < v.tokens.size(); ++i)
    if (v.last.at(v.tokens[i]) == int64_t(i))
      vocab += (vocab.empty() ? "{\n      " : ",\n      ") + ojson(v.tokens[i]).dump() + ": " + std::to_string(i);
  for (const std::string& m : merges) list += (list.empty() ? "[\n      " : ",\n      ") + ojson(m).dump();
  s.replace(s.rfind("\"@merges@\""), 10, list.empty() ? "[]" : list + "\n    ]");  // the last ones: the model's
  s.replace(s.rfind("\"@vocab@\""), 9, vocab.empty() ? "{}" : vocab + "\n    }");
  return s;
}

// transformers' SentencePieceExtractor.extract(vocab_scores): a merge (l, r) for every two
// pieces whose concatenation is a piece with a non-zero score (LlamaConverter gives unk,
// bos and eos 0: control and unknown pieces here), ordered by that score, highest first,
// then by l's and r's ids (Python's stable sort over its loops). A piece with a space can
// not be written in this tokenizers version's "l r" merge format and makes no merge.
std::vector<std::string> spm_merges(const Vocab& v) {
  std::vector<std::tuple<float, int64_t, int64_t>> ms;  // score, l, r
  for (size_t p = 0; p < v.tokens.size(); ++p) {
    const std::string& t = v.tokens[p];
    const float score = v.types[p] == Unknown || v.types[p] == Control ? 0.0f : v.scores[p];
    if (score == 0.0f || v.last.at(t) != int64_t(p)) continue;
    for (size_t k = 1; k < t.size(); ++k) {
      if ((t[k] & 0xC0) == 0x80) continue;  // inside a UTF-8 character
      auto l = v.last.find(t.substr(0, k)), r = v.last.find(t.substr(k));
      if (l != v.last.end() && r != v.last.end() && l->first.find(' ') == std::string::npos &&
          r->first.find(' ') == std::string::npos)
        ms.emplace_back(-score, l->second, r->second);
    }
  }
  std::sort(ms.begin(), ms.end());
  std::vector<std::string> out;
  for (const auto& [score, l, r] : ms) out.push_back(v.tokens[size_t(l)] + " " + v.tokens[size_t(r)]);
  return out;
}

// LlamaConverter's tokenizer.json: BPE with byte fallback over the pieces, the normalizer
// that does SentencePiece's escaping (a "▁" in front where add_dummy_prefix, spaces as
// "▁"), its decoder, bos (and eos) from the post-processor. Unknown and control pieces are
// special added tokens, as the converter adds <unk>, <s>, </s>; user-defined pieces (which
// 4.30's converter leaves to BPE) are added tokens too, matched whole as sentencepiece and
// llama.cpp match them.
std::string spm_json(const Vocab& v, bool byte_fallback) {
  ojson doc = json_head(v, {Unknown, Control, UserDefined}, true);
  const ojson replace = {{"type", "Replace"}, {"pattern", {{"String", " "}}}, {"content", "\u2581"}},
              prepend = {{"type", "Prepend"}, {"prepend", "\u2581"}};
  doc["normalizer"] = v.add_space_prefix ? ojson{{"type", "Sequence"}, {"normalizers", {prepend, replace}}} : replace;
  doc["pre_tokenizer"] = nullptr;
  doc["post_processor"] = v.add_bos || v.add_eos ? template_processing(v) : ojson(nullptr);
  ojson decoders = {{{"type", "Replace"}, {"pattern", {{"String", "\u2581"}}}, {"content", " "}},
                    {{"type", "ByteFallback"}}, {{"type", "Fuse"}}};
  if (v.add_space_prefix) decoders.push_back({{"type", "Strip"}, {"content", " "}, {"start", 1}, {"stop", 0}});
  doc["decoder"] = {{"type", "Sequence"}, {"decoders", decoders}};
  return bpe_json(doc, v, spm_merges(v), true, byte_fallback);
}

// A byte-level BPE's tokenizer.json as the family's own (pre-tokenizer, decoder); control
// tokens special added tokens, user-defined ones (stored as their text by the converter)
// plain added tokens, both matched in the raw text.
std::string gpt2_json(const Vocab& v, const Pre& pre, const std::vector<std::string>& merges) {
  ojson doc = json_head(v, {Control, UserDefined}, false);
  doc["normalizer"] = pre.nfc ? ojson{{"type", "NFC"}} : ojson(nullptr);
  auto byte_level = [](bool prefix, bool trim, bool regex) {
    return ojson{{"type", "ByteLevel"}, {"add_prefix_space", prefix}, {"trim_offsets", trim}, {"use_regex", regex}};
  };
  if (pre.regexes.empty()) {
    doc["pre_tokenizer"] = byte_level(false, pre.trim_offsets, true);
  } else {
    ojson seq = ojson::array();
    for (const char* re : pre.regexes)
      seq.push_back({{"type", "Split"}, {"pattern", {{"Regex", re}}}, {"behavior", "Isolated"}, {"invert", false}});
    seq.push_back(byte_level(false, pre.trim_offsets, false));
    doc["pre_tokenizer"] = {{"type", "Sequence"}, {"pretokenizers", seq}};
  }
  doc["post_processor"] = v.add_bos || v.add_eos ? template_processing(v) : byte_level(true, false, true);
  doc["decoder"] = byte_level(true, true, true);
  return bpe_json(doc, v, merges, false, false);
}

// ---------------------------------------------------------------- the SentencePiece model
// A BPE ModelProto as Llama's tokenizer.model is (sentencepiece_model.proto): the pieces
// with their scores and types; trainer_spec model_type BPE, byte_fallback where there are
// byte pieces, the special ids and pieces; normalizer "identity" (llama.cpp normalizes
// nothing either) with add_dummy_prefix from add_space_prefix, whitespace escaped and
// kept (remove_extra_whitespaces false).
std::string spm_model(const Vocab& v, bool byte_fallback) {
  Proto m;
  for (size_t i = 0; i < v.tokens.size(); ++i) {
    Proto p;
    p.bytes(1, v.tokens[i]).f32(2, v.scores[i]);
    if (v.types[i] != Normal) p.num(3, v.types[i]);
    m.bytes(1, p.b);
  }
  Proto t;
  t.num(3, 2).num(4, int64_t(v.tokens.size())).num(35, byte_fallback);  // model_type BPE, vocab_size
  const std::pair<const char*, int> special[] = {{"unknown", 40}, {"bos", 41}, {"eos", 42}, {"padding", 43}};
  for (const auto& [which, field] : special) {  // unk_id 40 ... pad_id 43; their pieces 45 ... 48
    t.num(field, v.ids.count(which) ? v.ids.at(which) : -1);
    if (v.ids.count(which)) t.bytes(field + 5, v.at(which));
  }
  m.bytes(2, t.b);
  Proto n;
  n.bytes(1, "identity").num(3, v.add_space_prefix).num(4, 0).num(5, 1);
  m.bytes(3, n.b);
  return m.b;
}

// Sentencepiece's own load checks (model_interface.cc), so that --spm never meets a file
// it refuses: one unknown piece, no piece twice among the normal (normal, user-defined,
// unused) or the reserved ones, byte pieces "<0xXX>" and all 256 of them or none.
void check_spm(Reader& r, Vocab& v) {
  Bad unknown, twice, bytes;
  std::map<std::pair<bool, std::string>, size_t> seen;
  std::vector<bool> byte(256);
  size_t n_bytes = 0;
  auto hex = [](char c) { return c >= '0' && c <= '9' ? c - '0' : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1; };
  for (size_t i = 0; i < v.tokens.size(); ++i) {
    const std::string& s = v.tokens[i];
    const int64_t t = v.types[i];
    if (t == Unknown) unknown.add("token " + std::to_string(i) + " " + quote(s));
    if (t == Unknown && v.ids.count("unknown") && v.ids["unknown"] != int64_t(i))
      r.problem("unknown_token_id", "found " + std::to_string(v.ids["unknown"]) + "; the unknown token (type 2) is " +
                                        std::to_string(i));
    if (t == Unknown) v.ids["unknown"] = int64_t(i);  // the piece sentencepiece takes as unknown
    if (auto [it, fresh] = seen.emplace(std::make_pair(t == Unknown || t == Control || t == Byte, s), i); !fresh)
      twice.add("tokens " + std::to_string(it->second) + " and " + std::to_string(i) + " are both " + quote(s));
    if (t != Byte) continue;
    const bool form = s.size() == 6 && s.compare(0, 3, "<0x") == 0 && s[5] == '>' && hex(s[3]) >= 0 && hex(s[4]) >= 0;
    const int b = form ? hex(s[3]) * 16 + hex(s[4]) : -1;  // sentencepiece's spelling: "<0x%02X>"
    if (b >= 0 && !byte[size_t(b)])
      byte[size_t(b)] = true, ++n_bytes;
    else
      bytes.add("token " + std::to_string(i) + " " + quote(s));
  }
  if (unknown.n != 1)
    r.problem("token_type", unknown.n ? "more than one unknown token (type 2): " + unknown.str()
                                      : "no unknown token (type 2): a SentencePiece model needs one");
  if (twice.n) r.problem("tokens", twice.str() + " (SentencePiece refuses a piece given twice)");
  if (bytes.n)
    r.problem("token_type", "byte tokens (type 6) must be <0x00> ... <0xFF>, each once: " + bytes.str());
  else if (n_bytes && n_bytes != 256)
    r.problem("token_type", std::to_string(n_bytes) + " byte tokens (type 6): byte fallback needs all 256 or none");
}

// "gpt2": every merge "l r" names two tokens whose concatenation is a token too (tokenizers
// refuses any other at load).
std::vector<std::string> read_merges(Reader& r, const Vocab& v) {
  if (!r.f.has(Reader::key("merges"))) r.problem("merges", "missing (required: the merges of a byte-level BPE)");
  auto merges = r.get("merges", &GgufFile::string_array).value_or(std::vector<std::string>());
  Bad bad;
  for (size_t i = 0; i < merges.size(); ++i) {
    const std::string& m = merges[i];
    const size_t sp = m.find(' ', 1);
    if (sp == std::string::npos || m.find(' ', sp + 1) != std::string::npos) {
      bad.add("merge " + std::to_string(i) + " " + quote(m) + " is not two tokens 'l r'");
      continue;
    }
    for (const std::string& t : {m.substr(0, sp), m.substr(sp + 1), m.substr(0, sp) + m.substr(sp + 1)})
      if (!v.last.count(t)) {
        bad.add("merge " + std::to_string(i) + " " + quote(m) + " names " + quote(t) + ", not a token");
        break;
      }
  }
  if (bad.n) r.problem("merges", bad.str());
  return merges;
}

// The lists and ids both kinds read, checked.
Vocab read_vocab(Reader& r, int64_t vocab, bool spm, const Pre* pre) {
  Vocab v;
  const std::string why = spm ? "a SentencePiece model's pieces, scores and types" : "a byte-level BPE's tokens";
  v.tokens = r.list("tokens", vocab, true, why, &GgufFile::string_array);
  v.types = r.list("token_type", vocab, spm, why, &GgufFile::int_array);
  if (!spm && !r.f.has(Reader::key("token_type"))) v.types.assign(size_t(vocab), Normal);
  if (spm) v.scores = r.list("scores", vocab, true, why, &GgufFile::float_array);
  Bad types, tokens, scores;
  for (size_t i = 0; i < v.types.size(); ++i)
    if (v.types[i] < Normal || v.types[i] > Byte)
      types.add("token " + std::to_string(i) + " has type " + std::to_string(v.types[i]));
  for (size_t i = 0; i < v.tokens.size(); ++i) try {
      if (v.tokens[i].empty()) throw std::runtime_error("empty");
      (void)ojson(v.tokens[i]).dump();  // the JSON's own UTF-8 check, as it will write it
      v.last[v.tokens[i]] = int64_t(i);
    } catch (const std::exception&) {
      tokens.add("token " + std::to_string(i) + (v.tokens[i].empty() ? " is empty" : " is not UTF-8"));
    }
  for (size_t i = 0; i < v.scores.size(); ++i)
    if (!std::isfinite(v.scores[i])) scores.add("token " + std::to_string(i) + ": " + std::to_string(v.scores[i]));
  if (types.n) r.problem("token_type", types.str() + " (1-6: normal, unknown, control, user-defined, unused, byte)");
  if (tokens.n) r.problem("tokens", tokens.str());
  if (scores.n) r.problem("scores", scores.str());
  for (const char* which : {"bos", "eos", "unknown", "padding"})
    if (auto id = r.get(std::string(which) + "_token_id", &GgufFile::int_value); id && (*id < 0 || *id >= vocab))
      r.problem(std::string(which) + "_token_id",
                "found " + std::to_string(*id) + "; not a token id (the vocabulary has " + std::to_string(vocab) + ")");
    else if (id)
      v.ids[which] = *id;
  // llama.cpp's defaults: SentencePiece adds bos and a space in front; byte-level BPE adds
  // bos for Llama 3's pre-tokenizers only.
  v.add_bos = r.get("add_bos_token", &GgufFile::bool_value).value_or(spm || pre->add_bos);
  v.add_eos = r.get("add_eos_token", &GgufFile::bool_value).value_or(false);
  if (spm) v.add_space_prefix = r.get("add_space_prefix", &GgufFile::bool_value).value_or(true);
  for (const auto& [flag, which] : {std::pair{v.add_bos, "bos"}, std::pair{v.add_eos, "eos"}})
    if (flag && !v.ids.count(which))
      r.problem(std::string("add_") + which + "_token", std::string("true, but there is no ") + which + "_token_id");
  return v;
}

}  // namespace

void add_gguf_tokenizer(const GgufFile& f, int64_t vocab, const std::string& name, const std::string& weights_abs,
                        std::vector<std::string>& header, Imported& out) {
  Reader r{f, {}};
  const auto model = r.get("model", &GgufFile::string_value);
  const auto pre_name = r.get("pre", &GgufFile::string_value);
  if (!r.pr.list.empty()) throw ImportError(r.pr.list);
  const Pre* pre = nullptr;
  for (const Pre& p : pres())
    if (std::count(p.names.begin(), p.names.end(), pre_name.value_or("default"))) pre = &p;
  const std::string what = model ? "tokenizer.ggml.model " + quote(*model) : "no tokenizer.ggml.model";
  std::string skip;  // why no files are written
  if (!model || (*model != "llama" && *model != "gpt2"))
    skip = what + ": no tokenizer files written (halformer import writes SentencePiece 'llama' and byte-level BPE "
                  "'gpt2' tokenizers)";
  else if (*model == "gpt2" && !pre)
    skip = what + " with tokenizer.ggml.pre " + quote(*pre_name) + ": no tokenizer.json written (known: gpt2, " +
           "llama-bpe, qwen2, default and their aliases, docs/import.md)";
  if (!skip.empty()) {
    out.notes.push_back(skip + "; give token ids with --src");
    header.push_back("Tokenizer: " + skip + ": give token ids with --src");
    return;
  }
  const bool spm = *model == "llama";
  Vocab v = read_vocab(r, vocab, spm, pre);
  if (!r.pr.list.empty()) throw ImportError(r.pr.list);  // the checks below read every list whole
  std::vector<std::string> merges;
  if (spm)
    check_spm(r, v);
  else
    merges = read_merges(r, v);
  if (!r.pr.list.empty()) throw ImportError(r.pr.list);

  // ---- the files, beside the weights, and the lines that say how to use them
  const std::string stem = fs::path(weights_abs).replace_extension("").string();
  const std::string json_path = stem + ".tokenizer.json", spm_path = stem + ".tokenizer.model";
  const std::string python = "  python: halformer.Model(DIR, weights=\"" + weights_abs + "\", tokenizer=\"" +
                             json_path + "\")";
  if (spm) {
    const bool fallback = std::count(v.types.begin(), v.types.end(), int64_t(Byte)) > 0;
    out.files.push_back({spm_path, spm_model(v, fallback)});
    out.files.push_back({json_path, spm_json(v, fallback)});
    header.push_back("Tokenizer: " + what + " (SentencePiece BPE, " + std::to_string(vocab) + " pieces" +
                     (fallback ? ", byte fallback" : "") + "): " + spm_path + " and " + json_path);
    header.push_back("  DIR/" + name + " --weights " + weights_abs + " --spm " + spm_path + " --text \"...\"");
    header.push_back(python);
    if (!v.add_bos) header.push_back("  add_bos_token is false: --text puts bos first all the same; the JSON does not");
  } else {
    out.files.push_back({json_path, gpt2_json(v, *pre, merges)});
    header.push_back("Tokenizer: " + what + " (byte-level BPE, " + std::to_string(merges.size()) +
                     " merges, pre-tokenizer " + quote(pre_name.value_or("default")) + " as " + pre->as + "): " +
                     json_path);
    header.push_back("  the binary has no byte-level BPE (--spm reads SentencePiece models): text through Python,");
    header.push_back(python);
    out.notes.push_back(what + " is a byte-level BPE, which the binary's --text does not read: " + json_path +
                        " is for Python (halformer.Model(..., tokenizer=))");
    if (!pre_name)
      out.notes.push_back("no tokenizer.ggml.pre: llama.cpp's default pre-tokenizer regexes, as llama.cpp reads the "
                          "file (it warns that they may cut text differently from the original tokenizer)");
  }
}

}  // namespace halformer::import
