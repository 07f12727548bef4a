// The tuning database file (tuning_db.h): shapes and entries, reading it (with
// file:line:column errors), writing it (YAML, atomically), and the machine fingerprint
// its entries are keyed by. Choosing and applying a winner is in choose.cpp, the knob
// tables in knobs.cpp.
#include "tuning_db.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <thread>
#include <tuple>

#include <sys/utsname.h>
#include <unistd.h>

#include "output_text.h"

namespace halformer::tune {
namespace fs = std::filesystem;

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
      out << YAML::Key << "median_ms" << YAML::Value << format_number(e.median_ms, 6);
      out << YAML::Key << "baseline_ms" << YAML::Value << format_number(e.baseline_ms, 6);
      if (e.speedup > 0) out << YAML::Key << "speedup" << YAML::Value << format_number(e.speedup, 6);
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

}  // namespace halformer::tune
