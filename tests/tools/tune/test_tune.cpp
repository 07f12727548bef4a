// The tuning database and how builds use it (tools/tune/tuning_db.h, docs/tuning.md).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#include <unistd.h>

#include "plan.h"
#include "spec.h"
#include "tuning_db.h"

namespace fs = std::filesystem;
using namespace halformer;
using namespace halformer::tune;

namespace {

std::string source_dir() {
  const char* s = std::getenv("HALFORMER_SOURCE_DIR");
  return s ? s : ".";
}

fs::path temp_dir(const std::string& name) {
  fs::path d = fs::temp_directory_path() / ("halformer_test_tune_" + name + "_" + std::to_string(::getpid()));
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

void write_file(const fs::path& p, const std::string& text) { std::ofstream(p, std::ios::binary) << text; }

std::string read_file(const fs::path& p) {
  std::ifstream in(p);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

Entry entry(const std::string& candidate, Params knobs, Shape shape, double speedup, const std::string& status = "ok",
            const std::string& fp = "test machine") {
  Entry e;
  e.generator = "linear";
  e.params = {{"in_features", "64"}, {"out_features", "192"}, {"activation", "none"}};
  e.target = "host";
  e.fingerprint = fp;
  e.shape = shape;
  e.candidate = candidate;
  e.knobs = std::move(knobs);
  e.status = status;
  if (status == "ok") {
    e.baseline_ms = 1.0;
    e.median_ms = 1.0 / speedup;
    e.speedup = speedup;
    e.samples = 5;
  } else {
    e.note = "test";
  }
  return e;
}

const Shape kEnc{"encode", 1, 16}, kDec{"decode", 1, 16};
const Params kKnobsA{{"vec", "8"}, {"tile_n", "1"}, {"tile_m", "4"}, {"parallel", "false"}};
const Params kKnobsB{{"vec", "32"}, {"tile_n", "3"}, {"tile_m", "6"}, {"parallel", "true"}};

Spec reverse_tiny() {
  ParseResult r = parse_spec_file(source_dir() + "/models/reverse-tiny.yaml");
  EXPECT_TRUE(r.ok());
  return *r.spec;
}

const PlannedKernel* kernel(const Plan& p, const std::string& generator, const std::string& param_value) {
  for (const auto& k : p.kernels)
    if (k.generator == generator)
      for (const auto& [n, v] : k.params)
        if (v == param_value) return &k;
  return nullptr;
}

std::string param(const PlannedKernel& k, const std::string& name) {
  for (const auto& [n, v] : k.params)
    if (n == name) return v;
  return "";
}

}  // namespace

// ---------------------------------------------------------------- format

TEST(TuneDb, RoundTrip) {
  Db db;
  db.upsert(entry("hand", {}, kEnc, 1.0));
  db.upsert(entry("knobs", kKnobsA, kEnc, 1.5));
  db.upsert(entry("adams2019", {{"autoscheduler", "Adams2019"}, {"autoscheduler.parallelism", "2"}}, kDec, 0, "wrong"));
  Db back = parse_db(format_db(db), "x.yaml");
  ASSERT_EQ(back.entries.size(), 3u);
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(back.entries[i].key(), db.entries[i].key());
    EXPECT_EQ(back.entries[i].status, db.entries[i].status);
    EXPECT_NEAR(back.entries[i].ratio(), db.entries[i].status == "ok" ? db.entries[i].ratio() : 0, 1e-4);
    EXPECT_GT(back.entries[i].line, 0);
  }
  EXPECT_EQ(back.entries[1].knobs, kKnobsA);
}

TEST(TuneDb, UpsertReplacesSameKey) {
  Db db;
  db.upsert(entry("knobs", kKnobsA, kEnc, 1.5));
  db.upsert(entry("knobs", kKnobsA, kEnc, 1.2));
  db.upsert(entry("knobs", kKnobsA, kDec, 1.2));
  ASSERT_EQ(db.entries.size(), 2u);
  EXPECT_NEAR(db.entries[0].ratio(), 1.2, 1e-9);
}

TEST(TuneDb, YamlSyntaxErrorNamesFileLineColumn) {
  try {
    parse_db("version: 1\nentries:\n  - generator: [oops\n", "bad.tune.yaml");
    FAIL() << "no error";
  } catch (const DbError& e) {
    EXPECT_NE(std::string(e.what()).find("bad.tune.yaml:"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find(": error: not valid YAML"), std::string::npos) << e.what();
  }
}

TEST(TuneDb, BadFieldNamesItsLine) {
  Db db;
  db.upsert(entry("knobs", kKnobsA, kEnc, 1.5));
  std::string text = format_db(db);
  const auto at = text.find("status: ok");
  ASSERT_NE(at, std::string::npos);
  text.replace(at, 10, "status: maybe");
  const int line = 1 + int(std::count(text.begin(), text.begin() + long(at), '\n'));
  try {
    parse_db(text, "db.yaml");
    FAIL() << "no error";
  } catch (const DbError& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("db.yaml:" + std::to_string(line) + ":"), std::string::npos) << m;
    EXPECT_NE(m.find("entries[0].status: expected ok, wrong or failed, found 'maybe'"), std::string::npos) << m;
  }
}

TEST(TuneDb, MissingKeyAndWrongTypes) {
  EXPECT_THROW(parse_db("version: 1\nentries:\n  - generator: linear\n", "d.yaml"), DbError);
  EXPECT_THROW(parse_db("- a\n- b\n", "d.yaml"), DbError);
  EXPECT_THROW(parse_db("version: 2\nentries: []\n", "d.yaml"), DbError);
  EXPECT_THROW(parse_db("version: 1\nentries: {a: 1}\n", "d.yaml"), DbError);
  try {
    parse_db("- a\n", "d.yaml");
  } catch (const DbError& e) {
    EXPECT_NE(std::string(e.what()).find("not a tuning database"), std::string::npos) << e.what();
  }
  EXPECT_TRUE(parse_db("", "d.yaml").entries.empty());
}

TEST(TuneDb, LoadMissingFileIsEmptyAndBinaryIsAnError) {
  fs::path d = temp_dir("load");
  EXPECT_TRUE(load_db((d / "none.yaml").string()).entries.empty());
  write_file(d / "bin.yaml", std::string("\0\1\2", 3));
  EXPECT_THROW(load_db((d / "bin.yaml").string()), DbError);
  EXPECT_THROW(load_db(d.string()), DbError);  // a directory
  fs::remove_all(d);
}

TEST(TuneDb, AtomicWriteMergesAndLeavesNoTemporaries) {
  fs::path d = temp_dir("write");
  const std::string path = (d / "t.yaml").string();
  Db a;
  a.path = path;
  a.upsert(entry("hand", {}, kEnc, 1.0));
  write_db_atomic(a, path);
  Db b = load_db(path);  // a second writer: starts from the file, adds its own
  b.upsert(entry("knobs", kKnobsB, kEnc, 1.3));
  write_db_atomic(b, path);
  Db c = load_db(path);
  EXPECT_EQ(c.entries.size(), 2u);
  int files = 0;
  for (const auto& f : fs::directory_iterator(d)) ++files, (void)f;
  EXPECT_EQ(files, 1);  // no leftover .tmp
  fs::remove_all(d);
}

// ---------------------------------------------------------------- choosing

TEST(TuneChoose, GeometricMeanNoSlowerShapeAndNoiseGuard) {
  Db db;
  for (const Shape& s : {kEnc, kDec}) db.upsert(entry("hand", {}, s, 1.0));
  // 2x faster encoding, 2.5x slower decoding: not a win overall.
  db.upsert(entry("knobs", kKnobsA, kEnc, 2.0));
  db.upsert(entry("knobs", kKnobsA, kDec, 0.4));
  // 3x faster encoding, a little slower decoding: still out (no shape may get slower).
  const Params kKnobsC{{"vec", "16"}, {"tile_n", "4"}, {"tile_m", "12"}, {"parallel", "true"}};
  db.upsert(entry("knobs", kKnobsC, kEnc, 3.0));
  db.upsert(entry("knobs", kKnobsC, kDec, 0.95));
  // Modest on both: the winner.
  db.upsert(entry("knobs", kKnobsB, kEnc, 1.5));
  db.upsert(entry("knobs", kKnobsB, kDec, 1.1));
  Choice c = choose(db, "linear", db.entries[0].params, "host", "test machine");
  ASSERT_TRUE(c.tuned) << c.reason;
  EXPECT_EQ(c.knobs, kKnobsB);
  EXPECT_NEAR(c.speedup, std::sqrt(1.5 * 1.1), 1e-6);
  EXPECT_EQ(c.shapes, 2);

  Db noise;
  noise.upsert(entry("hand", {}, kEnc, 1.0));
  noise.upsert(entry("knobs", kKnobsA, kEnc, 1.01));
  Choice n = choose(noise, "linear", noise.entries[0].params, "host", "test machine");
  EXPECT_FALSE(n.tuned);
  EXPECT_NE(n.reason.find("within noise"), std::string::npos) << n.reason;
}

TEST(TuneChoose, WrongOrIncompleteCandidatesAreNeverChosen) {
  Db db;
  for (const Shape& s : {kEnc, kDec}) db.upsert(entry("hand", {}, s, 1.0));
  db.upsert(entry("knobs", kKnobsA, kEnc, 10.0));
  db.upsert(entry("knobs", kKnobsA, kDec, 0, "wrong"));  // wrong on one shape: out
  db.upsert(entry("knobs", kKnobsB, kEnc, 5.0));         // never measured on decode: out
  Choice c = choose(db, "linear", db.entries[0].params, "host", "test machine");
  EXPECT_FALSE(c.tuned);
  EXPECT_EQ(c.candidate, "hand");
}

TEST(TuneChoose, OtherMachineOrTargetFallsBack) {
  Db db;
  db.upsert(entry("hand", {}, kEnc, 1.0, "ok", "other cpu"));
  db.upsert(entry("knobs", kKnobsA, kEnc, 2.0, "ok", "other cpu"));
  Choice c = choose(db, "linear", db.entries[0].params, "host", "test machine");
  EXPECT_FALSE(c.tuned);
  EXPECT_NE(c.reason.find("another machine"), std::string::npos) << c.reason;
  Choice t = choose(db, "linear", db.entries[0].params, "host-opencl", "other cpu");
  EXPECT_FALSE(t.tuned);
  EXPECT_NE(t.reason.find("no entry"), std::string::npos) << t.reason;
  EXPECT_TRUE(choose(db, "linear", db.entries[0].params, "host", "other cpu").tuned);
}

// ---------------------------------------------------------------- spec, plan, build

TEST(TuneSpec, TuningSectionIsStored) {
  ParseResult r = parse_spec_string(
      "name: t\narchitecture: encoder_decoder\n"
      "sizes: {d_model: 64, heads: 4, d_ff: 128, encoder_layers: 1, decoder_layers: 1, src_vocab: 16, "
      "tgt_vocab: 16, max_len: 64}\n"
      "tuning:\n  db: tuning/t.yaml\n  seq_lens: [16, 64]\n  batch_sizes: [1, 4]\n",
      "t.yaml");
  ASSERT_TRUE(r.ok()) << (r.diagnostics.empty() ? "" : r.diagnostics[0].str());
  EXPECT_EQ(r.spec->tuning_db, "tuning/t.yaml");
  EXPECT_EQ(r.spec->tuning_seq_lens, (std::vector<int64_t>{16, 64}));
  EXPECT_EQ(r.spec->tuning_batch_sizes, (std::vector<int64_t>{1, 4}));
}

TEST(TuneSpec, ResolveDbPrecedence) {
  Spec s = reverse_tiny();
  s.file = "/some/dir/spec.yaml";
  s.tuning_db = "tuning/db.yaml";
  unsetenv("HALFORMER_TUNING_DB");
  EXPECT_EQ(resolve_db(s).path, "/some/dir/tuning/db.yaml");
  setenv("HALFORMER_TUNING_DB", "/x/flag.yaml", 1);
  EXPECT_EQ(resolve_db(s).path, "/x/flag.yaml");
  setenv("HALFORMER_TUNING_DB", "none", 1);
  EXPECT_EQ(resolve_db(s).path, "");
  unsetenv("HALFORMER_TUNING_DB");
  s.tuning_db.clear();
  EXPECT_EQ(resolve_db(s).path, "");
}

// A database with a knob winner and an autoscheduler winner for reverse-tiny's kernels.
Db winners_for(const Plan& plan, const std::string& fp) {
  Db db;
  for (const auto& k : plan.kernels) {
    if (k.function.find("linear_64x192") == std::string::npos && k.function.find("argmax") == std::string::npos)
      continue;
    Entry base;
    base.generator = k.generator;
    base.params = shape_params(k.generator, k.params);
    base.target = "host";
    base.fingerprint = fp;
    base.shape = kDec;
    Entry hand = base, win = base;
    hand.candidate = "hand";
    hand.baseline_ms = hand.median_ms = 1;
    if (k.generator == "argmax") {
      win.candidate = "adams2019";
      win.knobs = {{"autoscheduler", "Adams2019"}, {"autoscheduler.parallelism", "2"}};
    } else {
      win.candidate = "knobs";
      win.knobs = kKnobsA;
    }
    win.baseline_ms = 1, win.median_ms = 0.5, win.speedup = 2;
    db.upsert(hand);
    db.upsert(win);
  }
  return db;
}

TEST(TuneApply, KnobsAndAutoschedulerPluginGoIntoThePlan) {
  fs::path d = temp_dir("apply");
  write_file(d / "libautoschedule_adams2019.so", "");  // apply_tuning only checks it exists
  const Spec spec = reverse_tiny();
  Plan plan = make_plan(spec);
  Db db = winners_for(plan, "me");
  write_db_atomic(db, (d / "db.yaml").string());
  auto notes = apply_tuning(plan, {(d / "db.yaml").string(), "--db"}, d.string(), "me");
  const PlannedKernel* lin = kernel(plan, "linear", "192");
  const PlannedKernel* arg = kernel(plan, "argmax", "16");
  ASSERT_TRUE(lin && arg);
  EXPECT_EQ(param(*lin, "tile_m"), "4");
  EXPECT_EQ(param(*lin, "parallel"), "false");
  EXPECT_EQ(param(*arg, "autoscheduler"), "Adams2019");
  ASSERT_EQ(arg->plugins.size(), 1u);
  EXPECT_EQ(plan.tuning_db, (d / "db.yaml").string());
  std::string all;
  for (const auto& n : notes) all += n + "\n";
  EXPECT_NE(all.find("tuned:  reverse_tiny_argmax_16: adams2019"), std::string::npos) << all;
  EXPECT_NE(all.find("notice: reverse_tiny_layernorm_64: hand schedule: no entry"), std::string::npos) << all;
  EXPECT_NE(all.find("2 of 15 kernels use tuned schedules"), std::string::npos) << all;

  // plan.cmake passes the plugin to the generator and re-plans when the database changes.
  write_plan(spec, plan, (d / "plan").string());
  const std::string cm = read_file(d / "plan" / "plan.cmake");
  EXPECT_NE(cm.find("autoscheduler=Adams2019 autoscheduler.parallelism=2 -p \"" +
                    (d / "libautoschedule_adams2019.so").string() + "\""),
            std::string::npos)
      << cm;
  EXPECT_NE(cm.find("CMAKE_CONFIGURE_DEPENDS \"" + (d / "db.yaml").string() + "\""), std::string::npos) << cm;

  // Another machine: every kernel keeps its hand schedule, with a notice.
  Plan other = make_plan(spec);
  auto notes2 = apply_tuning(other, {(d / "db.yaml").string(), "--db"}, d.string(), "someone else");
  EXPECT_EQ(other.kernels[1].params, make_plan(spec).kernels[1].params);
  all.clear();
  for (const auto& n : notes2) all += n + "\n";
  EXPECT_NE(all.find("measured on another machine"), std::string::npos) << all;
  fs::remove_all(d);
}

// The engine's paged self-attention takes the decoder self-attention's knobs, so that both
// sum alike (a request's tokens in the engine are those of its run alone).
TEST(TuneApply, PagedAttentionTakesTheDecoderAttentionsKnobs) {
  fs::path d = temp_dir("paged");
  ParseResult r = parse_spec_file(source_dir() + "/models/gpt-tiny.yaml");
  ASSERT_TRUE(r.ok());
  Plan plan = make_plan(*r.spec);
  const PlannedKernel* dec = nullptr;
  for (const auto& k : plan.kernels)
    if (k.function == plan.roles.at("decoder_self_attention")) dec = &k;
  ASSERT_TRUE(dec);
  Db db;
  Entry base;
  base.generator = dec->generator;
  base.params = shape_params(dec->generator, dec->params);
  base.target = "host";
  base.fingerprint = "me";
  base.shape = kDec;
  Entry hand = base, win = base;
  hand.candidate = "hand";
  hand.baseline_ms = hand.median_ms = 1;
  win.candidate = "knobs";
  win.knobs = {{"vec", "8"}, {"tile_q", "4"}};
  win.baseline_ms = 1, win.median_ms = 0.5, win.speedup = 2;
  db.upsert(hand);
  db.upsert(win);
  write_db_atomic(db, (d / "db.yaml").string());
  apply_tuning(plan, {(d / "db.yaml").string(), "--db"}, d.string(), "me");
  for (const char* role : {"decoder_self_attention", "paged_self_attention"})
    for (const auto& k : plan.kernels)
      if (k.function == plan.roles.at(role)) {
        EXPECT_EQ(param(k, "vec"), "8") << role;
        EXPECT_EQ(param(k, "tile_q"), "4") << role;
      }
  fs::remove_all(d);
}

TEST(TuneApply, CorruptMissingOrHandEditedDatabaseNeverBreaksThePlan) {
  fs::path d = temp_dir("corrupt");
  const Spec spec = reverse_tiny();
  const Plan clean = make_plan(spec);
  write_file(d / "bad.yaml", "version: 1\nentries:\n  - generator: [oops\n");
  Plan plan = make_plan(spec);
  std::vector<std::string> notes;
  ASSERT_NO_THROW(notes = apply_tuning(plan, {(d / "bad.yaml").string(), "--db"}, d.string(), "me"));
  ASSERT_GE(notes.size(), 2u);
  EXPECT_NE(notes[0].find((d / "bad.yaml").string() + ":"), std::string::npos) << notes[0];
  EXPECT_NE(notes[1].find("every kernel uses its hand schedule"), std::string::npos) << notes[1];
  for (size_t i = 0; i < plan.kernels.size(); ++i) EXPECT_EQ(plan.kernels[i].params, clean.kernels[i].params);

  Plan missing = make_plan(spec);
  notes = apply_tuning(missing, {(d / "nope.yaml").string(), "the spec's tuning.db"}, d.string(), "me");
  ASSERT_EQ(notes.size(), 1u);
  EXPECT_NE(notes[0].find("does not exist yet"), std::string::npos) << notes[0];

  // A hand-edited winner with a nonsense knob value is skipped (with file:line), not built.
  Db db = winners_for(make_plan(spec), "me");
  for (auto& e : db.entries)
    if (e.candidate == "knobs") e.knobs["tile_m"] = "banana";
  write_db_atomic(db, (d / "edited.yaml").string());
  Plan edited = make_plan(spec);
  notes = apply_tuning(edited, {(d / "edited.yaml").string(), "--db"}, d.string(), "me");
  std::string all;
  for (const auto& n : notes) all += n + "\n";
  EXPECT_NE(all.find("knob tile_m: 'banana' is not a valid value"), std::string::npos) << all;
  EXPECT_NE(all.find((d / "edited.yaml").string() + ":"), std::string::npos) << all;
  EXPECT_EQ(kernel(edited, "linear", "192")->params, kernel(clean, "linear", "192")->params);
  // ... and without its plugin, an autoscheduler winner is skipped too.
  EXPECT_NE(all.find("autoscheduler plugin"), std::string::npos) << all;
  fs::remove_all(d);
}

TEST(TuneApply, SeveralDeviceVariantsShareParamsSoNoAutoscheduler) {
  ParseResult r = parse_spec_string(read_file(source_dir() + "/models/reverse-tiny.yaml") + "\n", "rt.yaml");
  ASSERT_TRUE(r.ok());
  Spec spec = *r.spec;
  spec.targets = {Target::Host, Target::OpenCL};
  Plan plan = make_plan(spec);
  if (plan.variants.size() < 2) GTEST_SKIP() << "this plan has no per-device variants";
  fs::path d = temp_dir("variants");
  write_file(d / "libautoschedule_adams2019.so", "");
  write_db_atomic(winners_for(plan, "me"), (d / "db.yaml").string());
  apply_tuning(plan, {(d / "db.yaml").string(), "--db"}, d.string(), "me");
  EXPECT_EQ(param(*kernel(plan, "argmax", "16"), "autoscheduler"), "");
  EXPECT_EQ(param(*kernel(plan, "linear", "192"), "tile_m"), "4");
  fs::remove_all(d);
}

// Run by tests/tools/tune/CMakeLists.txt after a short tuning run: adds fixed winners to the
// run's database (a knob setting for layernorm and linear_64x16, Adams2019 for argmax,
// Mullapudi2016 for log_softmax) so that the rebuild certainly exercises both kinds of tuned
// kernels.
TEST(TuneFixture, AddForcedWinners) {
  const char* db_path = std::getenv("HALFORMER_TUNE_FORCE_DB");
  const char* spec_path = std::getenv("HALFORMER_TUNE_FORCE_SPEC");
  if (!db_path || !spec_path) GTEST_SKIP() << "fixture step of the tuning tests (needs HALFORMER_TUNE_FORCE_DB)";
  ParseResult r = parse_spec_file(spec_path);
  ASSERT_TRUE(r.ok());
  const Plan plan = make_plan(*r.spec);
  Db db = load_db(db_path);
  const std::string fp = host_fingerprint();
  int forced = 0;
  for (const auto& k : plan.kernels) {
    Params knobs;
    std::string cand = "knobs";
    if (k.generator == "layernorm") knobs = {{"vec", "8"}, {"rows_per_task", "2"}};
    if (k.function.find("linear_64x16") != std::string::npos) knobs = kKnobsA;
    if (k.generator == "argmax") {
      cand = "adams2019";
      knobs = {{"autoscheduler", "Adams2019"}, {"autoscheduler.parallelism", "2"}, {"autoscheduler.beam_size", "1"}};
    }
    if (k.generator == "softmax") {
      cand = "mullapudi2016";
      knobs = {{"autoscheduler", "Mullapudi2016"}, {"autoscheduler.parallelism", "2"}};
    }
    if (knobs.empty()) continue;
    Entry base;
    base.generator = k.generator;
    base.params = shape_params(k.generator, k.params);
    base.target = "host";
    base.fingerprint = fp;
    std::set<Shape> shapes;
    for (const auto& e : db.entries)
      if (e.generator == base.generator && e.params == base.params && e.fingerprint == fp && e.target == "host" &&
          e.candidate == "hand" && e.status == "ok")
        shapes.insert(e.shape);
    if (shapes.empty()) shapes = {kDec};
    for (const Shape& s : shapes) {
      Entry e = base;
      e.shape = s;
      e.candidate = cand;
      e.knobs = knobs;
      e.median_ms = 0.001, e.baseline_ms = 0.1, e.speedup = 100, e.samples = 1;
      e.note = "forced by tests/tools/tune (not a measurement)";
      db.upsert(e);
    }
    ++forced;
  }
  EXPECT_EQ(forced, 4);
  write_db_atomic(db, db_path);
}
