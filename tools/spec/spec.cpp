// The spec parser's entry points (spec.h, docs/spec.md): loading a spec file or text and
// rejecting what is not one YAML mapping (missing file, directory, too big, binary, syntax
// errors, several documents, empty) before parse_root reads its sections (spec_parse.cpp).
// The other files of the parser: spec_yaml.cpp (typed conversions of one YAML node, with
// diagnostics), spec_parse.cpp (the sections -> Spec), spec_validate.cpp (cross-field
// checks), spec_supported.cpp (check_supported), spec_internal.h (what they share);
// spec_names.cpp holds the enums' spellings and spec_defaults.cpp the defaults' listing.
#include <yaml-cpp/eventhandler.h>

#include <cerrno>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "spec_internal.h"

namespace halformer {

using namespace spec_internal;

namespace {
ParseResult fail(const std::string& file, Loc at, const std::string& message) {
  ParseResult r;
  r.diagnostics.push_back({file, at.line, at.column, "", message});
  return r;
}

// Where the text stops being UTF-8 text (NUL and other control bytes count as binary).
std::optional<size_t> first_bad_byte(const std::string& t) {
  for (size_t i = 0; i < t.size();) {
    const unsigned char c = static_cast<unsigned char>(t[i]);
    if (c < 0x80) {
      if ((c < 0x20 && c != '\t' && c != '\n' && c != '\r') || c == 0x7f) return i;
      ++i;
      continue;
    }
    const size_t len = (c & 0xe0) == 0xc0 ? 2 : (c & 0xf0) == 0xe0 ? 3 : (c & 0xf8) == 0xf0 ? 4 : 0;
    if (len == 0 || c == 0xc0 || c == 0xc1 || c > 0xf4 || i + len > t.size()) return i;
    for (size_t k = 1; k < len; ++k)
      if ((static_cast<unsigned char>(t[i + k]) & 0xc0) != 0x80) return i;
    i += len;
  }
  return std::nullopt;
}

// Where the first documents of the text start (at most 3), from yaml-cpp's event parser.
// Not YAML::LoadAll: in yaml-cpp 0.7 it never returns on a stray ',' (jbeder/yaml-cpp#1040):
// the parser keeps starting empty documents at the same token. Here that is a syntax error.
class DocumentStarts : public YAML::EventHandler {
 public:
  std::vector<YAML::Mark> marks;
  void OnDocumentStart(const YAML::Mark& m) override { marks.push_back(m); }
  void OnDocumentEnd() override {}
  void OnNull(const YAML::Mark&, YAML::anchor_t) override {}
  void OnAlias(const YAML::Mark&, YAML::anchor_t) override {}
  void OnScalar(const YAML::Mark&, const std::string&, YAML::anchor_t, const std::string&) override {}
  void OnSequenceStart(const YAML::Mark&, const std::string&, YAML::anchor_t, YAML::EmitterStyle::value) override {}
  void OnSequenceEnd() override {}
  void OnMapStart(const YAML::Mark&, const std::string&, YAML::anchor_t, YAML::EmitterStyle::value) override {}
  void OnMapEnd() override {}
};

std::vector<YAML::Mark> document_starts(const std::string& text) {
  std::istringstream in(text);
  YAML::Parser parser(in);
  DocumentStarts starts;
  auto& m = starts.marks;
  while (m.size() < 3 && parser.HandleNextDocument(starts)) {
    if (m.size() >= 2 && m[m.size() - 1].pos == m[m.size() - 2].pos) {
      const size_t pos = static_cast<size_t>(m.back().pos);
      throw YAML::ParserException(m.back(), "unexpected '" + std::string(1, pos < text.size() ? text[pos] : '?') + "'");
    }
  }
  return m;
}

// yaml-cpp's message for tab indentation does not mention tabs.
std::string tab_hint(const std::string& text, const YAML::Mark& m) {
  if (m.is_null()) return "";
  size_t start = 0;
  for (int line = 0; line < m.line && start != std::string::npos; ++line) {
    start = text.find('\n', start);
    if (start != std::string::npos) ++start;
  }
  for (size_t i = start; i != std::string::npos && i < text.size() && (text[i] == ' ' || text[i] == '\t'); ++i)
    if (text[i] == '\t') return " (this line is indented with a tab; YAML allows only spaces)";
  return "";
}

}  // namespace

ParseResult parse_spec_string(const std::string& text, const std::string& file) {
  try {
    if (text.size() > kMaxFileBytes)
      return fail(file, {},
                  "file is " + std::to_string(text.size()) + " bytes; a spec is a small YAML text file (limit " +
                      std::to_string(kMaxFileBytes) + " bytes)");
    if (auto bad = first_bad_byte(text)) {
      const size_t line_start = text.rfind('\n', *bad) == std::string::npos ? 0 : text.rfind('\n', *bad) + 1;
      const int line = 1 + static_cast<int>(std::count(text.begin(), text.begin() + *bad, '\n'));
      char hex[8];
      std::snprintf(hex, sizeof hex, "0x%02x", static_cast<unsigned char>(text[*bad]));
      return fail(file, {line, static_cast<int>(*bad - line_start) + 1},
                  std::string("not a YAML text file: found byte ") + hex +
                      ", which UTF-8 YAML text cannot contain (binary file?)");
    }
    const std::vector<YAML::Mark> docs = document_starts(text);
    if (docs.size() > 1)
      return fail(file, loc_of(docs[1]), "a second YAML document starts here; a spec file holds exactly one");
    const YAML::Node root = YAML::Load(text);
    if (root.IsNull())
      return fail(file, {}, "empty spec: expected a mapping with at least 'name', 'architecture' and 'sizes'");
    if (!root.IsMap())
      return fail(
          file, loc_of(root.Mark()),
          "expected a mapping of sections (name, architecture, sizes, ...) at the top level, found " + describe(root));
    return parse_root(root, file);
  } catch (const YAML::Exception& e) {  // ParserException and the rest: syntax errors
    return fail(file, loc_of(e.mark), "YAML syntax error: " + e.msg + tab_hint(text, e.mark));
  } catch (const std::exception& e) {
    return fail(file, {}, std::string("cannot parse: ") + e.what());
  }
}

ParseResult parse_spec_file(const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::file_status st = fs::status(path, ec);
  if (!fs::exists(st)) return fail(path, {}, "cannot open spec file: no such file");
  if (fs::is_directory(st)) return fail(path, {}, "cannot read spec file: it is a directory");
  if (!fs::is_regular_file(st)) return fail(path, {}, "cannot read spec file: not a regular file");
  std::ifstream in(path, std::ios::binary);
  if (!in) return fail(path, {}, std::string("cannot open spec file: ") + std::strerror(errno));
  std::ostringstream text;
  text << in.rdbuf();
  if (in.bad()) return fail(path, {}, std::string("cannot read spec file: ") + std::strerror(errno));
  return parse_spec_string(text.str(), path);
}

}  // namespace halformer
