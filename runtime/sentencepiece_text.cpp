#include "halformer/sentencepiece_text.h"

#include <sentencepiece_processor.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>
#include <unordered_map>

#include "halformer/error.h"

namespace halformer {
namespace fs = std::filesystem;

// Marian's vocab.json (piece -> model id), its special ids and target.spm.
struct SentencePieceText::Marian {
  std::unordered_map<std::string, int32_t> ids;
  std::vector<std::string> pieces;   // by id; empty: no entry
  std::vector<bool> has_piece;
  int32_t unk = 0;
  std::vector<int32_t> special;      // eos, unk, pad: skipped when decoding
  bool clean_up = true;              // transformers' clean_up_tokenization_spaces
  std::unique_ptr<sentencepiece::SentencePieceProcessor> target;
};

SentencePieceText::SentencePieceText() : sp_(std::make_unique<sentencepiece::SentencePieceProcessor>()) {}
SentencePieceText::SentencePieceText(SentencePieceText&&) noexcept = default;
SentencePieceText& SentencePieceText::operator=(SentencePieceText&&) noexcept = default;
SentencePieceText::~SentencePieceText() = default;

namespace {

// `path` exists (load / load_marian checked it).
void load_model(sentencepiece::SentencePieceProcessor& sp, const std::string& path) {
  const auto status = sp.Load(path);
  if (!status.ok()) throw Error("--spm " + path + ": not a SentencePiece model (" + status.ToString() + ")");
}

// transformers' clean_up_tokenization (clean_up_tokenization_spaces), as Marian's and
// T5's tokenizers apply it when decoding.
std::string replace_all(std::string s, const std::string& from, const std::string& to) {
  for (size_t at = s.find(from); at != std::string::npos; at = s.find(from, at + to.size())) s.replace(at, from.size(), to);
  return s;
}
std::string clean_up_tokenization(std::string text) {
  for (const auto& [from, to] : std::vector<std::pair<std::string, std::string>>{
           {" .", "."}, {" ?", "?"}, {" !", "!"}, {" ,", ","}, {" ' ", "'"}, {" n't", "n't"},
           {" 'm", "'m"}, {" 's", "'s"}, {" 've", "'ve"}, {" 're", "'re"}})
    text = replace_all(text, from, to);
  return text;
}

std::string strip(const std::string& s) {
  const char* ws = " \t\n\r\f\v";
  const size_t a = s.find_first_not_of(ws);
  return a == std::string::npos ? std::string() : s.substr(a, s.find_last_not_of(ws) - a + 1);
}

nlohmann::json read_json(const std::string& path) {
  std::ifstream f(path);
  if (!f) throw Error("--spm: cannot read " + path);
  try {
    return nlohmann::json::parse(f);
  } catch (const nlohmann::json::exception& e) {
    throw Error("--spm: " + path + ": not valid JSON (" + e.what() + ")");
  }
}

}  // namespace

SentencePieceText SentencePieceText::load(const std::string& path) {
  std::error_code ec;
  const fs::path p(path);
  if (!fs::exists(p, ec)) throw Error("--spm " + path + ": no such file");
  if (fs::is_directory(p, ec)) {
    if (fs::exists(p / "source.spm", ec)) return load_marian(p.string(), path);
    if (fs::exists(p / "tokenizer.model", ec)) return load((p / "tokenizer.model").string());
    if (fs::exists(p / "spiece.model", ec)) return load((p / "spiece.model").string());
    throw Error("--spm " + path + ": a directory without tokenizer.model, T5's spiece.model or Marian's source.spm + vocab.json");
  }
  const std::string name = p.filename().string();
  if ((name == "source.spm" || name == "target.spm") && fs::exists(p.parent_path() / "vocab.json", ec))
    return load_marian(p.parent_path().string(), path);
  SentencePieceText t;
  t.path_ = path;
  load_model(*t.sp_, path);
  if (name == "spiece.model") {  // T5Tokenizer's decoding (decode() below)
    t.t5_ = true;
    const fs::path config = p.parent_path() / "tokenizer_config.json";
    if (fs::exists(config, ec)) {
      const nlohmann::json cfg = read_json(config.string());
      if (cfg.is_object() && cfg.contains("clean_up_tokenization_spaces") && cfg["clean_up_tokenization_spaces"].is_boolean())
        t.t5_clean_up_ = cfg["clean_up_tokenization_spaces"].get<bool>();
    }
  }
  return t;
}

SentencePieceText SentencePieceText::load_marian(const std::string& dir, const std::string& shown) {
  const fs::path d(dir);
  std::error_code ec;
  for (const char* f : {"vocab.json", "source.spm"})
    if (!fs::exists(d / f, ec)) throw Error("--spm " + shown + ": Marian's " + f + " is missing from " + dir);
  if (fs::exists(d / "target_vocab.json", ec))
    throw Error("--spm " + shown + ": " + (d / "target_vocab.json").string() +
                ": separate source and target vocabularies are not supported (docs/import.md)");
  SentencePieceText t;
  t.path_ = shown;
  t.marian_ = std::make_unique<Marian>();
  Marian& m = *t.marian_;
  load_model(*t.sp_, (d / "source.spm").string());
  m.target = std::make_unique<sentencepiece::SentencePieceProcessor>();
  const fs::path target = fs::exists(d / "target.spm", ec) ? d / "target.spm" : d / "source.spm";
  load_model(*m.target, target.string());

  const std::string vocab_path = (d / "vocab.json").string();
  const nlohmann::json vocab = read_json(vocab_path);
  if (!vocab.is_object() || vocab.empty())
    throw Error("--spm: " + vocab_path + ": expected an object of piece -> id");
  for (const auto& [piece, id] : vocab.items()) {
    if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() > INT32_MAX)
      throw Error("--spm: " + vocab_path + ": \"" + piece + "\": " + id.dump() + " is not an id (an integer >= 0)");
    const int32_t i = id.get<int32_t>();
    if (size_t(i) >= m.pieces.size()) {
      m.pieces.resize(i + 1);
      m.has_piece.resize(i + 1, false);
    }
    if (m.has_piece[i])
      throw Error("--spm: " + vocab_path + ": id " + std::to_string(i) + " is given to both \"" + m.pieces[i] +
                  "\" and \"" + piece + "\"");
    m.pieces[i] = piece;
    m.has_piece[i] = true;
    m.ids[piece] = i;
  }
  // MarianTokenizer's special tokens (its defaults; the unk token must be there)
  for (const char* s : {"</s>", "<unk>"})
    if (!m.ids.count(s)) throw Error("--spm: " + vocab_path + ": no entry for \"" + std::string(s) + "\"");
  m.unk = m.ids.at("<unk>");
  for (const char* s : {"</s>", "<unk>", "<pad>"})
    if (m.ids.count(s)) m.special.push_back(m.ids.at(s));
  if (fs::exists(d / "tokenizer_config.json", ec)) {
    const nlohmann::json cfg = read_json((d / "tokenizer_config.json").string());
    if (cfg.is_object() && cfg.value("separate_vocabs", false))
      throw Error("--spm " + shown + ": tokenizer_config.json: separate_vocabs: true is not supported (docs/import.md)");
    if (cfg.is_object() && cfg.contains("clean_up_tokenization_spaces") && cfg["clean_up_tokenization_spaces"].is_boolean())
      m.clean_up = cfg["clean_up_tokenization_spaces"].get<bool>();
  }
  return t;
}

std::vector<int32_t> SentencePieceText::encode(const std::string& text) const {
  std::vector<int32_t> out;
  if (!marian_) {
    std::vector<int> ids;
    const auto status = sp_->Encode(text, &ids);
    if (!status.ok()) throw Error("--spm " + path_ + ": cannot encode text (" + status.ToString() + ")");
    return std::vector<int32_t>(ids.begin(), ids.end());
  }
  // MarianTokenizer: a leading language code (">>fra<<") is one token; every code-like span
  // is taken out of the text that SentencePiece sees (its remove_language_code).
  static const std::regex code(">>.+<<");
  std::smatch lead;
  std::vector<std::string> pieces;
  if (std::regex_search(text, lead, code, std::regex_constants::match_continuous)) pieces.push_back(lead.str());
  const std::string rest = std::regex_replace(text, code, "");
  std::vector<std::string> sub;
  const auto status = sp_->Encode(rest, &sub);
  if (!status.ok()) throw Error("--spm " + path_ + ": cannot encode text (" + status.ToString() + ")");
  pieces.insert(pieces.end(), sub.begin(), sub.end());
  for (const auto& piece : pieces) {
    auto it = marian_->ids.find(piece);
    out.push_back(it == marian_->ids.end() ? marian_->unk : it->second);
  }
  return out;
}

std::string SentencePieceText::decode(const std::vector<int32_t>& ids) const {
  const int n = size();
  if (t5_) {
    // T5Tokenizer.decode(skip_special_tokens=True): pad, eos and unk dropped, and the
    // sentinel ids past the pieces (<extra_id_N>, special tokens too); the rest decoded,
    // stripped, and cleaned up as transformers' clean_up_tokenization does.
    std::vector<int> kept;
    for (int32_t id : ids) {
      if (id < 0) throw Error("--spm " + path_ + ": token " + std::to_string(id) + " has no piece");
      if (id < n && !sp_->IsControl(id) && !sp_->IsUnknown(id)) kept.push_back(id);
    }
    std::string text;
    const auto status = sp_->Decode(kept, &text);
    if (!status.ok()) throw Error("--spm " + path_ + ": cannot decode (" + status.ToString() + ")");
    text = strip(text);
    return t5_clean_up_ ? clean_up_tokenization(text) : text;
  }
  for (int32_t id : ids)
    if (id < 0 || id >= n || (marian_ && !marian_->has_piece[id]))
      throw Error("--spm " + path_ + ": token " + std::to_string(id) + " has no piece (the tokenizer has " +
                  std::to_string(n) + (marian_ ? " ids in vocab.json" : "") + "; is it this model's tokenizer?)");
  std::string text;
  if (!marian_) {
    const auto status = sp_->Decode(std::vector<int>(ids.begin(), ids.end()), &text);
    if (!status.ok()) throw Error("--spm " + path_ + ": cannot decode (" + status.ToString() + ")");
    return text;
  }
  // MarianTokenizer.decode(skip_special_tokens=True): special ids dropped, the pieces
  // decoded by target.spm, stripped, then transformers' clean_up_tokenization.
  std::vector<std::string> pieces;
  for (int32_t id : ids)
    if (std::find(marian_->special.begin(), marian_->special.end(), id) == marian_->special.end())
      pieces.push_back(marian_->pieces[id]);
  const auto status = marian_->target->Decode(pieces, &text);
  if (!status.ok()) throw Error("--spm " + path_ + ": cannot decode (" + status.ToString() + ")");
  text = strip(text);
  return marian_->clean_up ? clean_up_tokenization(text) : text;
}

int SentencePieceText::size() const { return marian_ ? int(marian_->pieces.size()) : sp_->GetPieceSize(); }

}  // namespace halformer
