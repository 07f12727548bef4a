// Read-only, memory-mapped safetensors file (https://github.com/huggingface/safetensors):
// 8-byte little-endian header length, a JSON header, then the raw tensor bytes.
// Every offset is checked against the file before anything is read, so a truncated or
// hostile file gives a clear error instead of an out-of-bounds read.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace halformer {

struct TensorInfo {
  std::string dtype;           // "F32", "F16", "BF16", "I64", ...
  std::vector<int64_t> shape;  // outermost first, as in PyTorch
  const uint8_t* data = nullptr;
  size_t bytes = 0;
  int64_t numel() const;
};

class SafetensorsFile {
 public:
  explicit SafetensorsFile(const std::string& path);  // throws halformer::Error
  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const std::string& path() const { return path_; }
  const std::map<std::string, TensorInfo>& tensors() const { return tensors_; }
  const TensorInfo* find(const std::string& name) const;
  // The header's "__metadata__" (string -> string; empty when the file has none).
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  // Drops the mapped pages of [p, p + bytes) from resident memory once the caller holds
  // its own (converted) copy, so that loading never keeps the file and the weights
  // resident at once. Reading them again faults them back in from the file.
  void release(const void* p, size_t bytes) const;

 private:
  std::string path_;
  void* map_ = nullptr;
  size_t size_ = 0;
  std::map<std::string, TensorInfo> tensors_;
  std::map<std::string, std::string> metadata_;
};

// Writes tensors (row-major) as a safetensors file, atomically (temporary file then
// rename), with optional "__metadata__". Used for --dump and `halformer quantize`.
struct NamedTensor {
  std::string name;
  std::string dtype;  // "F32", "I32", "I8", "BF16"
  std::vector<int64_t> shape;
  const void* data;
};
void write_safetensors(const std::string& path, const std::vector<NamedTensor>& tensors,
                       const std::map<std::string, std::string>& metadata = {});

}  // namespace halformer
