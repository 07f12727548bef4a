// write_if_changed and the number formatter of generated text (output_text.h).
#include "output_text.h"

#include <unistd.h>

#include <charconv>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <system_error>

namespace halformer {

void write_if_changed(const std::filesystem::path& path, const std::string& content) {
  namespace fs = std::filesystem;
  {
    std::ifstream in(path, std::ios::binary);
    if (in) {
      std::stringstream old;
      old << in.rdbuf();
      if (in && old.str() == content) return;
    }
  }
  // One temporary name per process: two writers of the same file never share it.
  fs::path tmp = path;
  tmp += ".tmp" + std::to_string(::getpid());
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    out << content;
    out.flush();
    if (!out) {
      std::error_code ec;
      fs::remove(tmp, ec);
      throw std::runtime_error(tmp.string() + ": cannot write");
    }
  }
  std::error_code ec;
  fs::rename(tmp, path, ec);
  if (ec) {
    std::error_code ignored;
    fs::remove(tmp, ignored);
    throw std::runtime_error(path.string() + ": cannot replace: " + ec.message());
  }
}

std::string format_number(double v, int significant_digits) {
  char buf[64];
  if (significant_digits > 0) {
    std::snprintf(buf, sizeof buf, "%.*g", significant_digits, v);
    return buf;
  }
  const auto [end, ec] = std::to_chars(buf, buf + sizeof buf, v);  // shortest round trip
  return std::string(buf, ec == std::errc() ? end : buf);
}

std::string format_float_literal(double v) {
  std::string s = format_number(v);
  if (s.find('e') != std::string::npos && s.find('.') == std::string::npos) s.insert(s.find('e'), ".0");
  if (s.find_first_of(".ein") == std::string::npos) s += ".0";  // not "inf" / "nan"
  return s;
}

}  // namespace halformer
