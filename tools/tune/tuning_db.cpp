#include "tuning_db.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <thread>

#include <sys/utsname.h>
#include <unistd.h>

namespace halformer::tune {
namespace fs = std::filesystem;

// ---------------------------------------------------------------- knobs

namespace {

std::vector<std::string> ints(std::initializer_list<int> v) {
  std::vector<std::string> r;
  for (int i : v) r.push_back(std::to_string(i));
  return r;
}

const std::map<std::string, std::vector<Knob>>& cpu_table() {
  static const std::map<std::string, std::vector<Knob>> t = [] {
    // The matmul's hand tile depends on the ISA (generators/schedules/cpu_matmul.h:
    // matmul_knobs_for); "0" is that default.
    std::vector<Knob> matmul{{"vec", ints({8, 16, 32}), "0"},
                             {"tile_n", ints({1, 2, 3, 4}), "0"},
                             {"tile_m", ints({1, 2, 4, 5, 6, 8, 12}), "0"},
                             {"parallel", {"false", "true"}, "true"}};
    // Reduced-precision linears: also whether calls of more than 8 rows use AMX tiles
    // (generators/schedules/cpu_matmul.h; searched only on AMX CPUs, below).
    std::vector<Knob> matmul_amx = matmul;
    matmul_amx.push_back({"amx", {"false", "true"}, "true"});
    std::vector<Knob> vec_only{{"vec", ints({4, 8, 16, 32}), "16"}};
    return std::map<std::string, std::vector<Knob>>{
        {"linear", matmul},
        {"linear_residual", matmul},
        {"linear_gated", matmul},
        {"linear_int8", matmul_amx},
        {"linear_int8_residual", matmul_amx},
        {"linear_int8_gated", matmul_amx},
        {"linear_bf16", matmul_amx},
        {"linear_bf16_residual", matmul_amx},
        {"linear_bf16_gated", matmul_amx},
        {"attention",
         {{"vec", ints({4, 8, 16, 32}), "0"},
          {"tile_q", ints({1, 2, 4, 6, 8, 16, 32}), "0"},
          {"v_features", ints({0, 16, 32, 64}), "0"},
          {"v_queries", ints({0, 1, 2, 4, 6, 8}), "0"}}},
        {"layernorm", {{"vec", ints({4, 8, 16, 32}), "16"}, {"rows_per_task", ints({1, 2, 4, 8, 16, 32}), "8"}}},
        {"embedding", vec_only},
        {"softmax", vec_only},
        {"pooling", vec_only},
        {"argmax", {{"lanes", ints({4, 8, 16, 32, 64}), "16"}}},
    };
  }();
  return t;
}

const std::map<std::string, std::vector<Knob>>& gpu_table() {
  static const std::map<std::string, std::vector<Knob>> t = [] {
    // schedules/gpu.h: many-row tiles, register tile rows, K unrolling, K slices and
    // register-staged K chunks;
    // few-row slices and the row count where the many-row path starts.
    std::vector<Knob> matmul{{"gpu_tile_n", ints({32, 64, 128}), "64"},
                             {"gpu_tile_m", ints({8, 16, 32}), "16"},
                             {"gpu_reg_m", ints({2, 4, 8}), "4"},
                             {"gpu_unroll_k", ints({1, 4, 8}), "4"},
                             {"gpu_slice_n", ints({16, 32, 64}), "32"},
                             {"gpu_k_slice", ints({0, 256, 512, 1024}), "512"},
                             {"gpu_stage_k", ints({0, 4, 8}), "8"},
                             {"gpu_split_rows", ints({256, 1024, 4096}), "256"}};
    return std::map<std::string, std::vector<Knob>>{
        {"linear", matmul},
        {"linear_residual", matmul},
        {"linear_gated", matmul},
        {"attention",
         {{"gpu_tile_q", ints({1, 2, 4, 8, 16, 32}), "8"},
          {"gpu_key_lanes", ints({8, 16, 32, 64, 128}), "32"},
          {"gpu_reduce_lanes", ints({0, 8, 16, 32}), "32"},
          {"gpu_score_queries", ints({0, 1, 2, 4, 8}), "1"},
          {"gpu_v_queries", ints({0, 1, 2, 4, 8}), "2"}}},
        {"layernorm", {{"gpu_threads", ints({32, 64, 128, 256}), "32"}}},
        {"argmax", {{"lanes", ints({4, 8, 16, 32, 64}), "16"}}},
    };
  }();
  return t;
}

const std::vector<Knob>& lookup(const std::map<std::string, std::vector<Knob>>& t, const std::string& g) {
  static const std::vector<Knob> none;
  auto it = t.find(g);
  return it == t.end() ? none : it->second;
}

std::string lower(std::string s) {
  for (char& c : s) c = char(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

}  // namespace

const std::vector<Knob>& cpu_knobs(const std::string& generator) { return lookup(cpu_table(), generator); }
const std::vector<Knob>& gpu_knobs(const std::string& generator) { return lookup(gpu_table(), generator); }

bool is_knob(const std::string& generator, const std::string& param) {
  if (param == "autoscheduler" || param.rfind("autoscheduler.", 0) == 0) return true;
  for (const auto* list : {&cpu_knobs(generator), &gpu_knobs(generator)})
    for (const auto& k : *list)
      if (k.name == param) return true;
  return false;
}

const std::vector<Autoscheduler>& autoschedulers() {
  static const std::vector<Autoscheduler> a{
      {"Adams2019", "libautoschedule_adams2019.so", false},
      {"Mullapudi2016", "libautoschedule_mullapudi2016.so", false},
      {"Li2018", "libautoschedule_li2018.so", false},
      {"Anderson2021", "libautoschedule_anderson2021.so", true},
  };
  return a;
}

const Autoscheduler* find_autoscheduler(const std::string& name) {
  for (const auto& a : autoschedulers())
    if (lower(a.name) == lower(name)) return &a;
  return nullptr;
}

// ---------------------------------------------------------------- shapes, entries

std::string Shape::str() const { return phase + " b" + std::to_string(batch) + " s" + std::to_string(seq); }
bool Shape::operator<(const Shape& o) const {
  return std::tie(phase, batch, seq) < std::tie(o.phase, o.batch, o.seq);
}
bool Shape::operator==(const Shape& o) const { return phase == o.phase && batch == o.batch && seq == o.seq; }

namespace {
std::string join(const Params& p) {
  std::string s;
  for (const auto& [k, v] : p) s += k + "=" + v + ",";
  return s;
}
}  // namespace

std::string Entry::candidate_key() const { return candidate + "{" + join(knobs) + "}"; }
std::string Entry::key() const {
  return generator + "|" + join(params) + "|" + target + "|" + fingerprint + "|" + shape.str() + "|" +
         candidate_key();
}

void Db::upsert(const Entry& e) {
  const std::string k = e.key();
  for (auto& old : entries)
    if (old.key() == k) {
      old = e;
      return;
    }
  entries.push_back(e);
}

const Entry* Db::find(const std::string& key) const {
  for (const auto& e : entries)
    if (e.key() == key) return &e;
  return nullptr;
}

// ---------------------------------------------------------------- reading

namespace {

struct Reader {
  std::string file;

  [[noreturn]] void fail(const YAML::Node& n, const std::string& field, const std::string& msg) const {
    const YAML::Mark m = n.Mark();
    std::ostringstream o;
    o << file;
    if (m.line >= 0) o << ":" << m.line + 1 << ":" << m.column + 1;
    o << ": error: " << (field.empty() ? "" : field + ": ") << msg;
    throw DbError(o.str());
  }

  static std::string describe(const YAML::Node& n) {
    if (n.IsMap()) return "a mapping";
    if (n.IsSequence()) return "a sequence";
    if (n.IsNull()) return "nothing";
    return "'" + n.Scalar() + "'";
  }

  const YAML::Node need(const YAML::Node& map, const char* key, const std::string& field) const {
    const YAML::Node v = map[key];
    if (!v) fail(map, field, std::string("missing key '") + key + "'");
    return v;
  }

  std::string str(const YAML::Node& map, const char* key, const std::string& field) const {
    const YAML::Node v = need(map, key, field);
    if (!v.IsScalar() || v.Scalar().empty())
      fail(v, field + "." + key, "expected a non-empty string, found " + describe(v));
    return v.Scalar();
  }

  int integer(const YAML::Node& map, const char* key, const std::string& field, int lo) const {
    const YAML::Node v = need(map, key, field);
    const std::string s = v.IsScalar() ? v.Scalar() : "";
    char* end = nullptr;
    errno = 0;
    const long x = s.empty() ? 0 : std::strtol(s.c_str(), &end, 10);
    if (s.empty() || *end || errno || x < lo || x > 1 << 30)
      fail(v, field + "." + key, "expected an integer >= " + std::to_string(lo) + ", found " + describe(v));
    return int(x);
  }

  double number(const YAML::Node& map, const char* key, const std::string& field) const {
    const YAML::Node v = need(map, key, field);
    const std::string s = v.IsScalar() ? v.Scalar() : "";
    char* end = nullptr;
    const double x = s.empty() ? 0 : std::strtod(s.c_str(), &end);
    if (s.empty() || *end || !std::isfinite(x) || x < 0)
      fail(v, field + "." + key, "expected a finite number >= 0, found " + describe(v));
    return x;
  }

  Params params(const YAML::Node& map, const char* key, const std::string& field) const {
    const YAML::Node v = need(map, key, field);
    if (v.IsNull()) return {};
    if (!v.IsMap()) fail(v, field + "." + key, "expected a mapping of name: value, found " + describe(v));
    Params p;
    for (const auto& kv : v) {
      if (!kv.first.IsScalar() || !kv.second.IsScalar())
        fail(kv.first, field + "." + key, "expected scalar name: value pairs, found " + describe(kv.second));
      p[kv.first.Scalar()] = kv.second.Scalar();
    }
    return p;
  }
};

}  // namespace

Db parse_db(const std::string& text, const std::string& file) {
  Db db;
  db.path = file;
  Reader rd{file};
  YAML::Node root;
  try {
    root = YAML::Load(text);
  } catch (const YAML::ParserException& e) {
    std::ostringstream o;
    o << file << ":" << e.mark.line + 1 << ":" << e.mark.column + 1 << ": error: not valid YAML: " << e.msg;
    throw DbError(o.str());
  }
  if (root.IsNull()) return db;  // empty file: empty database
  if (!root.IsMap())
    rd.fail(root, "", "not a tuning database: expected a mapping with 'version' and 'entries', found " +
                          Reader::describe(root));
  const int version = rd.integer(root, "version", "", 1);
  if (version != 1)
    rd.fail(root["version"], "version", "unsupported database version " + std::to_string(version) + " (this halformer reads 1)");
  const YAML::Node entries = rd.need(root, "entries", "");
  if (entries.IsNull()) return db;
  if (!entries.IsSequence()) rd.fail(entries, "entries", "expected a sequence of entries, found " + Reader::describe(entries));
  int i = 0;
  for (const auto& n : entries) {
    const std::string f = "entries[" + std::to_string(i++) + "]";
    if (!n.IsMap()) rd.fail(n, f, "expected a mapping, found " + Reader::describe(n));
    Entry e;
    e.line = n.Mark().line + 1;
    e.generator = rd.str(n, "generator", f);
    e.params = rd.params(n, "params", f);
    e.target = rd.str(n, "target", f);
    e.fingerprint = rd.str(n, "fingerprint", f);
    const YAML::Node s = rd.need(n, "shape", f);
    if (!s.IsMap()) rd.fail(s, f + ".shape", "expected {phase, batch, seq}, found " + Reader::describe(s));
    e.shape.phase = rd.str(s, "phase", f + ".shape");
    if (e.shape.phase != "encode" && e.shape.phase != "decode")
      rd.fail(s["phase"], f + ".shape.phase", "expected encode or decode, found '" + e.shape.phase + "'");
    e.shape.batch = rd.integer(s, "batch", f + ".shape", 1);
    e.shape.seq = rd.integer(s, "seq", f + ".shape", 1);
    e.candidate = rd.str(n, "candidate", f);
    e.knobs = rd.params(n, "knobs", f);
    e.status = rd.str(n, "status", f);
    if (e.status != "ok" && e.status != "wrong" && e.status != "failed")
      rd.fail(n["status"], f + ".status", "expected ok, wrong or failed, found '" + e.status + "'");
    if (e.status == "ok" || n["median_ms"]) {  // wrong entries may carry a timing (comparison only)
      e.median_ms = rd.number(n, "median_ms", f);
      e.baseline_ms = rd.number(n, "baseline_ms", f);
      if (e.median_ms <= 0 || e.baseline_ms <= 0)
        rd.fail(n["median_ms"], f + ".median_ms", "a timed entry needs median_ms and baseline_ms > 0");
    }
    if (n["samples"]) e.samples = rd.integer(n, "samples", f, 0);
    if (e.median_ms > 0 && n["speedup"]) e.speedup = rd.number(n, "speedup", f);
    if (n["note"] && n["note"].IsScalar()) e.note = n["note"].Scalar();
    if (n["measured"] && n["measured"].IsScalar()) e.measured = n["measured"].Scalar();
    db.upsert(e);
  }
  return db;
}

Db load_db(const std::string& path) {
  std::error_code ec;
  if (!fs::exists(path, ec)) {
    Db db;
    db.path = path;
    return db;
  }
  if (fs::is_directory(path, ec)) throw DbError(path + ": error: is a directory, not a tuning database file");
  std::ifstream in(path, std::ios::binary);
  if (!in) throw DbError(path + ": error: cannot read the tuning database");
  std::stringstream ss;
  ss << in.rdbuf();
  const std::string text = ss.str();
  if (text.find('\0') != std::string::npos)
    throw DbError(path + ": error: not a YAML text file (contains NUL bytes)");
  return parse_db(text, path);
}

// ---------------------------------------------------------------- writing

namespace {

std::string fmt_ms(double v) {
  std::ostringstream o;
  o.precision(6);
  o << v;
  return o.str();
}

void emit_params(YAML::Emitter& out, const Params& p) {
  out << YAML::Flow << YAML::BeginMap;
  for (const auto& [k, v] : p) out << YAML::Key << k << YAML::Value << v;
  out << YAML::EndMap;
}

}  // namespace

std::string format_db(const Db& db) {
  YAML::Emitter out;
  out << YAML::Comment(
      "halformer tuning database: written by `halformer tune`, read by `halformer build` (docs/tuning.md).\n"
      "One entry per measurement; later runs merge into this file, they never clobber it.");
  out << YAML::BeginMap;
  out << YAML::Key << "version" << YAML::Value << 1;
  out << YAML::Key << "entries" << YAML::Value << YAML::BeginSeq;
  for (const auto& e : db.entries) {
    out << YAML::BeginMap;
    out << YAML::Key << "generator" << YAML::Value << e.generator;
    out << YAML::Key << "params" << YAML::Value;
    emit_params(out, e.params);
    out << YAML::Key << "target" << YAML::Value << e.target;
    out << YAML::Key << "fingerprint" << YAML::Value << YAML::DoubleQuoted << e.fingerprint;
    out << YAML::Key << "shape" << YAML::Value << YAML::Flow << YAML::BeginMap << YAML::Key << "phase"
        << YAML::Value << e.shape.phase << YAML::Key << "batch" << YAML::Value << e.shape.batch << YAML::Key
        << "seq" << YAML::Value << e.shape.seq << YAML::Key << "rows" << YAML::Value << e.shape.rows()
        << YAML::EndMap;
    out << YAML::Key << "candidate" << YAML::Value << e.candidate;
    out << YAML::Key << "knobs" << YAML::Value;
    emit_params(out, e.knobs);
    out << YAML::Key << "status" << YAML::Value << e.status;
    if (e.median_ms > 0) {
      out << YAML::Key << "median_ms" << YAML::Value << fmt_ms(e.median_ms);
      out << YAML::Key << "baseline_ms" << YAML::Value << fmt_ms(e.baseline_ms);
      if (e.speedup > 0) out << YAML::Key << "speedup" << YAML::Value << fmt_ms(e.speedup);
      out << YAML::Key << "samples" << YAML::Value << e.samples;
    }
    if (!e.note.empty()) out << YAML::Key << "note" << YAML::Value << YAML::DoubleQuoted << e.note;
    if (!e.measured.empty()) out << YAML::Key << "measured" << YAML::Value << e.measured;
    out << YAML::EndMap;
  }
  out << YAML::EndSeq << YAML::EndMap;
  return std::string(out.c_str()) + "\n";
}

void write_db_atomic(const Db& db, const std::string& path) {
  const fs::path p(path);
  if (p.has_parent_path()) fs::create_directories(p.parent_path());
  const std::string tmp = path + ".tmp." + std::to_string(::getpid());
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    out << format_db(db);
    out.flush();
    if (!out) {
      std::error_code ec;
      fs::remove(tmp, ec);
      throw DbError(path + ": error: cannot write the tuning database (" + tmp + ")");
    }
  }
  std::error_code ec;
  fs::rename(tmp, path, ec);
  if (ec) {
    fs::remove(tmp, ec);
    throw DbError(path + ": error: cannot replace the tuning database: " + ec.message());
  }
}

// ---------------------------------------------------------------- machine

std::string host_fingerprint() {
  static const std::string fp = [] {
    std::ifstream in("/proc/cpuinfo");
    std::string line, model, flags;
    while (std::getline(in, line)) {
      auto colon = line.find(':');
      if (colon == std::string::npos) continue;
      std::string key = line.substr(0, colon), value = line.substr(colon + 1);
      while (!key.empty() && std::isspace(static_cast<unsigned char>(key.back()))) key.pop_back();
      while (!value.empty() && std::isspace(static_cast<unsigned char>(value.front()))) value.erase(0, 1);
      if (model.empty() && (key == "model name" || key == "Model" || key == "CPU part")) model = value;
      if (flags.empty() && (key == "flags" || key == "Features")) flags = value;
    }
    // ISA extensions that change what Halide generates (x86 and Arm).
    static const std::set<std::string> isa{
        "sse4_1", "sse4_2", "avx", "avx2", "fma", "f16c", "avx512f", "avx512cd", "avx512bw", "avx512dq",
        "avx512vl", "avx512_vnni", "avx512_bf16", "avx512_fp16", "avx_vnni", "avx512vbmi", "amx_tile",
        "asimd", "asimddp", "sve", "sve2", "fphp", "asimdhp", "i8mm", "bf16"};
    std::set<std::string> have;
    std::istringstream fl(flags);
    for (std::string f; fl >> f;)
      if (isa.count(f)) have.insert(f);
    struct utsname u {};
    std::string arch = ::uname(&u) == 0 ? u.machine : "unknown";
    std::string r = (model.empty() ? std::string("unknown cpu") : model) + "; " +
                    std::to_string(std::max(1u, std::thread::hardware_concurrency())) + " cpus; " + arch;
    for (const auto& f : have) r += " " + f;
    // The schedules measured: a database made with other generator sources compared
    // its candidates against another hand schedule, so its verdicts do not carry over.
    return r + "; generators " + HALFORMER_GENERATORS_VERSION;
  }();
  return fp;
}

// ---------------------------------------------------------------- choosing

Params shape_params(const std::string& generator, const std::vector<std::pair<std::string, std::string>>& params) {
  Params p;
  for (const auto& [k, v] : params)
    if (!is_knob(generator, k)) p[k] = v;
  return p;
}

Params knob_params(const std::string& generator, const std::vector<std::pair<std::string, std::string>>& params) {
  Params p;
  for (const auto& [k, v] : params)
    if (is_knob(generator, k)) p[k] = v;
  return p;
}

double candidate_score(const std::vector<double>& speedups) {
  if (speedups.empty()) return 0;
  double sum = 0;
  for (double r : speedups) {
    if (!(r >= kMaxSlowdown)) return 0;
    sum += std::log(r);
  }
  return std::exp(sum / double(speedups.size()));
}

Choice choose(const Db& db, const std::string& generator, const Params& shape, const std::string& target,
              const std::string& fingerprint, bool allow_autoscheduler) {
  Choice c;
  c.candidate = "hand";
  std::vector<const Entry*> kernel, mine;
  for (const auto& e : db.entries)
    if (e.generator == generator && e.params == shape && e.target == target) kernel.push_back(&e);
  if (kernel.empty()) {
    c.reason = "no entry in the tuning database";
    return c;
  }
  for (const Entry* e : kernel)
    if (e->fingerprint == fingerprint) mine.push_back(e);
  if (mine.empty()) {
    c.reason = "entries were measured on another machine or with other generator sources (" +
               kernel.front()->fingerprint + "), not this one; run halformer tune again";
    return c;
  }
  // Shapes the hand schedule was measured on; without hand entries, every shape seen.
  std::set<Shape> shapes;
  for (const Entry* e : mine)
    if (e->candidate == "hand" && e->status == "ok") shapes.insert(e->shape);
  if (shapes.empty())
    for (const Entry* e : mine)
      if (e->status == "ok") shapes.insert(e->shape);
  std::map<std::string, std::vector<const Entry*>> by_candidate;
  for (const Entry* e : mine)
    if (e->candidate != "hand" && (allow_autoscheduler || !e->knobs.count("autoscheduler")))
      by_candidate[e->candidate_key()].push_back(e);
  double best = 0;
  int rejected = 0, slower = 0;
  for (const auto& [key, list] : by_candidate) {
    bool ok = true;
    std::map<Shape, const Entry*> at;
    for (const Entry* e : list) {
      if (e->status != "ok") ok = false;
      at[e->shape] = e;
    }
    if (!ok) {
      ++rejected;
      continue;
    }
    std::vector<double> ratios;
    std::vector<const Entry*> used;
    for (const auto& s : shapes) {
      auto it = at.find(s);
      if (it == at.end()) {
        ok = false;
        break;
      }
      ratios.push_back(it->second->ratio());
      used.push_back(it->second);
    }
    if (!ok || shapes.empty()) continue;
    const double speedup = candidate_score(ratios);
    if (speedup == 0) {
      ++slower;
      continue;
    }
    if (speedup > best) {
      best = speedup;
      c.candidate = list.front()->candidate;
      c.knobs = list.front()->knobs;
      c.speedup = speedup;
      c.shapes = int(shapes.size());
      c.winner_entries = used;
    }
  }
  if (best == 0) {
    c.candidate = "hand";
    c.knobs.clear();
    c.reason = by_candidate.empty() ? "only the hand schedule has been measured"
               : rejected == int(by_candidate.size())
                   ? "no candidate passed the correctness checks (" + std::to_string(rejected) + " wrong or failed)"
               : slower > 0 ? "every correct candidate is slower than it on at least one shape"
                            : "no candidate was measured on every shape the hand schedule was";
    return c;
  }
  if (best < kMinSpeedup) {
    std::ostringstream o;
    o.setf(std::ios::fixed);
    o.precision(2);
    const std::string who = c.candidate == "knobs" ? "a knob setting" : c.candidate;
    if (best < 1)
      o << "no candidate beats it (best: " << who << " at " << best << "x)";
    else
      o << "the best candidate (" << who << ", " << best << "x) is within noise (< " << kMinSpeedup << "x)";
    c.reason = o.str();
    c.candidate = "hand";
    c.knobs.clear();
    c.winner_entries.clear();
    return c;
  }
  c.tuned = true;
  return c;
}

// ---------------------------------------------------------------- applying

DbSource resolve_db(const Spec& spec) {
  if (const char* env = std::getenv("HALFORMER_TUNING_DB"); env && *env) {
    if (std::string(env) == "none") return {"", "--no-db"};
    return {fs::absolute(env).lexically_normal().string(), "--db"};
  }
  if (!spec.tuning_db.empty()) {
    fs::path p(spec.tuning_db);
    if (p.is_relative()) p = fs::absolute(fs::path(spec.file).parent_path() / p);
    return {p.lexically_normal().string(), "the spec's tuning.db"};
  }
  return {"", ""};
}

namespace {

// A knob value the generators accept: a small positive integer or a bool.
bool valid_knob_value(const std::string& k, const std::string& v) {
  if (k == "autoscheduler") return find_autoscheduler(v) != nullptr;
  if (v == "true" || v == "false") return true;
  if (v.empty() || v.size() > 6) return false;
  for (char ch : v)
    if (!std::isdigit(static_cast<unsigned char>(ch))) return false;
  const int x = std::stoi(v);
  return x >= 0 && x <= 65536;
}

std::string fmt_speedup(double s) {
  std::ostringstream o;
  o.setf(std::ios::fixed);
  o.precision(2);
  o << s << "x";
  return o.str();
}

}  // namespace

std::vector<std::string> apply_tuning(Plan& plan, const DbSource& source, const std::string& plugin_dir,
                                      const std::string& fingerprint) {
  std::vector<std::string> notes;
  if (source.path.empty()) return notes;
  std::error_code ec;
  if (!fs::exists(source.path, ec)) {
    notes.push_back("notice: tuning database " + source.path + " (" + source.origin +
                    ") does not exist yet: every kernel uses its hand schedule (run `halformer tune` to fill it)");
    return notes;
  }
  plan.tuning_db = source.path;
  Db db;
  try {
    db = load_db(source.path);
  } catch (const DbError& e) {
    notes.push_back(std::string(e.what()));
    notes.push_back("warning: ignoring the unreadable tuning database " + source.path +
                    ": every kernel uses its hand schedule (fix or delete the file, or build with --no-db)");
    return notes;
  }
  int tuned = 0;
  const bool single = plan.variants.size() == 1;
  for (auto& k : plan.kernels) {
    const Params shape = shape_params(k.generator, k.params);
    bool any = false;
    for (const auto& [device, target] : plan.variants) {
      const std::string who = k.function + (single ? "" : " [" + device + "]");
      Choice c = choose(db, k.generator, shape, target, fingerprint, single);
      if (!c.tuned) {
        notes.push_back("notice: " + who + ": hand schedule: " + c.reason);
        continue;
      }
      // Validate before touching the plan: a hand-edited entry must never break the build.
      std::string bad;
      for (const auto& [name, value] : c.knobs)
        if (!is_knob(k.generator, name))
          bad = "'" + name + "' is not a schedule knob of " + k.generator;
        else if (name.rfind("autoscheduler.", 0) == 0 && name != "autoscheduler.parallelism" &&
                 name != "autoscheduler.beam_size")
          bad = "autoscheduler setting '" + name + "' is not one halformer passes (parallelism, beam_size)";
        else if (!valid_knob_value(name, value))
          bad = "knob " + name + ": '" + value + "' is not a valid value";
      std::string plugin;
      if (bad.empty() && c.knobs.count("autoscheduler")) {
        const Autoscheduler* a = find_autoscheduler(c.knobs.at("autoscheduler"));
        plugin = (fs::path(plugin_dir) / a->plugin).string();
        if (!fs::exists(plugin, ec)) bad = "autoscheduler plugin " + plugin + " not found";
      }
      if (!bad.empty()) {
        const int line = c.winner_entries.empty() ? 0 : c.winner_entries.front()->line;
        notes.push_back("notice: " + who + ": hand schedule: " + source.path + ":" + std::to_string(line) + ": " + bad);
        continue;
      }
      for (const auto& [name, value] : c.knobs) {
        auto it = std::find_if(k.params.begin(), k.params.end(), [&](const auto& p) { return p.first == name; });
        if (it != k.params.end())
          it->second = value;
        else
          k.params.emplace_back(name, value);
      }
      if (!plugin.empty()) k.plugins.push_back(plugin);
      std::string desc = c.candidate;
      if (c.candidate == "knobs") {
        desc.clear();
        for (const auto& [name, value] : c.knobs) desc += (desc.empty() ? "" : " ") + name + "=" + value;
      }
      notes.push_back("tuned:  " + who + ": " + desc + " (" + fmt_speedup(c.speedup) + " vs hand over " +
                      std::to_string(c.shapes) + " shape" + (c.shapes == 1 ? "" : "s") + ")");
      any = true;
    }
    if (any) ++tuned;
  }
  notes.push_back("tuning database " + source.path + " (" + source.origin + "): " + std::to_string(tuned) + " of " +
                  std::to_string(plan.kernels.size()) + " kernels use tuned schedules");
  return notes;
}

}  // namespace halformer::tune
