// Text through a SentencePiece model (the tokenizer.model / source.spm of Llama-style and
// Marian checkpoints), for the inference binary's --text with --spm; Debian's
// libsentencepiece does the work.
//
//   auto sp = halformer::SentencePieceText::load("tokenizer.model");
//   std::vector<int32_t> ids = sp.encode("Hello world");   // pieces only, no bos / eos
//   std::string text = sp.decode(ids);
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace sentencepiece {
class SentencePieceProcessor;
}

namespace halformer {

class SentencePieceText {
 public:
  // Throws halformer::Error naming the file when it is missing or not a SentencePiece model.
  static SentencePieceText load(const std::string& path);
  SentencePieceText(SentencePieceText&&) noexcept;
  SentencePieceText& operator=(SentencePieceText&&) noexcept;
  ~SentencePieceText();

  std::vector<int32_t> encode(const std::string& text) const;
  // Ids outside the model's pieces (a model vocabulary larger than the tokenizer's) are an
  // Error naming the id; control pieces (bos, eos, pad) decode to nothing.
  std::string decode(const std::vector<int32_t>& ids) const;
  int size() const;  // number of pieces

 private:
  SentencePieceText();
  std::string path_;
  std::unique_ptr<sentencepiece::SentencePieceProcessor> sp_;
};

}  // namespace halformer
