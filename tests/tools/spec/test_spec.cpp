// Tests for the spec parser (tools/spec). Needs HALFORMER_SOURCE_DIR = the repository root.
//
// Corpus tests: every tests/tools/spec/broken/*.yaml and tests/tools/spec/good/*.yaml
// starts with comment lines stating what must happen:
//   # expect: <substring>              parsing fails and some diagnostic's str() contains it
//   # expect-unsupported: <substring>  parsing succeeds and some check_supported() diagnostic contains it
// A good file without expect-unsupported lines must be fully supported.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "spec.h"

namespace fs = std::filesystem;
using namespace halformer;

namespace {

std::string source_dir() {
  const char* dir = std::getenv("HALFORMER_SOURCE_DIR");
  return dir ? dir : "";
}

std::vector<std::string> corpus(const std::string& sub) {
  std::vector<std::string> files;
  const fs::path dir = fs::path(source_dir()) / "tests" / "tools" / "spec" / sub;
  std::error_code ec;
  if (source_dir().empty() || !fs::is_directory(dir, ec)) return files;
  for (const auto& e : fs::directory_iterator(dir))
    if (e.path().extension() == ".yaml") files.push_back(e.path().string());
  std::sort(files.begin(), files.end());
  return files;
}

struct Expectations {
  std::vector<std::string> errors, unsupported;
};

// The leading "# expect..." comment lines of a corpus file.
Expectations read_expectations(const std::string& path) {
  Expectations ex;
  std::ifstream in(path, std::ios::binary);
  std::string line;
  while (std::getline(in, line) && line.rfind("#", 0) == 0) {
    if (line.rfind("# expect: ", 0) == 0) ex.errors.push_back(line.substr(10));
    if (line.rfind("# expect-unsupported: ", 0) == 0) ex.unsupported.push_back(line.substr(22));
  }
  return ex;
}

std::string all(const std::vector<Diagnostic>& diags) {
  std::string s;
  for (const auto& d : diags) s += "  " + d.str() + "\n";
  return s.empty() ? "  (none)\n" : s;
}

void expect_contains(const std::vector<Diagnostic>& diags, const std::string& wanted) {
  bool found = false;
  for (const auto& d : diags) found = found || d.str().find(wanted) != std::string::npos;
  EXPECT_TRUE(found) << "no diagnostic contains: " << wanted << "\ndiagnostics:\n" << all(diags);
}

// A valid spec to start variations from.
const char* kMinimal =
    "name: t\n"
    "architecture: encoder_decoder\n"
    "sizes: {d_model: 32, heads: 4, d_ff: 64, encoder_layers: 1, decoder_layers: 1, "
    "src_vocab: 100, tgt_vocab: 100, max_len: 16}\n";

}  // namespace

// ------------------------------------------------------------------ corpus
TEST(Corpus, SourceDirIsSet) {
  ASSERT_FALSE(source_dir().empty()) << "set HALFORMER_SOURCE_DIR to the repository root (ctest does this)";
  ASSERT_TRUE(fs::is_directory(fs::path(source_dir()) / "tests" / "tools" / "spec" / "broken"))
      << "HALFORMER_SOURCE_DIR=" << source_dir() << " has no tests/tools/spec/broken";
}

// The corpus is walked inside one test per directory (not a parameterized test): ctest's
// gtest_discover_tests lists tests without HALFORMER_SOURCE_DIR set, so a file list built
// at start-up would be empty there. Each failure names its file.
TEST(Corpus, BrokenFilesFailWithExpectedDiagnostics) {
  const std::vector<std::string> files = corpus("broken");
  EXPECT_GE(files.size(), 25u) << "HALFORMER_SOURCE_DIR=" << source_dir();
  for (const std::string& path : files) {
    SCOPED_TRACE(path);
    const Expectations ex = read_expectations(path);
    EXPECT_FALSE(ex.errors.empty() && ex.unsupported.empty())
        << "first line must be '# expect: <text>' or '# expect-unsupported: <text>'";
    const ParseResult r = parse_spec_file(path);
    if (!ex.errors.empty()) {
      EXPECT_FALSE(r.ok()) << "parsed without errors";
      EXPECT_FALSE(r.spec.has_value());
      for (const auto& e : ex.errors) expect_contains(r.diagnostics, e);
    }
    if (!ex.unsupported.empty()) {
      if (!r.ok()) {
        ADD_FAILURE() << "diagnostics:\n" << all(r.diagnostics);
        continue;
      }
      const auto unsupported = check_supported(*r.spec);
      for (const auto& e : ex.unsupported) expect_contains(unsupported, e);
      for (const auto& d : unsupported) EXPECT_NE(d.message.find("not supported yet"), std::string::npos) << d.str();
    }
  }
}

TEST(Corpus, GoodFilesParseAndSupportIsAsExpected) {
  const std::vector<std::string> files = corpus("good");
  EXPECT_GE(files.size(), 3u) << "HALFORMER_SOURCE_DIR=" << source_dir();
  for (const std::string& path : files) {
    SCOPED_TRACE(path);
    const Expectations ex = read_expectations(path);
    const ParseResult r = parse_spec_file(path);
    if (!r.ok()) {
      ADD_FAILURE() << "diagnostics:\n" << all(r.diagnostics);
      continue;
    }
    const auto unsupported = check_supported(*r.spec);
    if (ex.unsupported.empty()) {
      EXPECT_TRUE(unsupported.empty()) << all(unsupported);
    }
    for (const auto& e : ex.unsupported) expect_contains(unsupported, e);
  }
}

// ------------------------------------------------------------------ the canonical model
TEST(TransformerBase, ParsesWithPaperValues) {
  ASSERT_FALSE(source_dir().empty()) << "set HALFORMER_SOURCE_DIR to the repository root";
  const std::string path = source_dir() + "/models/transformer-base.yaml";
  const ParseResult r = parse_spec_file(path);
  ASSERT_TRUE(r.ok()) << all(r.diagnostics);
  const Spec& s = *r.spec;
  EXPECT_EQ(s.file, path);
  EXPECT_EQ(s.name, "transformer-base");
  EXPECT_EQ(s.architecture, Architecture::EncoderDecoder);
  EXPECT_EQ(s.d_model, 512);
  EXPECT_EQ(s.heads, 8);
  EXPECT_EQ(s.d_ff, 2048);
  EXPECT_EQ(s.encoder_layers, 6);
  EXPECT_EQ(s.decoder_layers, 6);
  EXPECT_EQ(s.src_vocab, 32000);
  EXPECT_EQ(s.tgt_vocab, 32000);
  EXPECT_EQ(s.max_len, 512);
  EXPECT_EQ(s.norm_placement, NormPlacement::Post);
  EXPECT_EQ(s.norm_kind, NormKind::Standard);
  EXPECT_DOUBLE_EQ(s.norm_eps, 1e-5);
  EXPECT_FALSE(s.final_norm);
  EXPECT_EQ(s.activation, Activation::Relu);
  EXPECT_DOUBLE_EQ(s.dropout, 0.1);
  EXPECT_EQ(s.positions, Positions::Sinusoidal);
  EXPECT_TRUE(s.scale_embedding);
  EXPECT_TRUE(s.causal);
  EXPECT_TRUE(s.padding_mask);
  EXPECT_EQ(s.head, HeadKind::LogSoftmax);
  EXPECT_EQ(s.pad_id, 0);
  EXPECT_EQ(s.bos_id, 1);
  EXPECT_EQ(s.eos_id, 2);
  EXPECT_EQ(s.decoding, DecodeStrategy::Greedy);
  EXPECT_EQ(s.max_new_tokens, 64);
  EXPECT_EQ(s.preset, WeightPreset::TorchTransformer);
  EXPECT_EQ(s.precision, Precision::Fp32);
  EXPECT_FALSE(s.int16_activations);
  EXPECT_EQ(s.cache_precision(), Precision::Fp32);
  EXPECT_EQ(s.targets, std::vector<Target>{Target::Host});
  EXPECT_TRUE(check_supported(s).empty()) << all(check_supported(s));
  ASSERT_TRUE(s.locations.count("sizes.d_model"));
  EXPECT_EQ(s.locations.at("sizes.d_model"), std::make_pair(8, 12));
}

// ------------------------------------------------------------------ files that are not specs
TEST(Files, MissingFile) {
  const ParseResult r = parse_spec_file("/nonexistent/dir/model.yaml");
  ASSERT_EQ(r.diagnostics.size(), 1u);
  EXPECT_FALSE(r.ok());
  EXPECT_EQ(r.diagnostics[0].str(), "/nonexistent/dir/model.yaml: error: cannot open spec file: no such file");
}

TEST(Files, Directory) {
  const std::string dir = fs::temp_directory_path().string();
  const ParseResult r = parse_spec_file(dir);
  ASSERT_EQ(r.diagnostics.size(), 1u);
  EXPECT_EQ(r.diagnostics[0].str(), dir + ": error: cannot read spec file: it is a directory");
}

TEST(Files, ZeroBytes) {
  const fs::path path = fs::temp_directory_path() / "halformer_test_spec_empty.yaml";
  std::ofstream(path).close();
  const ParseResult r = parse_spec_file(path.string());
  fs::remove(path);
  ASSERT_EQ(r.diagnostics.size(), 1u);
  EXPECT_NE(r.diagnostics[0].str().find(": error: empty spec"), std::string::npos) << r.diagnostics[0].str();
  EXPECT_EQ(r.diagnostics[0].line, 0);
}

TEST(Files, DeepNestingDoesNotThrow) {
  const std::string text = "name: " + std::string(100000, '[');
  ParseResult r;
  EXPECT_NO_THROW(r = parse_spec_string(text, "deep.yaml"));
  EXPECT_FALSE(r.ok());
  EXPECT_FALSE(r.diagnostics.empty());
}

// yaml-cpp 0.7's LoadAll never returns on these (jbeder/yaml-cpp#1040); the parser must.
TEST(Files, StrayCommaIsASyntaxErrorNotAHang) {
  for (const char* text : {",", ",\n", ", a\n", "- a\n,\n", "# c\n,\nname: x\n"}) {
    const ParseResult r = parse_spec_string(text, "c.yaml");
    ASSERT_EQ(r.diagnostics.size(), 1u) << text;
    EXPECT_NE(r.diagnostics[0].str().find(": error: YAML syntax error: unexpected ','"), std::string::npos)
        << r.diagnostics[0].str();
  }
}

TEST(Files, HugeFileRejected) {
  const ParseResult r = parse_spec_string(std::string(2 << 20, '#'), "big.yaml");
  ASSERT_EQ(r.diagnostics.size(), 1u);
  EXPECT_NE(r.diagnostics[0].message.find("small YAML text file"), std::string::npos);
}

// ------------------------------------------------------------------ reporting
TEST(Reporting, SeveralProblemsReportedTogetherInFileOrder) {
  const std::string text =
      "name: t\n"
      "architecture: encoder_decoder\n"
      "sizes:\n"
      "  d_model: 30\n"  // 30 % 4 != 0
      "  heads: 4\n"
      "  d_ff: many\n"  // wrong type
      "  encoder_layers: 1\n"
      "  decoder_layers: 1\n"
      "  src_vocab: 100\n"
      "  tgt_vocab: 100\n"
      "  max_len: 16\n"
      "layer:\n"
      "  activaton: gelu\n"   // unknown key
      "  final_norm: nope\n"  // wrong type
      "precision: fp64\n";    // bad enum
  const ParseResult r = parse_spec_string(text, "m.yaml");
  EXPECT_FALSE(r.ok());
  ASSERT_GE(r.diagnostics.size(), 3u) << all(r.diagnostics);
  ASSERT_EQ(r.diagnostics.size(), 5u) << all(r.diagnostics);
  EXPECT_EQ(r.diagnostics[0].str(),
            "m.yaml:4:12: error: sizes.d_model: d_model 30 is not divisible by heads 4 (remainder 2); "
            "each head gets d_model / heads features");
  EXPECT_EQ(r.diagnostics[1].str(), "m.yaml:6:9: error: sizes.d_ff: expected an integer, found 'many'");
  EXPECT_EQ(r.diagnostics[2].str(),
            "m.yaml:13:3: error: layer.activaton: unknown key 'activaton' (did you mean 'activation'?)");
  EXPECT_EQ(r.diagnostics[3].str(), "m.yaml:14:15: error: layer.final_norm: expected true/false, found 'nope'");
  EXPECT_EQ(r.diagnostics[4].str(),
            "m.yaml:15:12: error: precision: unknown precision 'fp64'; allowed: fp32, bf16, fp16, int8, q8_0, int4 "
            "(did you mean 'fp32'?)");
}

TEST(Reporting, DiagnosticFormat) {
  EXPECT_EQ((Diagnostic{"a.yaml", 3, 7, "sizes.d_model", "bad"}).str(), "a.yaml:3:7: error: sizes.d_model: bad");
  EXPECT_EQ((Diagnostic{"a.yaml", 0, 0, "sizes", "bad"}).str(), "a.yaml: error: sizes: bad");
  EXPECT_EQ((Diagnostic{"a.yaml", 2, 1, "", "bad"}).str(), "a.yaml:2:1: error: bad");
  EXPECT_EQ((Diagnostic{"a.yaml", 0, 0, "", "bad"}).str(), "a.yaml: error: bad");
}

TEST(Reporting, SyntaxErrorPositionIsOneBased) {
  const ParseResult r = parse_spec_string("name: t\nsizes: [1, 2\n", "s.yaml");
  ASSERT_EQ(r.diagnostics.size(), 1u);
  EXPECT_EQ(r.diagnostics[0].str(), "s.yaml:3:1: error: YAML syntax error: end of sequence flow not found");
}

TEST(Reporting, OmittedValueIsReportedAtItsKey) {
  const ParseResult r =
      parse_spec_string(std::string(kMinimal) + "layer:\n  activation:\n  final_norm: true\n", "o.yaml");
  ASSERT_EQ(r.diagnostics.size(), 1u) << all(r.diagnostics);
  EXPECT_EQ(
      r.diagnostics[0].str(),
      "o.yaml:5:3: error: layer.activation: expected an activation, found nothing; allowed: relu, gelu, gelu_tanh, silu, relu2, swiglu, geglu, geglu_tanh");
}

// ------------------------------------------------------------------ values and defaults
TEST(Values, DefaultsFromTheStruct) {
  const ParseResult r = parse_spec_string(kMinimal, "d.yaml");
  ASSERT_TRUE(r.ok()) << all(r.diagnostics);
  const Spec& s = *r.spec;
  const Spec defaults;
  EXPECT_EQ(s.norm_placement, defaults.norm_placement);
  EXPECT_EQ(s.norm_kind, defaults.norm_kind);
  EXPECT_DOUBLE_EQ(s.norm_eps, defaults.norm_eps);
  EXPECT_EQ(s.activation, defaults.activation);
  EXPECT_EQ(s.positions, defaults.positions);
  EXPECT_EQ(s.scale_embedding, defaults.scale_embedding);
  EXPECT_EQ(s.head, defaults.head);
  EXPECT_EQ(s.cuda_capability, defaults.cuda_capability);
  EXPECT_EQ(s.targets, defaults.targets);
  EXPECT_EQ(s.max_new_tokens, 16) << "the default max_new_tokens (64) is capped at max_len";
  EXPECT_FALSE(s.locations.count("layer"));
  EXPECT_TRUE(s.locations.count("sizes.max_len"));
}

TEST(Values, ScheduleWeightsMapAndTuning) {
  const ParseResult r = parse_spec_string(std::string(kMinimal) +
                                              "weights:\n  preset: explicit\n  map:\n    encoder.0.q: enc.q.weight\n"
                                              "schedule:\n  linear.tile_m: 8\n  attention.vectorize: true\n"
                                              "tuning: {db: t.json, seq_lens: [16], batch_sizes: [1, 8]}\n"
                                              "targets: [host, cuda, opencl]\ncuda_capability: 86\n",
                                          "w.yaml");
  ASSERT_TRUE(r.ok()) << all(r.diagnostics);
  EXPECT_EQ(r.spec->preset, WeightPreset::Explicit);
  EXPECT_EQ(r.spec->weight_map.at("encoder.0.q"), "enc.q.weight");
  EXPECT_EQ(r.spec->schedule.at("linear.tile_m"), "8");
  EXPECT_EQ(r.spec->schedule.at("attention.vectorize"), "true");
  EXPECT_EQ(r.spec->targets, (std::vector<Target>{Target::Host, Target::Cuda, Target::OpenCL}));
  EXPECT_EQ(r.spec->cuda_capability, 86);
}

// Every enum value is accepted under its to_string() spelling and parses back to itself.
template <class E>
void round_trip(const std::string& section, const std::string& key, std::vector<E> values, E Spec::*field,
                const std::string& extra = "") {
  for (E v : values) {
    const std::string text = std::string(kMinimal) + section + ":\n  " + key + ": " + to_string(v) + "\n" + extra;
    const ParseResult r = parse_spec_string(text, "e.yaml");
    ASSERT_TRUE(r.ok()) << to_string(v) << "\n" << all(r.diagnostics);
    EXPECT_EQ((*r.spec).*field, v) << to_string(v);
  }
}

TEST(Values, EnumsRoundTripThroughToString) {
  round_trip<NormPlacement>("layer", "norm_placement", {NormPlacement::Post, NormPlacement::Pre},
                            &Spec::norm_placement);
  round_trip<NormKind>("layer", "norm_kind", {NormKind::Standard, NormKind::Annotated}, &Spec::norm_kind);
  round_trip<Activation>("layer", "activation", {Activation::Relu, Activation::Gelu, Activation::GeluTanh, Activation::Silu, Activation::Relu2},
                         &Spec::activation);
  round_trip<Positions>("embedding", "positions", {Positions::Sinusoidal, Positions::Learned, Positions::None, Positions::SinusoidalSplit},
                        &Spec::positions);
  round_trip<HeadKind>("head", "kind", {HeadKind::LogSoftmax, HeadKind::Softmax, HeadKind::Logits, HeadKind::Hidden},
                       &Spec::head);
  round_trip<DecodeStrategy>("decoding", "strategy", {DecodeStrategy::Greedy, DecodeStrategy::Beam}, &Spec::decoding);
  round_trip<WeightPreset>(
      "weights", "preset",
      {WeightPreset::TorchTransformer, WeightPreset::AnnotatedTransformer, WeightPreset::HuggingfaceBert,
       WeightPreset::HuggingfaceRoberta, WeightPreset::HuggingfaceDistilbert, WeightPreset::HuggingfaceGpt2,
       WeightPreset::HuggingfaceBart},
      &Spec::preset);
  EXPECT_STREQ(to_string(Architecture::EncoderDecoder), "encoder_decoder");
  EXPECT_STREQ(to_string(Architecture::Encoder), "encoder");
  EXPECT_STREQ(to_string(Architecture::Decoder), "decoder");
  EXPECT_STREQ(to_string(HeadKind::Classifier), "classifier");
  EXPECT_STREQ(to_string(HeadKind::Embedding), "embedding");
  EXPECT_STREQ(to_string(Pooling::Cls), "cls");
  EXPECT_STREQ(to_string(Pooling::Mean), "mean");
  EXPECT_STREQ(to_string(WeightPreset::Explicit), "explicit");
  EXPECT_STREQ(to_string(Precision::Fp32), "fp32");
  EXPECT_STREQ(to_string(Precision::Bf16), "bf16");
  EXPECT_STREQ(to_string(Target::Host), "host");
  EXPECT_STREQ(to_string(Target::Cuda), "cuda");
  EXPECT_STREQ(to_string(Target::OpenCL), "opencl");
}

// ------------------------------------------------------------------ check_supported
TEST(Supported, EverythingListedAsSupportedIsAccepted) {
  const std::string text = std::string(kMinimal) +
                           "layer: {norm_placement: pre, norm_kind: annotated, final_norm: true, activation: gelu}\n"
                           "embedding: {positions: none, scale: false}\n"
                           "attention: {causal: false, padding_mask: false}\n"
                           "head: {kind: softmax}\n"
                           "precision: int8\n"
                           "precision_overrides: {int16_activations: true, kv_cache: fp32}\n";
  const ParseResult r = parse_spec_string(text, "s.yaml");
  ASSERT_TRUE(r.ok()) << all(r.diagnostics);
  EXPECT_TRUE(r.spec->int16_activations);
  EXPECT_EQ(r.spec->cache_precision(), Precision::Fp32);
  EXPECT_TRUE(check_supported(*r.spec).empty()) << all(check_supported(*r.spec));
}

// The attention caches follow the precision (bf16 in reduced-precision builds) unless
// precision_overrides.kv_cache says otherwise.
TEST(Supported, KvCacheFollowsPrecision) {
  Spec s;
  for (Precision p : {Precision::Bf16, Precision::Int8}) {
    s.precision = p;
    EXPECT_EQ(s.cache_precision(), Precision::Bf16);
  }
  s.kv_cache_precision = Precision::Fp32;
  EXPECT_EQ(s.cache_precision(), Precision::Fp32);
  s.precision = Precision::Fp32;
  s.kv_cache_precision = Precision::Bf16;
  EXPECT_EQ(s.cache_precision(), Precision::Bf16);
  EXPECT_TRUE(check_supported(s).empty()) << all(check_supported(s));
  s.kv_cache_precision = Precision::Fp16;  // llama.cpp's cache type: 16 bits like bf16
  EXPECT_TRUE(s.half_cache());
  EXPECT_TRUE(check_supported(s).empty()) << all(check_supported(s));
  s.kv_cache_precision = Precision::Int8;  // int8 rows with a scale each (halformer/kv_int8.h)
  EXPECT_TRUE(s.int8_cache());
  EXPECT_TRUE(s.half_cache());  // the new rows bf16 before they are stored
  EXPECT_TRUE(check_supported(s).empty()) << all(check_supported(s));
  s.kv_cache_precision = Precision::Q8_0;
  EXPECT_FALSE(check_supported(s).empty());
}

TEST(Supported, DefaultsWithoutLocationHaveNoLine) {
  Spec s;
  s.file = "x.yaml";
  s.precision = Precision::Int8;
  s.targets = {Target::Host, Target::Cuda};
  const auto d = check_supported(s);
  ASSERT_EQ(d.size(), 1u);
  EXPECT_EQ(d[0].str(), "x.yaml: error: targets: precision 'int8' with target 'cuda' (int8 kernels are CPU only) is not "
                        "supported yet (planned; see docs/spec.md)");
}
