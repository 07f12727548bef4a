// The C++ BERT tokenizer (runtime/tokenizer.cpp).
//   Unit.*           behaviour on a tiny vocabulary (no Python, no model)
//   VsHuggingFace.*  ids identical to the Hugging Face tokenizer of all-MiniLM-L6-v2 on
//                    every line of tests/models/minilm/corpus.txt and on a sweep of code points;
//                    the expected ids are made at test time by reference.py
//                    (HALFORMER_MINILM_REFERENCE = its output directory).
#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "halformer/error.h"
#include "halformer/tokenizer.h"

using halformer::BertTokenizer;
using Ids = std::vector<int32_t>;

namespace {

// [PAD]=0 [UNK]=1 [CLS]=2 [SEP]=3 [MASK]=4, then words and pieces.
BertTokenizer tiny() {
  return BertTokenizer::from_tokens({"[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "un", "##aff", "##able", "aff",
                                     "##a", "a", "b", "$", "elan", "中", "文", ",", "!", "hello", "x", "y", "##b",
                                     "⹂", "[", "]", "mask", "ab", "abcd", "σ", "##σ", "i"});
}

std::vector<std::string> words(const BertTokenizer& t, const std::string& s) { return t.basic_tokenize(s); }
using W = std::vector<std::string>;

}  // namespace

TEST(Unit, GreedyLongestMatchWithContinuationPieces) {
  auto t = tiny();
  EXPECT_EQ(t.tokenize("unaffable"), W({"un", "##aff", "##able"}));
  EXPECT_EQ(t.tokenize("affable"), W({"aff", "##able"}));
  EXPECT_EQ(t.tokenize("aaa"), W({"a", "##a", "##a"}));
  // One piece that cannot be matched makes the whole word [UNK].
  EXPECT_EQ(t.tokenize("unaffablez hello"), W({"[UNK]", "hello"}));
}

TEST(Unit, WordsLongerThan100CharactersAreUnknown) {
  auto t = tiny();
  EXPECT_EQ(t.tokenize(std::string(100, 'a')).size(), 100u);
  EXPECT_EQ(t.tokenize(std::string(101, 'a')), W({"[UNK]"}));
  // Characters, not bytes: 60 two-byte characters are one 60-character word.
  std::string sigmas;
  for (int i = 0; i < 60; ++i) sigmas += "Σ";
  EXPECT_EQ(t.tokenize(sigmas).size(), 60u);
}

TEST(Unit, CleaningAccentsCaseCjkPunctuation) {
  auto t = tiny();
  EXPECT_EQ(words(t, "  Élan\tHELLO\u00a0x "), W({"elan", "hello", "x"}));
  EXPECT_EQ(words(t, "E\xCC\x81LAN"), W({"elan"}));                       // decomposed accent
  EXPECT_EQ(words(t, "a\x01" "b\x7f" "c\u200bd\ufffde"), W({"abcde"}));  // control/format dropped
  EXPECT_EQ(words(t, "a\x0b" "b"), W({"ab"}));  // vertical tab is a control character first
  EXPECT_EQ(words(t, "中文x"), W({"中", "文", "x"}));
  EXPECT_EQ(words(t, "a$b,c!d\u00bfe"), W({"a", "$", "b", ",", "c", "!", "d", "\u00bf", "e"}));
  EXPECT_EQ(words(t, "\u03a3\u0391"), W({"\u03c3\u03b1"}));  // lower case, no final-sigma rule
  EXPECT_EQ(words(t, "\u0130"), W({"i"}));                    // İ: NFD, mark dropped, lower case
}

TEST(Unit, UnicodeTablesOfTheReference) {
  auto t = tiny();
  // U+2E42 (punctuation since Unicode 7) is split off; U+2E52 (Unicode 13) is a letter
  // for the reference tokenizer, whose tables are Unicode 8.0's.
  EXPECT_EQ(words(t, "a\u2e42b"), W({"a", "\u2e42", "b"}));
  EXPECT_EQ(words(t, "a\u2e52b"), W({"a\u2e52b"}));
  EXPECT_EQ(words(t, "a\u08e2b"), W({"a\u08e2b"}));  // a format character only since Unicode 9
  EXPECT_EQ(words(t, "a\u061cb"), W({"ab"}));        // a format character in Unicode 8
}

TEST(Unit, SpecialTokensInTheText) {
  auto t = tiny();
  EXPECT_EQ(t.encode("x[MASK]y", 512), Ids({2, 19, 4, 20, 3}));
  EXPECT_EQ(t.encode("[CLS][SEP]", 512), Ids({2, 2, 3, 3}));
  // Only the exact, case-sensitive spelling is special.
  EXPECT_EQ(t.tokenize("[mask]"), W({"[", "mask", "]"}));
}

TEST(Unit, InvalidUtf8IsDropped) {
  auto t = tiny();
  EXPECT_EQ(words(t, "ab\xff" "cd"), W({"abcd"}));
  EXPECT_EQ(words(t, "ab\xe2\x82" "cd\xc3"), W({"abcd"}));  // truncated sequences
  EXPECT_EQ(words(t, "\xed\xa0\x80x"), W({"x"}));           // an encoded surrogate
}

TEST(Unit, ClsSepAndTruncation) {
  auto t = tiny();
  EXPECT_EQ(t.encode("", 512), Ids({2, 3}));
  EXPECT_EQ(t.encode("   \t ", 512), Ids({2, 3}));
  EXPECT_EQ(t.encode("a b x y", 512), Ids({2, 10, 11, 19, 20, 3}));
  EXPECT_EQ(t.encode("a b x y", 4), Ids({2, 10, 11, 3}));
  EXPECT_EQ(t.encode("unaffable", 3), Ids({2, 5, 3}));  // cuts inside a word, like Hugging Face
  EXPECT_EQ(t.encode("a b", 2), Ids({2, 3}));
  EXPECT_THROW(t.encode("a", 1), halformer::Error);
}

TEST(Unit, BatchPadding) {
  auto t = tiny();
  auto b = t.pad(t.encode_batch({"a b x", "y"}, 512));
  EXPECT_EQ(b.width, 5u);
  EXPECT_EQ(b.ids, Ids({2, 10, 11, 19, 3, 2, 20, 3, 0, 0}));
  EXPECT_EQ(b.lengths, Ids({5, 3}));
}

TEST(Unit, VocabularyErrors) {
  EXPECT_THROW(BertTokenizer::from_vocab_file("/nonexistent/vocab.txt"), halformer::Error);
  EXPECT_THROW(BertTokenizer::from_tokens({"[PAD]", "[UNK]", "[SEP]", "a"}), halformer::Error);  // no [CLS]
  try {
    BertTokenizer::from_tokens({"[CLS]", "[SEP]"});
    FAIL();
  } catch (const halformer::Error& e) {
    EXPECT_NE(std::string(e.what()).find("[UNK]"), std::string::npos);
  }
}

// ---- against the Hugging Face tokenizer (expected ids made by reference.py)
namespace {

std::string reference_dir() {
  const char* d = std::getenv("HALFORMER_MINILM_REFERENCE");
  return d ? d : "";
}

std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error(path + ": cannot open");
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

std::vector<std::string> lines_of(const std::string& path) {
  std::string all = slurp(path);
  std::vector<std::string> out;
  for (size_t pos = 0; pos < all.size();) {
    size_t end = std::min(all.find('\n', pos), all.size());
    out.push_back(all.substr(pos, end - pos));
    pos = end + 1;
  }
  return out;
}

std::vector<Ids> ids_of(const std::string& path) {
  std::vector<Ids> out;
  for (const auto& l : lines_of(path)) {
    Ids ids;
    std::istringstream in(l);
    for (int32_t v; in >> v;) ids.push_back(v);
    out.push_back(ids);
  }
  return out;
}

BertTokenizer minilm() {
  std::string dir = lines_of(reference_dir() + "/model_dir.txt").at(0);
  return BertTokenizer::from_vocab_file(dir + "/vocab.txt");
}

std::string show(const BertTokenizer& t, const Ids& ids) {
  std::string s;
  for (int32_t i : ids) s += (s.empty() ? "" : " ") + t.token(i);
  return s;
}

// Returns the number of texts whose ids agree; prints the first disagreements.
size_t agree(const BertTokenizer& t, const std::vector<std::string>& texts, const std::vector<Ids>& want,
             int max_length, const std::string& what) {
  EXPECT_EQ(texts.size(), want.size()) << what;
  size_t same = 0, shown = 0;
  for (size_t i = 0; i < std::min(texts.size(), want.size()); ++i) {
    Ids got = t.encode(texts[i], max_length);
    if (got == want[i]) {
      ++same;
    } else if (shown++ < 10) {
      ADD_FAILURE() << what << " line " << i + 1 << ": " << texts[i].substr(0, 80) << "\n  halformer:    "
                    << show(t, got).substr(0, 300) << "\n  Hugging Face: " << show(t, want[i]).substr(0, 300);
    }
  }
  std::printf("%s, max_length %d: ids identical on %zu/%zu texts\n", what.c_str(), max_length, same, texts.size());
  return same;
}

}  // namespace

TEST(VsHuggingFace, CorpusAtEveryLength) {
  ASSERT_FALSE(reference_dir().empty()) << "HALFORMER_MINILM_REFERENCE is not set (run through ctest)";
  const char* corpus = std::getenv("HALFORMER_MINILM_CORPUS");
  ASSERT_TRUE(corpus);
  auto t = minilm();
  auto texts = lines_of(corpus);
  ASSERT_GE(texts.size(), 200u);
  for (int L : {512, 256, 16}) {
    auto want = ids_of(reference_dir() + "/ids_" + std::to_string(L) + ".txt");
    EXPECT_EQ(agree(t, texts, want, L, "corpus"), texts.size());
  }
}

TEST(VsHuggingFace, CodePointSweep) {
  ASSERT_FALSE(reference_dir().empty()) << "HALFORMER_MINILM_REFERENCE is not set (run through ctest)";
  auto t = minilm();
  auto texts = lines_of(reference_dir() + "/sweep.txt");
  auto want = ids_of(reference_dir() + "/ids_sweep.txt");
  ASSERT_GT(texts.size(), 10000u);
  EXPECT_EQ(agree(t, texts, want, 512, "code point sweep"), texts.size());
}
