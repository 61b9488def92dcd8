#include "engine/safetensors.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <stdexcept>

#include "engine/file_io.h"
#include "engine/json.h"

namespace ul {

namespace {

// The reference implementation refuses headers over 100 MB; a header that size is an attack or
// corruption, not a model.
constexpr uint64_t kMaxHeader = 100000000;

std::runtime_error st_error(const std::string& path, const std::string& what) {
  return std::runtime_error(path + ": safetensors: " + what);
}

float f32_from_f16(uint16_t h) {
  const uint32_t sign = uint32_t(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1Fu, man = h & 0x3FFu, u;
  if (exp == 0x1F) {
    u = sign | 0x7F800000u | (man << 13);  // inf / NaN
  } else if (exp != 0) {
    u = sign | ((exp + 112) << 23) | (man << 13);
  } else if (man == 0) {
    u = sign;  // +-0
  } else {     // subnormal: shift until the implicit bit appears
    exp = 113;
    while (!(man & 0x400u)) man <<= 1, exp--;
    u = sign | (exp << 23) | ((man & 0x3FFu) << 13);
  }
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

}  // namespace

size_t safetensors_dtype_size(const std::string& d) {
  static const std::map<std::string, size_t> sizes = {
      {"BOOL", 1}, {"U8", 1},  {"I8", 1},  {"F8_E5M2", 1}, {"F8_E4M3", 1}, {"I16", 2}, {"U16", 2},
      {"F16", 2},  {"BF16", 2}, {"I32", 4}, {"U32", 4},     {"F32", 4},     {"I64", 8}, {"U64", 8}, {"F64", 8}};
  auto it = sizes.find(d);
  return it == sizes.end() ? 0 : it->second;
}

int64_t SafeTensorInfo::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

namespace {
// The first `bytes` bytes of path (fewer when the file is shorter), and the file's size.
std::string read_prefix(const std::string& path, size_t bytes, size_t& file_size) {
  require_regular_file(path);
  std::ifstream f(path, std::ios::binary);
  if (!f) throw st_error(path, std::string("cannot open: ") + std::strerror(errno));
  f.seekg(0, std::ios::end);
  file_size = size_t(f.tellg());
  f.seekg(0);
  std::string s(std::min(bytes, file_size), '\0');
  if (!f.read(&s[0], std::streamsize(s.size()))) throw st_error(path, "read failed");
  return s;
}
}  // namespace

SafetensorsFile::SafetensorsFile(const std::string& path, bool header_only) : path_(path), header_only_(header_only) {
  size_t file_size = 0;
  if (header_only) bytes_ = read_prefix(path, 8, file_size);
  else bytes_ = read_whole_file(path), file_size = bytes_.size();
  if (file_size < 8) throw st_error(path, "truncated: " + std::to_string(file_size) + " bytes, no 8-byte header length");
  uint64_t n = 0;
  for (int k = 7; k >= 0; k--) n = (n << 8) | static_cast<unsigned char>(bytes_[size_t(k)]);
  if (n > kMaxHeader) throw st_error(path, "header length " + std::to_string(n) + " exceeds the 100 MB limit");
  if (n > file_size - 8)
    throw st_error(path, "truncated: the header claims " + std::to_string(n) + " bytes but the file has " +
                             std::to_string(file_size - 8) + " after the length");
  data0_ = 8 + size_t(n);
  if (header_only) {
    bytes_ = read_prefix(path, data0_, file_size);
    if (bytes_.size() < data0_) throw st_error(path, "the file shrank while it was read");
  }
  const size_t data_bytes = file_size - data0_;
  const std::string header = bytes_.substr(8, size_t(n));
  if (header.empty() || header[0] != '{') throw st_error(path, "the header is not a JSON object");
  // A tensor's entry is about 75 bytes or more for 7 values (over 10 a value): a header of
  // "0,0,0,..." (2 bytes a value, 112 bytes in memory) is refused at an eighth of its values,
  // before it takes 14 times its size (a quarter let a 100 MB header reach 4 GB).
  const JsonValue root = parse_json(header, path + ": safetensors header", header.size() / 8 + 1024);
  if (!root.is(JsonValue::Kind::object)) throw st_error(path, "the header is not a JSON object");

  for (const auto& [name, v] : root.fields) {
    if (name == "__metadata__") {
      if (v.is(JsonValue::Kind::null)) continue;  // as the reference reads it: no metadata
      if (!v.is(JsonValue::Kind::object)) throw st_error(path, "__metadata__ is not an object");
      for (const auto& [k, s] : v.fields) {
        if (!s.is(JsonValue::Kind::string)) throw st_error(path, "__metadata__ value of '" + k + "' is not a string");
        metadata_[k] = s.text;
      }
      continue;
    }
    const std::string where = path + ": safetensors: tensor '" + name + "'";
    if (!v.is(JsonValue::Kind::object)) throw st_error(path, "tensor '" + name + "' is not an object");
    for (const auto& [k, unused] : v.fields)
      if (k != "dtype" && k != "shape" && k != "data_offsets") throw st_error(path, "tensor '" + name + "': unknown field '" + k + "'");
    const JsonValue *dt = v.find("dtype"), *sh = v.find("shape"), *off = v.find("data_offsets");
    if (!dt || !sh || !off) throw st_error(path, "tensor '" + name + "' needs dtype, shape and data_offsets");
    SafeTensorInfo t;
    t.name = name;
    t.dtype = dt->as_string(where + " dtype");
    const size_t esize = safetensors_dtype_size(t.dtype);
    if (esize == 0) throw st_error(path, "tensor '" + name + "': unknown dtype '" + t.dtype + "'");
    if (!sh->is(JsonValue::Kind::array)) throw st_error(path, "tensor '" + name + "': shape is not an array");
    for (const JsonValue& d : sh->items) {
      const int64_t x = d.as_int(where + " shape");
      if (x < 0) throw st_error(path, "tensor '" + name + "': negative dimension " + std::to_string(x));
      t.shape.push_back(x);
    }
    // An empty tensor holds no bytes whatever its other dimensions; otherwise every partial product
    // times the element size stays within the data section, so numel * esize below cannot overflow.
    uint64_t numel = std::find(t.shape.begin(), t.shape.end(), 0) != t.shape.end() ? 0 : 1;
    for (int64_t x : t.shape) {
      if (numel == 0) break;
      if (numel > data_bytes / esize / uint64_t(x))
        throw st_error(path, "tensor '" + name + "': shape is larger than the file's " + std::to_string(data_bytes) +
                                 " data bytes");
      numel *= uint64_t(x);
    }
    if (!off->is(JsonValue::Kind::array) || off->items.size() != 2)
      throw st_error(path, "tensor '" + name + "': data_offsets must be [begin, end]");
    const int64_t b = off->items[0].as_int(where + " data_offsets"), e = off->items[1].as_int(where + " data_offsets");
    if (b < 0 || e < b || uint64_t(e) > data_bytes)
      throw st_error(path, "tensor '" + name + "': data_offsets [" + std::to_string(b) + ", " + std::to_string(e) +
                               "] outside the " + std::to_string(data_bytes) + " data bytes");
    t.begin = size_t(b), t.end = size_t(e);
    if (numel * esize != t.end - t.begin)
      throw st_error(path, "tensor '" + name + "': shape x " + t.dtype + " is " + std::to_string(numel * esize) +
                               " bytes but data_offsets span " + std::to_string(t.end - t.begin));
    tensors_.push_back(std::move(t));
  }
  // The tensors must tile the data section exactly: no overlap, no hole, nothing after the last.
  std::sort(tensors_.begin(), tensors_.end(),
            [](const SafeTensorInfo& a, const SafeTensorInfo& b) { return a.begin != b.begin ? a.begin < b.begin : a.end < b.end; });
  size_t at = 0;
  for (const SafeTensorInfo& t : tensors_) {
    if (t.begin < at) throw st_error(path, "tensor '" + t.name + "' overlaps the tensor before it (data_offsets " +
                                               std::to_string(t.begin) + " < " + std::to_string(at) + ")");
    if (t.begin > at) throw st_error(path, "unused bytes [" + std::to_string(at) + ", " + std::to_string(t.begin) +
                                               ") before tensor '" + t.name + "'");
    at = t.end;
  }
  if (at != data_bytes)
    throw st_error(path, std::to_string(data_bytes - at) + " trailing bytes after the last tensor");
  by_name_.reserve(tensors_.size());
  for (size_t i = 0; i < tensors_.size(); i++) by_name_.emplace(tensors_[i].name, i);  // (names are unique: JSON keys)
}

const SafeTensorInfo* SafetensorsFile::find(const std::string& name) const {
  const auto it = by_name_.find(name);
  return it == by_name_.end() ? nullptr : &tensors_[it->second];
}

std::vector<float> SafetensorsFile::to_f32(const SafeTensorInfo& t) const {
  if (header_only_) throw std::logic_error(path_ + ": read for its header only; tensor '" + t.name + "' has no data here");
  const char* p = bytes_.data() + data0_ + t.begin;
  const size_t n = size_t(t.numel());
  std::vector<float> out(n);
  if (t.dtype == "F32") {
    std::memcpy(out.data(), p, n * 4);
  } else if (t.dtype == "BF16" || t.dtype == "F16") {
    const bool bf = t.dtype == "BF16";
    for (size_t k = 0; k < n; k++) {
      uint16_t h;
      std::memcpy(&h, p + 2 * k, 2);
      out[k] = bf ? f32_from_bf16(h) : f32_from_f16(h);
    }
  } else {
    throw st_error(path_, "tensor '" + t.name + "' has dtype " + t.dtype + "; only F32, BF16 and F16 can be loaded");
  }
  return out;
}

void write_safetensors(const std::string& path, const std::vector<SafeTensorOut>& tensors,
                       const std::map<std::string, std::string>& metadata, const std::string& dtype,
                       const std::function<void()>& before_rename) {
  for (const SafeTensorOut& t : tensors) {
    int64_t n = 1;
    for (int64_t d : t.shape) n *= d;
    if (size_t(n) != t.data.size())
      throw st_error(path, "tensor '" + t.name + "': shape holds " + std::to_string(n) + " values, data has " +
                               std::to_string(t.data.size()));
  }
  write_safetensors_streamed(
      path, tensors, metadata, dtype,
      [&](size_t i, float* out) { std::copy(tensors[i].data.begin(), tensors[i].data.end(), out); }, before_rename);
}

void write_safetensors_streamed(const std::string& path, const std::vector<SafeTensorOut>& tensors,
                                const std::map<std::string, std::string>& metadata, const std::string& dtype,
                                const std::function<void(size_t, float*)>& fill,
                                const std::function<void()>& before_rename) {
  if (dtype != "F32" && dtype != "BF16") throw st_error(path, "can only write F32 or BF16, not " + dtype);
  const size_t esize = safetensors_dtype_size(dtype);
  std::string header = "{";
  if (!metadata.empty()) {
    header += "\"__metadata__\":{";
    bool first = true;
    for (const auto& [k, v] : metadata) header += (first ? "" : ",") + json_quote(k) + ":" + json_quote(v), first = false;
    header += "}";
  }
  size_t at = 0;
  std::vector<size_t> counts;
  for (const SafeTensorOut& t : tensors) {
    int64_t n = 1;
    std::string shape;
    for (int64_t d : t.shape) n *= d, shape += (shape.empty() ? "" : ",") + std::to_string(d);
    counts.push_back(size_t(n));
    const size_t end = at + size_t(n) * esize;
    header += std::string(header.size() > 1 ? "," : "") + json_quote(t.name) + ":{\"dtype\":\"" + dtype + "\",\"shape\":[" +
              shape + "],\"data_offsets\":[" + std::to_string(at) + "," + std::to_string(end) + "]}";
    at = end;
  }
  header += "}";
  header.append((8 - header.size() % 8) % 8, ' ');  // aligns the data section to 8 bytes
  unsigned char len[8];
  for (int k = 0; k < 8; k++) len[k] = static_cast<unsigned char>(uint64_t(header.size()) >> (8 * k));
  AtomicFile f(path);
  f.write(len, 8);
  f.write(header.data(), header.size());
  std::vector<float> values;  // one tensor's at a time
  std::vector<uint16_t> h;
  for (size_t i = 0; i < tensors.size(); i++) {
    values.resize(counts[i]);
    fill(i, values.data());
    if (dtype == "F32") {
      f.write(values.data(), values.size() * 4);
      continue;
    }
    h.resize(values.size());
    for (size_t k = 0; k < h.size(); k++) h[k] = bf16_from_f32(values[k]);
    f.write(h.data(), h.size() * 2);
  }
  f.sync();
  if (before_rename) before_rename();
  f.commit();
}

}  // namespace ul
