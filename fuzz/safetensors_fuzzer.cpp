// libFuzzer harness: the safetensors reader (runtime/safetensors.cpp). The input bytes
// are written to a memfd and opened by path, as the runtime opens weights. Either
// SafetensorsFile throws halformer::Error, or every tensor it reports lies inside the
// file, spans exactly numel x dtype size bytes, does not overlap another, and can be
// read in full.
//
//   clang++ -std=c++17 -g -O1 -fsanitize=fuzzer,address,undefined -I runtime/include \
//     fuzz/safetensors_fuzzer.cpp runtime/safetensors.cpp -o fuzz_safetensors
//   ./fuzz_safetensors -dict=fuzz/safetensors.dict NEW_CORPUS fuzz/corpus/safetensors
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "fuzz_input_file.h"
#include "halformer/error.h"
#include "halformer/safetensors.h"

namespace {

size_t dtype_size(const std::string& d) {
  static const std::map<std::string, size_t> sizes = {
      {"F64", 8}, {"F32", 4}, {"F16", 2}, {"BF16", 2}, {"I64", 8}, {"I32", 4},
      {"I16", 2}, {"I8", 1},  {"U8", 1},  {"BOOL", 1}, {"U16", 2}, {"U32", 4}, {"U64", 8}};
  auto it = sizes.find(d);
  return it == sizes.end() ? 0 : it->second;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = halformer_fuzz::input_file(data, size);
  try {
    halformer::SafetensorsFile f(path);
    uint64_t header = 0;
    for (int i = 7; i >= 0; --i) header = (header << 8) | data[i];
    const uint64_t data_size = size - 8 - header;  // the reader accepted the header length
    std::vector<std::pair<const uint8_t*, const uint8_t*>> ranges;
    uint64_t total = 0;
    for (const auto& [name, t] : f.tensors()) {
      uint64_t numel = 1;
      for (int64_t d : t.shape) {
        if (d < 0) std::abort();
        numel *= uint64_t(d);
      }
      if (dtype_size(t.dtype) == 0 || t.bytes != numel * dtype_size(t.dtype)) std::abort();
      if (t.numel() != int64_t(numel)) std::abort();
      uint64_t sum = 0;
      for (size_t i = 0; i < t.bytes; ++i) sum += t.data[i];  // every byte readable
      volatile uint64_t sink = sum;
      (void)sink;
      if (t.bytes) ranges.push_back({t.data, t.data + t.bytes});
      total += t.bytes;
      if (f.find(name) != &t) std::abort();
    }
    if (total > data_size) std::abort();
    std::sort(ranges.begin(), ranges.end());
    for (size_t i = 1; i < ranges.size(); ++i)
      if (ranges[i - 1].second > ranges[i].first) std::abort();  // overlap
    if (!ranges.empty() && uint64_t(ranges.back().second - ranges.front().first) > data_size)
      std::abort();  // spread wider than the data section
  } catch (const halformer::Error& e) {
    if (std::string(e.what()).rfind(path + ": ", 0) != 0) std::abort();  // names the file
  }
  return 0;
}
