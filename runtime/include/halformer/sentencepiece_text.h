// Text through a SentencePiece model (the tokenizer.model of Llama-style checkpoints, the
// source.spm / target.spm / vocab.json of Marian ones), for the inference binary's --text
// with --spm; Debian's libsentencepiece does the work.
//
//   auto sp = halformer::SentencePieceText::load("tokenizer.model");
//   std::vector<int32_t> ids = sp.encode("Hello world");   // pieces only, no bos / eos
//   std::string text = sp.decode(ids);
//
// T5 (spiece.model, or its directory): ids are the pieces' own, and decode() is
// T5Tokenizer.decode(skip_special_tokens=True): pad / eos / unk and the sentinel ids past
// the pieces (<extra_id_N>) dropped, the text stripped and cleaned up (as Marian's below).
//
// Marian (load() is given its source.spm, or its directory): the model's ids are not the
// pieces' own but vocab.json's, and output decodes through target.spm, exactly as
// transformers' MarianTokenizer does (a leading ">>lang<<" code is one token; decode skips
// eos / unk / pad and cleans up spaces before punctuation unless tokenizer_config.json
// says clean_up_tokenization_spaces: false).
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
  // `path`: a SentencePiece model file, or a directory holding tokenizer.model, T5's
  // spiece.model, or Marian's
  // source.spm + vocab.json (a source.spm / target.spm file with a vocab.json beside it is
  // read as Marian's too: its pieces' own ids are not the model's). Throws halformer::Error
  // naming the file when something is missing or malformed.
  static SentencePieceText load(const std::string& path);
  SentencePieceText(SentencePieceText&&) noexcept;
  SentencePieceText& operator=(SentencePieceText&&) noexcept;
  ~SentencePieceText();

  std::vector<int32_t> encode(const std::string& text) const;
  // Ids the tokenizer has no piece for (a model vocabulary larger than the tokenizer's) are
  // an Error naming the id; control pieces (bos, eos, pad; Marian: eos, unk, pad) decode to
  // nothing.
  std::string decode(const std::vector<int32_t>& ids) const;
  int size() const;  // number of ids: pieces, or Marian's vocab.json entries (largest id + 1)

 private:
  struct Marian;
  SentencePieceText();
  static SentencePieceText load_marian(const std::string& dir, const std::string& shown);
  std::string path_;
  std::unique_ptr<sentencepiece::SentencePieceProcessor> sp_;  // encodes (Marian: source.spm)
  std::unique_ptr<Marian> marian_;
  bool t5_ = false;            // spiece.model: T5Tokenizer's decoding
  bool t5_clean_up_ = true;    // its clean_up_tokenization_spaces (tokenizer_config.json)
};

}  // namespace halformer
