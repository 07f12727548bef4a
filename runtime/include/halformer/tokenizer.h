// BERT tokenizer: text -> WordPiece token ids, as the Hugging Face tokenizer of an
// uncased BERT model does it (tokenizers' BertNormalizer + BertPreTokenizer + WordPiece
// + the [CLS] ... [SEP] template; the same ids as BertTokenizerFast / tokenizer.json).
//
//   auto tok = halformer::BertTokenizer::from_vocab_file("vocab.txt");
//   std::vector<int32_t> ids = tok.encode("Hello, world!", /*max_length=*/256);
//   // 101 7592 1010 2088 999 102
//
// Steps, in order (each on Unicode code points; the input is UTF-8):
//  0. the special tokens of the vocabulary ([PAD] [UNK] [CLS] [SEP] [MASK]) written
//     literally in the text are kept whole, as those ids; the text between them goes on;
//  1. clean: NUL, U+FFFD and control/format/private-use characters (Cc, Cf, Co; not
//     tab, LF, CR) are dropped, whitespace (White_Space property, tab, LF, CR) becomes ' ';
//  2. CJK ideographs get a space on each side (each becomes its own word);
//  3. lower-casing models: NFD, then non-spacing marks (Mn) dropped (accents), then
//     lower case;
//  4. split on whitespace; punctuation (Unicode P* and every ASCII non-alphanumeric
//     symbol) becomes a word of its own;
//  5. WordPiece: greedy longest match from the start of each word, later pieces looked
//     up with the "##" prefix; a word that cannot be covered, or is longer than 100
//     characters, is one [UNK];
//  6. [CLS] + pieces + [SEP], the pieces truncated so that the whole fits max_length.
// Invalid UTF-8 bytes read as U+FFFD (and so are dropped by step 1). Unicode data
// (categories, NFD, lower case) comes from utf8proc; where the Hugging Face tokenizer's
// own category tables are older than utf8proc's (they are Unicode 8.0), characters
// assigned after Unicode 8.0 are given its behaviour (see tokenizer.cpp).
#pragma once

#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

namespace halformer {

struct BertTokenizerOptions {
  bool lower_case = true;      // uncased models (all-MiniLM, bert-base-uncased)
  bool strip_accents = true;   // Hugging Face: defaults to lower_case
  bool split_cjk = true;       // tokenize_chinese_chars
  int max_chars_per_word = 100;
};

class BertTokenizer {
 public:
  using Options = BertTokenizerOptions;

  // vocab.txt: one token per line, the id is the 0-based line number. Throws
  // halformer::Error when the file cannot be read or lacks [CLS], [SEP] or [UNK].
  static BertTokenizer from_vocab_file(const std::string& path, const Options& options);
  static BertTokenizer from_vocab_file(const std::string& path) { return from_vocab_file(path, Options()); }
  static BertTokenizer from_tokens(const std::vector<std::string>& tokens, const Options& options = Options());

  // [CLS] text's pieces [SEP], at most max_length ids (max_length >= 2; longer texts
  // lose their last pieces, as Hugging Face's truncation=True does).
  std::vector<int32_t> encode(const std::string& text, int max_length) const;
  std::vector<std::vector<int32_t>> encode_batch(const std::vector<std::string>& texts, int max_length) const;
  // The ids padded to the batch's longest ([B][T] row-major, pad id 0 unless the vocab
  // says otherwise) and each sequence's length (= its attention mask's sum).
  struct Batch {
    std::vector<int32_t> ids;
    std::vector<int32_t> lengths;
    size_t width = 0;
  };
  Batch pad(const std::vector<std::vector<int32_t>>& seqs) const;

  // The WordPiece pieces of a text, without [CLS]/[SEP] and without truncation.
  std::vector<std::string> tokenize(const std::string& text) const;
  // Steps 1-4 only: the words WordPiece sees.
  std::vector<std::string> basic_tokenize(const std::string& text) const;

  int32_t id(const std::string& token) const;  // -1 when not in the vocabulary
  const std::string& token(int32_t id) const;
  size_t vocab_size() const { return tokens_.size(); }
  int32_t cls_id() const { return cls_; }
  int32_t sep_id() const { return sep_; }
  int32_t unk_id() const { return unk_; }
  int32_t pad_id() const { return pad_; }

 private:
  BertTokenizer() = default;
  void pieces(const std::string& text, std::vector<int32_t>& out) const;
  void wordpiece(const std::string& word, size_t chars, std::vector<int32_t>& out) const;
  std::vector<std::string> words(const std::string& segment) const;

  Options options_;
  std::vector<std::string> tokens_;
  std::unordered_map<std::string, int32_t> vocab_;
  std::vector<std::pair<std::string, int32_t>> specials_;  // matched literally in the text
  int32_t cls_ = -1, sep_ = -1, unk_ = -1, pad_ = 0;
};

}  // namespace halformer
