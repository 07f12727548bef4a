// The typed reading of one YAML node, with diagnostics: the message wording helpers
// (closest match, how a found value is shown), the conversions to integer, number and bool
// (to_enum is a template in spec_internal.h), Section's constructor (duplicate, unknown and
// non-scalar keys) and the order diagnostics are reported in. Nothing here knows a
// particular field: the sections and their keys (schema()) are in spec_parse.cpp.
#include <charconv>
#include <cmath>
#include <sstream>

#include "spec_internal.h"

namespace halformer::spec_internal {

// ---------------------------------------------------------------- message wording
namespace {
size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diag = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diag + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diag = up;
    }
  }
  return row[b.size()];
}
}  // namespace

// " (did you mean 'x'?)" for the closest candidate within edit distance 2, else "".
std::string closest(const std::string& word, const std::vector<std::string>& candidates) {
  std::string best;
  size_t best_d = 3;
  for (const auto& c : candidates) {
    size_t d = edit_distance(word, c);
    if (d < best_d) best_d = d, best = c;
  }
  return best.empty() ? "" : " (did you mean '" + best + "'?)";
}

std::string join(const std::vector<std::string>& v) {
  std::string s;
  for (const auto& x : v) s += (s.empty() ? "" : ", ") + x;
  return s;
}

// How a found value is shown in messages.
std::string describe(const YAML::Node& n) {
  if (!n.IsDefined() || n.IsNull()) return "nothing";
  if (n.IsMap()) return "a mapping";
  if (n.IsSequence()) return "a sequence";
  if (n.Tag() != "?") return "the quoted string '" + n.Scalar() + "'";
  return "'" + n.Scalar() + "'";
}

std::string fmt(double v) {
  std::ostringstream os;
  os << v;
  return os.str();
}

// ---------------------------------------------------------------- typed conversions
std::optional<int64_t> to_int(Context& cx, const YAML::Node& n, Loc at, const std::string& field, int64_t lo,
                              int64_t hi) {
  const std::string s = n.IsScalar() && n.Tag() == "?" ? n.Scalar() : "";
  const size_t sign = s.size() > 1 && (s[0] == '-' || s[0] == '+') ? 1 : 0;
  if (s.empty() || !std::all_of(s.begin() + sign, s.end(), [](char c) { return c >= '0' && c <= '9'; })) {
    cx.error(at, field, "expected an integer, found " + describe(n));
    return std::nullopt;
  }
  int64_t v = 0;
  if (std::from_chars(s.data() + sign, s.data() + s.size(), v).ec != std::errc() || v > kInt32Max) {
    cx.error(at, field, "found " + s + ", which does not fit in a 32-bit integer (largest is 2147483647)");
    return std::nullopt;
  }
  if (s[0] == '-') v = -v;
  if (v < lo || v > hi) {
    std::string range = hi == kInt32Max ? (lo == 1 ? "> 0" : ">= " + std::to_string(lo))
                                        : "between " + std::to_string(lo) + " and " + std::to_string(hi);
    cx.error(at, field, "must be " + range + ", found " + std::to_string(v));
    return std::nullopt;
  }
  return v;
}

std::optional<double> to_number(Context& cx, const YAML::Node& n, Loc at, const std::string& field) {
  std::string s = n.IsScalar() && n.Tag() == "?" ? n.Scalar() : "";
  if (!s.empty() && s[0] == '+') s.erase(0, 1);
  double v = 0;
  auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (s.empty() || ec != std::errc() || end != s.data() + s.size() || !std::isfinite(v)) {
    cx.error(at, field, "expected a finite number, found " + describe(n));
    return std::nullopt;
  }
  return v;
}

std::optional<bool> to_bool(Context& cx, const YAML::Node& n, Loc at, const std::string& field) {
  const std::string s = n.IsScalar() && n.Tag() == "?" ? n.Scalar() : "";
  if (s == "true" || s == "True" || s == "TRUE") return true;
  if (s == "false" || s == "False" || s == "FALSE") return false;
  cx.error(at, field, "expected true/false, found " + describe(n));
  return std::nullopt;
}

// ---------------------------------------------------------------- Section
// Reports non-scalar keys, duplicate keys and (unless the section is free-form) unknown
// keys, and records where every key's value is.
Section::Section(Context& cx, const YAML::Node& node, Loc at, std::string path, bool free_form)
    : cx_(cx), at_(at), path_(std::move(path)) {
  if (!node.IsDefined() || node.IsNull()) return;  // absent or empty: all defaults
  if (!node.IsMap()) {
    cx_.error(at, path_, "expected a mapping, found " + describe(node));
    return;
  }
  const auto known = schema().find(path_);
  for (auto it = node.begin(); it != node.end(); ++it) {
    const Loc key_at = loc_of(it->first.Mark());
    if (!it->first.IsScalar()) {
      cx_.error(key_at, path_, "expected a plain key, found " + describe(it->first));
      continue;
    }
    const std::string key = it->first.Scalar();
    if (const Entry* first = entry(key)) {
      cx_.error(key_at, field(key),
                "duplicate key '" + key + "' (first written at line " +
                    std::to_string(loc_of(first->key_node.Mark()).line) + ")");
      continue;
    }
    if (!free_form && known != schema().end() &&
        std::find(known->second.begin(), known->second.end(), key) == known->second.end()) {
      cx_.error(key_at, field(key), "unknown key '" + key + "'" + hint(key, known->second));
      continue;
    }
    const Loc value_at = it->second.IsNull() ? key_at : loc_of(it->second.Mark());
    entries_.push_back({key, it->first, it->second, value_at, key_at});
    cx_.spec.locations[field(key)] = {value_at.line, value_at.column};
  }
}

// A close known key, or the section where this key belongs.
std::string Section::hint(const std::string& key, const std::vector<std::string>& known) const {
  if (std::string h = closest(key, known); !h.empty()) return h;
  for (const auto& [section, keys] : schema())
    if (section != path_ && std::find(keys.begin(), keys.end(), key) != keys.end())
      return " (did you mean '" + (section.empty() ? key : section + "." + key) + "'?)";
  return "";
}

// ---------------------------------------------------------------- diagnostics
// File order; diagnostics without a line last.
void sort_by_position(std::vector<Diagnostic>& diags) {
  std::stable_sort(diags.begin(), diags.end(), [](const Diagnostic& a, const Diagnostic& b) {
    auto key = [](const Diagnostic& d) { return std::make_pair(d.line == 0 ? INT32_MAX : d.line, d.column); };
    return key(a) < key(b);
  });
}

}  // namespace halformer::spec_internal
