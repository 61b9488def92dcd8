// Helpers shared by the communicator backends: the byte accounting of CommStats (the formulas are
// documented in communicator.h), host staging of device buffers (local, MPI), element-wise
// reductions on host buffers (local) and the bf16 conversions (MPI has no bf16 type). bf16 is the
// top half of an f32: it is widened exactly, reduced in f32, and rounded back to nearest-even once.
#pragma once
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

#include "engine/device.h"
#include "engine/tensor.h"
#include "parallel/communicator.h"

namespace ul {

// Bytes one rank sends to the other P - 1 ranks, by the standard algorithm of each collective.
namespace comm_volume {
inline uint64_t all_to_all(size_t count, DType t, int P) { return uint64_t(count) * (P - 1) * dtype_size(t); }
inline uint64_t all_gather(size_t count, DType t, int P) { return uint64_t(count) * (P - 1) * dtype_size(t); }
inline uint64_t reduce_scatter(size_t count, DType t, int P) { return uint64_t(count) * (P - 1) * dtype_size(t); }
inline uint64_t all_reduce(size_t count, DType t, int P) {  // ring: reduce-scatter + all-gather
  return 2 * uint64_t(count) * (P - 1) * dtype_size(t) / P;
}
inline uint64_t broadcast(size_t count, DType t, int P, bool is_root) {
  return is_root && P > 1 ? uint64_t(count) * dtype_size(t) : 0;
}
}  // namespace comm_volume

// Host memory for a collective's buffer: the buffer itself on the host, else a staging copy.
class Staged {
 public:
  Staged(Device d, const void* p, size_t bytes, bool copy_in) : dev_(d), p_(const_cast<void*>(p)), bytes_(bytes) {
    if (dev_ == Device::cpu) return;
    host_.resize(bytes);
    if (copy_in) device_copy(host_.data(), Device::cpu, p, dev_, bytes);
  }
  void* host() { return dev_ == Device::cpu ? p_ : host_.data(); }
  void copy_out() {
    if (dev_ != Device::cpu) device_copy(p_, dev_, host_.data(), Device::cpu, bytes_);
  }

 private:
  Device dev_;
  void* p_;
  size_t bytes_;
  std::vector<char> host_;
};

inline float bf16_to_f32(uint16_t h) {
  uint32_t u = uint32_t(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

inline uint16_t f32_to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7f800000u) == 0x7f800000u && (u & 0x7fffffu)) return uint16_t((u >> 16) | 0x40);  // NaN stays NaN
  u += 0x7fffu + ((u >> 16) & 1u);  // round to nearest, ties to even
  return uint16_t(u >> 16);
}

template <class T>
inline void reduce_typed(T* acc, const T* x, size_t n, ReduceOp op) {
  if (op == ReduceOp::sum)
    for (size_t i = 0; i < n; i++) acc[i] += x[i];
  else
    for (size_t i = 0; i < n; i++) acc[i] = std::max(acc[i], x[i]);
}

// Reduces `nsrc` host buffers (each n elements of type t, in the given order) into dst.
// The order is fixed (source 0 first), so every rank that runs it gets the same bits.
// bf16 is accumulated in f32 and rounded once at the end.
inline void reduce_many(void* dst, const void* const* srcs, int nsrc, size_t n, DType t, ReduceOp op) {
  if (n == 0 || nsrc == 0) return;
  if (t != DType::bf16) {
    std::memcpy(dst, srcs[0], n * dtype_size(t));  // dst must not alias any source
    for (int k = 1; k < nsrc; k++) {
      if (t == DType::f32) reduce_typed(static_cast<float*>(dst), static_cast<const float*>(srcs[k]), n, op);
      if (t == DType::f64) reduce_typed(static_cast<double*>(dst), static_cast<const double*>(srcs[k]), n, op);
      if (t == DType::i32) reduce_typed(static_cast<int32_t*>(dst), static_cast<const int32_t*>(srcs[k]), n, op);
    }
    return;
  }
  auto* d = static_cast<uint16_t*>(dst);
  for (size_t i = 0; i < n; i++) {
    float a = bf16_to_f32(static_cast<const uint16_t*>(srcs[0])[i]);
    for (int k = 1; k < nsrc; k++) {
      float v = bf16_to_f32(static_cast<const uint16_t*>(srcs[k])[i]);
      a = op == ReduceOp::sum ? a + v : std::max(a, v);
    }
    d[i] = f32_to_bf16(a);
  }
}

}  // namespace ul
