#include "halformer/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <limits>
#include <set>
#include <nlohmann/json.hpp>

#include "halformer/error.h"

namespace halformer {
namespace {

size_t dtype_size(const std::string& dtype) {
  static const std::map<std::string, size_t> sizes = {
      {"F64", 8}, {"F32", 4}, {"F16", 2}, {"BF16", 2}, {"I64", 8}, {"I32", 4},
      {"I16", 2}, {"I8", 1},  {"U8", 1},  {"BOOL", 1}, {"U16", 2}, {"U32", 4}, {"U64", 8}};
  auto it = sizes.find(dtype);
  return it == sizes.end() ? 0 : it->second;
}

constexpr uint64_t kMaxHeader = 100u << 20;  // the format's own limit is 100 MB

}  // namespace

int64_t TensorInfo::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

SafetensorsFile::SafetensorsFile(const std::string& path) : path_(path) {
  auto fail = [&](const std::string& what) { throw Error(path + ": " + what); };
  // O_NONBLOCK: opening a FIFO must not wait for a writer (it is refused just below).
  int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) fail(std::string("cannot open weights file: ") + std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    fail("not a regular file");
  }
  size_ = static_cast<size_t>(st.st_size);
  if (size_ < 8) {
    ::close(fd);
    fail("too small to be a safetensors file (" + std::to_string(size_) + " bytes; need >= 8)");
  }
  map_ = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd, 0);
  ::close(fd);
  if (map_ == MAP_FAILED) {
    map_ = nullptr;
    fail(std::string("mmap failed: ") + std::strerror(errno));
  }
  const auto* bytes = static_cast<const uint8_t*>(map_);
  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | bytes[i];
  if (header_len > kMaxHeader || header_len > size_ - 8) {
    fail("header length " + std::to_string(header_len) + " runs past the end of the file (" +
         std::to_string(size_) + " bytes): truncated or not a safetensors file");
  }
  nlohmann::json header;
  // A tensor named twice would be ambiguous (the JSON library keeps one of them).
  std::set<std::string> names;
  std::string duplicate;
  auto on_key = [&](int depth, nlohmann::json::parse_event_t event, nlohmann::json& parsed) {
    if (event == nlohmann::json::parse_event_t::key && depth == 1 && duplicate.empty() &&
        !names.insert(parsed.get<std::string>()).second)
      duplicate = parsed.get<std::string>();
    return true;
  };
  try {
    header = nlohmann::json::parse(bytes + 8, bytes + 8 + header_len, on_key);
  } catch (const nlohmann::json::exception& e) {
    fail(std::string("malformed JSON header: ") + e.what());
  }
  if (!duplicate.empty()) fail("tensor '" + duplicate + "' appears more than once in the header (duplicate name)");
  if (!header.is_object()) fail("JSON header is not an object");
  const uint8_t* data = bytes + 8 + header_len;
  const size_t data_size = size_ - 8 - header_len;

  std::vector<std::pair<size_t, std::pair<size_t, std::string>>> ranges;
  for (auto& item : header.items()) {
    // Not a structured binding: lambdas below capture `name` (C++20, clang 14 refuses).
    const std::string name = item.key();
    auto& entry = item.value();
    if (name == "__metadata__") {
      if (!entry.is_object()) fail("'__metadata__' is not an object");
      for (auto& m : entry.items()) {
        if (!m.value().is_string()) fail("'__metadata__' entry '" + m.key() + "' is not a string");
        metadata_[m.key()] = m.value().get<std::string>();
      }
      continue;
    }
    auto bad = [&](const std::string& what) { fail("tensor '" + name + "': " + what); };
    if (!entry.is_object()) bad("entry is not an object");
    if (!entry.contains("dtype") || !entry["dtype"].is_string()) bad("missing string 'dtype'");
    if (!entry.contains("shape") || !entry["shape"].is_array()) bad("missing array 'shape'");
    if (!entry.contains("data_offsets") || !entry["data_offsets"].is_array() ||
        entry["data_offsets"].size() != 2)
      bad("missing 'data_offsets' [begin, end]");
    TensorInfo t;
    t.dtype = entry["dtype"].get<std::string>();
    size_t esize = dtype_size(t.dtype);
    if (esize == 0) bad("unknown dtype '" + t.dtype + "'");
    uint64_t numel = 1;
    for (auto& d : entry["shape"]) {
      if (!d.is_number_unsigned()) bad("shape entries must be non-negative integers");
      uint64_t v = d.get<uint64_t>();
      if (v != 0 && numel > std::numeric_limits<uint64_t>::max() / 8 / v) bad("shape overflows");
      numel *= v;
      t.shape.push_back(static_cast<int64_t>(v));
    }
    auto& off = entry["data_offsets"];
    if (!off[0].is_number_unsigned() || !off[1].is_number_unsigned())
      bad("data_offsets must be non-negative integers");
    uint64_t begin = off[0].get<uint64_t>(), end = off[1].get<uint64_t>();
    if (begin > end || end > data_size)
      bad("data_offsets [" + std::to_string(begin) + ", " + std::to_string(end) +
          ") outside the data section (" + std::to_string(data_size) + " bytes)");
    if (end - begin != numel * esize)
      bad("data_offsets span " + std::to_string(end - begin) + " bytes but dtype " + t.dtype +
          " and shape need " + std::to_string(numel * esize));
    t.data = data + begin;
    t.bytes = end - begin;
    ranges.push_back({begin, {end, name}});
    tensors_.emplace(name, std::move(t));
  }
  std::sort(ranges.begin(), ranges.end());
  for (size_t i = 1; i < ranges.size(); ++i) {
    if (ranges[i].first < ranges[i - 1].second.first)
      fail("tensors '" + ranges[i - 1].second.second + "' and '" + ranges[i].second.second +
           "' overlap in the data section");
  }
}

SafetensorsFile::~SafetensorsFile() {
  if (map_) ::munmap(map_, size_);
}

const TensorInfo* SafetensorsFile::find(const std::string& name) const {
  auto it = tensors_.find(name);
  return it == tensors_.end() ? nullptr : &it->second;
}

void SafetensorsFile::release(const void* p, size_t bytes) const {
  const uintptr_t page = uintptr_t(::sysconf(_SC_PAGESIZE));
  const uintptr_t lo = uintptr_t(p) & ~(page - 1), end = uintptr_t(p) + bytes;
  const uintptr_t map_end = uintptr_t(map_) + size_;
  if (!map_ || bytes == 0 || uintptr_t(p) < uintptr_t(map_) || end > map_end) return;
  // Whole pages around the range: a neighbour's page dropped too is read back on use.
  const uintptr_t hi = std::min(map_end, (end + page - 1) & ~(page - 1));
  ::madvise(reinterpret_cast<void*>(lo), hi - lo, MADV_DONTNEED);
}

void write_safetensors(const std::string& path, const std::vector<NamedTensor>& tensors,
                       const std::map<std::string, std::string>& metadata) {
  nlohmann::json header = nlohmann::json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  size_t offset = 0;
  std::vector<size_t> sizes;
  for (const auto& t : tensors) {
    size_t n = 1;
    for (int64_t d : t.shape) n *= static_cast<size_t>(d);
    size_t bytes = n * dtype_size(t.dtype);
    header[t.name] = {{"dtype", t.dtype}, {"shape", t.shape}, {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
    sizes.push_back(bytes);
  }
  std::string h = header.dump();
  while ((h.size() + 8) % 8) h.push_back(' ');  // keep the data section 8-byte aligned
  std::string tmp = path + ".tmp";
  FILE* f = std::fopen(tmp.c_str(), "wb");
  if (!f) throw Error(path + ": cannot write: " + std::strerror(errno));
  uint64_t len = h.size();
  uint8_t le[8];
  for (int i = 0; i < 8; ++i) le[i] = static_cast<uint8_t>(len >> (8 * i));
  bool ok = std::fwrite(le, 1, 8, f) == 8 && std::fwrite(h.data(), 1, h.size(), f) == h.size();
  for (size_t i = 0; ok && i < tensors.size(); ++i)
    ok = std::fwrite(tensors[i].data, 1, sizes[i], f) == sizes[i];
  ok = (std::fclose(f) == 0) && ok;
  if (!ok || std::rename(tmp.c_str(), path.c_str()) != 0) {
    std::remove(tmp.c_str());
    throw Error(path + ": write failed: " + std::strerror(errno));
  }
}

}  // namespace halformer
