// GGUF reader (gguf_file.h): the type table, the block decoders, then the parser.
//
// Layout read (gguf.md): "GGUF", version u32, tensor count u64, metadata count u64; the
// metadata (key string, value type u32, value; a string is a u64 length and its bytes,
// an array an element type u32, a u64 count and the elements); the tensor infos (name,
// n_dims u32, n_dims u64 dims, type u32, offset u64); padding to the alignment; the data.
// The parser bounds each count by the bytes left before looping or allocating: the
// smallest metadata entry takes 13 bytes, the smallest tensor info 24, a string 8.
#include "gguf_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>

namespace halformer::import {
namespace {

// ------------------------------------------------------------------------- tensor types
struct TypeRow {
  GgmlType type;
  const char* name;
  int64_t block, bytes;
  bool decoded;  // dequantize() knows it
};
using T = GgmlType;
constexpr TypeRow kTypes[] = {
    {T::F32, "F32", 1, 4, true}, {T::F16, "F16", 1, 2, true}, {T::Q4_0, "Q4_0", 32, 18, true},
    {T::Q4_1, "Q4_1", 32, 20, true}, {T::Q5_0, "Q5_0", 32, 22, true}, {T::Q5_1, "Q5_1", 32, 24, true},
    {T::Q8_0, "Q8_0", 32, 34, true}, {T::Q8_1, "Q8_1", 32, 36, true}, {T::Q2_K, "Q2_K", 256, 84, true},
    {T::Q3_K, "Q3_K", 256, 110, true}, {T::Q4_K, "Q4_K", 256, 144, true}, {T::Q5_K, "Q5_K", 256, 176, true},
    {T::Q6_K, "Q6_K", 256, 210, true}, {T::Q8_K, "Q8_K", 256, 292, true}, {T::IQ2_XXS, "IQ2_XXS", 256, 66, false},
    {T::IQ2_XS, "IQ2_XS", 256, 74, false}, {T::IQ3_XXS, "IQ3_XXS", 256, 98, false}, {T::IQ1_S, "IQ1_S", 256, 50, false},
    {T::IQ4_NL, "IQ4_NL", 32, 18, false}, {T::IQ3_S, "IQ3_S", 256, 110, false}, {T::IQ2_S, "IQ2_S", 256, 82, false},
    {T::IQ4_XS, "IQ4_XS", 256, 136, false}, {T::I8, "I8", 1, 1, true}, {T::I16, "I16", 1, 2, true},
    {T::I32, "I32", 1, 4, true}, {T::I64, "I64", 1, 8, true}, {T::F64, "F64", 1, 8, true},
    {T::IQ1_M, "IQ1_M", 256, 56, false}, {T::BF16, "BF16", 1, 2, true}, {T::TQ1_0, "TQ1_0", 256, 54, false},
    {T::TQ2_0, "TQ2_0", 256, 66, false}, {T::MXFP4, "MXFP4", 32, 17, false},
};

const TypeRow* row_of(uint32_t type) {
  for (const TypeRow& r : kTypes)
    if (uint32_t(r.type) == type) return &r;
  return nullptr;
}
const TypeRow& known(GgmlType type) {
  const TypeRow* r = row_of(uint32_t(type));
  if (!r) throw GgufError("unknown tensor type " + std::to_string(uint32_t(type)));
  return *r;
}

// ---------------------------------------------------------------- little-endian loads
uint16_t u16(const uint8_t* p) { return uint16_t(p[0] | p[1] << 8); }
uint32_t u32(const uint8_t* p) { return uint32_t(u16(p)) | uint32_t(u16(p + 2)) << 16; }
uint64_t u64(const uint8_t* p) { return uint64_t(u32(p)) | uint64_t(u32(p + 4)) << 32; }
template <class F, class U>
F bits_as(U u) {
  F f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}
float fp16(const uint8_t* p) { return half_to_float(u16(p)); }

// --------------------------------------------------------------------- block decoders
// One block at `b` to block-size floats at `y`. The K-quants hold 256 elements in
// sub-blocks of 16 or 32, each with its own scale (and min) quantized against the
// super-block's d (and dmin).

// Q4_K / Q5_K: eight 6-bit scales and eight 6-bit mins packed in 12 bytes; bytes 0-3
// hold scales 0-3 (low 6 bits), 4-7 mins 0-3, 8-11 the low nibbles of scales 4-7 and
// high nibbles of mins 4-7, whose top 2 bits are the spare bits of bytes 0-7.
void scale_min_k4(int j, const uint8_t* s, int& scale, int& min) {
  if (j < 4) {
    scale = s[j] & 63;
    min = s[j + 4] & 63;
  } else {
    scale = (s[j + 4] & 15) | (s[j - 4] >> 6) << 4;
    min = (s[j + 4] >> 4) | (s[j] >> 6) << 4;
  }
}

// Q4_K: d, dmin, scales[12], qs[128]; Q5_K (five): d, dmin, scales[12], qh[32], qs[128].
// Each 64 elements take 32 bytes of qs, low nibbles then high; Q5_K's fifth bits come
// from bit (sub-block) of qh[l].
template <bool five>
void q45_k(const uint8_t* b, float* y) {
  const float d = fp16(b), dmin = fp16(b + 2);
  const uint8_t *qh = b + 16, *q = b + (five ? 48 : 16);
  for (int c = 0; c < 4; ++c, q += 32, y += 64)
    for (int h = 0; h < 2; ++h) {
      int sc, m;
      scale_min_k4(2 * c + h, b + 4, sc, m);
      const float dl = d * float(sc), ml = dmin * float(m);
      for (int l = 0; l < 32; ++l)
        y[32 * h + l] = dl * float(((q[l] >> 4 * h) & 15) | (five ? ((qh[l] >> (2 * c + h)) & 1) << 4 : 0)) - ml;
    }
}

void q6_k(const uint8_t* b, float* y) {  // ql[128], qh[64], int8 scales[16], d
  const float d = fp16(b + 208);
  const uint8_t *ql = b, *qh = b + 128, *sc = b + 192;
  for (int n = 0; n < 2; ++n, ql += 64, qh += 32, sc += 8, y += 128)  // 128 elements
    for (int k = 0; k < 4; ++k)  // 32 elements: a nibble of ql, 2 bits of qh
      for (int l = 0; l < 32; ++l) {
        const int lo = (ql[l + 32 * (k & 1)] >> 4 * (k >> 1)) & 15, hi = (qh[l] >> 2 * k) & 3;
        y[32 * k + l] = d * float(int8_t(sc[l / 16 + 2 * k])) * float((lo | hi << 4) - 32);
      }
}

void q2_k(const uint8_t* b, float* y) {  // scales[16] (4-bit scale, 4-bit min), qs[64], d, dmin
  const float d = fp16(b + 80), dmin = fp16(b + 82);
  const uint8_t *sc = b, *q = b + 16;
  for (int n = 0; n < 2; ++n, q += 32)
    for (int shift = 0; shift < 8; shift += 2)
      for (int h = 0; h < 2; ++h, ++sc) {
        const float dl = d * float(*sc & 15), ml = dmin * float(*sc >> 4);
        for (int l = 0; l < 16; ++l) *y++ = dl * float((q[16 * h + l] >> shift) & 3) - ml;
      }
}

void q3_k(const uint8_t* b, float* y) {  // hmask[32], qs[64], scales[12] (sixteen 6-bit), d
  const float d = fp16(b + 108);
  const uint8_t *hm = b, *q = b + 32, *s = b + 96;
  int scales[16];
  for (int i = 0; i < 16; ++i) {
    const int lo = i < 8 ? s[i] & 15 : s[i - 8] >> 4, hi = (s[8 + i % 4] >> 2 * (i / 4)) & 3;
    scales[i] = (lo | hi << 4) - 32;
  }
  int is = 0, bit = 0;
  for (int n = 0; n < 2; ++n, q += 32)
    for (int shift = 0; shift < 8; shift += 2, ++bit)
      for (int h = 0; h < 2; ++h) {
        const float dl = d * float(scales[is++]);
        for (int l = 16 * h; l < 16 * h + 16; ++l)  // a clear hmask bit subtracts 4
          *y++ = dl * float(((q[l] >> shift) & 3) - ((hm[l] >> bit) & 1 ? 0 : 4));
      }
}

// The blocks of one type, each through `f`.
template <class F>
void each_block(const uint8_t* b, int64_t nb, const TypeRow& r, float* y, F f) {
  for (int64_t i = 0; i < nb; ++i) f(b + i * r.bytes, y + i * r.block);
}

// Text for messages: printable ASCII as is, other bytes as \xNN, at most 120 characters.
std::string quoted(const std::string& s) {
  std::string out = "'";
  for (size_t i = 0; i < s.size() && i < 120; ++i) {
    const unsigned char c = s[i];
    if (c >= 32 && c < 127) {
      out += char(c);
    } else {
      static const char* hex = "0123456789abcdef";
      out += std::string("\\x") + hex[c >> 4] + hex[c & 15];
    }
  }
  return out + (s.size() > 120 ? "...'" : "'");
}

size_t fixed_size(ValueType t) {  // 0: string or array
  switch (t) {
    case ValueType::UINT8: case ValueType::INT8: case ValueType::BOOL: return 1;
    case ValueType::UINT16: case ValueType::INT16: return 2;
    case ValueType::UINT32: case ValueType::INT32: case ValueType::FLOAT32: return 4;
    case ValueType::UINT64: case ValueType::INT64: case ValueType::FLOAT64: return 8;
    default: return 0;
  }
}

// An integer element as int64; `big`: a uint64 above INT64_MAX (v holds its bits).
bool integer_at(ValueType t, const uint8_t* p, int64_t& v, bool& big) {
  big = false;
  switch (t) {
    case ValueType::UINT8: v = p[0]; return true;
    case ValueType::INT8: v = int8_t(p[0]); return true;
    case ValueType::UINT16: v = u16(p); return true;
    case ValueType::INT16: v = int16_t(u16(p)); return true;
    case ValueType::UINT32: v = u32(p); return true;
    case ValueType::INT32: v = int32_t(u32(p)); return true;
    case ValueType::UINT64: big = u64(p) > uint64_t(INT64_MAX); v = int64_t(u64(p)); return true;
    case ValueType::INT64: v = int64_t(u64(p)); return true;
    default: return false;
  }
}

}  // namespace

// ------------------------------------------------------------------ type table queries
bool is_known_type(uint32_t type) { return row_of(type) != nullptr; }
const char* type_name(GgmlType type) {
  const TypeRow* r = row_of(uint32_t(type));
  return r ? r->name : "unknown";
}
int64_t block_elements(GgmlType type) { return known(type).block; }
int64_t block_bytes(GgmlType type) { return known(type).bytes; }
bool can_dequantize(GgmlType type) {
  const TypeRow* r = row_of(uint32_t(type));
  return r && r->decoded;
}

float half_to_float(uint16_t h) {
  const uint32_t sign = uint32_t(h & 0x8000) << 16, exp = (h >> 10) & 31, man = h & 0x3ff;
  if (exp == 0) return std::copysign(std::ldexp(float(man), -24), sign ? -1.0f : 1.0f);  // zero, subnormal
  if (exp == 31) return bits_as<float>(sign | 0x7f800000u | man << 13);                  // inf, nan
  return bits_as<float>(sign | (exp + 112) << 23 | man << 13);
}
float bf16_to_float(uint16_t b) { return bits_as<float>(uint32_t(b) << 16); }

void dequantize(GgmlType type, const uint8_t* b, int64_t elements, float* y) {
  const TypeRow& r = known(type);
  if (!r.decoded) throw GgufError(std::string("dequantizing ") + r.name + " is not supported");
  if (elements < 0 || elements % r.block != 0)
    throw GgufError(std::to_string(elements) + " elements are not whole " + r.name + " blocks");
  const int64_t nb = elements / r.block;
  switch (type) {
    case T::F32: return each_block(b, nb, r, y, [](const uint8_t* p, float* o) { *o = bits_as<float>(u32(p)); });
    case T::F16: return each_block(b, nb, r, y, [](const uint8_t* p, float* o) { *o = fp16(p); });
    case T::BF16: return each_block(b, nb, r, y, [](const uint8_t* p, float* o) { *o = bf16_to_float(u16(p)); });
    case T::F64: return each_block(b, nb, r, y, [](const uint8_t* p, float* o) { *o = float(bits_as<double>(u64(p))); });
    case T::I8: return each_block(b, nb, r, y, [](const uint8_t* p, float* o) { *o = float(int8_t(*p)); });
    case T::I16: return each_block(b, nb, r, y, [](const uint8_t* p, float* o) { *o = float(int16_t(u16(p))); });
    case T::I32: return each_block(b, nb, r, y, [](const uint8_t* p, float* o) { *o = float(int32_t(u32(p))); });
    case T::I64: return each_block(b, nb, r, y, [](const uint8_t* p, float* o) { *o = float(int64_t(u64(p))); });
    case T::Q4_0:  // d, qs[16]: element j in the low nibble of byte j, element j + 16 in the high one
      return each_block(b, nb, r, y, [](const uint8_t* p, float* o) {
        const float d = fp16(p);
        for (int j = 0; j < 16; ++j) {
          o[j] = float((p[2 + j] & 15) - 8) * d;
          o[j + 16] = float((p[2 + j] >> 4) - 8) * d;
        }
      });
    case T::Q4_1:  // d, m, qs[16]
      return each_block(b, nb, r, y, [](const uint8_t* p, float* o) {
        const float d = fp16(p), m = fp16(p + 2);
        for (int j = 0; j < 16; ++j) {
          o[j] = float(p[4 + j] & 15) * d + m;
          o[j + 16] = float(p[4 + j] >> 4) * d + m;
        }
      });
    case T::Q5_0:  // d, qh (bit j: element j's fifth bit), qs[16]
    case T::Q5_1:  // d, m, qh, qs[16]
      return each_block(b, nb, r, y, [type](const uint8_t* p, float* o) {
        const bool q51 = type == T::Q5_1;
        const float d = fp16(p), m = q51 ? fp16(p + 2) : 0.0f;
        const uint32_t qh = u32(p + (q51 ? 4 : 2));
        const uint8_t* q = p + (q51 ? 8 : 6);
        const int bias = q51 ? 0 : 16;
        for (int j = 0; j < 16; ++j) {
          const int lo = (q[j] & 15) | ((qh >> j) & 1) << 4, hi = (q[j] >> 4) | ((qh >> (j + 16)) & 1) << 4;
          o[j] = q51 ? float(lo) * d + m : float(lo - bias) * d;
          o[j + 16] = q51 ? float(hi) * d + m : float(hi - bias) * d;
        }
      });
    case T::Q8_0:  // d, int8 qs[32]
    case T::Q8_1:  // d, s (d times the sum of qs, for dot products), int8 qs[32]
      return each_block(b, nb, r, y, [type](const uint8_t* p, float* o) {
        const float d = fp16(p);
        const uint8_t* q = p + (type == T::Q8_1 ? 4 : 2);
        for (int j = 0; j < 32; ++j) o[j] = float(int8_t(q[j])) * d;
      });
    case T::Q8_K:  // float32 d, int8 qs[256], int16 bsums[16]
      return each_block(b, nb, r, y, [](const uint8_t* p, float* o) {
        const float d = bits_as<float>(u32(p));
        for (int j = 0; j < 256; ++j) o[j] = float(int8_t(p[4 + j])) * d;
      });
    case T::Q2_K: return each_block(b, nb, r, y, q2_k);
    case T::Q3_K: return each_block(b, nb, r, y, q3_k);
    case T::Q4_K: return each_block(b, nb, r, y, q45_k<false>);
    case T::Q5_K: return each_block(b, nb, r, y, q45_k<true>);
    case T::Q6_K: return each_block(b, nb, r, y, q6_k);
    default: throw GgufError(std::string("dequantizing ") + r.name + " is not supported");
  }
}

const char* value_type_name(ValueType type) {
  static const char* names[] = {"uint8", "int8",   "uint16", "int16", "uint32", "int32",  "float32",
                                "bool",  "string", "array",  "uint64", "int64", "float64"};
  return uint32_t(type) < 13 ? names[uint32_t(type)] : "unknown";
}

int64_t TensorInfo::elements() const {
  int64_t n = 1;
  for (int64_t d : dims) n *= d;
  return n;
}
int64_t TensorInfo::row_length() const { return dims.empty() ? 1 : dims[0]; }
int64_t TensorInfo::rows() const { return elements() / row_length(); }
uint64_t TensorInfo::row_bytes() const { return uint64_t(row_length() / block_elements(type) * block_bytes(type)); }

// ------------------------------------------------------------------------------ the file
GgufFile::GgufFile(const std::string& path) : path_(path) {
  auto fail = [&](const std::string& what) { throw GgufError(path + ": " + what); };
  // O_NONBLOCK: opening a FIFO must not wait for a writer (it is refused just below).
  const int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) fail(std::string("cannot open: ") + std::strerror(errno));
  struct stat st {};
  const bool regular = ::fstat(fd, &st) == 0 && S_ISREG(st.st_mode);
  size_ = regular ? uint64_t(st.st_size) : 0;
  void* m = regular && size_ > 0 ? ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd, 0) : nullptr;
  const int mmap_errno = errno;
  ::close(fd);
  if (!regular) fail("not a regular file");
  if (m == MAP_FAILED) fail(std::string("mmap failed: ") + std::strerror(mmap_errno));
  mapping_.reset(static_cast<const uint8_t*>(m));
  mapping_.get_deleter().size = size_;
  map_ = mapping_.get();
  parse();  // a throw unmaps (mapping_ is destroyed)
}

void GgufFile::Unmap::operator()(const uint8_t* p) const {
  if (p) ::munmap(const_cast<uint8_t*>(p), size);
}

void GgufFile::parse() {
  auto fail = [&](const std::string& where, const std::string& what) {
    throw GgufError(path_ + ": " + where + ": " + what);
  };
  const auto str = [](uint64_t v) { return std::to_string(v); };
  uint64_t pos = 0;
  auto left = [&] { return size_ - pos; };
  auto need = [&](uint64_t n, const std::string& where, const std::string& what) {
    if (n > left()) fail(where, "truncated " + what + " (" + str(n) + " bytes needed, " + str(left()) + " left)");
  };
  auto read_string = [&](const std::string& where, const std::string& what) {
    need(8, where, what + " length");
    const uint64_t n = u64(map_ + pos);
    pos += 8;
    if (n > left()) fail(where, what + " of " + str(n) + " bytes runs past the end of the file (" + str(left()) + " left)");
    pos += n;
    return std::string(reinterpret_cast<const char*>(map_ + pos - n), n);
  };

  // ---- header
  if (size_ < 4 || std::memcmp(map_, "GGUF", 4) != 0)
    fail("header", size_ < 4 ? "truncated (" + str(size_) + " bytes): not a GGUF file"
                             : "not a GGUF file (magic " + quoted(std::string(reinterpret_cast<const char*>(map_), 4)) +
                                   ", expected 'GGUF')");
  need(24, "header", "header");
  version_ = u32(map_ + 4);
  if (version_ != 2 && version_ != 3) {
    const bool swapped = version_ != 0 && (version_ & 0xffff) == 0;
    fail("header", "GGUF version " + str(version_) + " is not supported (versions 2 and 3, little-endian" +
                       (swapped ? "; this looks like a big-endian file)" : ")"));
  }
  const uint64_t n_tensors = u64(map_ + 8), n_kv = u64(map_ + 16);
  pos = 24;
  if (n_kv > left() / 13 || n_tensors > left() / 24 || n_kv * 13 + n_tensors * 24 > left())
    fail("header", str(n_kv) + " metadata entries and " + str(n_tensors) + " tensors cannot fit in " +
                       str(size_) + " bytes");

  // ---- metadata
  for (uint64_t i = 0; i < n_kv; ++i) {
    const std::string key = read_string("metadata entry #" + str(i), "key");
    const std::string where = "key " + quoted(key);
    if (index_.count(key)) fail(where, "duplicate key (entries #" + str(index_[key]) + " and #" + str(i) + ")");
    need(4, where, "value type");
    Entry e{key, ValueType(u32(map_ + pos)), ValueType::UINT8, 1, 0};
    pos += 4;
    if (uint32_t(e.type) > 12) fail(where, "unknown value type " + str(uint32_t(e.type)));
    e.elem = e.type;
    if (e.type == ValueType::ARRAY) {
      need(12, where, "array header");
      e.elem = ValueType(u32(map_ + pos));
      e.count = u64(map_ + pos + 4);
      pos += 12;
      if (uint32_t(e.elem) > 12) fail(where, "unknown array element type " + str(uint32_t(e.elem)));
      if (e.elem == ValueType::ARRAY) fail(where, "arrays of arrays are not supported");
    }
    e.at = pos;
    const size_t sz = fixed_size(e.elem);
    const uint64_t min_size = sz ? sz : 8;  // a string takes at least its length
    if (e.count > left() / min_size)
      fail(where, (e.type == ValueType::ARRAY ? "array of " + str(e.count) + " " + value_type_name(e.elem) + " values"
                                              : value_type_name(e.elem) + std::string(" value")) +
                      " runs past the end of the file (" + str(left()) + " bytes left)");
    if (sz) {
      for (uint64_t k = 0; e.elem == ValueType::BOOL && k < e.count; ++k)
        if (map_[pos + k] > 1) fail(where, "bool value " + str(map_[pos + k]) + " (0 or 1)");
      pos += e.count * sz;
    } else {
      for (uint64_t k = 0; k < e.count; ++k)
        read_string(where, e.type == ValueType::ARRAY ? "string #" + str(k) : "string");
    }
    index_[key] = entries_.size();
    entries_.push_back(std::move(e));
  }
  if (has("general.alignment")) {
    alignment_ = uint_value("general.alignment");
    if (alignment_ == 0 || (alignment_ & (alignment_ - 1)) != 0 || alignment_ > (uint64_t(1) << 31))
      fail("key 'general.alignment'", "alignment " + str(alignment_) + " is not a power of two up to 2^31");
  }

  // ---- tensor infos
  tensors_.reserve(n_tensors);
  for (uint64_t i = 0; i < n_tensors; ++i) {
    TensorInfo t;
    t.name = read_string("tensor info #" + str(i), "tensor name");
    const std::string where = "tensor " + quoted(t.name);
    if (tensor_index_.count(t.name))
      fail(where, "duplicate tensor name (tensors #" + str(tensor_index_[t.name]) + " and #" + str(i) + ")");
    need(4, where, "tensor info");
    const uint32_t n_dims = u32(map_ + pos);
    pos += 4;
    if (n_dims > 4) fail(where, str(n_dims) + " dimensions (at most 4)");
    need(8 * n_dims + 12, where, "tensor info");
    int64_t elements = 1;
    for (uint32_t k = 0; k < n_dims; ++k, pos += 8) {
      const int64_t d = int64_t(u64(map_ + pos));
      if (d <= 0) fail(where, "dimension " + str(k) + " is " + std::to_string(d) + " (at least 1)");
      if (__builtin_mul_overflow(elements, d, &elements)) fail(where, "the element count overflows");
      t.dims.push_back(d);
    }
    const uint32_t type = u32(map_ + pos);
    t.offset = u64(map_ + pos + 4);
    pos += 12;
    const TypeRow* r = row_of(type);
    if (!r) fail(where, "unknown tensor type " + str(type));
    t.type = r->type;
    if (t.row_length() % r->block != 0)
      fail(where, "row length " + str(t.row_length()) + " (dims[0]) is not a multiple of " + r->name +
                      "'s block of " + str(r->block) + " elements");
    if (t.offset % alignment_ != 0)
      fail(where, "data offset " + str(t.offset) + " is not a multiple of the alignment " + str(alignment_));
    uint64_t row_bytes = 0;
    if (__builtin_mul_overflow(uint64_t(t.row_length() / r->block), uint64_t(r->bytes), &row_bytes) ||
        __builtin_mul_overflow(row_bytes, uint64_t(t.rows()), &t.bytes))
      fail(where, "the byte size overflows");
    tensor_index_[t.name] = tensors_.size();
    tensors_.push_back(std::move(t));
  }

  // ---- data: every tensor inside the file, none overlapping another
  data_offset_ = (pos + alignment_ - 1) / alignment_ * alignment_;
  const uint64_t data_size = size_ > data_offset_ ? size_ - data_offset_ : 0;
  for (TensorInfo& t : tensors_) {
    if (t.offset > data_size || t.bytes > data_size - t.offset)
      fail("tensor " + quoted(t.name), "data at " + str(t.offset) + " + " + str(t.bytes) + " bytes runs past the end of the file (" +
                                           str(data_size) + " bytes of data from offset " + str(data_offset_) + ")");
    t.data = map_ + data_offset_ + t.offset;
  }
  std::vector<const TensorInfo*> by_offset;
  for (const TensorInfo& t : tensors_) by_offset.push_back(&t);
  std::sort(by_offset.begin(), by_offset.end(), [](auto a, auto b) { return a->offset < b->offset; });
  for (size_t i = 1; i < by_offset.size(); ++i) {
    const TensorInfo &a = *by_offset[i - 1], &b = *by_offset[i];
    if (a.offset + a.bytes > b.offset)
      fail("tensor " + quoted(b.name), "data at " + str(b.offset) + " overlaps tensor " + quoted(a.name) + " (" +
                                           str(a.offset) + " + " + str(a.bytes) + " bytes)");
  }
}

// -------------------------------------------------------------------------- metadata
std::vector<std::string> GgufFile::keys() const {
  std::vector<std::string> out;
  for (const Entry& e : entries_) out.push_back(e.key);
  return out;
}

const GgufFile::Entry& GgufFile::entry(const std::string& key) const {
  auto it = index_.find(key);
  if (it == index_.end()) throw GgufError(path_ + ": key " + quoted(key) + ": missing");
  return entries_[it->second];
}

void GgufFile::wrong(const Entry& e, const std::string& expected) const {
  throw GgufError(path_ + ": key " + quoted(e.key) + ": expected " + expected + ", found " + show(e.key));
}

ValueType GgufFile::value_type(const std::string& key) const { return entry(key).type; }
ValueType GgufFile::array_type(const std::string& key) const { return array_size(key), entry(key).elem; }
uint64_t GgufFile::array_size(const std::string& key) const {
  const Entry& e = entry(key);
  if (e.type != ValueType::ARRAY) wrong(e, "an array");
  return e.count;
}

uint64_t GgufFile::uint_value(const std::string& key) const {
  const Entry& e = entry(key);
  int64_t v = 0;
  bool big = false;
  if (e.type == ValueType::ARRAY || !integer_at(e.type, map_ + e.at, v, big) || (!big && v < 0))
    wrong(e, "an unsigned integer");
  return uint64_t(v);
}
int64_t GgufFile::int_value(const std::string& key) const {
  const Entry& e = entry(key);
  int64_t v = 0;
  bool big = false;
  if (e.type == ValueType::ARRAY || !integer_at(e.type, map_ + e.at, v, big) || big) wrong(e, "an int64 integer");
  return v;
}
double GgufFile::float_value(const std::string& key) const {
  const Entry& e = entry(key);
  if (e.type == ValueType::FLOAT32) return bits_as<float>(u32(map_ + e.at));
  if (e.type == ValueType::FLOAT64) return bits_as<double>(u64(map_ + e.at));
  wrong(e, "a float32 or float64");
}
bool GgufFile::bool_value(const std::string& key) const {
  const Entry& e = entry(key);
  if (e.type != ValueType::BOOL) wrong(e, "a bool");
  return map_[e.at] != 0;
}
std::string GgufFile::string_value(const std::string& key) const {
  const Entry& e = entry(key);
  if (e.type != ValueType::STRING) wrong(e, "a string");
  return std::string(reinterpret_cast<const char*>(map_ + e.at + 8), u64(map_ + e.at));
}
std::vector<std::string> GgufFile::string_array(const std::string& key) const {
  const Entry& e = entry(key);
  if (e.type != ValueType::ARRAY || e.elem != ValueType::STRING) wrong(e, "an array of strings");
  std::vector<std::string> out;
  out.reserve(e.count);
  for (uint64_t k = 0, at = e.at; k < e.count; ++k) {
    const uint64_t n = u64(map_ + at);
    out.emplace_back(reinterpret_cast<const char*>(map_ + at + 8), n);
    at += 8 + n;
  }
  return out;
}
std::vector<float> GgufFile::float_array(const std::string& key) const {
  const Entry& e = entry(key);
  const bool f32 = e.elem == ValueType::FLOAT32;
  if (e.type != ValueType::ARRAY || (!f32 && e.elem != ValueType::FLOAT64)) wrong(e, "an array of floats");
  std::vector<float> out(e.count);
  for (uint64_t k = 0; k < e.count; ++k)
    out[k] = f32 ? bits_as<float>(u32(map_ + e.at + 4 * k)) : float(bits_as<double>(u64(map_ + e.at + 8 * k)));
  return out;
}
std::vector<int64_t> GgufFile::int_array(const std::string& key) const {
  const Entry& e = entry(key);
  int64_t v = 0;
  bool big = false;
  if (e.type != ValueType::ARRAY || !integer_at(e.elem, map_ + e.at, v, big)) wrong(e, "an array of integers");
  std::vector<int64_t> out(e.count);
  for (uint64_t k = 0; k < e.count; ++k) {
    integer_at(e.elem, map_ + e.at + k * fixed_size(e.elem), out[k], big);
    if (big) throw GgufError(path_ + ": key " + quoted(key) + ": element " + std::to_string(k) + " exceeds int64");
  }
  return out;
}
std::vector<bool> GgufFile::bool_array(const std::string& key) const {
  const Entry& e = entry(key);
  if (e.type != ValueType::ARRAY || e.elem != ValueType::BOOL) wrong(e, "an array of bools");
  std::vector<bool> out(e.count);
  for (uint64_t k = 0; k < e.count; ++k) out[k] = map_[e.at + k] != 0;
  return out;
}

std::string GgufFile::show(const std::string& key) const {
  const Entry& e = entry(key);
  const std::string type = value_type_name(e.type);
  if (e.type == ValueType::ARRAY) return "array of " + std::to_string(e.count) + " " + value_type_name(e.elem);
  if (e.type == ValueType::STRING) return "string " + quoted(string_value(key));
  if (e.type == ValueType::BOOL) return std::string("bool ") + (map_[e.at] ? "true" : "false");
  if (e.type == ValueType::FLOAT32 || e.type == ValueType::FLOAT64) {
    char buf[40];
    std::snprintf(buf, sizeof buf, "%.9g", float_value(key));
    return type + " " + buf;
  }
  int64_t v = 0;
  bool big = false;
  integer_at(e.type, map_ + e.at, v, big);
  return type + " " + (big ? std::to_string(uint64_t(v)) : std::to_string(v));
}

// ---------------------------------------------------------------------------- tensors
const TensorInfo* GgufFile::find(const std::string& name) const {
  auto it = tensor_index_.find(name);
  return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
}
const TensorInfo& GgufFile::tensor(const std::string& name) const {
  const TensorInfo* t = find(name);
  if (!t) throw GgufError(path_ + ": tensor " + quoted(name) + ": no such tensor");
  return *t;
}

const uint8_t* GgufFile::row_data(const TensorInfo& t, int64_t row) const {
  if (row < 0 || row >= t.rows())
    throw GgufError(path_ + ": tensor " + quoted(t.name) + ": row " + std::to_string(row) + " outside its " +
                    std::to_string(t.rows()) + " rows");
  return t.data + uint64_t(row) * t.row_bytes();
}

void GgufFile::dequantize_rows(const TensorInfo& t, int64_t row0, int64_t rows, float* out) const {
  const std::string where = path_ + ": tensor " + quoted(t.name) + ": ";
  if (row0 < 0 || rows < 0 || row0 > t.rows() || rows > t.rows() - row0)
    throw GgufError(where + "rows " + std::to_string(row0) + " + " + std::to_string(rows) + " outside its " +
                    std::to_string(t.rows()) + " rows");
  if (!can_dequantize(t.type)) throw GgufError(where + "dequantizing " + type_name(t.type) + " is not supported");
  dequantize(t.type, t.data + uint64_t(row0) * t.row_bytes(), rows * t.row_length(), out);
}

}  // namespace halformer::import
