// libFuzzer harness: the GGUF reader (tools/import/gguf_file.cpp). The input bytes are
// written to a memfd and opened by path, as `halformer import` opens a model. Either
// GgufFile throws GgufError naming the file, or every tensor it reports has 1-4 positive
// dims, whole blocks per row, an aligned offset, exactly rows x row bytes inside the data
// section apart from the others, every byte readable and (where the type is decoded) every
// row dequantizable; and every metadata value reads back through its typed accessor.
//
//   clang++ -std=c++17 -g -O1 -fsanitize=fuzzer,address,undefined -I tools/import
//           fuzz/gguf_fuzzer.cpp tools/import/gguf_file.cpp -o fuzz_gguf
//   ./fuzz_gguf NEW_CORPUS fuzz/corpus/gguf
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "fuzz_input_file.h"
#include "gguf_file.h"

namespace {

using namespace halformer::import;

void check(bool ok) {
  if (!ok) std::abort();
}

void read_metadata(const GgufFile& f) {
  for (const std::string& key : f.keys()) {
    check(f.has(key));
    (void)f.show(key);
    const ValueType t = f.value_type(key);
    if (t == ValueType::STRING) (void)f.string_value(key);
    if (t == ValueType::BOOL) (void)f.bool_value(key);
    if (t == ValueType::FLOAT32 || t == ValueType::FLOAT64) (void)f.float_value(key);
    if (t != ValueType::ARRAY) continue;
    const ValueType e = f.array_type(key);
    size_t n = 0;
    if (e == ValueType::STRING) n = f.string_array(key).size();
    else if (e == ValueType::FLOAT32 || e == ValueType::FLOAT64) n = f.float_array(key).size();
    else if (e == ValueType::BOOL) n = f.bool_array(key).size();
    else try { n = f.int_array(key).size(); } catch (const GgufError&) { n = f.array_size(key); }  // uint64 > INT64_MAX
    check(n == f.array_size(key));
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = halformer_fuzz::input_file(data, size);
  std::optional<GgufFile> opened;
  try {
    opened.emplace(path);
  } catch (const GgufError& e) {
    check(std::string(e.what()).rfind(path + ": ", 0) == 0);  // names the file
    return 0;
  }
  // Opened: from here on nothing may throw (an exception escaping is a crash).
  const GgufFile& f = *opened;
  check(f.file_size() == size && (f.alignment() & (f.alignment() - 1)) == 0);
  read_metadata(f);
  const uint64_t data_size = size > f.data_offset() ? size - f.data_offset() : 0;
  std::vector<std::pair<uint64_t, uint64_t>> ranges;
  for (const TensorInfo& t : f.tensors()) {
    check(t.dims.size() <= 4 && f.find(t.name) == &t);
    int64_t elements = 1;
    for (int64_t d : t.dims) check(d > 0), elements *= d;
    check(elements == t.elements() && t.row_length() % block_elements(t.type) == 0);
    check(t.bytes == uint64_t(t.rows()) * t.row_bytes() && t.offset % f.alignment() == 0);
    check(t.offset <= data_size && t.bytes <= data_size - t.offset);
    check(t.data - f.tensors()[0].data == int64_t(t.offset) - int64_t(f.tensors()[0].offset));
    uint64_t sum = 0;
    for (uint64_t i = 0; i < t.bytes; ++i) sum += t.data[i];  // every byte readable
    volatile uint64_t sink = sum;
    (void)sink;
    ranges.push_back({t.offset, t.offset + t.bytes});
    if (can_dequantize(t.type)) {
      std::vector<float> row(size_t(t.row_length()));
      for (int64_t r = 0; r < t.rows(); ++r) f.dequantize_rows(t, r, 1, row.data());
    }
  }
  std::sort(ranges.begin(), ranges.end());
  for (size_t i = 1; i < ranges.size(); ++i) check(ranges[i - 1].second <= ranges[i].first);  // apart
  return 0;
}
