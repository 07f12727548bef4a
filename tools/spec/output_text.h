// Writing generated text, the same way everywhere in tools/: files replaced atomically and
// only when their content changes (so a build sees no new timestamps for an unchanged
// plan), and the one number formatter of generated C++, CMake, YAML and JSON.
#pragma once

#include <filesystem>
#include <string>

namespace halformer {

// Writes `content` to `path` unless the file already holds exactly that: into a temporary
// file in the same directory, then renamed over `path`, so that a reader (or a build
// interrupted half-way) sees the old file or the new one, never a part. Throws
// std::runtime_error when it cannot write.
void write_if_changed(const std::filesystem::path& path, const std::string& content);

// `v` as text. significant_digits 0: the shortest text that reads back as the same double
// ("0.1", "1e-05", "10000"); n > 0: at most n significant digits, as printf's %.<n>g.
std::string format_number(double v, int significant_digits = 0);

// format_number(v) with a '.' always there ("1.0", "1.0e-12"): YAML 1.1 readers (PyYAML)
// take "1e-12" for a string, and JSON / YAML readers then see a float, not an integer.
std::string format_float_literal(double v);

}  // namespace halformer
