// The GGUF reader (tools/import/gguf_file.h). Files are built here, byte by byte (Builder),
// so each test states exactly what the file holds:
//  * Values: every metadata type through its accessor; every tensor type dequantized
//    against values computed by hand (F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0 ...) or, for
//    the K-quants, against decoders written here per element from the format's description.
//  * Refusals: each malformed file gives a GgufError naming the file and the key or tensor.
//  * Robustness: every prefix of a valid file and seeded random corruptions of it open or
//    throw GgufError (the fuzzer, fuzz/gguf_fuzzer.cpp, does this at length).
//  * PypiCompat: files written by PyPI's gguf package (make_gguf.py) read back as its own
//    dequantize() reads them; skipped unless HALFORMER_GGUF_PYPI_DIR is set (ctest sets it).
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "gguf_file.h"

namespace fs = std::filesystem;
using namespace halformer::import;

namespace {

// ------------------------------------------------------------------ building GGUF bytes
struct Bytes {
  std::string b;
  Bytes& u8(uint8_t v) { return b.push_back(char(v)), *this; }
  Bytes& u16(uint16_t v) { return u8(v & 255).u8(v >> 8); }
  Bytes& u32(uint32_t v) { return u16(v & 0xffff).u16(v >> 16); }
  Bytes& u64(uint64_t v) { return u32(uint32_t(v)).u32(uint32_t(v >> 32)); }
  Bytes& f32(float f) { uint32_t v; std::memcpy(&v, &f, 4); return u32(v); }
  Bytes& f64(double f) { uint64_t v; std::memcpy(&v, &f, 8); return u64(v); }
  Bytes& str(const std::string& s) { return u64(s.size()), b += s, *this; }
  Bytes& raw(const std::string& s) { return b += s, *this; }
};

struct Tensor {
  std::string name;
  std::vector<uint64_t> dims;
  uint32_t type;
  std::string data;
  int64_t offset = -1;  // -1: the next aligned place
};

struct Builder {
  uint32_t version = 3;
  uint64_t alignment = 32;                 // where data is placed (general.alignment is a kv like any other)
  std::vector<std::string> kvs;            // each entry's bytes
  std::vector<Tensor> tensors;
  int64_t n_kv = -1, n_tensors = -1;       // -1: the real counts

  Builder& kv(const std::string& key, ValueType t, const Bytes& v) {
    kvs.push_back(Bytes().str(key).u32(uint32_t(t)).raw(v.b).b);
    return *this;
  }
  Builder& kv_u32(const std::string& key, uint32_t v) { return kv(key, ValueType::UINT32, Bytes().u32(v)); }
  Builder& kv_str(const std::string& key, const std::string& v) { return kv(key, ValueType::STRING, Bytes().str(v)); }
  Builder& tensor(Tensor t) { return tensors.push_back(std::move(t)), *this; }

  std::string bytes() const {
    Bytes out;
    out.raw("GGUF").u32(version).u64(n_tensors >= 0 ? uint64_t(n_tensors) : tensors.size());
    out.u64(n_kv >= 0 ? uint64_t(n_kv) : kvs.size());
    for (const std::string& k : kvs) out.raw(k);
    std::vector<uint64_t> offsets;
    uint64_t next = 0;
    for (const Tensor& t : tensors) {
      const uint64_t off = t.offset >= 0 ? uint64_t(t.offset) : next;
      offsets.push_back(off);
      next = std::max(next, (off + t.data.size() + alignment - 1) / alignment * alignment);
      out.str(t.name).u32(uint32_t(t.dims.size()));
      for (uint64_t d : t.dims) out.u64(d);
      out.u32(t.type).u64(off);
    }
    out.b.resize((out.b.size() + alignment - 1) / alignment * alignment, '\0');
    const size_t data = out.b.size();
    for (size_t i = 0; i < tensors.size(); ++i) {
      if (out.b.size() < data + offsets[i] + tensors[i].data.size()) out.b.resize(data + offsets[i] + tensors[i].data.size());
      std::memcpy(&out.b[data + offsets[i]], tensors[i].data.data(), tensors[i].data.size());
    }
    return out.b;
  }
};

// Test files go to a directory of this process's own, removed at exit.
const fs::path& scratch_dir() {
  static const struct Dir {
    fs::path path = fs::temp_directory_path() / ("halformer-gguf-test-" + std::to_string(::getpid()));
    ~Dir() { std::error_code ec; fs::remove_all(path, ec); }
  } dir;
  return dir.path;
}
std::string scratch(const std::string& name) {
  fs::create_directories(scratch_dir());
  return (scratch_dir() / name).string();
}
std::string write(const std::string& name, const std::string& bytes) {
  const std::string path = scratch(name);
  std::ofstream(path, std::ios::binary).write(bytes.data(), std::streamsize(bytes.size()));
  return path;
}
std::vector<float> all_rows(const GgufFile& f, const std::string& name) {
  const TensorInfo& t = f.tensor(name);
  std::vector<float> out(size_t(t.elements()));
  f.dequantize_rows(t, 0, t.rows(), out.data());
  return out;
}
uint16_t half_bits(float x) {  // exact for the halves used here (normal, representable)
  uint32_t v;
  std::memcpy(&v, &x, 4);
  return uint16_t((v >> 16 & 0x8000) | (((v >> 23 & 255) - 112) << 10) | (v >> 13 & 0x3ff));
}
std::string seeded_bytes(size_t n, unsigned seed) {
  std::mt19937 rng(seed);
  std::string s(n, '\0');
  for (char& c : s) c = char(rng() & 255);
  return s;
}
// Sets the f16 at `at` in every block (size `bytes`) to a small positive scale.
void set_scale(std::string& data, size_t bytes, size_t at, unsigned seed) {
  std::mt19937 rng(seed);
  for (size_t b = 0; b + bytes <= data.size(); b += bytes) {
    const uint16_t h = half_bits(float(1 + rng() % 64) / 1024.0f);
    data[b + at] = char(h & 255), data[b + at + 1] = char(h >> 8);
  }
}

// ----------------------------------------------- K-quant references, one element at a time
// A 6-bit scale (w = 0) or min (w = 1) of sub-block j from Q4_K/Q5_K's 12 bytes.
int k4_scale(const uint8_t* s, int j, int w) {
  if (j < 4) return s[j + 4 * w] & 63;
  return (w ? s[j + 4] >> 4 : s[j + 4] & 15) | (s[j - 4 * (1 - w)] >> 6) << 4;
}
float ref_q4_k(const uint8_t* b, int i, bool five) {  // Q5_K: one more bit from qh
  const int sub = i / 32, l = i % 32, nib = (b[(five ? 48 : 16) + 32 * (sub / 2) + l] >> 4 * (sub % 2)) & 15;
  const int q = nib + (five ? ((b[16 + l] >> sub) & 1) * 16 : 0);
  return half_to_float(uint16_t(b[0] | b[1] << 8)) * float(k4_scale(b + 4, sub, 0)) * float(q) -
         half_to_float(uint16_t(b[2] | b[3] << 8)) * float(k4_scale(b + 4, sub, 1));
}
float ref_q6_k(const uint8_t* b, int i) {
  const int half = i / 128, k = i % 128 / 32, l = i % 32;
  const int lo = (b[64 * half + 32 * (k % 2) + l] >> 4 * (k / 2)) & 15, hi = (b[128 + 32 * half + l] >> 2 * k) & 3;
  const float d = half_to_float(uint16_t(b[208] | b[209] << 8));
  return d * float(int8_t(b[192 + 8 * half + 2 * k + l / 16])) * float((lo | hi << 4) - 32);
}
float ref_q2_k(const uint8_t* b, int i) {
  const int half = i / 128, g = i % 128 / 32, h = i % 32 / 16, l = i % 16, sc = b[8 * half + 2 * g + h];
  const int q = (b[16 + 32 * half + 16 * h + l] >> 2 * g) & 3;
  return half_to_float(uint16_t(b[80] | b[81] << 8)) * float(sc & 15) * float(q) -
         half_to_float(uint16_t(b[82] | b[83] << 8)) * float(sc >> 4);
}
float ref_q3_k(const uint8_t* b, int i) {
  const int half = i / 128, g = i % 128 / 32, h = i % 32 / 16, idx = 16 * h + i % 16, j = 8 * half + 2 * g + h;
  const int low = (b[96 + j % 8] >> 4 * (j / 8)) & 15, high = (b[104 + j % 4] >> 2 * (j / 4)) & 3;
  const int q = ((b[32 + 32 * half + idx] >> 2 * g) & 3) - ((b[idx] >> (4 * half + g)) & 1 ? 0 : 4);
  return half_to_float(uint16_t(b[108] | b[109] << 8)) * float((low | high << 4) - 32) * float(q);
}

// Expects opening `bytes` to throw a GgufError whose message holds the path and each of `parts`.
void expect_refused(const std::string& name, const std::string& bytes, const std::vector<std::string>& parts) {
  const std::string path = write(name + ".gguf", bytes);
  try {
    GgufFile f(path);
    ADD_FAILURE() << name << ": opened";
  } catch (const GgufError& e) {
    const std::string m = e.what();
    EXPECT_EQ(m.rfind(path + ": ", 0), 0u) << m;
    for (const std::string& p : parts) EXPECT_NE(m.find(p), std::string::npos) << name << ": '" << p << "' not in: " << m;
  }
}

Tensor f32_tensor(const std::string& name, std::vector<uint64_t> dims) {
  Bytes b;
  uint64_t n = 1;
  for (uint64_t d : dims) n *= d;
  for (uint64_t i = 0; i < n; ++i) b.f32(float(i) * 0.5f - 1.0f);
  return {name, std::move(dims), 0, b.b};
}

}  // namespace

// ------------------------------------------------------------------------------ values
TEST(GgufValues, EveryMetadataType) {
  Builder g;
  g.kv_str("general.architecture", "llama").kv_u32("llama.block_count", 2);
  g.kv("u8", ValueType::UINT8, Bytes().u8(200)).kv("i8", ValueType::INT8, Bytes().u8(0xfe));
  g.kv("u16", ValueType::UINT16, Bytes().u16(60000)).kv("i16", ValueType::INT16, Bytes().u16(0x8000));
  g.kv("i32", ValueType::INT32, Bytes().u32(uint32_t(-7))).kv("u64", ValueType::UINT64, Bytes().u64(~0ull));
  g.kv("i64", ValueType::INT64, Bytes().u64(uint64_t(-5))).kv("f32", ValueType::FLOAT32, Bytes().f32(1e-5f));
  g.kv("f64", ValueType::FLOAT64, Bytes().f64(0.1)).kv("yes", ValueType::BOOL, Bytes().u8(1));
  g.kv("tokens", ValueType::ARRAY, Bytes().u32(8).u64(3).str("<s>").str("").str("h\xc3\xa9"));
  g.kv("scores", ValueType::ARRAY, Bytes().u32(6).u64(2).f32(-1.5f).f32(2.0f));
  g.kv("types", ValueType::ARRAY, Bytes().u32(5).u64(3).u32(1).u32(uint32_t(-2)).u32(3));
  g.kv("flags", ValueType::ARRAY, Bytes().u32(7).u64(2).u8(0).u8(1)).kv("empty", ValueType::ARRAY, Bytes().u32(4).u64(0));
  const GgufFile f(write("values.gguf", g.bytes()));
  EXPECT_EQ(f.version(), 3u);
  EXPECT_EQ(f.keys().size(), 17u);
  EXPECT_EQ(f.keys()[0], "general.architecture");
  EXPECT_EQ(f.string_value("general.architecture"), "llama");
  EXPECT_EQ(f.uint_value("llama.block_count"), 2u);
  EXPECT_EQ(f.uint_value("u8"), 200u);
  EXPECT_EQ(f.int_value("i8"), -2);
  EXPECT_EQ(f.uint_value("u16"), 60000u);
  EXPECT_EQ(f.int_value("i16"), -32768);
  EXPECT_EQ(f.int_value("i32"), -7);
  EXPECT_EQ(f.uint_value("u64"), ~0ull);
  EXPECT_EQ(f.int_value("i64"), -5);
  EXPECT_EQ(f.float_value("f32"), double(1e-5f));
  EXPECT_EQ(f.float_value("f64"), 0.1);
  EXPECT_TRUE(f.bool_value("yes"));
  EXPECT_EQ(f.string_array("tokens"), (std::vector<std::string>{"<s>", "", "h\xc3\xa9"}));
  EXPECT_EQ(f.float_array("scores"), (std::vector<float>{-1.5f, 2.0f}));
  EXPECT_EQ(f.int_array("types"), (std::vector<int64_t>{1, -2, 3}));
  EXPECT_EQ(f.bool_array("flags"), (std::vector<bool>{false, true}));
  EXPECT_EQ(f.array_size("empty"), 0u);
  EXPECT_EQ(f.array_type("tokens"), ValueType::STRING);
  EXPECT_EQ(f.show("tokens"), "array of 3 string");
  EXPECT_EQ(f.show("i32"), "int32 -7");
  EXPECT_EQ(f.show("general.architecture"), "string 'llama'");
  EXPECT_TRUE(f.has("u8"));
  EXPECT_FALSE(f.has("llama.context_length"));
  EXPECT_TRUE(f.tensors().empty());
  // Absent or of the wrong type: the key is named.
  auto refused = [&](auto call, const std::string& text) {
    try {
      call();
      ADD_FAILURE() << "no error: " << text;
    } catch (const GgufError& e) {
      EXPECT_NE(std::string(e.what()).find(text), std::string::npos) << e.what();
    }
  };
  refused([&] { f.uint_value("llama.context_length"); }, "key 'llama.context_length': missing");
  refused([&] { f.uint_value("i32"); }, "key 'i32': expected an unsigned integer, found int32 -7");
  refused([&] { f.int_value("u64"); }, "key 'u64': expected an int64 integer");
  refused([&] { f.string_value("u8"); }, "key 'u8': expected a string, found uint8 200");
  refused([&] { f.float_value("u8"); }, "key 'u8': expected a float32 or float64");
  refused([&] { f.string_array("scores"); }, "key 'scores': expected an array of strings, found array of 2 float32");
  refused([&] { f.float_array("general.architecture"); }, "key 'general.architecture': expected an array of floats");
  refused([&] { f.int_array("tokens"); }, "key 'tokens': expected an array of integers");
  refused([&] { f.bool_value("flags"); }, "key 'flags': expected a bool");
}

TEST(GgufValues, FloatTypesAndLayout) {
  Builder g;
  g.version = 2;
  g.kv("general.alignment", ValueType::UINT32, Bytes().u32(64));
  g.alignment = 64;
  g.tensor(f32_tensor("a", {3, 2})).tensor(f32_tensor("b", {5}));
  g.tensor({"half", {7}, 1, Bytes().u16(0x3c00).u16(0xc000).u16(0x3555).u16(0x0001).u16(0x7bff).u16(0x8000).u16(0x7c00).b});
  g.tensor({"bf16", {3}, 30, Bytes().u16(0x3f80).u16(0xc040).u16(0x4049).b});
  g.tensor({"ints", {4}, 24, Bytes().u8(0x80).u8(0).u8(1).u8(0x7f).b});
  g.tensor({"f64", {2}, 28, Bytes().f64(0.25).f64(-3.0).b});
  const GgufFile f(write("floats.gguf", g.bytes()));
  EXPECT_EQ(f.version(), 2u);
  EXPECT_EQ(f.alignment(), 64u);
  EXPECT_EQ(f.data_offset() % 64, 0u);
  const TensorInfo& a = f.tensor("a");
  EXPECT_EQ(a.dims, (std::vector<int64_t>{3, 2}));
  EXPECT_EQ(a.row_length(), 3);
  EXPECT_EQ(a.rows(), 2);
  EXPECT_EQ(a.bytes, 24u);
  EXPECT_EQ(f.tensor("b").offset, 64u);
  std::vector<float> row(3);
  f.dequantize_rows(a, 1, 1, row.data());
  EXPECT_EQ(row, (std::vector<float>{0.5f, 1.0f, 1.5f}));
  const std::vector<float> h = all_rows(f, "half");
  EXPECT_EQ(h[0], 1.0f);
  EXPECT_EQ(h[1], -2.0f);
  EXPECT_EQ(h[2], 0.333251953125f);
  EXPECT_EQ(h[3], std::ldexp(1.0f, -24));  // the smallest subnormal
  EXPECT_EQ(h[4], 65504.0f);
  EXPECT_TRUE(h[5] == 0.0f && std::signbit(h[5]));
  EXPECT_TRUE(std::isinf(h[6]));
  EXPECT_EQ(all_rows(f, "bf16"), (std::vector<float>{1.0f, -3.0f, 3.140625f}));
  EXPECT_EQ(all_rows(f, "ints"), (std::vector<float>{-128.0f, 0.0f, 1.0f, 127.0f}));
  EXPECT_EQ(all_rows(f, "f64"), (std::vector<float>{0.25f, -3.0f}));
  EXPECT_EQ(f.find("nope"), nullptr);
  EXPECT_THROW(f.tensor("nope"), GgufError);
  EXPECT_THROW(f.dequantize_rows(a, 1, 2, row.data()), GgufError);
  EXPECT_THROW(f.dequantize_rows(a, -1, 1, row.data()), GgufError);
}

TEST(GgufValues, LegacyQuantsByHand) {
  // Q4_0, d = 0.5: byte j holds element j (low nibble, j) and element j + 16 (high, 15 - j).
  Bytes q40;
  q40.u16(half_bits(0.5f));
  for (int j = 0; j < 16; ++j) q40.u8(uint8_t(j | (15 - j) << 4));
  // Q4_1, d = 0.25, m = -1: the same nibbles.
  Bytes q41;
  q41.u16(half_bits(0.25f)).u16(half_bits(-1.0f)).raw(q40.b.substr(2));
  // Q5_0 / Q5_1: nibbles j / 15 - j, fifth bits set for even elements (qh = 0x55555555).
  Bytes q50, q51;
  q50.u16(half_bits(0.5f)).u32(0x55555555).raw(q40.b.substr(2));
  q51.u16(half_bits(0.5f)).u16(half_bits(2.0f)).u32(0x55555555).raw(q40.b.substr(2));
  // Q8_0, two rows of one block: d = 0.125 and 2, qs = j - 16.
  Bytes q80, q81, q8k;
  for (float d : {0.125f, 2.0f}) {
    q80.u16(half_bits(d));
    for (int j = 0; j < 32; ++j) q80.u8(uint8_t(j - 16));
  }
  q81.u16(half_bits(0.125f)).u16(0).raw(q80.b.substr(2, 32));
  q8k.f32(0.01f);
  for (int j = 0; j < 256; ++j) q8k.u8(uint8_t(j));
  q8k.raw(std::string(32, '\0'));
  Builder g;
  g.tensor({"q4_0", {32}, 2, q40.b}).tensor({"q4_1", {32}, 3, q41.b}).tensor({"q5_0", {32}, 6, q50.b});
  g.tensor({"q5_1", {32}, 7, q51.b}).tensor({"q8_0", {32, 2}, 8, q80.b}).tensor({"q8_1", {32}, 9, q81.b});
  g.tensor({"q8_k", {256}, 15, q8k.b});
  const GgufFile f(write("legacy.gguf", g.bytes()));
  const std::vector<float> a = all_rows(f, "q4_0"), b = all_rows(f, "q4_1"), c = all_rows(f, "q5_0"),
                           d = all_rows(f, "q5_1"), e = all_rows(f, "q8_0"), k = all_rows(f, "q8_k");
  for (int j = 0; j < 16; ++j) {
    EXPECT_EQ(a[j], float(j - 8) * 0.5f);
    EXPECT_EQ(a[j + 16], float(7 - j) * 0.5f);
    EXPECT_EQ(b[j], float(j) * 0.25f - 1.0f);
    EXPECT_EQ(b[j + 16], float(15 - j) * 0.25f - 1.0f);
    const int hi = j % 2 == 0 ? 16 : 0;  // elements j and j + 16 share the parity of j
    EXPECT_EQ(c[j], float(j + hi - 16) * 0.5f);
    EXPECT_EQ(c[j + 16], float(15 - j + hi - 16) * 0.5f);
    EXPECT_EQ(d[j], float(j + hi) * 0.5f + 2.0f);
  }
  for (int j = 0; j < 32; ++j) {
    EXPECT_EQ(e[j], float(j - 16) * 0.125f);
    EXPECT_EQ(e[32 + j], float(j - 16) * 2.0f);
  }
  EXPECT_EQ(all_rows(f, "q8_1"), std::vector<float>(e.begin(), e.begin() + 32));
  for (int j = 0; j < 256; ++j) EXPECT_EQ(k[j], float(int8_t(j)) * 0.01f);
  // Raw blocks as they are: row 1 of q8_0 is its second 34-byte block.
  const TensorInfo& t = f.tensor("q8_0");
  EXPECT_EQ(t.row_bytes(), 34u);
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(f.row_data(t, 1)), 34), q80.b.substr(34));
  EXPECT_THROW(f.row_data(t, 2), GgufError);
}

TEST(GgufValues, KQuantsAgainstElementwiseReference) {
  struct Case { const char* name; uint32_t type; size_t bytes; std::vector<size_t> scales; };
  const std::vector<Case> cases = {{"q2_k", 10, 84, {80, 82}}, {"q3_k", 11, 110, {108}}, {"q4_k", 12, 144, {0, 2}},
                                   {"q5_k", 13, 176, {0, 2}}, {"q6_k", 14, 210, {208}}};
  Builder g;
  for (size_t c = 0; c < cases.size(); ++c) {
    std::string data = seeded_bytes(cases[c].bytes * 4, unsigned(c));  // 2 rows x 2 blocks
    for (size_t at : cases[c].scales) set_scale(data, cases[c].bytes, at, unsigned(c * 10 + at));
    g.tensor({cases[c].name, {512, 2}, cases[c].type, data});
  }
  const GgufFile f(write("kquants.gguf", g.bytes()));
  for (const Case& c : cases) {
    const TensorInfo& t = f.tensor(c.name);
    EXPECT_EQ(t.row_bytes(), 2 * c.bytes);
    EXPECT_EQ(block_elements(t.type), 256);
    std::vector<float> got(512);
    f.dequantize_rows(t, 1, 1, got.data());  // the second row: blocks 2 and 3
    for (int i = 0; i < 512; ++i) {
      const uint8_t* b = t.data + (2 + i / 256) * c.bytes;
      const int k = i % 256;
      const float want = c.type == 10 ? ref_q2_k(b, k) : c.type == 11 ? ref_q3_k(b, k)
                       : c.type == 14 ? ref_q6_k(b, k) : ref_q4_k(b, k, c.type == 13);
      ASSERT_NEAR(got[i], want, 1e-6f * std::max(1.0f, std::fabs(want))) << c.name << " element " << i;
    }
  }
}

TEST(GgufValues, TypeTableAndUndecodedTypes) {
  EXPECT_EQ(block_bytes(GgmlType::Q4_0), 18);
  EXPECT_EQ(block_bytes(GgmlType::Q8_0), 34);
  EXPECT_EQ(block_bytes(GgmlType::Q4_K), 144);
  EXPECT_EQ(block_bytes(GgmlType::Q6_K), 210);
  EXPECT_EQ(block_elements(GgmlType::Q4_0), 32);
  EXPECT_EQ(block_elements(GgmlType::BF16), 1);
  EXPECT_STREQ(type_name(GgmlType::Q5_K), "Q5_K");
  EXPECT_FALSE(is_known_type(4));
  EXPECT_FALSE(can_dequantize(GgmlType::IQ2_XXS));
  Builder g;
  g.tensor({"blk.0.ffn_up.weight", {256}, 16, std::string(66, '\0')});
  GgufFile opened(write("iq.gguf", g.bytes()));
  const GgufFile f(std::move(opened));  // the mapping moves with it
  EXPECT_EQ(f.tensors()[0].data[65], 0);
  std::vector<float> out(256);
  try {
    f.dequantize_rows(f.tensors()[0], 0, 1, out.data());
    ADD_FAILURE();
  } catch (const GgufError& e) {
    EXPECT_NE(std::string(e.what()).find("tensor 'blk.0.ffn_up.weight': dequantizing IQ2_XXS is not supported"),
              std::string::npos) << e.what();
  }
}

// ---------------------------------------------------------------------------- refusals
TEST(GgufRefusals, FileAndHeader) {
  EXPECT_THROW(GgufFile(scratch("missing.gguf")), GgufError);
  EXPECT_THROW(GgufFile(fs::temp_directory_path().string()), GgufError);
  expect_refused("empty", "", {"header: truncated (0 bytes)"});
  expect_refused("magic", "GGML" + std::string(40, '\0'), {"header: not a GGUF file (magic 'GGML'"});
  expect_refused("short_header", std::string("GGUF\x03\0\0\0", 8), {"header: truncated header"});
  Builder g;
  g.version = 1;
  expect_refused("version1", g.bytes(), {"GGUF version 1 is not supported"});
  g.version = 0x03000000;
  expect_refused("big_endian", g.bytes(), {"big-endian"});
  g.version = 3, g.n_kv = int64_t(1) << 60;
  expect_refused("absurd_kv", g.bytes(), {"header: 1152921504606846976 metadata entries"});
  g.n_kv = -1, g.n_tensors = 1000;
  expect_refused("absurd_tensors", g.bytes(), {"1000 tensors cannot fit"});
}

TEST(GgufRefusals, Metadata) {
  auto one = [](ValueType t, const Bytes& v) { Builder g; g.kv("general.name", t, v); return g.bytes(); };
  Builder long_key;
  long_key.kvs.push_back(Bytes().u64(1000).raw(std::string(20, 'a')).b);
  expect_refused("key_length", long_key.bytes(), {"metadata entry #0: key of 1000 bytes runs past the end"});
  long_key.kvs[0] = Bytes().u64(~0ull).raw(std::string(20, 'a')).b;
  expect_refused("key_length_max", long_key.bytes(), {"metadata entry #0: key of 18446744073709551615 bytes runs"});
  const std::string good = one(ValueType::STRING, Bytes().str("tiny"));  // 60 bytes, then padding
  expect_refused("truncated_value", good.substr(0, 58), {"key 'general.name': string of 4 bytes"});
  expect_refused("string_length", one(ValueType::STRING, Bytes().u64(~0ull)), {"key 'general.name': string of"});
  expect_refused("truncated_type", good.substr(0, 24 + 8 + 12 + 2), {"key 'general.name': truncated value type"});
  expect_refused("unknown_type", one(ValueType(13), Bytes().u32(0)), {"key 'general.name': unknown value type 13"});
  expect_refused("array_count", one(ValueType::ARRAY, Bytes().u32(4).u64(1ull << 62)),
                 {"key 'general.name': array of 4611686018427387904 uint32 values runs past the end"});
  expect_refused("array_strings", one(ValueType::ARRAY, Bytes().u32(8).u64(2).str("a").u64(99)),
                 {"key 'general.name': string #1 of 99 bytes runs past the end"});
  expect_refused("array_of_arrays", one(ValueType::ARRAY, Bytes().u32(9).u64(1).u32(4).u64(0)),
                 {"key 'general.name': arrays of arrays are not supported"});
  expect_refused("array_elem_type", one(ValueType::ARRAY, Bytes().u32(77).u64(0)),
                 {"key 'general.name': unknown array element type 77"});
  expect_refused("array_header", one(ValueType::ARRAY, Bytes().u32(4)).substr(0, 52),
                 {"key 'general.name': truncated array header"});
  expect_refused("bool_value", one(ValueType::BOOL, Bytes().u8(2)), {"key 'general.name': bool value 2"});
  expect_refused("duplicate_key", Builder().kv_u32("a.b", 1).kv_u32("c", 2).kv_u32("a.b", 3).bytes(),
                 {"key 'a.b': duplicate key (entries #0 and #2)"});
  expect_refused("binary_key", Builder().kv_u32("a", 1).kv_u32(std::string("\x01z", 2), 1).kv_u32("a", 1).bytes(),
                 {"key 'a': duplicate"});
  expect_refused("alignment_type", Builder().kv_str("general.alignment", "32").bytes(),
                 {"key 'general.alignment': expected an unsigned integer, found string '32'"});
  expect_refused("alignment_value", Builder().kv_u32("general.alignment", 24).bytes(),
                 {"key 'general.alignment': alignment 24 is not a power of two"});
  expect_refused("alignment_zero", Builder().kv_u32("general.alignment", 0).bytes(), {"key 'general.alignment'"});
}

TEST(GgufRefusals, TensorInfos) {
  const std::string q = "blk.0.attn_q.weight";
  auto with = [&](Tensor t) { Builder g; g.kv_str("general.architecture", "llama").tensor(std::move(t)); return g.bytes(); };
  const std::string good = with(f32_tensor(q, {4, 2}));
  EXPECT_NO_THROW(GgufFile(write("tensor_good.gguf", good)));
  const size_t info_end = 24 + 8 + 20 + 4 + 8 + 5 + (8 + q.size()) + 4 + 16 + 4 + 8;
  expect_refused("truncated_info", good.substr(0, info_end - 3), {"tensor '" + q + "': truncated tensor info"});
  expect_refused("truncated_name", good.substr(0, 69 + 8 + 6), {"tensor info #0: tensor name of 19 bytes runs past"});
  expect_refused("n_dims", with({q, {1, 1, 1, 1, 1}, 0, std::string(4, '\0')}), {"tensor '" + q + "': 5 dimensions (at most 4)"});
  expect_refused("zero_dim", with({q, {4, 0}, 0, ""}), {"tensor '" + q + "': dimension 1 is 0"});
  expect_refused("negative_dim", with({q, {uint64_t(-4)}, 0, ""}), {"tensor '" + q + "': dimension 0 is -4"});
  expect_refused("overflow", with({q, {1ull << 32, 1ull << 32, 4}, 0, ""}), {"tensor '" + q + "': the element count overflows"});
  expect_refused("bytes_overflow", with({q, {1ull << 62, 1}, 0, ""}), {"tensor '" + q + "': the byte size overflows"});
  expect_refused("unknown_type", with({q, {32}, 99, ""}), {"tensor '" + q + "': unknown tensor type 99"});
  expect_refused("removed_type", with({q, {32}, 4, ""}), {"tensor '" + q + "': unknown tensor type 4"});
  expect_refused("row_length", with({q, {33, 2}, 2, std::string(36, '\0')}),
                 {"tensor '" + q + "': row length 33 (dims[0]) is not a multiple of Q4_0's block of 32"});
  Tensor unaligned = f32_tensor(q, {4});
  unaligned.offset = 16;
  expect_refused("unaligned", with(unaligned), {"tensor '" + q + "': data offset 16 is not a multiple of the alignment 32"});
  expect_refused("past_end", good.substr(0, good.size() - 1), {"tensor '" + q + "': data at 0 + 32 bytes runs past the end"});
  Builder dup;
  dup.tensor(f32_tensor(q, {4})).tensor(f32_tensor("x", {4})).tensor(f32_tensor(q, {4}));
  expect_refused("duplicate_tensor", dup.bytes(), {"tensor '" + q + "': duplicate tensor name (tensors #0 and #2)"});
  Builder overlap;
  Tensor b = f32_tensor("blk.0.attn_k.weight", {8});
  b.offset = 32;
  overlap.tensor(f32_tensor(q, {16})).tensor(b);
  expect_refused("overlap", overlap.bytes(), {"tensor 'blk.0.attn_k.weight': data at 32 overlaps tensor '" + q + "'"});
}

// Every prefix and seeded corruptions of a valid file: opened or refused, never a crash.
TEST(GgufRefusals, PrefixesAndCorruptions) {
  Builder g;
  g.kv_str("general.architecture", "llama").kv("tokens", ValueType::ARRAY, Bytes().u32(8).u64(2).str("a").str("bc"));
  g.tensor(f32_tensor("a", {4, 2})).tensor({"q", {32}, 2, std::string(18, '\x11')});
  const std::string good = g.bytes();
  for (size_t n = 0; n < good.size(); ++n) {
    const std::string path = write("prefix.gguf", good.substr(0, n));
    EXPECT_THROW(GgufFile f(path), GgufError) << n << " bytes";
  }
  std::mt19937 rng(7);
  for (int i = 0; i < 2000; ++i) {
    std::string bad = good;
    for (int k = 0; k < 1 + int(rng() % 4); ++k) bad[rng() % bad.size()] = char(rng() & 255);
    try {
      GgufFile f(write("corrupt.gguf", bad));
      for (const std::string& key : f.keys()) f.show(key);
      for (const TensorInfo& t : f.tensors())
        if (can_dequantize(t.type)) {
          std::vector<float> out(size_t(t.elements()));
          f.dequantize_rows(t, 0, t.rows(), out.data());
        }
    } catch (const GgufError&) {
    }
  }
}

// ------------------------------------------------------------ PyPI gguf's files (make_gguf.py)
TEST(PypiCompat, SameMetadataAndFloats) {
  const char* dir = std::getenv("HALFORMER_GGUF_PYPI_DIR");
  if (!dir) GTEST_SKIP() << "HALFORMER_GGUF_PYPI_DIR not set (ctest's import_gguf_pypi_compat sets it)";
  std::ifstream in(fs::path(dir) / "expected.json");
  ASSERT_TRUE(in) << dir << "/expected.json";
  const nlohmann::json want = nlohmann::json::parse(in);
  for (const auto& file : want.at("files")) {
    const GgufFile f((fs::path(dir) / file.at("name").get<std::string>()).string());
    SCOPED_TRACE(f.path());
    EXPECT_EQ(f.version(), file.at("version").get<uint32_t>());
    EXPECT_EQ(f.alignment(), file.at("alignment").get<uint64_t>());
    EXPECT_EQ(f.data_offset(), file.at("data_offset").get<uint64_t>());
    EXPECT_EQ(f.keys(), file.at("keys").get<std::vector<std::string>>());
    for (const auto& [key, v] : want.at("metadata").items()) {
      const std::string type = v.at("type");
      const auto& value = v.at("value");
      if (type == "string") {
        EXPECT_EQ(f.string_value(key), value.get<std::string>()) << key;
      } else if (type == "bool") {
        EXPECT_EQ(f.bool_value(key), value.get<bool>()) << key;
      } else if (type == "float32" || type == "float64") {
        EXPECT_EQ(f.float_value(key), value.get<double>()) << key;
      } else if (type == "array:string") {
        EXPECT_EQ(f.string_array(key), value.get<std::vector<std::string>>()) << key;
      } else if (type == "array:float32") {
        EXPECT_EQ(f.float_array(key), value.get<std::vector<float>>()) << key;
      } else if (type == "array:int32") {
        EXPECT_EQ(f.int_array(key), value.get<std::vector<int64_t>>()) << key;
      } else if (type == "array:bool") {
        EXPECT_EQ(f.bool_array(key), value.get<std::vector<bool>>()) << key;
      } else if (type[0] == 'u') {
        EXPECT_EQ(f.uint_value(key), value.get<uint64_t>()) << key;
      } else {
        EXPECT_EQ(f.int_value(key), value.get<int64_t>()) << key;
      }
      const bool array = type.rfind("array:", 0) == 0;  // "array:int32": the element type
      EXPECT_STREQ(value_type_name(array ? f.array_type(key) : f.value_type(key)), type.substr(array ? 6 : 0).c_str());
    }
    ASSERT_EQ(f.tensors().size(), want.at("tensors").size());
    for (const auto& [name, w] : want.at("tensors").items()) {
      const TensorInfo& t = f.tensor(name);
      EXPECT_STREQ(type_name(t.type), w.at("type").get<std::string>().c_str()) << name;
      EXPECT_EQ(t.dims, w.at("dims").get<std::vector<int64_t>>()) << name;
      std::ifstream raw(fs::path(dir) / w.at("expected").get<std::string>(), std::ios::binary);
      const std::string bytes((std::istreambuf_iterator<char>(raw)), std::istreambuf_iterator<char>());
      ASSERT_EQ(bytes.size(), size_t(t.elements()) * 4) << name;
      std::vector<float> expected(size_t(t.elements()));
      std::memcpy(expected.data(), bytes.data(), bytes.size());
      const std::vector<float> got = all_rows(f, name);
      const double tolerance = w.at("tolerance").get<double>();  // 0: bit for bit
      size_t differ = 0;
      for (size_t i = 0; i < got.size(); ++i) {
        const bool same = tolerance == 0 ? std::memcmp(&got[i], &expected[i], 4) == 0
                                         : std::fabs(got[i] - expected[i]) <= tolerance * std::max(1.0f, std::fabs(expected[i]));
        if (!same && differ++ < 5) ADD_FAILURE() << name << "[" << i << "]: " << got[i] << " vs gguf's " << expected[i];
      }
      EXPECT_EQ(differ, 0u) << name;
    }
  }
}
