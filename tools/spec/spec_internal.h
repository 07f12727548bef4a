// What the spec parser's files share, none of it part of the spec library's interface
// (spec.h): the limits on sizes, the messages' wording helpers, Context (the diagnostics of
// one parse and where each field was written), the typed conversions of one YAML node, and
// Section (one YAML mapping, handing out typed values by key). spec_yaml.cpp defines what
// is not inline here; spec_parse.cpp holds the schema and the section readers,
// spec_validate.cpp the cross-field checks, spec_supported.cpp check_supported, and
// spec.cpp the entry points (loading a file or a text).
#pragma once

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "spec.h"

namespace halformer::spec_internal {

// ---------------------------------------------------------------- limits
// The largest values a spec may give (beyond them: a diagnostic, not an allocation).
constexpr int64_t kInt32Max = 2147483647;
constexpr int64_t kMaxDModel = 65536, kMaxHeads = 1024, kMaxDff = 1 << 20, kMaxLayers = 1024;
constexpr int64_t kMaxVocab = 10000000, kMaxLen = 1 << 20, kMaxTypeVocab = 1024, kMaxBeam = 1024;
constexpr double kMaxWeightGiB = 64.0;
constexpr size_t kMaxFileBytes = 1 << 20;

// Known keys per section ("" is the top level), in documentation order (spec_parse.cpp).
const std::map<std::string, std::vector<std::string>>& schema();

// ---------------------------------------------------------------- message wording
// " (did you mean 'x'?)" for the closest candidate within edit distance 2, else "".
std::string closest(const std::string& word, const std::vector<std::string>& candidates);
std::string join(const std::vector<std::string>& v);
// How a found value is shown in messages.
std::string describe(const YAML::Node& n);
std::string fmt(double v);

// ---------------------------------------------------------------- Context
struct Loc {
  int line = 0, column = 0;
};
inline Loc loc_of(const YAML::Mark& m) { return m.is_null() ? Loc{} : Loc{m.line + 1, m.column + 1}; }

// Collects the diagnostics of one parse and remembers which fields were written (in
// spec.locations) and which were reported as wrong.
struct Context {
  std::string file;
  Spec& spec;
  std::vector<Diagnostic> diags;
  std::set<std::string> failed;  // fields reported as wrong: their value was not stored

  void error(Loc at, const std::string& field, const std::string& message) {
    diags.push_back({file, at.line, at.column, field, message});
    failed.insert(field);
  }
  bool present(const std::string& field) const { return spec.locations.count(field) > 0; }
  // Written by the user and valid.
  bool given(const std::string& field) const { return present(field) && !failed.count(field); }
  bool any_failed(const std::string& prefix) const {
    auto it = failed.lower_bound(prefix);
    return it != failed.end() && it->compare(0, prefix.size(), prefix) == 0;
  }
  // Where a field was written, else where its nearest enclosing section was, else nowhere.
  Loc where(std::string field) const { return locate(spec, std::move(field)); }
  static Loc locate(const Spec& spec, std::string field) {
    for (;;) {
      auto it = spec.locations.find(field);
      if (it != spec.locations.end()) return {it->second.first, it->second.second};
      size_t dot = field.rfind('.');
      if (dot == std::string::npos) return {};
      field.resize(dot);
    }
  }
};

// File order; diagnostics without a line last.
void sort_by_position(std::vector<Diagnostic>& diags);

// ---------------------------------------------------------------- typed conversions
// Each reports its own diagnostic at `at` for `field` and returns nullopt on failure.
std::optional<int64_t> to_int(Context& cx, const YAML::Node& n, Loc at, const std::string& field, int64_t lo,
                              int64_t hi);
std::optional<double> to_number(Context& cx, const YAML::Node& n, Loc at, const std::string& field);
std::optional<bool> to_bool(Context& cx, const YAML::Node& n, Loc at, const std::string& field);

template <class E>
std::optional<E> to_enum(Context& cx, const YAML::Node& n, Loc at, const std::string& field, const std::string& what) {
  std::vector<std::string> allowed;
  for (const auto& [value, name] : enum_names(E{})) {
    if (n.IsScalar() && n.Scalar() == name) return value;
    allowed.push_back(name);
  }
  std::string msg =
      n.IsScalar() && !n.Scalar().empty()
          ? "unknown " + what + " '" + n.Scalar() + "'; allowed: " + join(allowed) + closest(n.Scalar(), allowed)
          : std::string(std::strchr("aeiou", what[0]) ? "expected an " : "expected a ") + what + ", found " +
                describe(n) + "; allowed: " + join(allowed);
  cx.error(at, field, msg);
  return std::nullopt;
}

// ---------------------------------------------------------------- Section
// One YAML mapping. The constructor reports non-scalar keys, duplicate keys and (unless
// the section is free-form) unknown keys, and records where every key's value is.
class Section {
 public:
  struct Entry {
    std::string key;
    YAML::Node key_node, value;
    Loc at;      // of the value; of the key when the value was omitted ("key:")
    Loc key_at;  // of the key
  };

  Section(Context& cx, const YAML::Node& node, Loc at, std::string path, bool free_form = false);

  const std::vector<Entry>& entries() const { return entries_; }
  const Entry* entry(const std::string& key) const {
    for (const auto& e : entries_)
      if (e.key == key) return &e;
    return nullptr;
  }
  bool has(const std::string& key) const { return entry(key) != nullptr; }
  std::string field(const std::string& key) const { return path_.empty() ? key : path_ + "." + key; }
  Loc at(const std::string& key) const { return has(key) ? entry(key)->at : at_; }
  Context& context() { return cx_; }

  void error(const std::string& key, const std::string& message) { cx_.error(at(key), field(key), message); }
  void require(const std::string& key, const std::string& what) {
    if (!has(key)) cx_.error(at_, field(key), "missing required key '" + key + "' (" + what + ")");
  }
  // Nested section; absent or null gives an empty section located at this key.
  Section section(const std::string& key, bool free_form = false) {
    const Entry* e = entry(key);
    return Section(cx_, e ? e->value : YAML::Node(), at(key), field(key), free_form);
  }

  // Typed readers: store into `out` and return true when the key is present and valid.
  bool read(const std::string& key, int64_t& out, int64_t lo, int64_t hi = kInt32Max) {
    return assign(key, out, [&](const Entry& e) { return to_int(cx_, e.value, e.at, field(key), lo, hi); });
  }
  bool read(const std::string& key, double& out) {
    return assign(key, out, [&](const Entry& e) { return to_number(cx_, e.value, e.at, field(key)); });
  }
  bool read(const std::string& key, bool& out) {
    return assign(key, out, [&](const Entry& e) { return to_bool(cx_, e.value, e.at, field(key)); });
  }
  bool read(const std::string& key, std::string& out) {
    return assign(key, out, [&](const Entry& e) -> std::optional<std::string> {
      if (e.value.IsScalar()) return e.value.Scalar();
      cx_.error(e.at, field(key), "expected a string, found " + describe(e.value));
      return std::nullopt;
    });
  }
  template <class E>
  bool read(const std::string& key, E& out, const std::string& what) {
    return assign(key, out, [&](const Entry& e) { return to_enum<E>(cx_, e.value, e.at, field(key), what); });
  }
  // A number checked by `allowed`, which returns "" when the value is fine, else the allowed range.
  template <class Check>
  bool read(const std::string& key, double& out, Check allowed) {
    double v = 0;
    if (!read(key, v)) return false;
    if (std::string range = allowed(v); !range.empty()) {
      error(key, "must be " + range + ", found " + fmt(v));
      return false;
    }
    return out = v, true;
  }

 private:
  template <class T, class Convert>
  bool assign(const std::string& key, T& out, Convert convert) {
    const Entry* e = entry(key);
    if (!e) return false;
    auto v = convert(*e);
    if (!v) return false;
    out = *v;
    return true;
  }
  // A close known key, or the section where this key belongs.
  std::string hint(const std::string& key, const std::vector<std::string>& known) const;

  Context& cx_;
  Loc at_;  // of the mapping itself, for missing keys
  std::string path_;
  std::vector<Entry> entries_;  // first occurrence of each accepted key, in file order
};

// ---------------------------------------------------------------- the parse, step by step
// The sections of a YAML mapping -> Spec, then the cross-field checks (spec_parse.cpp).
ParseResult parse_root(const YAML::Node& root, const std::string& file);
// The checks between fields, run once every section is read; fills the defaults that depend
// on other fields (spec_validate.cpp). have_sizes: 'sizes' was given and is a mapping.
void check_consistency(Context& cx, Spec& s, bool have_sizes);

}  // namespace halformer::spec_internal
