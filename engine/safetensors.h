// The safetensors file format (Hugging Face's weight files), read and written without a library.
//
//   8 bytes   N, little-endian uint64: the header length
//   N bytes   a JSON object: {"NAME": {"dtype": "F32", "shape": [d0, d1], "data_offsets": [begin, end]}, ...,
//             "__metadata__": {"key": "value", ...} (optional, string values only)}; the writer pads it
//             with spaces to a multiple of 8 so that the data that follows is aligned
//   the data  every tensor's bytes, row-major, little-endian; offsets are relative to the data start
//
// The reader checks everything a corrupt or hostile file could get wrong and throws a
// std::runtime_error naming the file and the problem: a header length past the end of the file,
// malformed JSON, an unknown dtype, a negative dimension, shape x dtype size != end - begin, offsets
// out of range, overlapping, or leaving a hole (the tensors must tile the data exactly, as the
// reference implementation requires).
#pragma once
#include <cstdint>
#include <cstring>
#include <functional>
#include <map>
#include <string>
#include <unordered_map>
#include <vector>

namespace ul {

// fp32 -> bf16 with round-to-nearest-even (NaN stays a quiet NaN); bf16 -> fp32 is exact.
inline uint16_t bf16_from_f32(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) return uint16_t((u >> 16) | 0x0040u);
  return uint16_t((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}
inline float f32_from_bf16(uint16_t h) {
  uint32_t u = uint32_t(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

struct SafeTensorInfo {
  std::string name, dtype;     // dtype: F64 F32 F16 BF16 I64 I32 I16 I8 U8 BOOL ...
  std::vector<int64_t> shape;  // [] is a scalar
  size_t begin = 0, end = 0;   // byte range in the data section
  int64_t numel() const;
};

class SafetensorsFile {
 public:
  // Reads and validates the whole file; or, header_only, only its header, checked against the
  // file's size the same way (enough for its metadata and tensor list; to_f32 then throws).
  explicit SafetensorsFile(const std::string& path, bool header_only = false);

  const std::string& path() const { return path_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  const std::vector<SafeTensorInfo>& tensors() const { return tensors_; }  // in data order
  const SafeTensorInfo* find(const std::string& name) const;
  // The tensor's values as fp32 (F32, BF16 and F16 only; other dtypes throw naming the tensor).
  std::vector<float> to_f32(const SafeTensorInfo& t) const;

 private:
  std::string path_, bytes_;  // bytes_: the whole file, or (header_only) its first data0_ bytes
  size_t data0_ = 0;
  bool header_only_ = false;
  std::map<std::string, std::string> metadata_;
  std::vector<SafeTensorInfo> tensors_;
  // name -> index in tensors_: find() once per name of an index's weight_map (a shard of 200,000
  // tensors missing one took 89 s to say so, every lookup a scan)
  std::unordered_map<std::string, size_t> by_name_;
};

// One tensor to write, fp32 in memory; the file stores it as F32 or BF16.
struct SafeTensorOut {
  std::string name;
  std::vector<int64_t> shape;
  std::vector<float> data;
};

// Writes path atomically (path.tmp, fsync, rename). dtype: "F32" or "BF16" (round-to-nearest-even).
// before_rename (if any) runs once the bytes are durable, just before the rename.
void write_safetensors(const std::string& path, const std::vector<SafeTensorOut>& tensors,
                       const std::map<std::string, std::string>& metadata, const std::string& dtype,
                       const std::function<void()>& before_rename = {});

// The same, one tensor in memory at a time: tensors[i].data is ignored (may be empty) and fill(i,
// out) writes tensor i's values (its shape's count) to out. An export of a model that fills the
// machine then needs one tensor's room, not a second copy of the model.
void write_safetensors_streamed(const std::string& path, const std::vector<SafeTensorOut>& tensors,
                                const std::map<std::string, std::string>& metadata, const std::string& dtype,
                                const std::function<void(size_t, float*)>& fill,
                                const std::function<void()>& before_rename = {});

// Bytes per element of a safetensors dtype name; 0 when the name is unknown.
size_t safetensors_dtype_size(const std::string& dtype);

}  // namespace ul
