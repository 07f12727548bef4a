// A validated reader of GGUF files (llama.cpp's model format, versions 2 and 3,
// little-endian): the first brick of `halformer import MODEL.gguf`.
//
// Design: the whole file is mapped read-only and checked once, in the constructor, before
// anything is handed out: every length, count and offset is bounded by the file's size
// before it is used (so no input makes the reader allocate more than a small multiple of
// the file, loop past its end or read outside it), every tensor lies inside the data
// section, aligned and apart from the others. Anything wrong is one GgufError,
// "FILE: key 'K': ..." or "FILE: tensor 'T': ...". Metadata is not copied: an entry
// remembers where its value sits and the typed accessors decode it when asked (they
// refuse a wrong type naming the key). Tensor bytes are handed out as they are (a later
// caller keeps Q4_0 / Q8_0 / K-quant blocks) or dequantized row by row to float; the block
// decoders follow the layouts of ggml's ggml-common.h, written from the format's description.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

namespace halformer::import {

// Every problem with a GGUF file, its metadata or its tensors.
struct GgufError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// ggml's tensor types (the numbers are the file's). Types 4, 5, 31-33 and 36-38 were
// removed from ggml or never written to files; a file using one is refused.
enum class GgmlType : uint32_t {
  F32 = 0, F16 = 1, Q4_0 = 2, Q4_1 = 3, Q5_0 = 6, Q5_1 = 7, Q8_0 = 8, Q8_1 = 9,
  Q2_K = 10, Q3_K = 11, Q4_K = 12, Q5_K = 13, Q6_K = 14, Q8_K = 15,
  IQ2_XXS = 16, IQ2_XS = 17, IQ3_XXS = 18, IQ1_S = 19, IQ4_NL = 20, IQ3_S = 21, IQ2_S = 22, IQ4_XS = 23,
  I8 = 24, I16 = 25, I32 = 26, I64 = 27, F64 = 28, IQ1_M = 29, BF16 = 30, TQ1_0 = 34, TQ2_0 = 35, MXFP4 = 39,
};

bool is_known_type(uint32_t type);      // one of GgmlType's values
const char* type_name(GgmlType type);   // "Q4_K"
int64_t block_elements(GgmlType type);  // elements per block: 1 (F32 ...), 32 (Q4_0 ...), 256 (K-quants)
int64_t block_bytes(GgmlType type);     // bytes per block: Q4_0 18, Q8_0 34, Q4_K 144, Q6_K 210, F16 2 ...
// Whether dequantize() decodes the type: all but the IQ*, TQ* and MXFP4 families.
bool can_dequantize(GgmlType type);
// Decodes `elements` (a multiple of block_elements(type)) elements from whole blocks at
// `blocks` into `out`. Throws GgufError for a type can_dequantize() refuses.
void dequantize(GgmlType type, const uint8_t* blocks, int64_t elements, float* out);
// IEEE half and bfloat16 bit patterns to float (exact).
float half_to_float(uint16_t h);
float bf16_to_float(uint16_t b);

// GGUF metadata value types (the numbers are the file's).
enum class ValueType : uint32_t {
  UINT8 = 0, INT8 = 1, UINT16 = 2, INT16 = 3, UINT32 = 4, INT32 = 5, FLOAT32 = 6, BOOL = 7,
  STRING = 8, ARRAY = 9, UINT64 = 10, INT64 = 11, FLOAT64 = 12,
};
const char* value_type_name(ValueType type);  // "uint32", "array" ...

struct TensorInfo {
  std::string name;
  GgmlType type = GgmlType::F32;
  std::vector<int64_t> dims;   // GGUF order: dims[0] (ne[0]) is the row length, the innermost
  uint64_t offset = 0;         // from the start of the data section (a multiple of the alignment)
  uint64_t bytes = 0;          // rows() * row_bytes()
  const uint8_t* data = nullptr;  // in the file's mapping; valid while its GgufFile lives

  int64_t elements() const;       // the product of dims (1 for no dims)
  int64_t row_length() const;     // dims[0] (1 for no dims)
  int64_t rows() const;           // elements() / row_length()
  uint64_t row_bytes() const;     // row_length() / block_elements * block_bytes
};

class GgufFile {
 public:
  // Maps and checks PATH. Throws GgufError naming PATH and what is wrong.
  explicit GgufFile(const std::string& path);

  const std::string& path() const { return path_; }
  uint32_t version() const { return version_; }
  uint64_t alignment() const { return alignment_; }      // general.alignment, default 32
  uint64_t data_offset() const { return data_offset_; }  // where the data section starts
  uint64_t file_size() const { return size_; }

  // ---- metadata. Integer accessors take any integer type whose value fits; the others
  // want exactly their type. Absent or wrong: GgufError "FILE: key 'K': ...".
  bool has(const std::string& key) const { return index_.count(key) > 0; }
  std::vector<std::string> keys() const;             // in file order
  ValueType value_type(const std::string& key) const;
  ValueType array_type(const std::string& key) const;  // an array's element type
  uint64_t array_size(const std::string& key) const;
  uint64_t uint_value(const std::string& key) const;
  int64_t int_value(const std::string& key) const;
  double float_value(const std::string& key) const;  // float32 or float64
  bool bool_value(const std::string& key) const;
  std::string string_value(const std::string& key) const;
  std::vector<std::string> string_array(const std::string& key) const;
  std::vector<float> float_array(const std::string& key) const;    // float32 or float64 elements
  std::vector<int64_t> int_array(const std::string& key) const;    // integer elements
  std::vector<bool> bool_array(const std::string& key) const;
  // The value for a message: "uint32 32", "string 'llama'", "array of 32000 string".
  std::string show(const std::string& key) const;

  // ---- tensors, in file order.
  const std::vector<TensorInfo>& tensors() const { return tensors_; }
  const TensorInfo* find(const std::string& name) const;   // nullptr when absent
  const TensorInfo& tensor(const std::string& name) const;  // throws naming the tensor
  // The raw blocks of one row (row_bytes() bytes), for callers that keep them as they are.
  const uint8_t* row_data(const TensorInfo& t, int64_t row) const;
  // Rows [row0, row0 + rows) as floats: rows * row_length() values into `out`. Throws for
  // rows outside the tensor or a type can_dequantize() refuses, naming the tensor.
  void dequantize_rows(const TensorInfo& t, int64_t row0, int64_t rows, float* out) const;

 private:
  struct Entry {
    std::string key;
    ValueType type;
    ValueType elem;    // arrays: the element type
    uint64_t count;    // arrays: the length
    uint64_t at;       // the value's first byte (for arrays: the first element's)
  };
  const Entry& entry(const std::string& key) const;
  [[noreturn]] void wrong(const Entry& e, const std::string& expected) const;
  void parse();

  struct Unmap {
    uint64_t size;  // no initializer: value-initialized by unique_ptr
    void operator()(const uint8_t* p) const;
  };
  std::string path_;
  std::unique_ptr<const uint8_t, Unmap> mapping_;  // the whole file, read-only (moves with the object)
  const uint8_t* map_ = nullptr;                   // mapping_.get()
  uint64_t size_ = 0;
  uint32_t version_ = 0;
  uint64_t alignment_ = 32;
  uint64_t data_offset_ = 0;
  std::vector<Entry> entries_;
  std::map<std::string, size_t> index_;
  std::vector<TensorInfo> tensors_;
  std::map<std::string, size_t> tensor_index_;
};

}  // namespace halformer::import
