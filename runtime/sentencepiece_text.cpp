#include "halformer/sentencepiece_text.h"

#include <sentencepiece_processor.h>

#include <filesystem>

#include "halformer/error.h"

namespace halformer {

SentencePieceText::SentencePieceText() : sp_(std::make_unique<sentencepiece::SentencePieceProcessor>()) {}
SentencePieceText::SentencePieceText(SentencePieceText&&) noexcept = default;
SentencePieceText& SentencePieceText::operator=(SentencePieceText&&) noexcept = default;
SentencePieceText::~SentencePieceText() = default;

SentencePieceText SentencePieceText::load(const std::string& path) {
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) throw Error("--spm " + path + ": no such file");
  if (std::filesystem::is_directory(path, ec)) throw Error("--spm " + path + ": is a directory, not a SentencePiece model");
  SentencePieceText t;
  t.path_ = path;
  const auto status = t.sp_->Load(path);
  if (!status.ok()) throw Error("--spm " + path + ": not a SentencePiece model (" + status.ToString() + ")");
  return t;
}

std::vector<int32_t> SentencePieceText::encode(const std::string& text) const {
  std::vector<int> ids;
  const auto status = sp_->Encode(text, &ids);
  if (!status.ok()) throw Error("--spm " + path_ + ": cannot encode text (" + status.ToString() + ")");
  return std::vector<int32_t>(ids.begin(), ids.end());
}

std::string SentencePieceText::decode(const std::vector<int32_t>& ids) const {
  std::vector<int> in;
  for (int32_t id : ids) {
    if (id < 0 || id >= sp_->GetPieceSize())
      throw Error("--spm " + path_ + ": token " + std::to_string(id) + " has no piece (the tokenizer has " +
                  std::to_string(sp_->GetPieceSize()) + "; is it this model's tokenizer?)");
    in.push_back(id);
  }
  std::string text;
  const auto status = sp_->Decode(in, &text);
  if (!status.ok()) throw Error("--spm " + path_ + ": cannot decode (" + status.ToString() + ")");
  return text;
}

int SentencePieceText::size() const { return sp_->GetPieceSize(); }

}  // namespace halformer
